//! The authentication filters' settings: `basic_auth` (users, hashes) and `forward_auth` (the
//! service's URL, the fields it gets and gives back).

use super::*;

/// RFC 9110 token characters.
/// A `basic_auth` filter: a realm that fits a quoted string, a valid user header, an htpasswd
/// file that exists (its entries are checked when the filter is built).
pub(super) fn validate_basic_auth(
    c: &Checker<'_>,
    key: &str,
    b: &BasicAuthConfig,
) -> Result<BasicAuthConfig> {
    if b.realm.is_empty()
        || b.realm
            .chars()
            .any(|ch| ch.is_control() || ch == '"' || ch == '\\')
    {
        return c.err(
            format!("{key}.realm"),
            "must be non-empty, without quotes, backslashes or control characters",
        );
    }
    if let Some(h) = &b.user_header
        && !valid_header_name(h)
    {
        return c.err(
            format!("{key}.user_header"),
            format!("`{h}` is not a valid header name"),
        );
    }
    if b.max_concurrent_checks == Some(0) {
        return c.err(format!("{key}.max_concurrent_checks"), "must be at least 1");
    }
    let mut b = b.clone();
    b.htpasswd = c.path(&b.htpasswd);
    c.file_exists(&format!("{key}.htpasswd"), &b.htpasswd)?;
    Ok(b)
}

/// A `forward_auth` filter: one service (a URL, or an upstream that exists and a path), valid
/// header names (lowercased), a timeout.
pub(super) fn validate_forward_auth(
    c: &Checker<'_>,
    key: &str,
    f: &ForwardAuthConfig,
    upstreams: &IndexMap<String, Upstream>,
) -> Result<ForwardAuth> {
    let mut settings = f.clone();
    for (field, names) in [
        ("request_headers", &mut settings.request_headers),
        ("response_headers", &mut settings.response_headers),
    ] {
        for (i, name) in names.iter_mut().enumerate() {
            if !valid_header_name(name) {
                return c.err(
                    format!("{key}.{field}[{i}]"),
                    format!("`{name}` is not a valid header name"),
                );
            }
            name.make_ascii_lowercase();
        }
    }
    if f.timeout.get().is_zero() {
        return c.err(format!("{key}.timeout"), "must be greater than 0");
    }
    let (service, path) = match (&f.url, &f.upstream) {
        (Some(url), None) => {
            if f.path.is_some() {
                return c.err(
                    format!("{key}.path"),
                    "goes with `upstream`; a `url` has its own path",
                );
            }
            let (upstream, path) = url_service(c, &format!("{key}.url"), url, f.timeout)?;
            (AuthService::Url(Box::new(upstream)), path)
        }
        (None, Some(name)) => {
            c.reference(&format!("{key}.upstream"), "upstream", name, upstreams)?;
            let path = f.path.clone().unwrap_or_else(|| "/".into());
            if !path.starts_with('/') || path.bytes().any(|b| !b.is_ascii_graphic()) {
                return c.err(format!("{key}.path"), "must be a path starting with /");
            }
            (AuthService::Upstream(name.clone()), path)
        }
        _ => return c.err(key, "needs one of `url` or `upstream`"),
    };
    Ok(ForwardAuth {
        settings,
        service,
        path,
    })
}

/// The upstream a `forward_auth` URL stands for, and the path and query to ask.
pub(super) fn url_service(
    c: &Checker<'_>,
    key: &str,
    url: &str,
    timeout: crate::units::Duration,
) -> Result<(Upstream, String)> {
    let bad = |why: &str| c.err(key, format!("`{url}` is not a usable URL: {why}"));
    let (tls, rest) = if let Some(rest) = url.strip_prefix("http://") {
        (false, rest)
    } else if let Some(rest) = url.strip_prefix("https://") {
        (true, rest)
    } else {
        return bad("the scheme must be http or https");
    };
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(split);
    if authority.contains('@') {
        return bad("credentials in a URL are not sent; use `request_headers`");
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') => match p.parse::<u16>() {
            Ok(p) if p > 0 => (h, p),
            _ => return bad("the port is not a number from 1 to 65535"),
        },
        _ => (authority, if tls { 443 } else { 80 }),
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let host_ok = if host.starts_with('[') {
        bare.parse::<std::net::Ipv6Addr>().is_ok() && host.ends_with(']')
    } else {
        !host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    };
    if !host_ok {
        return bad("the host is not a name or an address");
    }
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else if path.is_empty() {
        "/".to_owned()
    } else {
        path.to_owned()
    };
    if path.bytes().any(|b| !b.is_ascii_graphic()) || path.contains('#') {
        return bad("the path has spaces, a fragment or characters that need escaping");
    }
    let address = format!("{host}:{port}");
    let (target_host, target_port, addr) = parse_target(c, key, &address)?;
    let settings = UpstreamConfig {
        targets: vec![TargetConfig::Address(address.clone())],
        balance: Balance::default(),
        hash_on: None,
        protocol: UpstreamProtocol::Http1,
        tls: tls.then(|| UpstreamTlsConfig {
            server_name: Some(bare.to_owned()),
            ..UpstreamTlsConfig::default()
        }),
        connect_timeout: timeout,
        timeout,
        retries: 0,
        resolve_every: None,
        health_check: HealthCheckConfig::default(),
        pool: PoolConfig::default(),
    };
    let upstream = Upstream {
        name: url.to_owned(),
        targets: vec![Target {
            authority: address,
            host: target_host,
            port: target_port,
            addr,
            weight: 1,
        }],
        hash_on: None,
        settings,
    };
    Ok((upstream, path))
}
