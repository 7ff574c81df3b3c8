//! What an attempt's outcome says: about its target (passive health) and about the request
//! (whether another target is tried). The one rule for both the general path
//! ([`super::ProxyRoute::forward`]) and the HTTP/1.1 fast path
//! ([`super::ProxyRoute::forward_text`]), whose loops over the targets are [`Tries`]'s.
//!
//! A target's failure is what says something about the target as a whole: a connection refused,
//! reset or not made in time, an answer that is broken or cut off, an answer not received within
//! the upstream's `timeout`. A status the target answers with counts only when the upstream lists
//! it in `health_check.passive.statuses` (none by default): a status answers one request, whose
//! URL the client chose, and a backend's deliberate `503` for one path must not let a client take
//! the target out for every route. Whatever is the client's doing (its request body failing, or
//! stalling past the listener's `body_read_timeout`) never counts.
//!
//! Another target is tried, while retries are left and the request can be sent again, after a
//! failure of the target's and after a `502`, `503` or `504`. When no target is left, the request
//! ends with the last attempt's outcome: its answer is relayed, or its error answered.
//!
//! A response body that breaks or stalls after its head is reported by [`super::body`], which
//! is the same for both paths.

use std::sync::atomic::Ordering;

use http::StatusCode;

use stream_proxy::upstream::Selection;

use super::upstream::Upstream;
use crate::error::GatewayError;

/// The statuses that count as a target's failure: a bit per status from 500 to 599, built once
/// when the config loads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CountedStatuses(u128);

impl CountedStatuses {
    /// The set of `statuses`; anything outside 500–599 (refused when the config is validated)
    /// is left out.
    pub(crate) fn new(statuses: &[u16]) -> Self {
        Self(
            statuses
                .iter()
                .filter_map(|s| s.checked_sub(500).filter(|bit| *bit < 100))
                .fold(0, |set, bit| set | 1 << bit),
        )
    }

    /// Whether an answer with `status` counts.
    pub(crate) fn contains(self, status: StatusCode) -> bool {
        let bit = status.as_u16().wrapping_sub(500);
        bit < 100 && self.0 & (1 << bit) != 0
    }
}

/// Whether an attempt that failed with `error`, before an answer was passed on, failed because of
/// its target: the failures that count against it, and that a retry on another target may mend.
pub(crate) fn is_targets_fault(error: &GatewayError) -> bool {
    matches!(
        error,
        GatewayError::UpstreamConnect { .. }
            | GatewayError::UpstreamFailed { .. }
            | GatewayError::UpstreamTimeout(_)
    )
}

/// The targets one request tries, in the balancer's order, and the outcome kept while the next
/// one is tried. `T` is an answer as the request's path holds it.
pub(super) struct Tries<T> {
    /// The balancer's hash of the request (`consistent_hash`), 0 without one.
    key: u64,
    /// How many other targets the request may try after its first.
    retries: usize,
    /// The targets tried so far (allocated on the first retry only).
    tried: Vec<usize>,
    /// The latest attempt's outcome, while another target is tried (boxed: only retries make
    /// one, and the request's future would otherwise carry it inline).
    kept: Option<Box<Result<T, GatewayError>>>,
}

/// What a request does next.
pub(super) enum Turn<T> {
    /// Try this target.
    Try(Selection),
    /// No target is left: the request ends with this outcome.
    End(Result<T, GatewayError>),
}

impl<T> Tries<T> {
    /// A request keyed `key` for the balancer that may try `retries` more targets after its
    /// first.
    pub(super) fn new(key: u64, retries: usize) -> Self {
        Self {
            key,
            retries,
            tried: Vec::new(),
            kept: None,
        }
    }

