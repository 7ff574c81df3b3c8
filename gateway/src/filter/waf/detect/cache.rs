//! Benign verdicts of the expensive detectors, remembered per value. Real traffic repeats
//! itself (a few thousand user agents, referers and argument values make most requests), and
//! the libinjection port costs microseconds per call, so a value seen benign once is not parsed
//! again.
//!
//! A direct-mapped table of 64-bit keyed hashes (SipHash with a per-process random key), shared
//! by every policy and thread; a racing write only loses an entry. An attacker cannot make an
//! attack look cached: they would need a collision on a keyed 64-bit hash they cannot observe.
//! Only benign verdicts are stored, so a wrong entry could at worst come from such a collision,
//! and a flood of distinct values only evicts entries (costing speed, never detection).

use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// Entries (a power of two): 16,384 × 8 bytes = 128 KiB.
const SLOTS: usize = 1 << 14;

/// Values longer than this are not cached: they are rarely repeated, and hashing them costs
/// nearly as much as a pre-checked detector run.
const MAX_LEN: usize = 512;

struct Table {
    hasher: std::collections::hash_map::RandomState,
    slots: Box<[AtomicU64]>,
}

fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(|| Table {
        hasher: std::collections::hash_map::RandomState::new(),
        slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
    })
}

/// The cache key of `value` inspected by the detector set `detectors` as `kind`; 0 means
/// "do not cache".
pub(super) fn key(detectors: u8, kind: u8, value: &[u8]) -> u64 {
    if value.len() > MAX_LEN {
        return 0;
    }
    let mut h = table().hasher.build_hasher();
    h.write_u8(detectors);
    h.write_u8(kind);
    h.write(value);
    // 0 marks an empty slot.
    h.finish() | 1
}

/// The cache key of `value` in a context `tag` of the caller's choosing (a policy and a place in
/// the request); never equal to a [`key`] of the same bytes, whose first byte is a detector set
/// (below 16). 0 means "do not cache".
pub(crate) fn tagged_key(tag: u64, value: &[u8]) -> u64 {
    if value.len() > MAX_LEN {
        return 0;
    }
    let mut h = table().hasher.build_hasher();
    h.write_u8(0xFF);
    h.write_u64(tag);
    h.write(value);
    h.finish() | 1
}

fn slot(key: u64) -> &'static AtomicU64 {
    &table().slots[(key >> 32) as usize & (SLOTS - 1)]
}

/// Whether `key` was remembered benign.
pub(crate) fn is_benign(key: u64) -> bool {
    key != 0 && slot(key).load(Ordering::Relaxed) == key
}

/// Remembers `key` as benign.
pub(crate) fn remember_benign(key: u64) {
    if key != 0 {
        slot(key).store(key, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_by_value_and_context() {
        let k = key(1, 2, b"hello world");
        assert!(!is_benign(key(1, 2, b"never stored here")));
        remember_benign(k);
        assert!(is_benign(k));
        assert_ne!(
            k,
            key(3, 2, b"hello world"),
            "detector set is part of the key"
        );
        assert_eq!(key(1, 2, &[b'a'; MAX_LEN + 1]), 0);
        assert!(!is_benign(0));
        assert_ne!(tagged_key(7, b"v"), tagged_key(8, b"v"));
        assert_eq!(tagged_key(7, &[b'a'; MAX_LEN + 1]), 0);
    }
}
