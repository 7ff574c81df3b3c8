//! `upstreams:`: targets (and the parser of a target, which `forward_auth` uses too), balancing,
//! TLS to them, health checks and pools.

use super::*;

pub(super) fn validate_upstreams(
    c: &Checker<'_>,
    raw: &mut RawConfig,
) -> Result<IndexMap<String, Upstream>> {
    let mut out = IndexMap::new();
    for (name, u) in raw.upstreams.iter_mut() {
        let checked = (|| -> Result<()> {
            let key = format!("upstreams.{name}");
            if u.targets.is_empty() {
                return c.err(format!("{key}.targets"), "at least one target is required");
            }
            let mut targets = Vec::new();
            for (i, t) in u.targets.iter().enumerate() {
                let tkey = format!("{key}.targets[{i}]");
                let (authority, weight) = match t {
                    TargetConfig::Address(a) => (a.clone(), 1),
                    TargetConfig::Weighted { address, weight } => (address.clone(), *weight),
                };
                if weight == 0 {
                    return c.err(format!("{tkey}.weight"), "must be at least 1");
                }
                let (host, port, addr) = parse_target(c, &tkey, &authority)?;
                targets.push(Target {
                    authority,
                    host,
                    port,
                    addr,
                    weight,
                });
            }
            let hash_on = match &u.hash_on {
                None => None,
                Some(h) => Some(match h.as_str() {
                    "client_ip" => HashKey::ClientIp,
                    "path" => HashKey::Path,
                    other => match other.split_once(':') {
                        Some(("header", n)) if valid_header_name(n) => {
                            HashKey::Header(n.to_ascii_lowercase())
                        }
                        Some(("cookie", n)) if !n.is_empty() => HashKey::Cookie(n.to_owned()),
                        _ => {
                            return c.err(
                                format!("{key}.hash_on"),
                                format!("`{other}` is not one of client_ip, path, header:NAME, cookie:NAME"),
                            );
                        }
                    },
                }),
            };
            if u.resolve_every.is_some_and(|d| d.get().is_zero()) {
                return c.err(format!("{key}.resolve_every"), "must be greater than 0");
            }
            if u.balance == Balance::ConsistentHash && hash_on.is_none() {
                return c.err(format!("{key}.balance"), "consistent_hash needs `hash_on`");
            }
            if let Some(path) = &u.health_check.path {
                if !path.starts_with('/') {
                    return c.err(format!("{key}.health_check.path"), "must start with /");
                }
                if u.health_check.interval.get().is_zero() {
                    return c.err(
                        format!("{key}.health_check.interval"),
                        "must be greater than 0",
                    );
                }
            }
            if u.health_check.unhealthy_after == 0 || u.health_check.healthy_after == 0 {
                return c.err(
                    format!("{key}.health_check"),
                    "unhealthy_after and healthy_after must be at least 1",
                );
            }
            for (i, status) in u.health_check.passive.statuses.iter().enumerate() {
                if !(500..=599).contains(status) {
                    return c.err(
                        format!("{key}.health_check.passive.statuses[{i}]"),
                        format!(
                            "{status} is not a 5xx status (only 500 to 599 can count against a target)"
                        ),
                    );
                }
            }
            if let Some(tls) = &mut u.tls {
                for (field, p) in [
                    ("ca", &mut tls.ca),
                    ("cert", &mut tls.cert),
                    ("key", &mut tls.key),
                ] {
                    if let Some(p) = p {
                        *p = c.path(p);
                        c.file_exists(&format!("{key}.tls.{field}"), p)?;
                    }
                }
                if tls.cert.is_some() != tls.key.is_some() {
                    return c.err(format!("{key}.tls"), "`cert` and `key` go together");
                }
            }
            out.insert(
                name.clone(),
                Upstream {
                    name: name.clone(),
                    targets,
                    hash_on,
                    settings: u.clone(),
                },
            );
            Ok(())
        })();
        c.keep(checked);
    }
    Ok(out)
}

/// A target's host and port, and its address when the host is an IP address. A name is only
/// checked for its shape here; the gateway resolves it when it loads the config.
pub(super) fn parse_target(
    c: &Checker<'_>,
    key: &str,
    authority: &str,
) -> Result<(String, u16, Option<SocketAddr>)> {
    if let Ok(a) = authority.parse::<SocketAddr>() {
        return Ok((a.ip().to_string(), a.port(), Some(a)));
    }
    let bad = || {
        c.err(
            key,
            format!(
                "`{authority}` is not a host:port (e.g. 127.0.0.1:9001, [::1]:9001 or \
                 users.internal:9001)"
            ),
        )
    };
    let Some((host, port)) = authority.rsplit_once(':') else {
        return bad();
    };
    let Ok(port) = port.parse::<u16>() else {
        return bad();
    };
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let name = host.strip_suffix('.').unwrap_or(host);
    if port == 0 || name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return bad();
    }
    Ok((host.to_ascii_lowercase(), port, None))
}