    /// The next target, or the outcome the request ends with when none is left: the one kept
    /// from the last attempt, else no healthy target.
    pub(super) fn next(&mut self, up: &Upstream) -> Turn<T> {
        match up.targets.select(self.key, &self.tried) {
            Some(selection) => Turn::Try(selection),
            None => Turn::End(match self.kept.take() {
                Some(kept) => *kept,
                None => Err(GatewayError::NoHealthyTarget(up.name.to_string())),
            }),
        }
    }

    /// The attempt on `selected` was answered with `status`, reported to the target's health;
    /// whether the answer is to be kept while another target is tried (a `502`–`504`, with
    /// retries left, for a request that can be sent again: `resendable`).
    pub(super) fn answered(
        &self,
        up: &Upstream,
        selected: &Selection,
        status: StatusCode,
        resendable: bool,
    ) -> bool {
        up.report_answer(selected, status);
        matches!(status.as_u16(), 502..=504) && resendable && self.retry_left()
    }

    /// The attempt on `selected` failed with `error`, reported to the target's health (and to
    /// the debug log); whether another target is to be tried.
    pub(super) fn failed(
        &self,
        up: &Upstream,
        selected: &Selection,
        error: &GatewayError,
        resendable: bool,
    ) -> bool {
        up.report_error(selected, error);
        tracing::debug!(upstream = %up.name, target = %selected.target().addr, error = %error, cause = ?std::error::Error::source(error), "upstream attempt failed");
        is_targets_fault(error) && resendable && self.retry_left()
    }

    /// Keeps the outcome of the attempt on the target at `index` and moves on: a retry,
    /// counted on the upstream.
    pub(super) fn retry(&mut self, up: &Upstream, index: usize, outcome: Result<T, GatewayError>) {
        up.retries_total.fetch_add(1, Ordering::Relaxed);
        self.tried.push(index);
        self.kept = Some(Box::new(outcome));
    }

    /// The attempts made so far beside the first.
    pub(super) fn retried(&self) -> usize {
        self.tried.len()
    }

    fn retry_left(&self) -> bool {
        self.tried.len() < self.retries
    }
}

impl Upstream {
    /// The `selected` target answered with `status`: a success unless the status is counted.
    #[inline]
    pub(crate) fn report_answer(&self, selected: &Selection, status: StatusCode) {
        if self.counted_statuses.contains(status) {
            self.targets.report_failure_on(selected.state());
        } else {
            self.targets.report_success_on(selected.state());
        }
    }

