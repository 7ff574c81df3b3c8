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

/// One `certificates` entry: files that exist, or ACME settings that can work.
fn validate_certificate(
    c: &Checker<'_>,
    name: &str,
    cert: &mut CertificateConfig,
) -> Result<Certificate> {
    let key = format!("certificates.{name}");
    let source = match (&mut cert.cert, &mut cert.key, &mut cert.acme) {
        (Some(file), Some(pem_key), None) => {
            *file = c.path(file);
            *pem_key = c.path(pem_key);
            c.file_exists(&format!("{key}.cert"), file)?;
            c.file_exists(&format!("{key}.key"), pem_key)?;
            CertificateSource::Files {
                cert: file.clone(),
                key: pem_key.clone(),
            }
        }
        (None, None, Some(acme)) => {
            validate_acme(c, &format!("{key}.acme"), acme)?;
            CertificateSource::Acme(acme.clone())
        }
        (_, _, Some(_)) => {
            return c.err(
                format!("{key}.acme"),
                "`acme` replaces `cert` and `key`; give one or the other",
            );
        }
        _ => {
            return c.err(key, "give `cert` and `key` (PEM files), or `acme`");
        }
    };
    Ok(Certificate {
        source,
        ocsp_stapling: cert.ocsp_stapling,
    })
}

fn validate_acme(c: &Checker<'_>, key: &str, acme: &mut AcmeConfig) -> Result<()> {
    if acme.domains.is_empty() {
        return c.err(format!("{key}.domains"), "at least one domain is required");
    }
    for (i, d) in acme.domains.iter_mut().enumerate() {
        let dkey = format!("{key}.domains[{i}]");
        *d = d.trim_end_matches('.').to_ascii_lowercase();
        if d.starts_with("*.") {
            return c.err(
                dkey,
                "wildcard names need the dns-01 challenge, which is not supported",
            );
        }
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        };
        if d.len() > 253 || !d.contains('.') || !d.split('.').all(label_ok) {
            return c.err(dkey, format!("`{d}` is not a DNS name"));
        }
    }
    if !acme.directory.starts_with("https://") {
        return c.err(
            format!("{key}.directory"),
            "must be an https:// URL (the CA's ACME directory)",
        );
    }
    if let Some(email) = &acme.email
        && (!email.contains('@') || email.contains(char::is_whitespace))
    {
        return c.err(
            format!("{key}.email"),
            format!("`{email}` is not an address"),
        );
    }
    acme.storage = c.path(&acme.storage);
    if let Some(ca) = &mut acme.directory_ca {
        *ca = c.path(ca);
        c.file_exists(&format!("{key}.directory_ca"), ca)?;
    }
    if acme.renew_before.is_some_and(|d| d.get().is_zero()) {
        return c.err(format!("{key}.renew_before"), "must be more than 0s");
    }
    Ok(())
}

/// An ACME certificate is only issued if the CA can reach its challenge: TLS-ALPN-01 on a TLS
/// listener serving it, HTTP-01 on a plain HTTP/1 listener.
fn check_acme_reachable(
    c: &Checker<'_>,
    certificates: &IndexMap<String, Certificate>,
    listeners: &[Listener],
) -> Result<()> {
    for (name, cert) in certificates {
        let CertificateSource::Acme(acme) = &cert.source else {
            continue;
        };
        let reachable = match acme.challenge {
            AcmeChallenge::TlsAlpn01 => listeners.iter().any(|l| {
                (l.http1 || l.http2)
                    && l.tls
                        .as_ref()
                        .is_some_and(|t| t.certificates.iter().any(|n| n == name))
            }),
            AcmeChallenge::Http01 => listeners.iter().any(|l| l.http1 && l.tls.is_none()),
        };
        if !reachable {
            let why = match acme.challenge {
                AcmeChallenge::TlsAlpn01 => {
                    "tls-alpn-01 needs a TLS listener (http1 or http2) that lists this certificate"
                }
                AcmeChallenge::Http01 => "http-01 needs a plain (non-TLS) http1 listener",
            };
            return c.err(format!("certificates.{name}.acme.challenge"), why);
        }
    }
    Ok(())
}

