//! Who may use the admin API. A browser on the admin's host can reach a loopback listener too:
//! a page on another site can `POST /reload` to it (cross-site request forgery), and a site
//! whose name is made to resolve to 127.0.0.1 can read `GET /config` as its own (DNS
//! rebinding). Browsers always send the name they think they talk to as `Host`, and the page's
//! origin as `Origin` with anything but a plain `GET` or `HEAD`, so:
//!
//! * `Host` (and an absolute target's authority) must be one of the listener's own address forms
//!   or an `admin.origins` entry, on every request;
//! * `Origin`, when present on a request other than `GET` and `HEAD`, must be one of them too;
//! * with `admin.token`, `Authorization: Bearer TOKEN` must carry it.
//!
//! Refusals are counted in `gateway_admin_refused_total{reason}`.

use std::net::SocketAddr;

use gateway_config::{Admin, AdminToken};
use http::{Method, Request, header};
use sha2::{Digest, Sha256};

use crate::telemetry::{Counter, Registry};

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// `Host` (or the target's authority) names something else, or nothing.
    Host,
    /// A state-changing request from a page of another origin.
    Origin,
    /// No bearer token, while one is required.
    NoToken,
    /// A bearer token that is not the configured one.
    WrongToken,
}

impl Refusal {
    /// The counter's `reason` label.
    fn reason(self) -> &'static str {
        match self {
            Self::Host => "host",
            Self::Origin => "origin",
            Self::NoToken | Self::WrongToken => "token",
        }
    }
}

/// The checks of one admin listener: its own address forms (fixed once it is bound) and the
/// refusal counters. The token and `admin.origins` come from the running config, so a reload
/// changes them without rebinding.
pub(super) struct Guard {
    /// `127.0.0.1:PORT`, `localhost:PORT`, `[::1]:PORT` and the bound address, lower-case.
    own: Vec<String>,
    refused_host: Counter,
    refused_origin: Counter,
    refused_token: Counter,
}

impl Guard {
    /// The guard of the listener bound at `local`.
    pub(super) fn new(local: SocketAddr, registry: &Registry) -> Self {
        let port = local.port();
        let mut own = vec![
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("[::1]:{port}"),
        ];
        let bound = local.to_string();
        if !own.contains(&bound) {
            own.push(bound);
        }
        let refused = |reason| {
            registry.counter(
                "gateway_admin_refused_total",
                "Admin API requests refused, by reason (host, origin, token).",
                &[("reason", reason)],
            )
        };
        Self {
            own,
            refused_host: refused("host"),
            refused_origin: refused("origin"),
            refused_token: refused("token"),
        }
    }

    /// Whether `req` may be served under `admin`'s settings; a refusal is counted.
    pub(super) fn check<B>(&self, req: &Request<B>, admin: &Admin) -> Result<(), Refusal> {
        let verdict = self.verdict(req, admin);
        if let Err(refusal) = verdict {
            match refusal {
                Refusal::Host => &self.refused_host,
                Refusal::Origin => &self.refused_origin,
                Refusal::NoToken | Refusal::WrongToken => &self.refused_token,
            }
            .inc();
            tracing::debug!(
                reason = refusal.reason(),
                method = %req.method(),
                path = req.uri().path(),
                "admin request refused"
            );
        }
        verdict
    }

    fn verdict<B>(&self, req: &Request<B>, admin: &Admin) -> Result<(), Refusal> {
        if !self.host_allowed(req, admin) {
            return Err(Refusal::Host);
        }
        let safe = matches!(*req.method(), Method::GET | Method::HEAD);
        if !safe && !self.origin_allowed(req, admin) {
            return Err(Refusal::Origin);
        }
        match &admin.token {
            None => Ok(()),
            Some(token) => match bearer_token(req) {
                None => Err(Refusal::NoToken),
                Some(presented) if same_secret(presented, token) => Ok(()),
                Some(_) => Err(Refusal::WrongToken),
            },
        }
    }

    /// Every authority the request names (the target's, for HTTP/2 and absolute-form; each
    /// `Host`) is allowed, and it names at least one.
    fn host_allowed<B>(&self, req: &Request<B>, admin: &Admin) -> bool {
        let mut named = false;
        if let Some(authority) = req.uri().authority() {
            if !self.allows_authority(authority.as_str(), admin) {
                return false;
            }
            named = true;
        }
        for host in req.headers().get_all(header::HOST) {
            match host.to_str() {
                Ok(host) if self.allows_authority(host, admin) => named = true,
                _ => return false,
            }
        }
        named
    }

    fn allows_authority(&self, authority: &str, admin: &Admin) -> bool {
        self.own.iter().any(|a| a.eq_ignore_ascii_case(authority))
            || admin
                .origins
                .iter()
                .any(|o| o.authority.eq_ignore_ascii_case(authority))
    }

    /// Every `Origin` (there is normally one, or none from a client that is not a browser) is
    /// one of the listener's own forms in any scheme, or an `admin.origins` entry. `null` (an
    /// opaque origin: a sandboxed frame, a `file:` page) is none of them.
    fn origin_allowed<B>(&self, req: &Request<B>, admin: &Admin) -> bool {
        req.headers().get_all(header::ORIGIN).iter().all(|origin| {
            let Some((scheme, authority)) = origin.to_str().ok().and_then(|o| o.split_once("://"))
            else {
                return false;
            };
            self.own.iter().any(|a| a.eq_ignore_ascii_case(authority))
                || admin.origins.iter().any(|o| {
                    o.authority.eq_ignore_ascii_case(authority)
                        && o.scheme
                            .as_deref()
                            .is_none_or(|s| s.eq_ignore_ascii_case(scheme))
                })
        })
    }
}

