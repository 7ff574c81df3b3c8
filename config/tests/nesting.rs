//! Nesting depth: a config nested deeper than `MAX_NESTING_DEPTH` levels is refused with a
//! located error before a YAML parser reads it (parsers take time quadratic in the depth of
//! `[[[[…`), and configs up to the limit load as before.

use gateway_config::MAX_NESTING_DEPTH;

/// Loads `text` from a file in a directory that also holds the plugin module `p.wasm`.
fn load(text: &str) -> Result<gateway_config::Config, String> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.wasm"), "").unwrap();
    let path = dir.path().join("deep.yaml");
    std::fs::write(&path, text).unwrap();
    gateway_config::load(&path).map_err(|e| {
        let shown = e.to_string();
        // The file name without the temporary directory.
        shown[shown.find("deep.yaml").unwrap_or(0)..].to_owned()
    })
}

/// A plugin whose `config` nests `levels` flow sequences: with the top-level mapping, `plugins`
/// and the plugin's own mapping, the deepest level is `levels + 3`.
fn flow_plugin(levels: usize) -> String {
    format!(
        "plugins:\n  p:\n    wasm: p.wasm\n    config: {}{}\n",
        "[".repeat(levels),
        "]".repeat(levels)
    )
}

/// The same depth with block mappings, one key per level.
fn block_plugin(levels: usize) -> String {
    let mut text = "plugins:\n  p:\n    wasm: p.wasm\n    config:\n".to_owned();
    for level in 0..levels {
        text += &format!("{}k{level}:\n", " ".repeat(6 + 2 * level));
    }
    text
}

/// How deeply a JSON value nests arrays and objects.
fn json_depth(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::Array(a) => 1 + a.iter().map(json_depth).max().unwrap_or(0),
        serde_json::Value::Object(o) => 1 + o.values().map(json_depth).max().unwrap_or(0),
        _ => 0,
    }
}

#[test]
fn a_hundred_thousand_open_brackets_get_the_depth_error() {
    let err = load(&"[".repeat(100_000)).unwrap_err();
    assert_eq!(
        err,
        format!(
            "deep.yaml:1:{}: nesting deeper than 64 levels",
            MAX_NESTING_DEPTH + 1
        )
    );
    // Inside a mapping and closed again (the shape the parsers take longest over).
    let closed = format!("routes: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
    let err = load(&closed).unwrap_err();
    assert_eq!(
        err,
        format!(
            "deep.yaml:1:{}: nesting deeper than 64 levels",
            9 + MAX_NESTING_DEPTH - 1
        )
    );
    let compact = "- ".repeat(100_000);
    let err = load(&compact).unwrap_err();
    assert_eq!(
        err,
        format!(
            "deep.yaml:1:{}: nesting deeper than 64 levels",
            2 * MAX_NESTING_DEPTH + 1
        )
    );
}

#[test]
fn configs_up_to_the_limit_load_and_one_level_more_is_refused() {
    for levels in [MAX_NESTING_DEPTH - 4, MAX_NESTING_DEPTH - 3] {
        for text in [flow_plugin(levels), block_plugin(levels)] {
            let config = load(&text).unwrap_or_else(|e| panic!("{levels} levels: {e}"));
            let json: serde_json::Value =
                serde_json::from_slice(&config.plugins["p"].config_json).unwrap();
            assert_eq!(json_depth(&json), levels, "{text}");
        }
    }
    let err = load(&flow_plugin(MAX_NESTING_DEPTH - 2)).unwrap_err();
    assert_eq!(
        err,
        format!(
            "deep.yaml:4:{}: nesting deeper than 64 levels",
            13 + MAX_NESTING_DEPTH - 3
        )
    );
    let err = load(&block_plugin(MAX_NESTING_DEPTH - 2)).unwrap_err();
    let last = MAX_NESTING_DEPTH - 3;
    assert_eq!(
        err,
        format!(
            "deep.yaml:{}:{}: nesting deeper than 64 levels",
            5 + last,
            7 + 2 * last
        )
    );
}

#[test]
fn brackets_in_strings_and_comments_are_not_nesting() {
    let brackets = "[{".repeat(5_000);
    let text = format!(
        "# {brackets}\nroutes:\n  - match: {{ path: \"/{brackets}\" }} # {brackets}\n    respond: {{ body: '{brackets}' }}\n  - match:\n      path: /{brackets}\n    respond:\n      body: |\n        {brackets}\n"
    );
    let config = load(&text).unwrap();
    assert_eq!(config.routes.len(), 2);
}
