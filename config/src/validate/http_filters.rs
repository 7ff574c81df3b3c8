//! The `cors`, `compress` and `cache` filters' settings (and the `caches:` they name): origins that parse, tokens where the protocol
//! wants tokens, no `*` where a browser would take it literally, codings and types well formed.

use indexmap::IndexMap;

use super::{Checker, Result, valid_header_name};
use crate::cors::OriginPattern;
use crate::model::{CacheFilterConfig, CacheStoreConfig, CompressConfig, CorsConfig, RawConfig};
use crate::runtime::{CacheFilter, CacheKeyPart};

/// Checks a `cors:` entry at `key` (`routes[i].filters[j].cors`).
pub(super) fn cors(c: &Checker<'_>, key: &str, cfg: &CorsConfig) -> Result<()> {
    if cfg.allow_origins.is_empty() {
        return c.err(
            format!("{key}.allow_origins"),
            "lists no origin; write `*` to allow every origin",
        );
    }
    for (k, origin) in cfg.allow_origins.iter().enumerate() {
        let at = format!("{key}.allow_origins[{k}]");
        match OriginPattern::parse(origin) {
            Ok(OriginPattern::Any) if cfg.allow_credentials => {
                return c.err(
                    at,
                    "`*` cannot be used with `allow_credentials: true` (browsers refuse it); \
                     list the origins",
                );
            }
            Ok(_) => {}
            Err(m) => return c.err(at, m),
        }
    }
    tokens(
        c,
        &format!("{key}.allow_methods"),
        &cfg.allow_methods,
        "a method",
    )?;
    tokens(
        c,
        &format!("{key}.allow_headers"),
        &cfg.allow_headers,
        "a header name",
    )?;
    tokens(
        c,
        &format!("{key}.expose_headers"),
        &cfg.expose_headers,
        "a header name",
    )?;
    if cfg.allow_credentials
        && let Some(k) = cfg.expose_headers.iter().position(|h| h == "*")
    {
        return c.err(
            format!("{key}.expose_headers[{k}]"),
            "with credentials a browser reads `*` as a header's name; list the headers",
        );
    }
    Ok(())
}

/// Each entry a token (`*` included, which is one).
fn tokens(c: &Checker<'_>, key: &str, list: &[String], what: &str) -> Result<()> {
    match list.iter().position(|t| !valid_header_name(t)) {
        Some(k) => c.err(
            format!("{key}[{k}]"),
            format!("`{}` is not {what}", list[k]),
        ),
        None => Ok(()),
    }
}

/// Checks a `compress:` entry at `key` (`routes[i].filters[j].compress`).
pub(super) fn compress(c: &Checker<'_>, key: &str, cfg: &CompressConfig) -> Result<()> {
    if cfg.algorithms.is_empty() {
        return c.err(format!("{key}.algorithms"), "lists no coding");
    }
    for (k, a) in cfg.algorithms.iter().enumerate() {
        if cfg.algorithms[..k].contains(a) {
            return c.err(format!("{key}.algorithms[{k}]"), "listed twice");
        }
    }
    for (k, t) in cfg.types.iter().flatten().enumerate() {
        if !valid_media_range(t) {
            return c.err(
                format!("{key}.types[{k}]"),
                format!("`{t}` is not `type/subtype`, `type/*` or `*`"),
            );
        }
    }
    let l = cfg.level;
    for (name, level, range) in [
        ("gzip", l.gzip, 1..=9),
        ("br", l.br, 0..=11),
        ("zstd", l.zstd, 1..=19),
    ] {
        if !range.contains(&level) {
            return c.err(
                format!("{key}.level.{name}"),
                format!(
                    "{level} is out of range ({}-{})",
                    range.start(),
                    range.end()
                ),
            );
        }
    }
    Ok(())
}

fn valid_media_range(t: &str) -> bool {
    t == "*"
        || t.split_once('/')
            .is_some_and(|(ty, sub)| ty != "*" && valid_header_name(ty) && valid_header_name(sub))
}

/// Checks `caches:`: every bound above zero, disk paths resolved against the config's
/// directory and not shared by two caches (each would evict the other's files).
pub(super) fn caches(
    c: &Checker<'_>,
    raw: &RawConfig,
) -> Result<IndexMap<String, CacheStoreConfig>> {
    let mut out = raw.caches.clone();
    let mut dirs: Vec<(&str, std::path::PathBuf)> = Vec::new();
    for (name, cache) in &mut out {
        if cache.memory.bytes() == 0 {
            return c.err(format!("caches.{name}.memory"), "must be greater than 0");
        }
        let Some(disk) = &mut cache.disk else {
            continue;
        };
        if disk.size.bytes() == 0 {
            return c.err(format!("caches.{name}.disk.size"), "must be greater than 0");
        }
        disk.path = c.path(&disk.path);
        if let Some((other, _)) = dirs.iter().find(|(_, p)| *p == disk.path) {
            return c.err(
                format!("caches.{name}.disk.path"),
                format!(
                    "`{}` is already the disk of cache `{other}`",
                    disk.path.display()
                ),
            );
        }
        dirs.push((name, disk.path.clone()));
    }
    Ok(out)
}

/// Checks a `cache:` entry at `key`: its store exists, its key parts are known.
pub(super) fn cache(
    c: &Checker<'_>,
    key: &str,
    cfg: &CacheFilterConfig,
    caches: &IndexMap<String, CacheStoreConfig>,
) -> Result<CacheFilter> {
    c.reference(&format!("{key}.store"), "cache", &cfg.store, caches)?;
    if cfg.key.is_empty() {
        return c.err(
            format!("{key}.key"),
            "lists no part; the default is [method, host, path, query]",
        );
    }
    let mut parts = Vec::with_capacity(cfg.key.len());
    for (k, part) in cfg.key.iter().enumerate() {
        parts.push(match part.as_str() {
            "method" => CacheKeyPart::Method,
            "scheme" => CacheKeyPart::Scheme,
            "host" => CacheKeyPart::Host,
            "path" => CacheKeyPart::Path,
            "query" => CacheKeyPart::Query,
            other => match other.split_once(':') {
                Some(("header", n)) if valid_header_name(n) => {
                    CacheKeyPart::Header(n.to_ascii_lowercase())
                }
                _ => {
                    return c.err(
                        format!("{key}.key[{k}]"),
                        format!(
                            "`{other}` is not method, scheme, host, path, query or header:NAME"
                        ),
                    );
                }
            },
        });
    }
    if cfg.max_object_size.bytes() == 0 {
        return c.err(format!("{key}.max_object_size"), "must be greater than 0");
    }
    Ok(CacheFilter {
        settings: cfg.clone(),
        key: parts,
    })
}
