//! A client connection's bytes through the request-side framing checks, whole, in pieces and
//! byte by byte: the same verdicts every way (see `gateway_http1::fuzzing::request_framing`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gateway_http1::fuzzing::request_framing(data));
