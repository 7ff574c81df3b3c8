//! Checks that go beyond the shape of the YAML, turning a [`RawConfig`] into a [`Config`]:
//! names unique, references resolved, binds parsed and not duplicated, expressions compiled,
//! relative paths resolved against the config file's directory.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use indexmap::IndexMap;

use crate::error::{ConfigError, Location};
use crate::locate::SourceMap;
use crate::model::*;
use crate::runtime::*;

/// Collects the located errors of one validation pass; the first one is reported.
struct Checker<'a> {
    file: &'a str,
    map: &'a SourceMap,
    base_dir: &'a Path,
    /// Errors found so far: each item (a listener, an upstream, a route...) is checked up to
    /// its first error, and the next item is checked all the same, so one run reports an
    /// error of every item that has one.
    errors: std::cell::RefCell<Vec<ConfigError>>,
}

type Result<T> = std::result::Result<T, ConfigError>;

impl Checker<'_> {
    /// The value, or `None` with the error kept for the report.
    fn keep<T>(&self, result: Result<T>) -> Option<T> {
        match result {
            Ok(v) => Some(v),
            Err(e) => {
                self.errors.borrow_mut().push(e);
                None
            }
        }
    }

    fn error_count(&self) -> usize {
        self.errors.borrow().len()
    }

    fn err<T>(&self, key: impl Into<String>, message: impl Into<String>) -> Result<T> {
        let key = key.into();
        let (line, column) = self.map.find(&key);
        Err(ConfigError::Invalid {
            location: Location {
                file: self.file.to_owned(),
                line,
                column,
            },
            key,
            message: message.into(),
        })
    }

    fn path(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_owned()
        } else {
            self.base_dir.join(p)
        }
    }

    fn bind(&self, key: &str, text: &str) -> Result<SocketAddr> {
        text.parse::<SocketAddr>().or_else(|_| {
            self.err(
                key,
                format!("`{text}` is not an ip:port address (e.g. 0.0.0.0:8080 or [::]:8443)"),
            )
        })
    }

    fn file_exists(&self, key: &str, path: &Path) -> Result<()> {
        if path.is_file() {
            Ok(())
        } else {
            self.err(key, format!("file `{}` does not exist", self.shown(path)))
        }
    }

    /// A resolved path as the user wrote it: relative to the config file when it is under it.
    fn shown(&self, path: &Path) -> String {
        path.strip_prefix(self.base_dir)
            .unwrap_or(path)
            .display()
            .to_string()
    }

    fn reference<V>(
        &self,
        key: &str,
        kind: &str,
        name: &str,
        defined: &IndexMap<String, V>,
    ) -> Result<()> {
        if defined.contains_key(name) {
            return Ok(());
        }
        let known: Vec<&str> = defined.keys().map(String::as_str).collect();
        let known = if known.is_empty() {
            "none are defined".to_owned()
        } else {
            format!("defined: {}", known.join(", "))
        };
        self.err(key, format!("unknown {kind} `{name}` ({known})"))
    }
}

