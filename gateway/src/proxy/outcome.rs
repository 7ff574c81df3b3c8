//! What an attempt's outcome says about its target: the one rule by which both the general path
//! ([`super::ProxyRoute::forward`]) and the HTTP/1.1 fast path
//! ([`super::ProxyRoute::forward_text`]) feed passive health.
//!
//! A target's failure is what says something about the target as a whole: a connection refused,
//! reset or not made in time, an answer that is broken or cut off, an answer not received within
//! the upstream's `timeout`. A status the target answers with counts only when the upstream lists
//! it in `health_check.passive.statuses` (none by default): a status answers one request, whose
//! URL the client chose, and a backend's deliberate `503` for one path must not let a client take
//! the target out for every route. Whatever is the client's doing (its request body failing, or
//! stalling past the listener's `body_read_timeout`) never counts.
//!
//! A response body that breaks or stalls after its head is reported by [`super::body`], which
//! is the same for both paths.

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
/// its target (the errors a retry on another target may mend).
pub(crate) fn is_targets_fault(error: &GatewayError) -> bool {
    matches!(
        error,
        GatewayError::UpstreamConnect { .. }
            | GatewayError::UpstreamFailed { .. }
            | GatewayError::UpstreamTimeout(_)
    )
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
