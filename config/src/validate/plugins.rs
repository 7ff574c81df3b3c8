//! `plugins:` (modules, limits, shared data) and `waf:` policies.

use super::*;

pub(super) fn validate_plugins(
    c: &Checker<'_>,
    raw: &mut RawConfig,
) -> Result<IndexMap<String, Plugin>> {
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

pub(super) fn validate_waf(
    c: &Checker<'_>,
    raw: &RawConfig,
) -> Result<IndexMap<String, WafPolicy>> {
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
