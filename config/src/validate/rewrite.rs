//! Checks of the `redirect` terminal and the `rewrite` filter: the paths and hosts they write
//! must be ones a request line and a `Location` can carry, and `replace_prefix` needs the
//! route's `match.path_prefix` to know what it replaces.

use super::{Checker, Result};
use crate::model::{RedirectConfig, RewriteConfig};
use crate::runtime::{PathRewrite, Redirect, Rewrite};

/// Statuses a redirect may answer with.
const REDIRECT_STATUSES: [u16; 5] = [301, 302, 303, 307, 308];

/// `routes[N].redirect`, for a route whose `match.path_prefix` is `prefix`.
pub(super) fn redirect(
    c: &Checker<'_>,
    key: &str,
    cfg: &RedirectConfig,
    prefix: Option<&str>,
) -> Result<Redirect> {
    if !REDIRECT_STATUSES.contains(&cfg.status) {
        return c.err(
            format!("{key}.status"),
            format!("`{}` is not one of 301, 302, 303, 307, 308", cfg.status),
        );
    }
    let scheme = match cfg.scheme.as_deref().map(str::to_ascii_lowercase) {
        Some(s) if s != "http" && s != "https" => {
            return c.err(format!("{key}.scheme"), "must be `http` or `https`");
        }
        other => other,
    };
    if let Some(host) = &cfg.host
        && !valid_host(host.as_bytes())
    {
        return c.err(
            format!("{key}.host"),
            format!("`{host}` is not a host name or address (the port goes in `port`)"),
        );
    }
    if cfg.port == Some(0) {
        return c.err(format!("{key}.port"), "must be between 1 and 65535");
    }
    let path = path_rule(
        c,
        key,
        cfg.path.as_ref(),
        cfg.replace_prefix.as_ref(),
        prefix,
    )?;
    Ok(Redirect {
        scheme,
        host: cfg.host.as_ref().map(|h| h.to_ascii_lowercase()),
        port: cfg.port,
        path,
        strip_query: cfg.strip_query,
        status: cfg.status,
    })
}

/// `routes[N].filters[M].rewrite`, for a route whose `match.path_prefix` is `prefix`.
pub(super) fn rewrite(
    c: &Checker<'_>,
    key: &str,
    cfg: &RewriteConfig,
    prefix: Option<&str>,
) -> Result<Rewrite> {
    let rules = [
        cfg.path.is_some(),
        cfg.replace_prefix.is_some(),
        cfg.path_regex.is_some(),
    ];
    if rules.iter().filter(|x| **x).count() > 1 {
        return c.err(
            key,
            "use only one of `path`, `replace_prefix`, `path_regex`",
        );
    }
    let path = match (&cfg.path_regex, &cfg.to) {
        (Some(re), Some(to)) => Some(regex_rule(c, key, re, to)?),
        (Some(_), None) => return c.err(format!("{key}.path_regex"), "needs `to`"),
        (None, Some(_)) => return c.err(format!("{key}.to"), "needs `path_regex`"),
        (None, None) => path_rule(
            c,
            key,
            cfg.path.as_ref(),
            cfg.replace_prefix.as_ref(),
            prefix,
        )?,
    };
    if let Some(host) = &cfg.host
        && !valid_authority(host.as_bytes())
    {
        return c.err(
            format!("{key}.host"),
            format!("`{host}` is not a host name or address with an optional port"),
        );
    }
    if path.is_none() && cfg.host.is_none() {
        return c.err(
            key,
            "needs one of `path`, `replace_prefix`, `path_regex` or `host`",
        );
    }
    Ok(Rewrite {
        path,
        host: cfg.host.clone(),
    })
}

/// `path` or `replace_prefix` (not both), checked.
fn path_rule(
    c: &Checker<'_>,
    key: &str,
    path: Option<&String>,
    replace_prefix: Option<&String>,
    prefix: Option<&str>,
) -> Result<Option<PathRewrite>> {
    match (path, replace_prefix) {
        (Some(_), Some(_)) => c.err(key, "use only one of `path` and `replace_prefix`"),
        (Some(p), None) => {
            check_path(c, &format!("{key}.path"), p)?;
            Ok(Some(PathRewrite::Replace(p.clone())))
        }
        (None, Some(with)) => {
            let Some(prefix) = prefix else {
                return c.err(
                    format!("{key}.replace_prefix"),
                    "needs the route's `match.path_prefix` (the part it replaces)",
                );
            };
            // Empty replaces the prefix with nothing, as `proxy.strip_prefix` does.
            if !with.is_empty() {
                check_path(c, &format!("{key}.replace_prefix"), with)?;
            }
            Ok(Some(PathRewrite::ReplacePrefix {
                prefix: prefix.to_owned(),
                with: with.clone(),
            }))
        }
        (None, None) => Ok(None),
    }
}

