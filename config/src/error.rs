//! The one error type of the config crate. Every error a user can cause names the file, the
//! line and column, and the key path (`routes[2].proxy.upstream`) it is about.

use std::fmt;
use std::path::PathBuf;

/// Where in a config file something is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The config file (or `<inline>` for configs loaded from a string).
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

/// Everything that can be wrong with a configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// YAML syntax, a type mismatch or an unknown key.
    #[error("{location}: {message}")]
    Parse {
        /// Where.
        location: Location,
        /// What serde reported, including the key path.
        message: String,
    },
    /// A value that parses but is not acceptable (a dangling reference, a duplicate bind...).
    #[error("{location}: {key}: {message}")]
    Invalid {
        /// Where.
        location: Location,
        /// Key path, e.g. `routes[0].proxy.upstream`.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// Several of the errors above, in the order of the file's sections (`gateway validate`
    /// reports them all at once); one per line.
    #[error("{}", list(.0))]
    Many(Vec<ConfigError>),
    /// An OpenTelemetry environment variable (`OTEL_*`) the `telemetry:` section takes
    /// settings from holds a value that cannot be used.
    #[error("environment variable {variable}: {message}")]
    Environment {
        /// The variable.
        variable: &'static str,
        /// What is wrong.
        message: String,
    },
}

impl ConfigError {
    /// The error as `gateway validate` shows it: each located error followed by the line of
    /// `source` it points at, with a caret under its column.
    pub fn render(&self, source: &str) -> String {
        let one = |e: &ConfigError| {
            let mut out = e.to_string();
            if let Some(at) = e.location()
                && let Some(text) = source.lines().nth(at.line.saturating_sub(1))
            {
                let number = at.line.to_string();
                let pad = " ".repeat(number.len());
                let caret = " ".repeat(at.column.saturating_sub(1).min(text.len()));
                out.push_str(&format!("\n {number} | {text}\n {pad} | {caret}^"));
            }
            out
        };
        match self {
            Self::Many(all) => {
                let shown: Vec<String> = all.iter().map(one).collect();
                format!("{} errors:\n{}", all.len(), shown.join("\n"))
            }
            other => one(other),
        }
    }

    /// The location the error points at, when it has one.
    pub fn location(&self) -> Option<&Location> {
        match self {
            Self::Read { .. } | Self::Environment { .. } => None,
            Self::Many(errors) => errors.first().and_then(Self::location),
            Self::Parse { location, .. } | Self::Invalid { location, .. } => Some(location),
        }
    }
}

fn list(errors: &[ConfigError]) -> String {
    let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
    format!("{} errors:\n{}", errors.len(), lines.join("\n"))
}