/// Browsers' preload lists take only a policy that covers subdomains for at least a year.
fn validate_hsts(c: &Checker<'_>, key: &str, hsts: &HstsConfig) -> Result<()> {
    const YEAR: u64 = 365 * 24 * 3600;
    if hsts.preload && !hsts.include_subdomains {
        return c.err(
            format!("{key}.preload"),
            "preload needs `include_subdomains: true`",
        );
    }
    if hsts.preload && hsts.max_age.get().as_secs() < YEAR {
        return c.err(
            format!("{key}.max_age"),
            "preload needs a max_age of at least 365d",
        );
    }
    Ok(())
}

type Claim<'f> = dyn FnMut(&Checker<'_>, String, SocketAddr, &'static str) -> Result<()> + 'f;

fn validate_listeners(
    c: &Checker<'_>,
    raw: &mut RawConfig,
    claim: &mut Claim<'_>,
) -> Result<Vec<Listener>> {
    let mut names = HashSet::new();
    let mut out = Vec::new();
    for (i, l) in raw.listeners.iter_mut().enumerate() {
        let checked = (|| -> Result<()> {
            let key = format!("listeners[{i}]");
            if !names.insert(l.name.clone()) {
                return c.err(
                    format!("{key}.name"),
                    format!("duplicate listener name `{}`", l.name),
                );
            }
            let addr = c.bind(&format!("{key}.bind"), &l.bind)?;
            if l.protocols.is_empty() {
                return c.err(
                    format!("{key}.protocols"),
                    "at least one protocol is required",
                );
            }
            let has = |p| l.protocols.contains(&p);
            let (http1, http2, http3) = (
                has(HttpProtocol::Http1),
                has(HttpProtocol::Http2),
                has(HttpProtocol::Http3),
            );
            if http3 && l.tls.is_none() {
                return c.err(format!("{key}.protocols"), "http3 requires `tls`");
            }
            if http3 && !(http1 || http2) {
                // Alt-Svc needs a TCP listener to be advertised from; QUIC-only is allowed but rare.
            }
            if let Some(tls) = &mut l.tls {
                if tls.certificates.is_empty() {
                    return c.err(
                        format!("{key}.tls.certificates"),
                        "at least one certificate is required",
                    );
                }
                for (j, name) in tls.certificates.iter().enumerate() {
                    c.reference(
                        &format!("{key}.tls.certificates[{j}]"),
                        "certificate",
                        name,
                        &raw.certificates,
                    )?;
                }
                if let Some(ca) = &mut tls.client_ca {
                    *ca = c.path(ca);
                    c.file_exists(&format!("{key}.tls.client_ca"), ca)?;
                }
                if let Some(hsts) = &tls.hsts {
                    validate_hsts(c, &format!("{key}.tls.hsts"), hsts)?;
                }
            }
            if http1 || http2 {
                claim(c, format!("{key}.bind"), addr, "tcp")?;
            }
            if http3 {
                claim(c, format!("{key}.bind"), addr, "udp")?;
                validate_http3(c, &key, &l.http3)?;
            }
            if l.max_header_size.bytes() < 1024 {
                return c.err(format!("{key}.max_header_size"), "must be at least 1KiB");
            }
            let mut trusted_proxies = Vec::with_capacity(l.trusted_proxies.len());
            for (j, net) in l.trusted_proxies.iter().enumerate() {
                trusted_proxies.push(network(c, &format!("{key}.trusted_proxies[{j}]"), net)?);
            }
            out.push(Listener {
                name: l.name.clone(),
                addr,
                http1,
                http2,
                http3,
                tls: l.tls.clone(),
                trusted_proxies,
                settings: l.clone(),
            });
            Ok(())
        })();
        c.keep(checked);
    }
    Ok(out)
}

