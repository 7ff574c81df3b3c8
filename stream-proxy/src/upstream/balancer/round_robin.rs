//! Smooth weighted round robin, as nginx does it: every pick adds each eligible target's weight
//! to its running score, takes the highest score and subtracts the total from it. Weights 5,1,1
//! give `a a b a c a a` rather than `a a a a a b c`, so a heavy target is never hit in a burst.
//! Equal weights (the common case) take a lock-free counter instead, which yields the same order.

use std::sync::Mutex;
use std::sync::atomic::AtomicUsize;

use super::{Candidates, next_eligible};

#[derive(Debug)]
pub(crate) struct RoundRobin {
    next: AtomicUsize,
    /// Running scores; `None` when all weights are equal.
    scores: Option<Mutex<Vec<i64>>>,
}

impl RoundRobin {
    pub(crate) fn new(weights: &[u32]) -> Self {
        let uniform = weights.windows(2).all(|w| w[0] == w[1]);
        Self {
            next: AtomicUsize::new(0),
            scores: (!uniform).then(|| Mutex::new(vec![0; weights.len()])),
        }
    }

    pub(crate) fn pick(&self, c: &impl Candidates) -> Option<usize> {
        let n = c.len();
        let Some(scores) = &self.scores else {
            return next_eligible(&self.next, c);
        };
        // A poisoned lock only means another pick panicked mid-update; the scores stay usable.
        let mut scores = scores.lock().unwrap_or_else(|e| e.into_inner());
        let mut total = 0i64;
        let mut best: Option<usize> = None;
        for i in 0..n {
            if !c.eligible(i) {
                continue;
            }
            let w = i64::from(c.weight(i));
            scores[i] += w;
            total += w;
            if best.is_none_or(|b| scores[i] > scores[b]) {
                best = Some(i);
            }
        }
        if let Some(b) = best {
            scores[b] -= total;
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{Fake, histogram};
    use super::*;

    #[test]
    fn equal_weights_rotate() {
        let c = Fake::new(&[1, 1, 1]);
        let rr = RoundRobin::new(&c.weights);
        let order: Vec<_> = (0..6).map(|_| rr.pick(&c).unwrap()).collect();
        assert_eq!(order, [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn smooth_weighted_order() {
        let c = Fake::new(&[5, 1, 1]);
        let rr = RoundRobin::new(&c.weights);
        let order: Vec<_> = (0..7).map(|_| rr.pick(&c).unwrap()).collect();
        assert_eq!(order, [0, 0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn weighted_distribution_is_exact() {
        let c = Fake::new(&[3, 1, 2]);
        let rr = RoundRobin::new(&c.weights);
        assert_eq!(histogram(600, &c, || rr.pick(&c)), [300, 100, 200]);
    }

    #[test]
    fn skips_ineligible_and_reports_none() {
        let mut c = Fake::new(&[2, 1, 1]);
        c.down = vec![0];
        let rr = RoundRobin::new(&c.weights);
        assert_eq!(histogram(100, &c, || rr.pick(&c)), [0, 50, 50]);
        c.down = vec![0, 1, 2];
        assert_eq!(rr.pick(&c), None);
        c.down = vec![1];
        let uniform = RoundRobin::new(&[1, 1, 1]);
        assert_eq!(histogram(100, &c, || uniform.pick(&c)), [50, 0, 50]);
        c.down = vec![0, 1, 2];
        let uniform = RoundRobin::new(&[1, 1, 1]);
        assert_eq!(uniform.pick(&c), None);
    }
}