/// The token of the request's one `Authorization: Bearer TOKEN` field (the scheme's name is
/// case-insensitive); `None` without one, or with several `Authorization` fields.
fn bearer_token<B>(req: &Request<B>) -> Option<&[u8]> {
    let mut fields = req.headers().get_all(header::AUTHORIZATION).iter();
    let value = fields.next()?;
    if fields.next().is_some() {
        return None;
    }
    let value = value.as_bytes();
    let (scheme, rest) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// Compares a presented token with the configured one in time that does not depend on where
/// they differ, nor on the configured token's length: both are hashed, and the digests are
/// compared whole.
fn same_secret(presented: &[u8], token: &AdminToken) -> bool {
    let a = Sha256::digest(presented);
    let b = Sha256::digest(token.as_bytes());
    let difference = a.iter().zip(b.iter()).fold(0u8, |d, (x, y)| d | (x ^ y));
    std::hint::black_box(difference) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admin(yaml: &str) -> Admin {
        let dir = std::path::Path::new(".");
        let config = gateway_config::load_str(yaml, "t.yaml", dir).expect("config");
        config.admin.expect("admin")
    }

    fn guard() -> Guard {
        Guard::new("127.0.0.1:9901".parse().unwrap(), &Registry::new())
    }

    fn request(method: &str, uri: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut b = Request::builder().method(method).uri(uri);
        for (n, v) in headers {
            b = b.header(*n, *v);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn hosts_are_the_listener_own_forms_or_configured() {
        let g = guard();
        let a = admin("admin: { bind: 127.0.0.1:9901, origins: [Admin.Example:8443] }\n");
        for host in [
            "127.0.0.1:9901",
            "LOCALHOST:9901",
            "[::1]:9901",
            "admin.example:8443",
        ] {
            let req = request("GET", "/config", &[("host", host)]);
            assert_eq!(g.check(&req, &a), Ok(()), "{host}");
        }
        for host in [
            "evil.example:9901",
            "localhost",
            "localhost:9902",
            "admin.example",
            "127.0.0.1:9901.evil.example",
        ] {
            let req = request("GET", "/config", &[("host", host)]);
            assert_eq!(g.check(&req, &a), Err(Refusal::Host), "{host}");
        }
        // No host at all, two hosts of which one is foreign, a foreign absolute target.
        assert_eq!(
            g.check(&request("GET", "/config", &[]), &a),
            Err(Refusal::Host)
        );
        let two = [("host", "localhost:9901"), ("host", "evil.example")];
        assert_eq!(
            g.check(&request("GET", "/config", &two), &a),
            Err(Refusal::Host)
        );
        let absolute = request(
            "GET",
            "http://evil.example:9901/config",
            &[("host", "localhost:9901")],
        );
        assert_eq!(g.check(&absolute, &a), Err(Refusal::Host));
    }

    #[test]
    fn origins_are_checked_on_requests_that_change_state() {
        let g = guard();
        let a = admin("admin: { bind: 127.0.0.1:9901, origins: [\"https://ops.example\"] }\n");
        let host = ("host", "127.0.0.1:9901");
        for origin in [
            "http://localhost:9901",
            "http://127.0.0.1:9901",
            "https://ops.example",
        ] {
            let req = request("POST", "/reload", &[host, ("origin", origin)]);
            assert_eq!(g.check(&req, &a), Ok(()), "{origin}");
        }
        for origin in [
            "http://evil.example",
            "null",
            "http://ops.example",
            "https://ops.example:444",
            "http://localhost:9902",
        ] {
            for method in ["POST", "PUT", "DELETE", "PATCH"] {
                let req = request(method, "/reload", &[host, ("origin", origin)]);
                assert_eq!(g.check(&req, &a), Err(Refusal::Origin), "{method} {origin}");
            }
            // A plain read is left to the Host check (a foreign page cannot read the answer).
            let req = request("GET", "/metrics", &[host, ("origin", origin)]);
            assert_eq!(g.check(&req, &a), Ok(()), "{origin}");
        }
        // No Origin: not a browser.
        assert_eq!(g.check(&request("POST", "/reload", &[host]), &a), Ok(()));
    }

    #[test]
    fn tokens_are_bearer_tokens_compared_whole() {
        let g = guard();
        let a = admin("admin: { bind: 127.0.0.1:9901, token: 0123456789abcdef0123 }\n");
        let host = ("host", "127.0.0.1:9901");
        let with = |auth: &str| request("GET", "/config", &[host, ("authorization", auth)]);
        assert_eq!(g.check(&with("Bearer 0123456789abcdef0123"), &a), Ok(()));
        assert_eq!(g.check(&with("bearer  0123456789abcdef0123 "), &a), Ok(()));
        assert_eq!(
            g.check(&request("GET", "/config", &[host]), &a),
            Err(Refusal::NoToken)
        );
        for wrong in [
            "Bearer 0123456789abcdef012",
            "Bearer 0123456789abcdef01234",
            "Bearer x",
            "Basic 0123456789abcdef0123",
            "Bearer",
            "0123456789abcdef0123",
        ] {
            let refusal = g.check(&with(wrong), &a).unwrap_err();
            assert!(
                matches!(refusal, Refusal::NoToken | Refusal::WrongToken),
                "{wrong}"
            );
        }
        let twice = request(
            "GET",
            "/config",
            &[
                host,
                ("authorization", "Bearer 0123456789abcdef0123"),
                ("authorization", "Bearer 0123456789abcdef0123"),
            ],
        );
        assert_eq!(g.check(&twice, &a), Err(Refusal::NoToken));
    }
}
