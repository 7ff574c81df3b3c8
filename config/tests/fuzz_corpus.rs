//! Replays the config fuzz target's seed corpus (`fuzz/corpus/load/`) with the target's own
//! check, so inputs that once made the loader fail stay fixed without running the fuzzer: every
//! input loads or gives an error located inside the text.

use std::path::Path;

#[test]
fn load_corpus_never_panics_and_errors_are_located() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/load");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("corpus dir")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no seed inputs in {}", dir.display());
    for file in files {
        let bytes = std::fs::read(&file).expect("read");
        let Ok(text) = std::str::from_utf8(&bytes) else {
            continue;
        };
        if let Err(e) = gateway_config::load_str(text, "fuzz.yaml", Path::new("/nonexistent/fuzz"))
        {
            let shown = e.to_string();
            assert!(
                shown.starts_with("fuzz.yaml:"),
                "{}: {shown}",
                file.display()
            );
        }
    }
}
