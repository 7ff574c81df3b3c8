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
    /// The location the error points at, when it has one.
    pub fn location(&self) -> Option<&Location> {
        match self {
            Self::Read { .. } | Self::Environment { .. } => None,
            Self::Parse { location, .. } | Self::Invalid { location, .. } => Some(location),
        }
    }
}
