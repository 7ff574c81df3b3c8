//! A proxy route's terminal as configured: one upstream ([`Terminal::Proxy`]), or a `split`
//! across several by weight ([`Terminal::Split`]), each with the route's `mirror`, `timeout`
//! and `retries`. A split entry may answer a `status` instead of naming an upstream: that
//! share of the requests gets the error answer at once (fault injection, and the Gateway
//! API's 500 for the share of backends that do not resolve).
//!
//! A split picks per request from an order computed at load: the smooth weighted round robin's
//! sequence over the weights divided by their greatest common divisor (`90/10` is a cycle of
//! ten picks, the minority spread through it rather than bunched), walked with one atomic
//! counter. Weights whose cycle would be longer than [`MAX_CYCLE`] are drawn at random by
//! weight instead, from precomputed cumulative weights. Entries of weight 0 get nothing (a
//! blue-green standby). Each pick is counted (`gateway_split_requests_total`), and the
//! answer carries the upstream's name ([`ServedBy`]) for the access log.

use std::future::{Future, Ready, ready};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use futures_util::future::Either;
use gateway_config::Config;
use gateway_config::model::ProxyConfig;
use http::{Request, Response, StatusCode};

use super::mirror::Mirror;
use super::{ProxyRoute, Upstreams};
use crate::body::Body;
use crate::context::RequestCx;
use crate::error::{GatewayError, error_response};
use crate::telemetry::{Counter, Registry};
use crate::terminal::Terminal;

/// The longest precomputed cycle of picks; longer ones are drawn at random.
const MAX_CYCLE: u64 = 10_000;

/// The upstream that answered a split route's request, on its response (for the access log).
#[derive(Clone, Debug)]
pub struct ServedBy(pub Arc<str>);

/// Builds the terminal of route `route_name` (config key `key`) for proxy settings `p`.
pub fn terminal(
    config: &Config,
    key: &str,
    route_name: &str,
    p: &ProxyConfig,
    upstreams: &Upstreams,
    registry: &Registry,
) -> Result<Terminal, GatewayError> {
    let upstream = |k: String, name: &str| {
        upstreams
            .get(name)
            .cloned()
            .ok_or_else(|| config.error(k, "no such upstream"))
    };
    let mirror = match &p.mirror {
        None => None,
        Some(m) => {
            let shadow_up = upstream(format!("{key}.mirror.upstream"), &m.upstream)?;
            // The copy's path was rewritten already; the shadow upstream's own timeout.
            let mut shadow = ProxyConfig::to_upstream(&m.upstream);
            shadow.preserve_host = p.preserve_host;
            shadow.upgrades = Vec::new();
            let shadow = ProxyRoute::new(&shadow, shadow_up);
            Some(Arc::new(Mirror::new(route_name, m, shadow, registry)))
        }
    };
    if let Some(name) = &p.upstream {
        let up = upstream(format!("{key}.upstream"), name)?;
        let route = ProxyRoute::new(p, up).mirrored(mirror);
        return Ok(Terminal::Proxy(Arc::new(route)));
    }
    let mut choices = Vec::with_capacity(p.split.len());
    let mut weights = Vec::with_capacity(p.split.len());
    for (i, s) in p.split.iter().enumerate() {
        if s.weight == 0 {
            continue;
        }
        let (to, label) = match (&s.upstream, s.status) {
            (Some(name), _) => {
                let up = upstream(format!("{key}.split[{i}].upstream"), name)?;
                let route = ProxyRoute::new(p, up).mirrored(mirror.clone());
                (Destination::Upstream(Arc::new(route)), name.clone())
            }
            (None, status) => {
                let status = status
                    .and_then(|s| StatusCode::from_u16(s).ok())
                    .ok_or_else(|| config.error(format!("{key}.split[{i}]"), "no status"))?;
                // The counter's `upstream` label names the answer instead.
                (
                    Destination::Status(status),
                    format!("status {}", status.as_u16()),
                )
            }
        };
        choices.push(Choice {
            to,
            picked: registry.counter(
                "gateway_split_requests_total",
                "Requests a split route sent to each of its upstreams.",
                &[("route", route_name), ("upstream", &label)],
            ),
        });
        weights.push(s.weight);
    }
    if choices.is_empty() {
        return Err(config
            .error(
                format!("{key}.split"),
                "at least one weight must be above 0",
            )
            .into());
    }
    // Decided here, not per request: no mirror, no `status` entry, and only upstreams
    // [`ProxyRoute::rewrite_text`] takes.
    let as_text = mirror.is_none()
        && choices.iter().all(|c| match &c.to {
            Destination::Upstream(route) => route.upstream.forwards_as_text(),
            Destination::Status(_) => false,
        });
    Ok(Terminal::Split(Arc::new(Split {
        picker: Picker::new(&weights),
        choices: choices.into(),
        as_text,
    })))
}

/// A route split across upstreams by weight.
pub struct Split {
    choices: Box<[Choice]>,
    picker: Picker,
    /// Every request can be forwarded as text ([`Split::forwards_as_text`]).
    as_text: bool,
}

struct Choice {
    to: Destination,
    picked: Counter,
}

/// Where a pick sends the request.
enum Destination {
    /// Forwarded to this upstream.
    Upstream(Arc<ProxyRoute>),
    /// Answered with this status here.
    Status(StatusCode),
}

