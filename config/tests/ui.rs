//! Golden tests for user-facing config errors: each `ui/invalid/NAME.yaml` must fail with exactly
//! the message in `ui/invalid/NAME.err` (file:line:col, key path, text). Each `ui/valid/*.yaml`
//! must load. Set `UPDATE_GOLDEN=1` to rewrite the `.err` files after an intended change.

use std::path::Path;

fn cases(dir: &str) -> Vec<std::path::PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/ui")
        .join(dir);
    let mut files: Vec<_> = std::fs::read_dir(&root)
        .expect("ui dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

#[test]
fn invalid_configs_report_located_errors() {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let mut failures = Vec::new();
    for case in cases("invalid") {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&case).unwrap();
        let got = match gateway_config::load_str(&text, &name, case.parent().unwrap()) {
            Ok(_) => "<loaded without error>".to_owned(),
            Err(e) => e.to_string(),
        };
        let golden = case.with_extension("err");
        if update {
            std::fs::write(&golden, format!("{got}\n")).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&golden).unwrap_or_default();
        if want.trim_end() != got {
            failures.push(format!(
                "{name}\n  want: {}\n  got:  {got}",
                want.trim_end()
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn valid_configs_load() {
    for case in cases("valid") {
        let text = std::fs::read_to_string(&case).unwrap();
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        if let Err(e) = gateway_config::load_str(&text, &name, case.parent().unwrap()) {
            panic!("{name}: {e}");
        }
    }
}

#[test]
fn relative_paths_resolve_against_the_config_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("site")).unwrap();
    let path = dir.path().join("g.yaml");
    std::fs::write(
        &path,
        "routes:\n  - match: { path_prefix: / }\n    static: { root: site }\n",
    )
    .unwrap();
    // Load from another working directory: the root is still found next to the file.
    let config = gateway_config::load(&path).unwrap();
    match &config.routes[0].action {
        gateway_config::RouteAction::Static(s) => {
            assert!(s.root.is_absolute());
            assert!(s.root.ends_with("site"));
        }
        _ => panic!("static route expected"),
    }
}