/// A CIDR (`10.0.0.0/8`, `2001:db8::/32`) or a bare address (its /32 or /128).
fn network(c: &Checker<'_>, key: &str, text: &str) -> Result<ipnet::IpNet> {
    let text = text.trim();
    if let Ok(net) = text.parse::<ipnet::IpNet>() {
        return Ok(net.trunc());
    }
    match text.parse::<std::net::IpAddr>() {
        Ok(ip) => Ok(ipnet::IpNet::from(ip)),
        Err(_) => c.err(
            key,
            format!("`{text}` is not an address or a CIDR (e.g. 10.0.0.0/8, 192.0.2.7, ::1)"),
        ),
    }
}

/// QUIC limits: quinn takes windows as 62-bit varints and needs at least one request stream.
fn validate_http3(c: &Checker<'_>, key: &str, h3: &Http3Settings) -> Result<()> {
    if h3.max_concurrent_streams == 0 {
        return c.err(
            format!("{key}.http3.max_concurrent_streams"),
            "must be at least 1",
        );
    }
    for (name, size) in [
        ("stream_receive_window", h3.stream_receive_window),
        ("connection_receive_window", h3.connection_receive_window),
    ] {
        if !(1024..=(1u64 << 62) - 1).contains(&size.bytes()) {
            return c.err(
                format!("{key}.http3.{name}"),
                "must be between 1KiB and 2^62-1 bytes",
            );
        }
    }
    if h3.idle_timeout.is_some_and(|t| t.get().is_zero()) {
        return c.err(format!("{key}.http3.idle_timeout"), "must be above 0");
    }
    Ok(())
}