    /// An attempt on the `selected` target failed with `error` before an answer: a failure of
    /// the target when it is the target's fault, nothing otherwise.
    pub(crate) fn report_error(&self, selected: &Selection, error: &GatewayError) {
        if is_targets_fault(error) {
            self.targets.report_failure_on(selected.state());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The upstream `app` of a config with `targets` and `retries`, built as a generation
    /// builds it (nothing listens on its targets: the tries never connect).
    fn upstream(targets: &str, retries: u32) -> std::sync::Arc<Upstream> {
        let yaml = format!(
            "upstreams:\n  app:\n    targets: {targets}\n    retries: {retries}\n\
             routes:\n  - match: {{ path_prefix: / }}\n    proxy: {{ upstream: app }}\n"
        );
        let config =
            gateway_config::load_str(&yaml, "t.yaml", std::path::Path::new(".")).expect("config");
        let upstreams = super::super::Upstreams::build(&config).expect("upstreams");
        upstreams.get("app").expect("app").clone()
    }

    fn status(code: u16) -> StatusCode {
        StatusCode::from_u16(code).unwrap()
    }

    #[test]
    fn a_bad_gateway_answer_is_kept_while_every_other_target_is_tried() {
        let up = upstream("[127.0.0.1:9, 127.0.0.2:9]", 5);
        let mut tries: Tries<u16> = Tries::new(0, 5);
        let mut seen = Vec::new();
        let ended = loop {
            let selected = match tries.next(&up) {
                Turn::Try(selected) => selected,
                Turn::End(outcome) => break outcome,
            };
            seen.push(selected.index());
            assert!(tries.answered(&up, &selected, status(503), true));
            tries.retry(&up, selected.index(), Ok(503));
        };
        // Each target once, then the last answer is the request's, not a gateway error.
        seen.sort();
        assert_eq!(seen, [0, 1]);
        assert!(matches!(ended, Ok(503)));
        assert_eq!(up.retries_total.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn retries_stop_at_the_routes_count_and_at_what_cannot_be_sent_again() {
        let up = upstream("[127.0.0.1:9, 127.0.0.2:9, 127.0.0.3:9]", 1);
        let mut tries: Tries<u16> = Tries::new(0, 1);
        let Turn::Try(first) = tries.next(&up) else {
            panic!("no target");
        };
        // A body already sent cannot go again: its 502 is the answer.
        assert!(!tries.answered(&up, &first, status(502), false));
        // Other statuses are answers, whatever is left.
        assert!(!tries.answered(&up, &first, status(500), true));
        assert!(!tries.answered(&up, &first, status(200), true));
        let refused = GatewayError::UpstreamConnect {
            addr: "127.0.0.1:9".into(),
            source: "refused".into(),
        };
        assert!(tries.failed(&up, &first, &refused, true));
        // The client's own failure is never the target's: no retry.
        let client = GatewayError::RequestBody("reset".into());
        assert!(!tries.failed(&up, &first, &client, true));
        // The refusal counted against the target; the statuses and the client's failure not.
        assert_eq!(up.targets.snapshot()[first.index()].failures, 1);
        tries.retry(&up, first.index(), Err(refused));
        let Turn::Try(second) = tries.next(&up) else {
            panic!("a second target");
        };
        assert_ne!(second.index(), first.index());
        // The one retry is spent.
        assert!(!tries.answered(&up, &second, status(503), true));
        let timed_out = GatewayError::UpstreamTimeout(Duration::from_secs(1));
        assert!(!tries.failed(&up, &second, &timed_out, true));
        assert_eq!(tries.retried(), 1);
    }

    #[test]
    fn without_a_target_the_request_ends_with_no_healthy_target() {
        let up = upstream("[127.0.0.1:9]", 0);
        let mut tries: Tries<u16> = Tries::new(0, 0);
        let Turn::Try(only) = tries.next(&up) else {
            panic!("no target");
        };
        tries.retry(&up, only.index(), Ok(504));
        assert!(matches!(tries.next(&up), Turn::End(Ok(504))));
        // Nothing kept: what ends it is that no target is left.
        assert!(matches!(
            tries.next(&up),
            Turn::End(Err(GatewayError::NoHealthyTarget(_)))
        ));
    }

    #[test]
    fn only_the_listed_statuses_count() {
        let none = CountedStatuses::default();
        let some = CountedStatuses::new(&[502, 504, 599, 500]);
        for s in [200, 404, 500, 502, 503, 504, 599] {
            let status = StatusCode::from_u16(s).unwrap();
            assert!(!none.contains(status), "{s} counted by default");
            assert_eq!(
                some.contains(status),
                [500, 502, 504, 599].contains(&s),
                "{s}"
            );
        }
        // Out of range (validation refuses them): ignored rather than wrapping around.
        assert_eq!(CountedStatuses::new(&[404, 600, 100]), none);
    }

    #[test]
    fn the_clients_faults_are_not_the_targets() {
        assert!(!is_targets_fault(&GatewayError::RequestBody(
            "reset".into()
        )));
        assert!(!is_targets_fault(&GatewayError::BodyReadTimeout(
            Duration::from_secs(1)
        )));
        assert!(is_targets_fault(&GatewayError::UpstreamTimeout(
            Duration::from_secs(1)
        )));
        assert!(is_targets_fault(&GatewayError::UpstreamFailed {
            addr: "127.0.0.1:1".into(),
            source: "reset".into(),
        }));
    }
}
