//! The four balancing algorithms. Each sees the targets through [`Candidates`] (weight, load,
//! eligibility), so the algorithms know nothing of health bookkeeping or retries and can be
//! tested with plain arrays.

mod consistent_hash;
mod least_requests;
mod random;
mod round_robin;

pub(crate) use consistent_hash::Ring;
pub(crate) use least_requests::LeastRequests;
pub(crate) use random::Random;
pub(crate) use round_robin::RoundRobin;

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use gateway_config::model::Balance;

/// What a balancer may ask about the targets.
pub(crate) trait Candidates {
    fn len(&self) -> usize;
    fn weight(&self, i: usize) -> u32;
    /// Requests or connections in flight.
    fn load(&self, i: usize) -> u32;
    /// Healthy and not excluded by the caller.
    fn eligible(&self, i: usize) -> bool;
}

/// The next eligible target in rotation. An ineligible slot draws the counter again rather than
/// falling through to its neighbour, so a missing target's share is spread evenly over the rest
/// instead of doubling the next one's.
pub(crate) fn next_eligible(counter: &AtomicUsize, c: &impl Candidates) -> Option<usize> {
    let n = c.len();
    for _ in 0..n {
        let i = counter.fetch_add(1, Relaxed) % n;
        if c.eligible(i) {
            return Some(i);
        }
    }
    (0..n).find(|&i| c.eligible(i))
}

/// Whether `a` carries less load per unit of weight than `b`.
pub(crate) fn less_loaded(c: &impl Candidates, a: usize, b: usize) -> bool {
    u64::from(c.load(a)) * u64::from(c.weight(b)) < u64::from(c.load(b)) * u64::from(c.weight(a))
}

/// One upstream's algorithm with its state.
#[derive(Debug)]
pub(crate) enum Balancer {
    RoundRobin(RoundRobin),
    LeastRequests(LeastRequests),
    Random(Random),
    ConsistentHash(Ring),
}

impl Balancer {
    /// `targets` are `(authority, weight)` in configuration order.
    pub(crate) fn new(balance: Balance, targets: &[(&str, u32)]) -> Self {
        let weights: Vec<u32> = targets.iter().map(|t| t.1.max(1)).collect();
        match balance {
            Balance::RoundRobin => Self::RoundRobin(RoundRobin::new(&weights)),
            Balance::LeastRequests => Self::LeastRequests(LeastRequests::default()),
            Balance::Random => Self::Random(Random::new(&weights)),
            Balance::ConsistentHash => Self::ConsistentHash(Ring::new(targets)),
        }
    }

    /// Picks an eligible target; `key` matters only to consistent hashing.
    #[inline]
    pub(crate) fn pick(&self, c: &impl Candidates, key: u64) -> Option<usize> {
        match self {
            Self::RoundRobin(b) => b.pick(c),
            Self::LeastRequests(b) => b.pick(c),
            Self::Random(b) => b.pick(c),
            Self::ConsistentHash(b) => b.pick(c, key),
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! A fake target list for the balancers' unit tests.
    use super::Candidates;
    use std::cell::RefCell;

    pub(crate) struct Fake {
        pub(crate) weights: Vec<u32>,
        pub(crate) load: RefCell<Vec<u32>>,
        pub(crate) down: Vec<usize>,
    }

    impl Fake {
        pub(crate) fn new(weights: &[u32]) -> Self {
            Self {
                weights: weights.to_vec(),
                load: RefCell::new(vec![0; weights.len()]),
                down: Vec::new(),
            }
        }
    }

    impl Candidates for Fake {
        fn len(&self) -> usize {
            self.weights.len()
        }
        fn weight(&self, i: usize) -> u32 {
            self.weights[i]
        }
        fn load(&self, i: usize) -> u32 {
            self.load.borrow()[i]
        }
        fn eligible(&self, i: usize) -> bool {
            !self.down.contains(&i)
        }
    }

    /// Counts picks per target over `n` rounds.
    pub(crate) fn histogram(
        n: usize,
        c: &Fake,
        mut pick: impl FnMut() -> Option<usize>,
    ) -> Vec<usize> {
        let mut counts = vec![0; c.len()];
        for _ in 0..n {
            if let Some(i) = pick() {
                counts[i] += 1;
            }
        }
        counts
    }
}
