//! The same bytes to the request-side framing checks and to `httparse`: they agree on where a
//! head ends and which heads are refused, apart from the documented leniencies (see
//! `gateway_http1::fuzzing::h1_differential`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gateway_http1::fuzzing::h1_differential(data));
