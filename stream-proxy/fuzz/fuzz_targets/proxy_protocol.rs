//! The PROXY protocol parser never panics, never claims more bytes than it was given, and never
//! changes its mind as more bytes arrive: a header once parsed (or rejected) stays so.
#![no_main]

use stream_proxy::proxy_protocol::parse;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let mut decided = None;
    for cut in 0..=data.len() {
        let now = parse(&data[..cut]);
        if let Ok(Some((_, len))) = &now {
            assert!(*len <= cut);
        }
        let summary = match &now {
            Ok(None) => None,
            Ok(Some((header, len))) => Some(Ok((*header, *len))),
            Err(_) => Some(Err(())),
        };
        if let Some(first) = &decided {
            assert_eq!(summary.as_ref(), Some(first), "verdict changed at {cut} bytes");
        } else {
            decided = summary;
        }
    }
});
