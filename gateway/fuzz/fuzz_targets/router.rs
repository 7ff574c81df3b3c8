//! Route lookup with fuzzed method, target and headers agrees with a plain first-match scan
//! and never panics (see `gateway::fuzzing::router`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gateway::fuzzing::router(data));
