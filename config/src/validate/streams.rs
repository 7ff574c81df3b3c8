//! `streams:`: L4 relays, their SNI routes, filters and PROXY protocol.

use super::*;

pub(super) fn validate_streams(
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
