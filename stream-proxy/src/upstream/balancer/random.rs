//! Power of two random choices: draw two targets (by weight) and take the less loaded one. It
//! spreads load almost as well as a full least-requests scan, needs no shared counter, and
//! avoids the herd that "always the least loaded" causes when many workers see the same
//! stale counts.

use rand::Rng;

use super::{Candidates, less_loaded};

/// Draws per choice before falling back to a scan (only when most targets are ineligible).
const DRAWS: usize = 3;

#[derive(Debug)]
pub(crate) struct Random {
    /// Running sums of the weights; `None` when all weights are equal.
    cumulative: Option<Box<[u64]>>,
}

impl Random {
    pub(crate) fn new(weights: &[u32]) -> Self {
        let uniform = weights.windows(2).all(|w| w[0] == w[1]);
        let cumulative = (!uniform).then(|| {
            weights
                .iter()
                .scan(0u64, |sum, w| {
                    *sum += u64::from(*w);
                    Some(*sum)
                })
                .collect()
        });
        Self { cumulative }
    }

    pub(crate) fn pick(&self, c: &impl Candidates) -> Option<usize> {
        let mut rng = rand::rng();
        match (self.draw(&mut rng, c), self.draw(&mut rng, c)) {
            (Some(a), Some(b)) => Some(if less_loaded(c, b, a) { b } else { a }),
            (Some(x), None) | (None, Some(x)) => Some(x),
            (None, None) => (0..c.len())
                .filter(|&i| c.eligible(i))
                .reduce(|best, i| if less_loaded(c, i, best) { i } else { best }),
        }
    }

    fn draw(&self, rng: &mut impl Rng, c: &impl Candidates) -> Option<usize> {
        let n = c.len();
        // A set of names not resolved yet has no target to draw.
        if n == 0 {
            return None;
        }
        (0..DRAWS)
            .map(|_| match &self.cumulative {
                None => rng.random_range(0..n),
                Some(cum) => {
                    let total = cum.last().copied().unwrap_or(1);
                    let r = rng.random_range(0..total);
                    cum.partition_point(|&s| s <= r)
                }
            })
            .find(|&i| c.eligible(i))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{Fake, histogram};
    use super::*;

    fn within(counts: &[usize], expected: &[f64], tolerance: f64) {
        let total: usize = counts.iter().sum();
        for (got, want) in counts.iter().zip(expected) {
            let share = *got as f64 / total as f64;
            assert!(
                (share - want).abs() < tolerance,
                "{counts:?} vs {expected:?}"
            );
        }
    }

    #[test]
    fn idle_targets_share_evenly() {
        let c = Fake::new(&[1, 1, 1, 1]);
        let r = Random::new(&c.weights);
        within(&histogram(20_000, &c, || r.pick(&c)), &[0.25; 4], 0.03);
    }

    #[test]
    fn weights_bias_the_draw() {
        let c = Fake::new(&[3, 1]);
        let r = Random::new(&c.weights);
        // With both draws landing on the same target ¾·¾ + ¼·¼ of the time and ties going to
        // the first draw, an idle pair splits exactly by weight.
        within(&histogram(20_000, &c, || r.pick(&c)), &[0.75, 0.25], 0.03);
    }

    #[test]
    fn prefers_the_less_loaded_of_two() {
        let c = Fake::new(&[1, 1]);
        *c.load.borrow_mut() = vec![10, 0];
        let r = Random::new(&c.weights);
        // Only when both draws hit target 0 (a quarter of the time) does it win.
        within(&histogram(20_000, &c, || r.pick(&c)), &[0.25, 0.75], 0.03);
    }

    #[test]
    fn skips_ineligible_and_reports_none() {
        let mut c = Fake::new(&[1, 1, 1, 1, 1, 1, 1, 1]);
        c.down = (0..7).collect();
        let r = Random::new(&c.weights);
        assert_eq!(histogram(1000, &c, || r.pick(&c))[7], 1000);
        c.down.push(7);
        assert_eq!(r.pick(&c), None);
    }
}
