//! `Authorization: Basic` values and htpasswd files as the `basic_auth` filter reads them (see
//! `gateway::fuzzing::basic_auth`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gateway::fuzzing::basic_auth(data));
