//! Entry points of the fuzz targets in `http1/fuzz/`, shared with the unit tests that replay
//! their seed corpora (`http1/fuzz/corpus/<target>/`) on every `cargo test`, so an input that
//! once failed stays fixed. Compiled for tests and with the `fuzzing` feature only.
//!
//! * [`request_framing`] and [`h1_differential`] ([`framing`]): the request-side framing checks
//!   give the same verdicts however the bytes are split, and agree with `httparse`.
//! * [`response_head`] and [`response_chunked`] ([`response`]): the client's reading of a
//!   response head and a chunked body, split anywhere.

mod framing;
mod response;

pub use framing::{h1_differential, request_framing};
pub use response::{response_chunked, response_head};

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    /// Replays every seed of `target` through `check`, naming the seed that fails.
    fn replay(target: &str, check: fn(&[u8])) {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/corpus")
            .join(target);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("entry").path())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no seed inputs in {}", dir.display());
        for path in files {
            let input = std::fs::read(&path).expect("read");
            let outcome = std::panic::catch_unwind(|| check(&input));
            assert!(outcome.is_ok(), "{target}: {} failed", path.display());
        }
    }

    #[test]
    fn request_framing_corpus_replays() {
        replay("request_framing", super::request_framing);
    }

    #[test]
    fn h1_differential_corpus_replays() {
        replay("h1_differential", super::h1_differential);
    }

    #[test]
    fn response_head_corpus_replays() {
        replay("response_head", super::response_head);
    }

    #[test]
    fn response_chunked_corpus_replays() {
        replay("response_chunked", super::response_chunked);
    }
}
