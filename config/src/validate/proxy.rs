//! `routes[].proxy`'s backends: exactly one of `upstream` and `split` (weights that send the
//! requests somewhere; each entry an upstream or a status), a `mirror` that is neither the
//! route's own upstream nor an idle copy, and route-level `timeout`/`retries`, which take the
//! upstream's rules.

use indexmap::IndexMap;

use super::{Checker, Result};
use crate::model::ProxyConfig;
use crate::runtime::Upstream;

/// Checks the upstreams `p` names (under `key`, `routes[N].proxy`).
pub(super) fn validate_backends(
    c: &Checker<'_>,
    key: &str,
    p: &ProxyConfig,
    upstreams: &IndexMap<String, Upstream>,
) -> Result<()> {
    match (&p.upstream, p.split.is_empty()) {
        (Some(u), true) => c.reference(&format!("{key}.upstream"), "upstream", u, upstreams)?,
        (None, false) => {
            for (i, s) in p.split.iter().enumerate() {
                let skey = format!("{key}.split[{i}]");
                match (&s.upstream, s.status) {
                    (Some(u), None) => {
                        c.reference(&format!("{skey}.upstream"), "upstream", u, upstreams)?;
                        if p.split[..i].iter().any(|o| o.upstream.as_ref() == Some(u)) {
                            return c.err(
                                format!("{skey}.upstream"),
                                format!("`{u}` is already in the split"),
                            );
                        }
                    }
                    (None, Some(status)) => {
                        if !(400..=599).contains(&status) {
                            return c.err(
                                format!("{skey}.status"),
                                "must be an error status, 400 to 599",
                            );
                        }
                    }
                    (Some(_), Some(_)) => {
                        return c.err(skey, "`upstream` and `status` exclude each other: set one");
                    }
                    (None, None) => {
                        return c.err(skey, "a split entry needs `upstream` or `status`");
                    }
                }
            }
            if p.split.iter().all(|s| s.weight == 0) {
                return c.err(
                    format!("{key}.split"),
                    "at least one weight must be above 0",
                );
            }
        }
        (Some(_), false) => {
            return c.err(
                format!("{key}.split"),
                "`upstream` and `split` exclude each other: set one",
            );
        }
        (None, true) => {
            return c.err(key, "a proxy needs `upstream` or `split`");
        }
    }
    if let Some(m) = &p.mirror {
        let mkey = format!("{key}.mirror");
        c.reference(
            &format!("{mkey}.upstream"),
            "upstream",
            &m.upstream,
            upstreams,
        )?;
        if !(0.0..=100.0).contains(&m.percent) {
            return c.err(format!("{mkey}.percent"), "must be between 0 and 100");
        }
        if m.max_in_flight == 0 {
            return c.err(format!("{mkey}.max_in_flight"), "must be at least 1");
        }
        if p.backends().iter().any(|(u, _)| *u == m.upstream) {
            return c.err(
                format!("{mkey}.upstream"),
                format!(
                    "`{}` already serves this route: a mirror is another upstream",
                    m.upstream
                ),
            );
        }
    }
    Ok(())
}
