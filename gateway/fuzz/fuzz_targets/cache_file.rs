//! The cache's disk files on any bytes, as the start-up scan and a read meet them: no panic
//! (see `gateway::fuzzing::cache_file`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gateway::fuzzing::cache_file(data));
