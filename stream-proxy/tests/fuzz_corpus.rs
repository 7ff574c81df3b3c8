//! Replays the seed corpora of the parser fuzz targets (`fuzz/corpus/`) with the targets' own
//! checks, so inputs that once failed stay fixed without running the fuzzer: no panic, no
//! header longer than its input, and a verdict that never changes as more bytes arrive.

use std::path::Path;

use stream_proxy::proxy_protocol::parse;
use stream_proxy::sni::{ClientHello, parse_client_hello};

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("corpus dir")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no seed inputs in {}", dir.display());
    files
        .iter()
        .map(|f| std::fs::read(f).expect("read"))
        .collect()
}

#[test]
fn client_hello_corpus_verdicts_are_stable() {
    let mut with_name = 0;
    for data in corpus("client_hello") {
        let mut verdict = ClientHello::Incomplete;
        for cut in 0..=data.len() {
            let now = parse_client_hello(&data[..cut]);
            if verdict != ClientHello::Incomplete {
                assert_eq!(now, verdict, "verdict changed at {cut} bytes");
            }
            verdict = now;
        }
        if format!("{verdict:?}").contains("example") {
            with_name += 1;
        }
    }
    assert!(with_name >= 3, "the real hellos' names are found");
}

#[test]
fn proxy_protocol_corpus_verdicts_are_stable() {
    let mut parsed = 0;
    for data in corpus("proxy_protocol") {
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
                assert_eq!(
                    summary.as_ref(),
                    Some(first),
                    "verdict changed at {cut} bytes"
                );
            } else {
                decided = summary;
            }
        }
        if matches!(decided, Some(Ok(_))) {
            parsed += 1;
        }
    }
    assert!(parsed >= 5, "the well-formed headers parse ({parsed})");
}