/// A `path_regex` and its `to`: the expression compiles and `to` names only its groups.
fn regex_rule(c: &Checker<'_>, key: &str, re: &str, to: &str) -> Result<PathRewrite> {
    let regex = match regex::Regex::new(re) {
        Ok(r) => r,
        Err(e) => {
            return c.err(
                format!("{key}.path_regex"),
                format!("invalid regular expression: {e}"),
            );
        }
    };
    check_path(c, &format!("{key}.to"), to)?;
    let groups = regex.captures_len() - 1;
    let mut rest = to.as_bytes();
    while let Some(i) = rest.iter().position(|&b| b == b'$') {
        match rest.get(i + 1) {
            Some(b'$') => {}
            Some(d @ b'1'..=b'9') if usize::from(d - b'0') <= groups => {}
            Some(d @ b'1'..=b'9') => {
                return c.err(
                    format!("{key}.to"),
                    format!(
                        "`${}` names a group `path_regex` does not have (it has {groups})",
                        char::from(*d)
                    ),
                );
            }
            _ => {
                return c.err(
                    format!("{key}.to"),
                    "`$` must be followed by a group number 1-9 (or `$$` for `$`)",
                );
            }
        }
        rest = &rest[i + 2..];
    }
    Ok(PathRewrite::Regex {
        regex,
        to: to.to_owned(),
    })
}

/// A path as a request target carries it: `/` first, then RFC 3986 path characters and
/// percent-escapes, no query or fragment.
fn check_path(c: &Checker<'_>, key: &str, path: &str) -> Result<()> {
    if !path.starts_with('/') {
        return c.err(key, "must start with /");
    }
    if !is_origin_path(path.as_bytes()) {
        return c.err(
            key,
            "must be a URL path: letters, digits, `-._~!$&'()*+,;=:@/` and %XX escapes \
             (no query, fragment or spaces)",
        );
    }
    Ok(())
}

/// Whether `path` is an origin-form path: `/` first, then RFC 3986 `pchar`s and `/`.
pub fn is_origin_path(path: &[u8]) -> bool {
    if path.first() != Some(&b'/') {
        return false;
    }
    let mut i = 0;
    while i < path.len() {
        match path[i] {
            b'%' => {
                let hex = path.get(i + 1..i + 3);
                if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                    return false;
                }
                i += 3;
                continue;
            }
            b if PATH_BYTE[usize::from(b)] => {}
            _ => return false,
        }
        i += 1;
    }
    true
}

/// The bytes a path may hold as they are (RFC 3986 `pchar` without `%`, and `/`), as a table:
/// the check runs per request for the `rewrite` filter's paths.
const PATH_BYTE: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric();
        b += 1;
    }
    let extra = b"-._~!$&'()*+,;=:@/";
    let mut i = 0;
    while i < extra.len() {
        t[extra[i] as usize] = true;
        i += 1;
    }
    t
};

/// A host name (letters, digits, `-._~`), an IPv4 address or a bracketed IPv6 address.
fn valid_host(host: &[u8]) -> bool {
    match host {
        [] => false,
        [b'[', literal @ .., b']'] => std::str::from_utf8(literal)
            .is_ok_and(|text| text.parse::<std::net::Ipv6Addr>().is_ok()),
        _ => host
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')),
    }
}

/// [`valid_host`] with an optional `:port`.
fn valid_authority(authority: &[u8]) -> bool {
    let colon = match authority.iter().rposition(|&b| b == b':') {
        Some(i) if !authority[i..].contains(&b']') => Some(i),
        _ => None,
    };
    match colon {
        Some(i) => {
            let port = &authority[i + 1..];
            valid_host(&authority[..i])
                && std::str::from_utf8(port).is_ok_and(|p| p.parse::<u16>().is_ok_and(|p| p > 0))
        }
        None => valid_host(authority),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_paths() {
        for ok in ["/", "/a/b", "/v2/%2Fx", "/a;b=c", "/~u/@x:y"] {
            assert!(is_origin_path(ok.as_bytes()), "{ok}");
        }
        for bad in [
            "",
            "a",
            "/a b",
            "/a?b",
            "/a#b",
            "/%zz",
            "/%2",
            "/a\r\nx: y",
            "/é",
        ] {
            assert!(!is_origin_path(bad.as_bytes()), "{bad:?}");
        }
    }

    #[test]
    fn hosts_and_authorities() {
        assert!(valid_host(b"example.com"));
        assert!(valid_host(b"[::1]"));
        assert!(!valid_host(b"example.com:80"));
        assert!(!valid_host(b"a/b"));
        assert!(!valid_host(b"[zz]"));
        assert!(valid_authority(b"example.com:8080"));
        assert!(valid_authority(b"[::1]:443"));
        assert!(valid_authority(b"[::1]"));
        assert!(!valid_authority(b"example.com:0"));
        assert!(!valid_authority(b"example.com:x"));
        assert!(!valid_authority(b"a b"));
    }
}