impl Split {
    /// The entry picked for the next request (counted).
    fn pick(&self) -> &Destination {
        let choice = &self.choices[self.picker.pick()];
        choice.picked.inc();
        &choice.to
    }

    /// The upstream picked for the next request, for the fast path, which takes a split only
    /// when [`Split::forwards_as_text`]: every entry is then an upstream.
    pub fn pick_upstream(&self) -> Option<&Arc<ProxyRoute>> {
        match self.pick() {
            Destination::Upstream(route) => Some(route),
            Destination::Status(_) => None,
        }
    }

    /// Whether the fast path can forward every request of the route as text (no mirror, no
    /// `status` entry, and only upstreams [`ProxyRoute::rewrite_text`] takes).
    pub fn forwards_as_text(&self) -> bool {
        self.as_text
    }

    /// Forwards one request to the upstream picked for it, the answer naming that upstream;
    /// or answers the status picked.
    pub fn forward(
        &self,
        req: Request<Body>,
        cx: &RequestCx,
    ) -> Either<Ready<Response<Body>>, impl Future<Output = Response<Body>> + Send + 'static> {
        let route = match self.pick() {
            Destination::Upstream(route) => route,
            Destination::Status(status) => {
                return Either::Left(ready(error_response(*status)));
            }
        };
        let served = ServedBy(route.upstream_name().clone());
        let fut = route.forward(req, cx);
        Either::Right(async move {
            let mut res = fut.await;
            res.extensions_mut().insert(served);
            res
        })
    }
}

/// How a split picks.
enum Picker {
    /// The cycle of picks, walked by a counter.
    Cycle {
        order: Box<[u32]>,
        next: AtomicUsize,
    },
    /// A draw below the total weight, looked up in the cumulative weights.
    Random { cumulative: Box<[u64]> },
}

impl Picker {
    fn new(weights: &[u32]) -> Self {
        let divisor = weights.iter().copied().fold(0, gcd).max(1);
        let reduced: Vec<u64> = weights.iter().map(|w| u64::from(w / divisor)).collect();
        let total: u64 = reduced.iter().sum();
        if total > MAX_CYCLE {
            let cumulative = weights
                .iter()
                .scan(0u64, |sum, w| {
                    *sum += u64::from(*w);
                    Some(*sum)
                })
                .collect();
            return Self::Random { cumulative };
        }
        Self::Cycle {
            order: smooth_order(&reduced).into(),
            next: AtomicUsize::new(0),
        }
    }

    fn pick(&self) -> usize {
        match self {
            Self::Cycle { order, next } => order[next.fetch_add(1, Relaxed) % order.len()] as usize,
            Self::Random { cumulative } => {
                let total = cumulative.last().copied().unwrap_or(1);
                let draw = rand::random_range(0..total);
                cumulative.partition_point(|c| *c <= draw)
            }
        }
    }
}

/// The smooth weighted round robin's picks over one cycle (`sum(weights)` picks): each round
/// every entry gains its weight and the richest, paying the total, is picked.
fn smooth_order(weights: &[u64]) -> Vec<u32> {
    let total: u64 = weights.iter().sum();
    let mut credit = vec![0i64; weights.len()];
    let mut order = Vec::with_capacity(total as usize);
    for _ in 0..total {
        let mut best = 0;
        for (i, w) in weights.iter().enumerate() {
            credit[i] += *w as i64;
            if credit[i] > credit[best] {
                best = i;
            }
        }
        credit[best] -= total as i64;
        order.push(best as u32);
    }
    order
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(picker: &Picker, entries: usize, n: usize) -> Vec<usize> {
        let mut c = vec![0; entries];
        for _ in 0..n {
            c[picker.pick()] += 1;
        }
        c
    }

    #[test]
    fn a_cycle_gives_each_entry_exactly_its_share() {
        let p = Picker::new(&[90, 10]);
        assert!(matches!(&p, Picker::Cycle { order, .. } if order.len() == 10));
        assert_eq!(counts(&p, 2, 1000), [900, 100]);
        let p = Picker::new(&[3, 2, 1]);
        assert_eq!(counts(&p, 3, 600), [300, 200, 100]);
    }

    #[test]
    fn the_minority_is_spread_through_the_cycle_not_bunched() {
        let order = smooth_order(&[4, 1]);
        assert_eq!(order.len(), 5);
        assert_eq!(order.iter().filter(|i| **i == 1).count(), 1);
        let order = smooth_order(&[1, 1]);
        assert_eq!(order, [0, 1]);
        // Five picks of the second entry in ten, never two in a row.
        let order = smooth_order(&[5, 5]);
        assert!(order.windows(2).all(|w| w[0] != w[1]), "{order:?}");
    }

    #[test]
    fn weights_with_a_long_cycle_are_drawn_by_weight() {
        let p = Picker::new(&[9_999, 2]);
        assert!(matches!(p, Picker::Random { .. }));
        let c = counts(&p, 2, 20_000);
        assert_eq!(c[0] + c[1], 20_000);
        // The second entry's expected count is about 4; far more would be a broken lookup.
        assert!(c[1] < 100, "{c:?}");
        let p = Picker::new(&[50_000, 50_001]);
        let c = counts(&p, 2, 10_000);
        assert!(c[0] > 4_000 && c[1] > 4_000, "{c:?}");
    }
}