/// A target's host and port, and its address when the host is an IP address. A name is only
/// checked for its shape here; the gateway resolves it when it loads the config.
fn parse_target(
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

fn validate_upstreams(c: &Checker<'_>, raw: &mut RawConfig) -> Result<IndexMap<String, Upstream>> {
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

mod admin;
mod cluster;
mod http_filters;
mod jwt;
mod proxy;
mod rewrite;

use proxy::validate_backends;
pub use rewrite::is_origin_path;

fn validate_plugins(c: &Checker<'_>, raw: &mut RawConfig) -> Result<IndexMap<String, Plugin>> {
    let mut out = IndexMap::new();
    for (name, p) in raw.plugins.iter_mut() {
        let checked = (|| -> Result<()> {
            let key = format!("plugins.{name}");
            p.wasm = c.path(&p.wasm);
            c.file_exists(&format!("{key}.wasm"), &p.wasm)?;
            let json = |v: &Option<serde_yaml::Value>, field: &str| -> Result<Vec<u8>> {
                match v {
                    None => Ok(Vec::new()),
                    Some(v) => serde_json::to_vec(v).or_else(|e| {
                        c.err(
                            format!("{key}.{field}"),
                            format!("cannot be expressed as JSON: {e}"),
                        )
                    }),
                }
            };
            out.insert(
                name.clone(),
                Plugin {
                    name: name.clone(),
                    wasm: p.wasm.clone(),
                    config_json: json(&p.config, "config")?,
                    vm_config_json: json(&p.vm_config, "vm_config")?,
                    limits: p.limits.clone(),
                },
            );
            Ok(())
        })();
        c.keep(checked);
    }
    Ok(out)
}

fn validate_waf(c: &Checker<'_>, raw: &RawConfig) -> Result<IndexMap<String, WafPolicy>> {
    let mut out = IndexMap::new();
    for (name, w) in &raw.waf {
        let checked = (|| -> Result<()> {
            let key = format!("waf.{name}");
            let mut ids = HashSet::new();
            let mut rules = Vec::new();
            for (i, r) in w.rules.iter().enumerate() {
                let rkey = format!("{key}.rules[{i}]");
                if !ids.insert(r.id) {
                    return c.err(format!("{rkey}.id"), format!("duplicate rule id {}", r.id));
                }
                let target = match r.location.as_str() {
                    "method" => WafTarget::Method,
                    "path" => WafTarget::Path,
                    "query" => WafTarget::Query,
                    "body" => WafTarget::Body,
                    "client_ip" => WafTarget::ClientIp,
                    other => match other.split_once(':') {
                        Some(("arg", n)) if !n.is_empty() => WafTarget::Arg(n.to_owned()),
                        Some(("header", n)) if valid_header_name(n) => {
                            WafTarget::Header(n.to_ascii_lowercase())
                        }
                        Some(("cookie", n)) if !n.is_empty() => WafTarget::Cookie(n.to_owned()),
                        _ => {
                            return c.err(
                                format!("{rkey}.where"),
                                format!("`{other}` is not one of method, path, query, arg:NAME, header:NAME, cookie:NAME, body, client_ip"),
                            );
                        }
                    },
                };
                if let Err(e) = regex::Regex::new(&r.pattern) {
                    return c.err(
                        format!("{rkey}.match"),
                        format!("invalid regular expression: {e}"),
                    );
                }
                rules.push(WafRule {
                    id: r.id,
                    target,
                    pattern: r.pattern.clone(),
                    action: r.action,
                });
            }
            out.insert(
                name.clone(),
                WafPolicy {
                    name: name.clone(),
                    rules,
                    settings: w.clone(),
                },
            );
            Ok(())
        })();
        c.keep(checked);
    }
    Ok(out)
}

/// RFC 9110 token characters.
/// A `basic_auth` filter: a realm that fits a quoted string, a valid user header, an htpasswd
/// file that exists (its entries are checked when the filter is built).
fn validate_basic_auth(c: &Checker<'_>, key: &str, b: &BasicAuthConfig) -> Result<BasicAuthConfig> {
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
fn validate_forward_auth(
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
fn url_service(
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

fn validate_routes(
    c: &Checker<'_>,
    raw: &mut RawConfig,
    listeners: &[Listener],
    upstreams: &IndexMap<String, Upstream>,
    plugins: &IndexMap<String, Plugin>,
    waf: &IndexMap<String, WafPolicy>,
) -> Result<Vec<Route>> {
    let mut out = Vec::new();
    let mut names = HashSet::new();
    let listener_index: IndexMap<String, usize> = listeners
        .iter()
        .enumerate()
        .map(|(i, l)| (l.name.clone(), i))
        .collect();
    let raw_caches = raw.caches.clone();
    for (i, r) in raw.routes.iter_mut().enumerate() {
        let checked = (|| -> Result<()> {
            let key = format!("routes[{i}]");
            let name = r.name.clone().unwrap_or_else(|| format!("route-{i}"));
            if !names.insert(name.clone()) {
                return c.err(
                    format!("{key}.name"),
                    format!("duplicate route name `{name}`"),
                );
            }
            let route_listeners = match &r.listeners {
                None => (0..listeners.len()).collect(),
                Some(names) => {
                    let mut v = Vec::new();
                    for (j, n) in names.iter().enumerate() {
                        c.reference(
                            &format!("{key}.listeners[{j}]"),
                            "listener",
                            n,
                            &listener_index,
                        )?;
                        v.push(listener_index[n]);
                    }
                    v
                }
            };
            let m = &r.matcher;
            let host = match &m.host {
                None => HostMatch::Any,
                Some(h) if h.starts_with("*.") && h.len() > 2 => {
                    HostMatch::Suffix(h[1..].to_ascii_lowercase())
                }
                Some(h) if h.contains('*') => {
                    return c.err(
                        format!("{key}.match.host"),
                        "a wildcard is only allowed as a leading `*.`",
                    );
                }
                Some(h) => HostMatch::Exact(h.to_ascii_lowercase()),
            };
            let path_conditions = [
                m.path.is_some(),
                m.path_prefix.is_some(),
                m.path_regex.is_some(),
            ];
            if path_conditions.iter().filter(|x| **x).count() > 1 {
                return c.err(
                    format!("{key}.match"),
                    "use only one of `path`, `path_prefix`, `path_regex`",
                );
            }
            let path = if let Some(p) = &m.path {
                if !p.starts_with('/') {
                    return c.err(format!("{key}.match.path"), "must start with /");
                }
                PathMatch::Exact(p.clone())
            } else if let Some(p) = &m.path_prefix {
                if !p.starts_with('/') {
                    return c.err(format!("{key}.match.path_prefix"), "must start with /");
                }
                if p == "/" {
                    PathMatch::Any
                } else {
                    PathMatch::Prefix(p.clone())
                }
            } else if let Some(p) = &m.path_regex {
                match regex::Regex::new(p) {
                    Ok(re) => PathMatch::Regex(re),
                    Err(e) => {
                        return c.err(
                            format!("{key}.match.path_regex"),
                            format!("invalid regular expression: {e}"),
                        );
                    }
                }
            } else {
                PathMatch::Any
            };
            let mut methods = Vec::new();
            for (j, meth) in m.methods.iter().flatten().enumerate() {
                if !valid_header_name(meth) {
                    return c.err(
                        format!("{key}.match.methods[{j}]"),
                        format!("`{meth}` is not a method"),
                    );
                }
                methods.push(meth.to_ascii_uppercase());
            }
            check_headers(
                c,
                &format!("{key}.match.headers"),
                m.headers.iter().map(|(k, v)| (k, Some(v))),
            )?;
            let headers = m
                .headers
                .iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
                .collect();
            let query = m
                .query
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let hkey = format!("{key}.match.header_regex");
            check_headers(c, &hkey, m.header_regex.keys().map(|k| (k, None)))?;
            let header_regex = m
                .header_regex
                .iter()
                .map(|(k, re)| Ok((k.to_ascii_lowercase(), compile_regex(c, &hkey, k, re)?)))
                .collect::<Result<_>>()?;
            let qkey = format!("{key}.match.query_regex");
            let query_regex = m
                .query_regex
                .iter()
                .map(|(k, re)| Ok((k.clone(), compile_regex(c, &qkey, k, re)?)))
                .collect::<Result<_>>()?;

            let mut filters = Vec::new();
            for (j, f) in r.filters.iter().enumerate() {
                let fkey = format!("{key}.filters[{j}]");
                filters.push(match f {
                    FilterConfig::Waf(name) => {
                        c.reference(&format!("{fkey}.waf"), "WAF policy", name, waf)?;
                        Filter::Waf(name.clone())
                    }
                    FilterConfig::Plugin(name) => {
                        c.reference(&format!("{fkey}.plugin"), "plugin", name, plugins)?;
                        Filter::Plugin(name.clone())
                    }
                    FilterConfig::RateLimit(rl) => {
                        if rl.requests == 0 || rl.per.get().is_zero() {
                            return c.err(
                                format!("{fkey}.rate_limit"),
                                "`requests` and `per` must be greater than 0",
                            );
                        }
                        let key = match rl.key.as_str() {
                            "client_ip" => RateLimitKey::ClientIp,
                            other => match other.split_once(':') {
                                Some(("header", n)) if valid_header_name(n) => {
                                    RateLimitKey::Header(n.to_ascii_lowercase())
                                }
                                _ => {
                                    return c.err(
                                        format!("{fkey}.rate_limit.key"),
                                        format!("`{other}` is not client_ip or header:NAME"),
                                    );
                                }
                            },
                        };
                        Filter::RateLimit {
                            settings: rl.clone(),
                            key,
                        }
                    }
                    FilterConfig::Headers(h) => {
                        let hkey = format!("{fkey}.headers");
                        check_headers(
                            c,
                            &format!("{hkey}.request_set"),
                            h.request_set.iter().map(|(k, v)| (k, Some(v))),
                        )?;
                        check_headers(
                            c,
                            &format!("{hkey}.request_add"),
                            h.request_add.iter().map(|(k, v)| (k, Some(v))),
                        )?;
                        check_headers(
                            c,
                            &format!("{hkey}.response_set"),
                            h.response_set.iter().map(|(k, v)| (k, Some(v))),
                        )?;
                        check_headers(
                            c,
                            &format!("{hkey}.response_add"),
                            h.response_add.iter().map(|(k, v)| (k, Some(v))),
                        )?;
                        check_headers(
                            c,
                            &format!("{hkey}.request_remove"),
                            h.request_remove.iter().map(|k| (k, None)),
                        )?;
                        check_headers(
                            c,
                            &format!("{hkey}.response_remove"),
                            h.response_remove.iter().map(|k| (k, None)),
                        )?;
                        Filter::Headers(h.clone())
                    }
                    FilterConfig::Cors(cors) => {
                        http_filters::cors(c, &format!("{fkey}.cors"), cors)?;
                        Filter::Cors(cors.clone())
                    }
                    FilterConfig::Compress(cfg) => {
                        http_filters::compress(c, &format!("{fkey}.compress"), cfg)?;
                        Filter::Compress(cfg.clone())
                    }
                    FilterConfig::Cache(cfg) => Filter::Cache(http_filters::cache(
                        c,
                        &format!("{fkey}.cache"),
                        cfg,
                        &raw_caches,
                    )?),
                    FilterConfig::Jwt(j) => {
                        Filter::Jwt(jwt::validate(c, &format!("{fkey}.jwt"), j, &name)?)
                    }
                    FilterConfig::BasicAuth(b) => {
                        Filter::BasicAuth(validate_basic_auth(c, &format!("{fkey}.basic_auth"), b)?)
                    }
                    FilterConfig::ForwardAuth(f) => Filter::ForwardAuth(validate_forward_auth(
                        c,
                        &format!("{fkey}.forward_auth"),
                        f,
                        upstreams,
                    )?),
                    FilterConfig::Rewrite(rw) => Filter::Rewrite(rewrite::rewrite(
                        c,
                        &format!("{fkey}.rewrite"),
                        rw,
                        m.path_prefix.as_deref(),
                    )?),
                });
            }

            let terminals = [
                r.proxy.is_some(),
                r.respond.is_some(),
                r.static_files.is_some(),
                r.redirect.is_some(),
            ];
            let action = match terminals.iter().filter(|x| **x).count() {
                0 => {
                    return c.err(
                        &key,
                        "a route needs one of `proxy`, `respond`, `static` or `redirect`",
                    );
                }
                1 => {
                    if let Some(rd) = &r.redirect {
                        RouteAction::Redirect(rewrite::redirect(
                            c,
                            &format!("{key}.redirect"),
                            rd,
                            r.matcher.path_prefix.as_deref(),
                        )?)
                    } else if let Some(p) = r.proxy.as_mut() {
                        validate_backends(c, &format!("{key}.proxy"), p, upstreams)?;
                        if let Some(sp) = &p.strip_prefix
                            && !sp.starts_with('/')
                        {
                            return c.err(format!("{key}.proxy.strip_prefix"), "must start with /");
                        }
                        for (j, protocol) in p.upgrades.iter_mut().enumerate() {
                            if !valid_upgrade_protocol(protocol) {
                                return c.err(
                                    format!("{key}.proxy.upgrades[{j}]"),
                                    format!(
                                        "`{protocol}` is not an Upgrade protocol (`name` or \
                                         `name/version`, e.g. `websocket`)"
                                    ),
                                );
                            }
                            protocol.make_ascii_lowercase();
                        }
                        RouteAction::Proxy(p.clone())
                    } else if let Some(resp) = &r.respond {
                        if !(100..=999).contains(&resp.status) {
                            return c.err(
                                format!("{key}.respond.status"),
                                "must be between 100 and 999",
                            );
                        }
                        check_headers(
                            c,
                            &format!("{key}.respond.headers"),
                            resp.headers.iter().map(|(k, v)| (k, Some(v))),
                        )?;
                        RouteAction::Respond(resp.clone())
                    } else {
                        let s = r.static_files.as_mut().expect("counted above");
                        s.root = c.path(&s.root);
                        if !s.root.is_dir() {
                            return c.err(
                                format!("{key}.static.root"),
                                format!("directory `{}` does not exist", c.shown(&s.root)),
                            );
                        }
                        for (j, idx) in s.index.iter().enumerate() {
                            if idx.is_empty()
                                || idx.contains('/')
                                || idx.contains('\\')
                                || idx == ".."
                            {
                                return c.err(
                                    format!("{key}.static.index[{j}]"),
                                    "must be a plain file name",
                                );
                            }
                        }
                        RouteAction::Static(s.clone())
                    }
                }
                _ => {
                    return c.err(
                        &key,
                        "a route has exactly one of `proxy`, `respond`, `static` or `redirect`",
                    );
                }
            };
            out.push(Route {
                name,
                listeners: route_listeners,
                host,
                path,
                methods,
                headers,
                query,
                header_regex,
                query_regex,
                filters,
                action,
            });
            Ok(())
        })();
        c.keep(checked);
    }
    Ok(out)
}

fn validate_streams(
    c: &Checker<'_>,
    raw: &RawConfig,
    upstreams: &IndexMap<String, Upstream>,
    plugins: &IndexMap<String, Plugin>,
    claim: &mut Claim<'_>,
) -> Result<Vec<Stream>> {
    let mut out = Vec::new();
    let mut names = HashSet::new();
    for (i, s) in raw.streams.iter().enumerate() {
        let checked = (|| -> Result<()> {
            let key = format!("streams[{i}]");
            if !names.insert(s.name.clone()) {
                return c.err(
                    format!("{key}.name"),
                    format!("duplicate stream name `{}`", s.name),
                );
            }
            let addr = c.bind(&format!("{key}.bind"), &s.bind)?;
            let transport = match s.protocol {
                StreamProtocol::Tcp => "tcp",
                StreamProtocol::Udp => "udp",
            };
            claim(c, format!("{key}.bind"), addr, transport)?;
            if let Some(u) = &s.upstream {
                c.reference(&format!("{key}.upstream"), "upstream", u, upstreams)?;
            }
            if s.protocol == StreamProtocol::Udp && !s.sni_routes.is_empty() {
                return c.err(
                    format!("{key}.sni_routes"),
                    "SNI routing needs protocol: tcp",
                );
            }
            if s.protocol == StreamProtocol::Udp && s.proxy_protocol != ProxyProtocolVersion::None {
                return c.err(
                    format!("{key}.proxy_protocol"),
                    "the PROXY protocol needs protocol: tcp",
                );
            }
            if s.protocol == StreamProtocol::Udp && s.accept_proxy_protocol {
                return c.err(
                    format!("{key}.accept_proxy_protocol"),
                    "the PROXY protocol needs protocol: tcp",
                );
            }
            for (host, u) in &s.sni_routes {
                if host.contains('*')
                    && !(host.starts_with("*.") && host.len() > 2 && !host[1..].contains('*'))
                {
                    return c.err(
                        format!("{key}.sni_routes.{host}"),
                        "a wildcard is only allowed as a leading `*.`",
                    );
                }
                c.reference(
                    &format!("{key}.sni_routes.{host}"),
                    "upstream",
                    u,
                    upstreams,
                )?;
            }
            if s.upstream.is_none() && s.sni_routes.is_empty() {
                return c.err(&key, "a stream needs `upstream` or `sni_routes`");
            }
            for (j, f) in s.filters.iter().enumerate() {
                let fkey = format!("{key}.filters[{j}]");
                match f {
                    StreamFilterConfig::Plugin(name) => {
                        c.reference(&format!("{fkey}.plugin"), "plugin", name, plugins)?
                    }
                    StreamFilterConfig::ConnectionRate(r)
                        if r.connections == 0 || r.per.get().is_zero() =>
                    {
                        return c.err(
                            format!("{fkey}.connection_rate"),
                            "`connections` and `per` must be greater than 0",
                        );
                    }
                    _ => {}
                }
            }
            out.push(Stream {
                name: s.name.clone(),
                addr,
                filters: s.filters.clone(),
                settings: s.clone(),
            });
            Ok(())
        })();
        c.keep(checked);
    }
    Ok(out)
}
