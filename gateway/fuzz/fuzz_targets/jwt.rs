//! The `jwt` filter's parsers on any bytes, as a token and as a key set: no panic
//! (see `gateway::fuzzing::jwt`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gateway::fuzzing::jwt(data));
