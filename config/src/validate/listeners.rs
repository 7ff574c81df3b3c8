//! `listeners:`: binds, protocols, trusted networks and HTTP/3 settings.

use super::*;

pub(super) fn validate_listeners(
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
pub(super) fn network(c: &Checker<'_>, key: &str, text: &str) -> Result<ipnet::IpNet> {
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
pub(super) fn validate_http3(c: &Checker<'_>, key: &str, h3: &Http3Settings) -> Result<()> {
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
