//! Consistent hashing on a ring with virtual nodes (ketama style). Each target owns
//! `POINTS_PER_WEIGHT × weight` points placed by a stable hash of its authority, so every
//! gateway with the same config builds the same ring. A key goes to the owner of the first point
//! at or after its hash. When a target is ejected (or removed from the config) only the keys on
//! its points move, each to the next point's owner; every other key stays where it was.
//!
//! A ring rather than Maglev: skipping an ineligible target is a walk to the next point, with
//! no table to rebuild when health changes, and 160 points per target keep the spread within a
//! few percent.

use super::Candidates;
use crate::upstream::hash::KeyHasher;

const POINTS_PER_WEIGHT: u32 = 160;
/// Bounds the ring (and its build time) for large weights: points are scaled down beyond it.
const MAX_POINTS: u64 = 1 << 16;

#[derive(Debug)]
pub(crate) struct Ring {
    /// `(position, target)` sorted by position.
    points: Box<[(u64, u32)]>,
}

impl Ring {
    /// `targets` are `(authority, weight)`.
    pub(crate) fn new(targets: &[(&str, u32)]) -> Self {
        let total: u64 = targets
            .iter()
            .map(|t| u64::from(t.1.max(1)) * u64::from(POINTS_PER_WEIGHT))
            .sum();
        let scale = (total.div_ceil(MAX_POINTS)).max(1);
        let mut points = Vec::with_capacity((total / scale) as usize);
        for (i, (authority, weight)) in targets.iter().enumerate() {
            let count = (u64::from((*weight).max(1)) * u64::from(POINTS_PER_WEIGHT) / scale).max(1);
            for replica in 0..count {
                let mut h = KeyHasher::new();
                h.write(authority.as_bytes());
                h.write(b"#");
                h.write(&replica.to_le_bytes());
                points.push((h.finish(), i as u32));
            }
        }
        points.sort_unstable();
        Self {
            points: points.into(),
        }
    }

    pub(crate) fn pick(&self, c: &impl Candidates, key: u64) -> Option<usize> {
        // Without this, an all-down upstream would walk every point on every request.
        if !(0..c.len()).any(|i| c.eligible(i)) {
            return None;
        }
        let len = self.points.len();
        let start = self.points.partition_point(|p| p.0 < key);
        (0..len)
            .map(|k| self.points[(start + k) % len].1 as usize)
            .find(|&i| c.eligible(i))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::Fake;
    use super::*;
    use crate::upstream::hash::hash_bytes;

    const NAMES: [&str; 5] = [
        "10.0.0.1:80",
        "10.0.0.2:80",
        "10.0.0.3:80",
        "10.0.0.4:80",
        "10.0.0.5:80",
    ];

    fn ring(names: &[&str]) -> Ring {
        Ring::new(&names.iter().map(|n| (*n, 1)).collect::<Vec<_>>())
    }

    fn keys() -> impl Iterator<Item = u64> {
        (0..20_000u32).map(|k| hash_bytes(format!("user-{k}").as_bytes()))
    }

    #[test]
    fn same_key_same_target() {
        let c = Fake::new(&[1; 5]);
        let r = ring(&NAMES);
        for key in keys().take(500) {
            assert_eq!(r.pick(&c, key), r.pick(&c, key));
        }
        // And the same on a ring built again (another process with the same config).
        let again = ring(&NAMES);
        assert!(keys().all(|k| r.pick(&c, k) == again.pick(&c, k)));
    }

    #[test]
    fn spread_is_even() {
        let c = Fake::new(&[1; 5]);
        let r = ring(&NAMES);
        let mut counts = [0usize; 5];
        for key in keys() {
            counts[r.pick(&c, key).unwrap()] += 1;
        }
        for n in counts {
            assert!((2_800..5_200).contains(&n), "{counts:?}");
        }
    }

    #[test]
    fn weights_scale_the_share() {
        let c = Fake::new(&[3, 1]);
        let r = Ring::new(&[(NAMES[0], 3), (NAMES[1], 1)]);
        let heavy = keys().filter(|&k| r.pick(&c, k) == Some(0)).count();
        assert!((13_500..16_500).contains(&heavy), "{heavy}");
    }

    #[test]
    fn ejecting_a_target_moves_only_its_keys() {
        let mut c = Fake::new(&[1; 5]);
        let r = ring(&NAMES);
        let before: Vec<_> = keys().map(|k| r.pick(&c, k).unwrap()).collect();
        c.down = vec![2];
        let after: Vec<_> = keys().map(|k| r.pick(&c, k).unwrap()).collect();
        let mut moved = 0;
        for (b, a) in before.iter().zip(&after) {
            if *b == 2 {
                assert_ne!(*a, 2);
                moved += 1;
            } else {
                assert_eq!(a, b, "a key not on the ejected target moved");
            }
        }
        assert!(moved > 2_800 && moved < 5_200, "{moved}");
    }

    #[test]
    fn removing_a_target_from_config_moves_only_its_keys() {
        let c5 = Fake::new(&[1; 5]);
        let c4 = Fake::new(&[1; 4]);
        let full = ring(&NAMES);
        let without: Vec<&str> = NAMES.iter().copied().filter(|n| *n != NAMES[3]).collect();
        let smaller = ring(&without);
        for key in keys() {
            let before = NAMES[full.pick(&c5, key).unwrap()];
            let after = without[smaller.pick(&c4, key).unwrap()];
            if before != NAMES[3] {
                assert_eq!(before, after);
            }
        }
    }

    #[test]
    fn all_down_is_none() {
        let mut c = Fake::new(&[1; 5]);
        c.down = (0..5).collect();
        assert_eq!(ring(&NAMES).pick(&c, 42), None);
    }
}
