//! An upstream's chunked body through the proxy's decoder, in one read and in many: the same
//! data, trailers and end (see `gateway_http1::fuzzing::response_chunked`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gateway_http1::fuzzing::response_chunked(data));
