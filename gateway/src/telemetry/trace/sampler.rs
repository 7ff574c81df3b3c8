//! Parent-based sampling: a request that carries a valid `traceparent` follows its `sampled`
//! flag (a sampled parent is always kept, so one trace is never cut in half at the gateway);
//! a new trace is kept with probability `sample_ratio`, decided from the trace id itself, as
//! OpenTelemetry's `TraceIdRatioBased` does, so every service using the same ratio agrees.

use super::context::{SpanContext, TraceId};

/// The sampling decision for new traces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sampler {
    /// New traces whose low 64 id bits are below this are kept; `u64::MAX` keeps all.
    threshold: u64,
    all: bool,
}

impl Sampler {
    /// A sampler keeping `ratio` (clamped to 0..=1) of new traces.
    pub fn new(ratio: f64) -> Self {
        let ratio = if ratio.is_nan() {
            0.0
        } else {
            ratio.clamp(0.0, 1.0)
        };
        Self {
            // `as` saturates, and 1.0 is handled by `all`.
            threshold: (ratio * (u64::MAX as f64)) as u64,
            all: ratio >= 1.0,
        }
    }

    /// Whether the span is recorded: the remote parent's flag, else the ratio.
    pub fn sample(&self, parent: Option<&SpanContext>, trace_id: &TraceId) -> bool {
        match parent {
            Some(p) => p.sampled,
            None => self.sample_new(trace_id),
        }
    }

    /// The ratio decision for a new trace.
    pub fn sample_new(&self, trace_id: &TraceId) -> bool {
        if self.all {
            return true;
        }
        let mut low = [0u8; 8];
        low.copy_from_slice(&trace_id[8..]);
        u64::from_be_bytes(low) < self.threshold
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::trace::context::{new_span_id, new_trace_id};

    fn parent(sampled: bool) -> SpanContext {
        SpanContext {
            trace_id: new_trace_id(),
            span_id: new_span_id(),
            sampled,
        }
    }

    #[test]
    fn parent_flag_wins_over_the_ratio() {
        let none = Sampler::new(0.0);
        let all = Sampler::new(1.0);
        let id = new_trace_id();
        assert!(none.sample(Some(&parent(true)), &id));
        assert!(!all.sample(Some(&parent(false)), &id));
    }

    #[test]
    fn ratio_applies_to_new_traces() {
        assert!((0..1000).all(|_| Sampler::new(1.0).sample(None, &new_trace_id())));
        assert!((0..1000).all(|_| !Sampler::new(0.0).sample(None, &new_trace_id())));
        let quarter = Sampler::new(0.25);
        let kept = (0..20_000)
            .filter(|_| quarter.sample(None, &new_trace_id()))
            .count();
        assert!((4_000..6_000).contains(&kept), "{kept}");
    }

    #[test]
    fn decision_depends_only_on_the_trace_id() {
        let s = Sampler::new(0.5);
        let id = new_trace_id();
        let first = s.sample_new(&id);
        assert!((0..100).all(|_| s.sample_new(&id) == first));
    }
}
