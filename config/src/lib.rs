//! The gateway's configuration: one YAML file, parsed strictly (unknown keys are errors),
//! validated whole (references, binds, expressions), with every error located by
//! `file:line:col` and key path.
//!
//! ```no_run
//! let config = gateway_config::load("gateway.yaml".as_ref())?;
//! println!("{} routes", config.routes.len());
//! # Ok::<(), gateway_config::ConfigError>(())
//! ```
#![deny(missing_docs)]

pub mod cors;
mod error;
mod locate;
pub mod model;
mod nesting;
mod otel_env;
mod runtime;
mod sections;
pub mod units;
mod validate;

use std::path::Path;
use std::sync::Arc;

pub use error::{ConfigError, Location};
pub use locate::SourceMap;
pub use model::{KubernetesConfig, RawConfig};
pub use nesting::MAX_NESTING_DEPTH;
pub use runtime::*;
pub use units::{ByteSize, Duration};
pub use validate::is_origin_path;

/// The JSON Schema (draft 2020-12) of the config file, made from the serde model and its doc
/// comments: every key with its type, allowed values, default and description. Editors use it
/// for completion and checks (`schema/gateway.schema.json`, `gateway schema`).
pub fn json_schema() -> serde_json::Value {
    let mut schema = schemars::schema_for!(RawConfig);
    schema.insert("title".into(), "gateway configuration".into());
    schema.to_value()
}

/// Loads and validates a config file; relative paths resolve against its directory.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    load_with(path, None)
}

/// Loads and validates YAML text; `file` names it in errors, relative paths resolve against
/// `base_dir`.
pub fn load_str(text: &str, file: &str, base_dir: &Path) -> Result<Config, ConfigError> {
    load_str_with(text, file, base_dir, None)
}

/// Like [`load`], with `extra` (what the Kubernetes controller made) merged into the file's
/// own sections before validation.
pub fn load_with(path: &Path, extra: Option<&RawConfig>) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let base = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let base = std::fs::canonicalize(base).unwrap_or_else(|_| base.to_owned());
    load_str_with(&text, &path.display().to_string(), &base, extra)
}

/// Like [`load_str`], with `extra` merged as [`load_with`] does.
pub fn load_str_with(
    text: &str,
    file: &str,
    base_dir: &Path,
    extra: Option<&RawConfig>,
) -> Result<Config, ConfigError> {
    let mut raw = parse(text, file)?;
    if let Some(extra) = extra {
        raw.merge(extra);
    }
    let source: Arc<str> = Arc::from(text);
    let map = Arc::new(SourceMap::build(text));
    validate::validate(raw, file, base_dir, source, map)
}

/// Parses YAML text into the serde form without validating references. Text nested deeper
/// than [`MAX_NESTING_DEPTH`] is refused before any YAML parser reads it.
pub fn parse(text: &str, file: &str) -> Result<RawConfig, ConfigError> {
    if text.trim().is_empty() {
        return Ok(RawConfig::default());
    }
    if let Err(too_deep) = nesting::measure(text, MAX_NESTING_DEPTH) {
        let (line, column) = nesting::line_col(text, too_deep.offset);
        return Err(ConfigError::Parse {
            location: Location {
                file: file.to_owned(),
                line,
                column,
            },
            message: format!("nesting deeper than {MAX_NESTING_DEPTH} levels"),
        });
    }
    serde_yaml::from_str(text).map_err(|e| {
        // Every section's and entry's own error, when there are several.
        let mut all = sections::each_error(text, file);
        if all.len() > 1 {
            all.sort_by_key(|e| e.location().map(|l| l.line));
            return ConfigError::Many(all);
        }
        let (line, column) = e
            .location()
            .map(|l| (l.line(), l.column()))
            .unwrap_or((1, 1));
        let mut message = e.to_string();
        // serde_yaml appends " at line L column C"; the location prefix says it already.
        if let Some(cut) = message.find(" at line ") {
            message.truncate(cut);
        }
        ConfigError::Parse {
            location: Location {
                file: file.to_owned(),
                line,
                column,
            },
            message,
        }
    })
}
