//! `X-Forwarded-For` and `Forwarded` values from a trusted proxy: no panic, a canonical client,
//! and a trusted hop on the right changes no named client (see `gateway::fuzzing::forwarded`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gateway::fuzzing::forwarded(data));
