//! Any text given to the config loader (YAML parse, the position index, validation) yields a
//! config or an error, never a panic; an error always names a line and column inside the text.
#![no_main]

use std::path::Path;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // A base directory that does not exist: relative paths in the input resolve to nothing.
    if let Err(e) = gateway_config::load_str(text, "fuzz.yaml", Path::new("/nonexistent/fuzz")) {
        let _ = e.to_string();
    }
});
