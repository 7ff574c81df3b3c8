//! The WAF's decoders on any bytes: no panic, output never longer than the input
//! (see `gateway::fuzzing::waf_decode`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gateway::fuzzing::waf_decode(data));
