//! Fewest requests in flight, scaled by weight (a target of weight 2 is as loaded as one of
//! weight 1 when it has twice the requests). Ties, which are the rule on a lightly loaded
//! upstream, are taken in rotation, so an idle upstream is served like round robin instead of
//! piling onto the first target.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use super::{Candidates, less_loaded};

#[derive(Debug, Default)]
pub(crate) struct LeastRequests {
    next: AtomicUsize,
}

impl LeastRequests {
    pub(crate) fn pick(&self, c: &impl Candidates) -> Option<usize> {
        // First pass: the least loaded target and how many share its load.
        let mut best: Option<usize> = None;
        let mut ties = 0;
        for i in (0..c.len()).filter(|&i| c.eligible(i)) {
            match best {
                Some(b) if less_loaded(c, b, i) => {}
                Some(b) if !less_loaded(c, i, b) => ties += 1,
                _ => (best, ties) = (Some(i), 1),
            }
        }
        let best = best?;
        if ties == 1 {
            return Some(best);
        }
        // Second pass: the k-th of the tied ones, k rotating.
        let k = self.next.fetch_add(1, Relaxed) % ties;
        (best..c.len())
            .filter(|&i| c.eligible(i) && !less_loaded(c, best, i))
            .nth(k)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{Fake, histogram};
    use super::*;

    #[test]
    fn picks_the_least_loaded() {
        let c = Fake::new(&[1, 1, 1]);
        *c.load.borrow_mut() = vec![5, 2, 9];
        let lr = LeastRequests::default();
        assert_eq!(histogram(30, &c, || lr.pick(&c)), [0, 30, 0]);
    }

    #[test]
    fn weight_scales_load() {
        let c = Fake::new(&[1, 4]);
        *c.load.borrow_mut() = vec![1, 3];
        let lr = LeastRequests::default();
        assert_eq!(lr.pick(&c), Some(1), "3/4 is less than 1/1");
    }

    #[test]
    fn converges_to_equal_in_flight() {
        // Requests that never finish: each pick raises the chosen target's load.
        let c = Fake::new(&[1, 1, 1, 1]);
        let lr = LeastRequests::default();
        for _ in 0..400 {
            let i = lr.pick(&c).unwrap();
            c.load.borrow_mut()[i] += 1;
        }
        assert_eq!(*c.load.borrow(), vec![100; 4]);
    }

    #[test]
    fn idle_targets_rotate_and_skip_ineligible() {
        let mut c = Fake::new(&[1, 1, 1]);
        let lr = LeastRequests::default();
        assert_eq!(histogram(300, &c, || lr.pick(&c)), [100, 100, 100]);
        c.down = vec![1];
        assert_eq!(histogram(300, &c, || lr.pick(&c)), [150, 0, 150]);
        c.down = vec![0, 1, 2];
        assert_eq!(lr.pick(&c), None);
    }
}
