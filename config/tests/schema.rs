//! The JSON Schema editors use (`schema/gateway.schema.json`) is the one the config model makes
//! today, and every example config passes it while broken ones do not.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn committed() -> serde_json::Value {
    let text = std::fs::read_to_string(root().join("schema/gateway.schema.json"))
        .expect("schema/gateway.schema.json");
    serde_json::from_str(&text).expect("the committed schema is JSON")
}

#[test]
fn the_committed_schema_is_the_models() {
    assert!(
        committed() == gateway_config::json_schema(),
        "schema/gateway.schema.json is out of date: run `cargo run -p gateway -- schema > schema/gateway.schema.json`"
    );
}

fn validator() -> jsonschema::Validator {
    jsonschema::draft202012::new(&gateway_config::json_schema())
        .expect("a valid draft 2020-12 schema")
}

fn as_json(yaml: &str) -> serde_json::Value {
    serde_yaml::from_str(yaml).expect("YAML")
}

#[test]
fn example_configs_pass_the_schema() {
    let validator = validator();
    let mut checked = 0;
    for dir in [
        root().join("config/examples"),
        root().join("config/tests/ui/valid"),
    ] {
        for entry in std::fs::read_dir(&dir).expect("examples") {
            let path = entry.expect("entry").path();
            if path.extension().is_none_or(|e| e != "yaml") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read");
            let errors: Vec<String> = validator
                .iter_errors(&as_json(&text))
                .map(|e| format!("{}: {e}", e.instance_path))
                .collect();
            assert!(errors.is_empty(), "{}: {errors:?}", path.display());
            checked += 1;
        }
    }
    assert!(checked >= 3, "{checked} configs checked");
}

#[test]
fn the_schema_refuses_what_the_loader_refuses() {
    let validator = validator();
    for (yaml, why) in [
        ("listenrs: []\n", "an unknown key"),
        (
            "listeners:\n  - name: a\n    bind: 127.0.0.1:0\n    protocols: [http9]\n",
            "an unknown protocol",
        ),
        (
            "server: { drain_timeout: 30 }\n",
            "a duration without a unit",
        ),
        (
            "server: { drain_timeout: soon }\n",
            "a duration that is not one",
        ),
        (
            "routes:\n  - match: { path: / }\n    filters: [ { gzip: {} } ]\n",
            "an unknown filter",
        ),
        (
            "routes:\n  - match: { path: / }\n    filters: [ { rate_limit: { per: 1s } } ]\n",
            "a missing required key",
        ),
        (
            "upstreams:\n  a: { targets: [x:1], balance: fastest }\n",
            "an unknown enum value",
        ),
    ] {
        assert!(!validator.is_valid(&as_json(yaml)), "{why}: {yaml}");
        assert!(
            gateway_config::parse(yaml, "t.yaml").is_err(),
            "the loader refuses {why} too"
        );
    }
}

#[test]
fn keys_carry_their_doc_text_and_defaults() {
    let schema = gateway_config::json_schema();
    let text = schema.to_string();
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    assert!(
        text.contains("Process-wide settings"),
        "doc comments become descriptions"
    );
    let server = &schema["$defs"]["ServerSettings"]["properties"];
    assert_eq!(server["drain_timeout"]["default"], "30s", "{server}");
    assert_eq!(server["log_format"]["default"], "text", "{server}");
}
