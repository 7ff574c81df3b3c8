//! An upstream's response head through both of the proxy's entry points, whole and in part:
//! they agree, and the framing is RFC 9112's (see `gateway_http1::fuzzing::response_head`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gateway_http1::fuzzing::response_head(data));
