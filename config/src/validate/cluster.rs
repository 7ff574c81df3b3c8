//! `cluster:` and the settings that depend on it: the Redis URL's shape, a usable timeout and
//! prefix, and `scope: global` only where a cluster is configured (a global limit without a
//! shared store would silently be a local one).

use super::{Checker, Result};
use crate::model::{ClusterConfig, FilterConfig, RawConfig, Scope};

/// The cluster settings, checked; `None` when the section is absent.
pub(super) fn validate(c: &Checker<'_>, raw: &RawConfig) -> Result<Option<ClusterConfig>> {
    if let Some(cluster) = &raw.cluster {
        check_url(c, &cluster.redis)?;
        if cluster.prefix.is_empty() || cluster.prefix.bytes().any(|b| b.is_ascii_whitespace()) {
            return c.err(
                "cluster.prefix",
                "must be a non-empty string without whitespace",
            );
        }
        let timeout = cluster.timeout.get();
        if timeout.is_zero() || timeout > std::time::Duration::from_secs(10) {
            return c.err("cluster.timeout", "must be between 1ms and 10s");
        }
    }
    let clustered = raw.cluster.is_some();
    for (i, route) in raw.routes.iter().enumerate() {
        for (j, filter) in route.filters.iter().enumerate() {
            if let FilterConfig::RateLimit(rl) = filter
                && rl.scope == Scope::Global
                && !clustered
            {
                return c.err(
                    format!("routes[{i}].filters[{j}].rate_limit.scope"),
                    "`global` needs a `cluster:` section (where the count is shared)",
                );
            }
        }
    }
    for (name, plugin) in &raw.plugins {
        if plugin.shared_data.scope == Scope::Global && !clustered {
            return c.err(
                format!("plugins.{name}.shared_data.scope"),
                "`global` needs a `cluster:` section (where the data is shared)",
            );
        }
    }
    Ok(raw.cluster.clone())
}

/// `redis://[user:password@]host:port[/db]`: the scheme, a host and a numeric database.
fn check_url(c: &Checker<'_>, url: &str) -> Result<()> {
    const KEY: &str = "cluster.redis";
    let Some(rest) = url.strip_prefix("redis://") else {
        return c.err(KEY, "must be a redis:// URL (e.g. redis://127.0.0.1:6379)");
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, db) = rest.split_at(authority_end);
    let host = authority.rsplit('@').next().unwrap_or_default();
    if host.is_empty() || host.starts_with(':') {
        return c.err(KEY, "names no host (e.g. redis://127.0.0.1:6379)");
    }
    if let Some((_, port)) = host.rsplit_once(':')
        && !host.ends_with(']')
        && port.parse::<u16>().is_err()
    {
        return c.err(KEY, format!("`{port}` is not a port number"));
    }
    let db = db.trim_start_matches('/');
    if !db.is_empty() && db.parse::<u32>().is_err() {
        return c.err(KEY, format!("`{db}` is not a database number"));
    }
    Ok(())
}
