//! The `cache` filter's header parsers on any bytes, and the answers made from them: no panic
//! (see `gateway::fuzzing::cache_control`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gateway::fuzzing::cache_control(data));
