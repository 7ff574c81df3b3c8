//! Replays the config fuzz targets' seed corpora (`fuzz/corpus/<target>/`) with the targets' own
//! checks, so inputs that once made them fail stay fixed without running the fuzzer: every
//! `load` input loads or gives an error located inside the text; every `origin` input passes
//! `gateway_config::cors::fuzz_origin`.

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
            let located = match &e {
                gateway_config::ConfigError::Many(all) => {
                    all.iter().all(|e| e.to_string().starts_with("fuzz.yaml:"))
                }
                _ => shown.starts_with("fuzz.yaml:"),
            };
            assert!(located, "{}: {shown}", file.display());
        }
    }
}

#[test]
fn origin_corpus_holds_the_matching_rules() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/origin");
    let files: Vec<_> = std::fs::read_dir(&dir)
        .expect("corpus dir")
        .map(|e| e.expect("entry").path())
        .collect();
    assert!(!files.is_empty(), "no seed inputs in {}", dir.display());
    for file in files {
        if let Ok(text) = std::fs::read_to_string(&file) {
            gateway_config::cors::fuzz_origin(&text);
        }
    }
}
