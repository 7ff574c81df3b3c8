//! Any text read as a CORS origin or an `allow_origins` entry parses or is refused, never a
//! panic; a subdomain wildcard never matches a host outside its domain
//! (`gateway_config::cors::fuzz_origin`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        gateway_config::cors::fuzz_origin(text);
    }
});
