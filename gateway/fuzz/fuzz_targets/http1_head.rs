//! Fuzzed bytes as one client connection through the real serving path, filter chain and
//! terminal: no panic, no hang, only HTTP/1.1 responses (see `gateway::fuzzing::http1_head`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gateway::fuzzing::http1_head(data));