/// Validates `raw` (read from `file`, relative paths against `base_dir`).
pub(crate) fn validate(
    mut raw: RawConfig,
    file: &str,
    base_dir: &Path,
    source: Arc<str>,
    map: Arc<SourceMap>,
) -> Result<Config> {
    let c = Checker {
        file,
        map: &map,
        base_dir,
        errors: Default::default(),
    };

    let admin = raw
        .admin
        .as_mut()
        .and_then(|a| c.keep(admin::validate(&c, a)));
    if let Some(log) = raw.telemetry.as_mut().and_then(|t| t.access_log.as_mut())
        && log.path != "stdout"
        && log.path != "stderr"
    {
        log.path = c.path(Path::new(&log.path)).display().to_string();
    }
    let mut telemetry = raw.telemetry.clone().unwrap_or_default();
    crate::otel_env::apply(&mut telemetry, &|name| std::env::var(name).ok())
        .map_err(|(variable, message)| ConfigError::Environment { variable, message })?;
    if let Some(t) = &telemetry.traces {
        if !(0.0..=1.0).contains(&t.ratio()) {
            c.keep(c.err::<()>(
                "telemetry.traces.sample_ratio",
                "must be between 0.0 and 1.0",
            ));
        }
        if !(t.otlp_endpoint.starts_with("http://") || t.otlp_endpoint.starts_with("https://")) {
            c.keep(c.err::<()>(
                "telemetry.traces.otlp_endpoint",
                "must be an http:// or https:// URL",
            ));
        }
    }

    let mut certificates = IndexMap::new();
    for (name, cert) in raw.certificates.iter_mut() {
        if let Some(v) = c.keep(validate_certificate(&c, name, cert)) {
            certificates.insert(name.clone(), v);
        }
    }

    let mut binds: HashMap<(SocketAddr, &'static str), String> = HashMap::new();
    let mut claim = |c: &Checker<'_>, key: String, addr: SocketAddr, transport: &'static str| {
        if addr.port() == 0 {
            return Ok(());
        }
        if let Some(first) = binds.insert((addr, transport), key.clone()) {
            return c.err(
                key,
                format!("{transport} address {addr} is already bound by {first}"),
            );
        }
        Ok(())
    };

    // Routes and streams name listeners, upstreams, plugins and WAF policies: they are checked
    // once those are sound, so that one broken upstream is not also reported by every route
    // naming it.
    let before = c.error_count();
    let listeners = validate_listeners(&c, &mut raw, &mut claim)?;
    let upstreams = validate_upstreams(&c, &mut raw)?;
    let plugins = validate_plugins(&c, &mut raw)?;
    let waf = validate_waf(&c, &raw)?;
    let caches = c.keep(http_filters::caches(&c, &raw)).unwrap_or_default();
    let referenced_ok = c.error_count() == before;
    if referenced_ok {
        c.keep(check_acme_reachable(&c, &certificates, &listeners));
    }
    let (routes, streams) = if referenced_ok {
        (
            validate_routes(&c, &mut raw, &listeners, &upstreams, &plugins, &waf)?,
            validate_streams(&c, &raw, &upstreams, &plugins, &mut claim)?,
        )
    } else {
        (Vec::new(), Vec::new())
    };
    if let Some(a) = &admin {
        c.keep(claim(&c, "admin.bind".into(), a.addr, "tcp"));
    }
    let cluster = c.keep(cluster::validate(&c, &raw)).flatten();
    let kubernetes = raw.kubernetes.as_mut().map(|k| {
        if let Some(path) = &mut k.kubeconfig {
            *path = c.path(path);
        }
        if k.controller_name.is_empty() || !k.controller_name.contains('/') {
            c.keep(c.err::<()>(
                "kubernetes.controller_name",
                "must be a domain-prefixed path such as gateway.dev/controller",
            ));
        }
        k.clone()
    });

    let mut errors = c.errors.take();
    match errors.len() {
        0 => {}
        1 => return Err(errors.remove(0)),
        _ => return Err(ConfigError::Many(errors)),
    }

    Ok(Config {
        file: file.to_owned(),
        base_dir: base_dir.to_owned(),
        source,
        source_map: map.clone(),
        server: {
            let mut server = raw.server.clone();
            if let Some(cache) = &mut server.wasm_cache {
                cache.path = c.path(&cache.path);
            }
            server
        },
        admin,
        telemetry,
        certificates,
        listeners,
        upstreams,
        plugins,
        waf,
        caches,
        routes,
        streams,
        cluster,
        kubernetes,
        raw,
    })
}

/// Claims an address for a listener, a stream or the admin API (`key`, the address, the
/// transport), refusing one another key claimed already.
type Claim<'f> = dyn FnMut(&Checker<'_>, String, SocketAddr, &'static str) -> Result<()> + 'f;

mod admin;
mod auth;
mod cluster;
mod http_filters;
mod jwt;
mod listeners;
mod plugins;
mod proxy;
mod rewrite;
mod routes;
mod streams;
mod tls;
mod upstreams;

use auth::*;
use listeners::*;
use plugins::*;
use proxy::validate_backends;
pub use rewrite::is_origin_path;
use routes::*;
use streams::*;
use tls::*;
use upstreams::*;

pub(crate) fn valid_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// An `Upgrade` protocol as RFC 9110 §7.8 writes one: a token, optionally `/` and a version
/// token.
fn valid_upgrade_protocol(protocol: &str) -> bool {
    match protocol.split_once('/') {
        Some((name, version)) => valid_header_name(name) && valid_header_name(version),
        None => valid_header_name(protocol),
    }
}

pub(crate) fn valid_header_value(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b == b'\t' || (0x20..0x7f).contains(&b) || b >= 0x80)
}

/// The regular expression `re` of entry `name` under `key`, compiled.
fn compile_regex(c: &Checker<'_>, key: &str, name: &str, re: &str) -> Result<regex::Regex> {
    regex::Regex::new(re).or_else(|e| {
        c.err(
            format!("{key}.{name}"),
            format!("invalid regular expression: {e}"),
        )
    })
}

fn check_headers<'m>(
    c: &Checker<'_>,
    key: &str,
    pairs: impl IntoIterator<Item = (&'m String, Option<&'m String>)>,
) -> Result<()> {
    for (name, value) in pairs {
        if !valid_header_name(name) {
            return c.err(
                format!("{key}.{name}"),
                format!("`{name}` is not a valid header name"),
            );
        }
        if let Some(v) = value
            && !valid_header_value(v)
        {
            return c.err(
                format!("{key}.{name}"),
                "header values cannot contain control characters",
            );
        }
    }
    Ok(())
}
