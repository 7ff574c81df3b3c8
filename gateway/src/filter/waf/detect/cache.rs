//! Remembered "nothing found" verdicts, keyed by the exact bytes of the value and a tag naming
//! the check (a detector set and kind, or a policy and a part of the request). Real traffic
//! repeats itself (a few thousand user agents, a client's address and session cookie on every
//! request, `page=2`, popular paths), and the checks cost from a regex pass to microseconds of
//! libinjection, so a value seen benign once is not inspected again by the same check.
//!
//! Each thread has its own direct-mapped table, so a lookup takes no lock and no atomic. An entry
//! stores the value itself and is compared byte for byte: a hit is an exact repetition of a value
//! the same (pure) check passed, so the cache can never hide an attack, whatever an attacker
//! sends. The slot index comes from a fast seeded hash; a crafted collision only evicts an entry
//! (costing speed, never detection). Only benign verdicts are stored.

use std::cell::RefCell;

/// Entries per thread (a power of two).
const SLOTS: usize = 512;

/// Values longer than this are not cached: they are rarely repeated. Bounds a thread's table
/// to `SLOTS × MAX_LEN` = 256 KiB of values.
pub(crate) const MAX_LEN: usize = 512;

/// What a cached verdict is about; tags of different kinds never collide (the kind is in the
/// top byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tag(u64);

impl Tag {
    /// The detector set `detectors` (bits) on a value of kind `kind`.
    pub(crate) fn detectors(detectors: u8, kind: u8) -> Self {
        Self(1 << 56 | u64::from(detectors) << 8 | u64::from(kind))
    }

    /// Every check of policy `policy` on one part of a request (`place` names the part: the
    /// path, a user agent, a query argument, a cookie, ...).
    pub(crate) fn place(policy: u64, place: u8) -> Self {
        Self(2 << 56 | (policy & 0xFFFF_FFFF_FFFF) << 8 | u64::from(place))
    }
}

struct Slot {
    /// 0: empty.
    tag: u64,
    /// Of tag and value: most misses are told by it without comparing bytes.
    hash: u64,
    value: Vec<u8>,
}

struct Table {
    seed: u64,
    slots: Box<[Slot]>,
}

impl Table {
    fn new() -> Self {
        Self {
            seed: rand::random::<u64>() | 1,
            slots: (0..SLOTS)
                .map(|_| Slot {
                    tag: 0,
                    hash: 0,
                    value: Vec::new(),
                })
                .collect(),
        }
    }

    fn hash(&self, tag: Tag, value: &[u8]) -> (u64, usize) {
        let h = hash(self.seed, tag.0, value);
        (h, h as usize & (SLOTS - 1))
    }
}

thread_local! {
    static TABLE: RefCell<Table> = RefCell::new(Table::new());
}

/// A multiply-rotate hash over 8-byte words: only spreads values over the slots (equality is
/// checked on the bytes), so it needs to be fast, not collision resistant.
fn hash(seed: u64, tag: u64, v: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mix = |h: u64, w: u64| (h ^ w).wrapping_mul(K).rotate_left(31);
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or_default());
    let mut h = mix(seed, tag ^ (v.len() as u64) << 40);
    let mut rest = v;
    while let Some((w, tail)) = rest.split_first_chunk::<8>() {
        h = mix(h, u64::from_le_bytes(*w));
        rest = tail;
    }
    if !rest.is_empty() {
        // The last 8 bytes (overlapping: the length is in the hash), or the few there are.
        let last = match v.len().checked_sub(8) {
            Some(start) => word(&v[start..]),
            None => rest.iter().fold(0, |acc, &b| acc << 8 | u64::from(b)),
        };
        h = mix(h, last);
    }
    h ^ h >> 29
}

/// Whether `value` was remembered benign for `tag` on this thread.
pub(crate) fn is_benign(tag: Tag, value: &[u8]) -> bool {
    if value.len() > MAX_LEN {
        return false;
    }
    TABLE.with_borrow(|t| {
        let (h, i) = t.hash(tag, value);
        let slot = &t.slots[i];
        slot.hash == h && slot.tag == tag.0 && slot.value == value
    })
}

/// Remembers `value` as benign for `tag` (evicting what shared its slot).
pub(crate) fn remember_benign(tag: Tag, value: &[u8]) {
    if value.len() > MAX_LEN {
        return;
    }
    TABLE.with_borrow_mut(|t| {
        let (h, i) = t.hash(tag, value);
        let slot = &mut t.slots[i];
        slot.tag = tag.0;
        slot.hash = h;
        slot.value.clear();
        slot.value.extend_from_slice(value);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_exact_values_by_tag() {
        let tag = Tag::detectors(1, 2);
        assert!(!is_benign(tag, b"never stored here"));
        remember_benign(tag, b"hello world");
        assert!(is_benign(tag, b"hello world"));
        assert!(!is_benign(tag, b"hello worle"));
        assert!(!is_benign(tag, b"hello worl"));
        assert!(!is_benign(Tag::detectors(3, 2), b"hello world"));
        assert!(!is_benign(Tag::place(1, 2), b"hello world"));
        // Lengths around the 8-byte words of the hash.
        for n in 0..20 {
            let v = vec![b'x'; n];
            remember_benign(tag, &v);
            assert!(is_benign(tag, &v), "{n}");
        }
        let long = [b'a'; MAX_LEN + 1];
        remember_benign(tag, &long);
        assert!(!is_benign(tag, &long));
    }

    #[test]
    fn a_full_table_only_evicts() {
        // Far more values than slots: whatever is found must have been stored, byte for byte.
        let tag = Tag::place(7, 1);
        for i in 0..SLOTS * 4 {
            remember_benign(tag, format!("v{i}").as_bytes());
        }
        let found = (0..SLOTS * 4)
            .filter(|i| is_benign(tag, format!("v{i}").as_bytes()))
            .count();
        assert!(found > 0 && found <= SLOTS);
        assert!(!is_benign(tag, b"x0"));
    }
}
