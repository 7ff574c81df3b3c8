//! Request paths through normalization under every rule: the normal form is normal, has no dot
//! segment or disguised separator, and never grows (see `gateway::fuzzing::path_normalize`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gateway::fuzzing::path_normalize(data));
