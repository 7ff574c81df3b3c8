//! The ClientHello parser never panics, and never changes its mind: once a prefix gets a
//! verdict other than `Incomplete`, more bytes give the same verdict (the proxy acts on the
//! first verdict while the client may still be sending).
#![no_main]

use stream_proxy::sni::{ClientHello, parse_client_hello};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let mut verdict = ClientHello::Incomplete;
    for cut in 0..=data.len() {
        let now = parse_client_hello(&data[..cut]);
        if verdict != ClientHello::Incomplete {
            assert_eq!(now, verdict, "verdict changed at {cut} bytes");
        }
        verdict = now;
    }
});
