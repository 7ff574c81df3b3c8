//! Every host function called with fuzzer-chosen pointers, lengths and ids from every
//! callback: a status or a clean trap, never a panic (see `wasm_host::fuzzing::host_calls`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| wasm_host::fuzzing::host_calls(data));
