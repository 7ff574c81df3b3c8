//! `admin:`: the listener address (loopback unless `allow_remote`), the bearer token (written
//! inline or read from `token_file`, never both) and the extra `origins` the admin API accepts,
//! each checked here so that the admin API only compares at request time.

use super::{Checker, Result};
use crate::model::AdminConfig;
use crate::runtime::{Admin, AdminOrigin, AdminToken};

/// Shortest token accepted: guessing one must not be practical.
const MIN_TOKEN_LEN: usize = 16;

/// The `admin` section, checked; `token_file` made absolute in `admin`.
pub(super) fn validate(c: &Checker<'_>, admin: &mut AdminConfig) -> Result<Admin> {
    let addr = c.bind("admin.bind", &admin.bind)?;
    if !addr.ip().is_loopback() && !admin.allow_remote {
        return c.err(
            "admin.bind",
            format!(
                "{addr} is not a loopback address; whoever reaches the admin API can reload \
                 and read the config, so set `admin.allow_remote: true` to expose it \
                 deliberately (and `admin.token` to require a token)"
            ),
        );
    }
    let token = match (&admin.token, &mut admin.token_file) {
        (Some(_), Some(_)) => {
            return c.err(
                "admin.token_file",
                "use only one of `token` and `token_file`",
            );
        }
        (Some(token), None) => Some(check_token(c, "admin.token", token, "the token")?),
        (None, Some(file)) => {
            *file = c.path(file);
            let text = std::fs::read_to_string(&*file).or_else(|e| {
                c.err(
                    "admin.token_file",
                    format!("cannot read `{}`: {e}", c.shown(file)),
                )
            })?;
            let what = format!("the token in `{}`", c.shown(file));
            Some(check_token(c, "admin.token_file", text.trim(), &what)?)
        }
        (None, None) => None,
    };
    let mut origins = Vec::with_capacity(admin.origins.len());
    for (i, origin) in admin.origins.iter().enumerate() {
        origins.push(parse_origin(origin).or_else(|why| {
            c.err(
                format!("admin.origins[{i}]"),
                format!("`{origin}` {why}; write `host:port` or `http(s)://host[:port]`"),
            )
        })?);
    }
    Ok(Admin {
        addr,
        token,
        origins,
    })
}

/// A token as RFC 6750 lets it be sent (`b64token`), long enough not to be guessed. The message
/// never quotes the token.
fn check_token(c: &Checker<'_>, key: &str, token: &str, what: &str) -> Result<AdminToken> {
    let body = token.trim_end_matches('=');
    let b64token = !body.is_empty()
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+/".contains(&b));
    if !b64token {
        return c.err(
            key,
            format!("{what} may only hold `A-Z a-z 0-9 - . _ ~ + /`, optionally ending in `=`"),
        );
    }
    if token.len() < MIN_TOKEN_LEN {
        return c.err(
            key,
            format!(
                "{what} is shorter than {MIN_TOKEN_LEN} characters (e.g. `openssl rand -hex 32` \
                 makes one)"
            ),
        );
    }
    Ok(AdminToken::new(token.to_owned()))
}

/// `[http(s)://]host[:port]`, lower-case; the reason it is not one otherwise.
fn parse_origin(text: &str) -> std::result::Result<AdminOrigin, &'static str> {
    let lower = text.to_ascii_lowercase();
    let (scheme, authority) = match lower.split_once("://") {
        Some((scheme @ ("http" | "https"), rest)) => (Some(scheme.to_owned()), rest),
        Some(_) => return Err("has a scheme other than http or https"),
        None => (None, lower.as_str()),
    };
    if authority.contains(['/', '?', '#']) {
        return Err("has a path; an origin is a scheme, a host and a port only");
    }
    let (host, port) = match authority.strip_prefix('[') {
        Some(rest) => {
            let (ip, after) = rest.split_once(']').ok_or("has an unclosed `[`")?;
            if ip.parse::<std::net::Ipv6Addr>().is_err() {
                return Err("has an invalid IPv6 address in brackets");
            }
            let port = match after {
                "" => None,
                _ => Some(after.strip_prefix(':').ok_or("has an invalid port")?),
            };
            (None, port)
        }
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (Some(host), Some(port)),
            None => (Some(authority), None),
        },
    };
    if let Some(host) = host {
        let name_chars = host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
        if host.is_empty() || !name_chars {
            return Err("has no valid host name");
        }
    }
    if let Some(port) = port
        && (!port.bytes().all(|b| b.is_ascii_digit()) || port.parse::<u16>().is_err())
    {
        return Err("has an invalid port");
    }
    Ok(AdminOrigin {
        scheme,
        authority: authority.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::parse_origin;

    #[test]
    fn origins_are_authorities_with_an_optional_scheme() {
        let o = parse_origin("HTTPS://Admin.Example.com").unwrap();
        assert_eq!(o.scheme.as_deref(), Some("https"));
        assert_eq!(o.authority, "admin.example.com");
        let o = parse_origin("localhost:9901").unwrap();
        assert_eq!((o.scheme, o.authority.as_str()), (None, "localhost:9901"));
        assert_eq!(parse_origin("[::1]:9901").unwrap().authority, "[::1]:9901");
        assert_eq!(parse_origin("http://[::1]").unwrap().authority, "[::1]");
        for bad in [
            "ftp://a:1",
            "http://a:1/path",
            "a:port",
            "a:70000",
            "[::1",
            "[nope]:1",
            "[::1]x",
            "",
            "a b:1",
            "user@a:1",
            "http://",
        ] {
            assert!(parse_origin(bad).is_err(), "{bad}");
        }
    }
}
