//! `routes:`: matches, filters and terminals, each checked against the sections it names.

use super::*;

pub(super) fn validate_routes(
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
