//! `Host` values and paths through the entry rules: an accepted host is safe to copy into
//! forwarding fields, and the fast path agrees with the general one (see
//! `gateway::fuzzing::host`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gateway::fuzzing::host(data));
