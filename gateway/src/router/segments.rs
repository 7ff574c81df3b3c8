//! The table a listener's routes are indexed by: the first path segment each route requires,
//! looked up without hashing the segment's text. A lookup finds the segment's end and its first
//! eight bytes in one load where the path is long enough, takes its length and its first and
//! last eight bytes as a fingerprint (which tells apart any two segments of up to 16 bytes),
//! probes a small open-addressed table from there, and compares text only for longer segments,
//! which costs less than a general-purpose hash map fed the segment found by a byte loop.

/// A segment's length and its first and last eight bytes, zero-padded when shorter (the two
/// overlap for 9 to 15 bytes and are the same for up to 8). Two segments of at most 16 bytes
/// with equal fingerprints are equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fingerprint {
    len: usize,
    head: u64,
    tail: u64,
}

/// Segments whose fingerprint holds all of their bytes.
const WHOLE_IN_FINGERPRINT: usize = 16;

impl Fingerprint {
    fn of(segment: &[u8]) -> Self {
        let len = segment.len();
        if len <= 8 {
            return Self::short(len, load(segment));
        }
        Self {
            len,
            head: load(&segment[..8]),
            tail: load(&segment[len - 8..]),
        }
    }

    /// The fingerprint of a segment of at most eight bytes, `whole` being all of them.
    fn short(len: usize, whole: u64) -> Self {
        Self {
            len,
            head: whole,
            tail: whole,
        }
    }

    /// Where probing for this segment starts in a table of `mask + 1` slots.
    fn slot(self, mask: usize) -> usize {
        let mixed = (self.head ^ self.tail.rotate_left(29) ^ self.len as u64)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (mixed >> 32) as usize & mask
    }
}

/// `/` in every byte, to find one in eight bytes at once.
const SLASHES: u64 = u64::from_ne_bytes([b'/'; 8]);

/// The text between a path's leading `/` and the next one: `static` for `/static/1k.bin`, empty
/// for `/`. Two paths that one route matches always share it (see `Matcher::first_segment`).
pub(super) fn first_segment(path: &[u8]) -> &[u8] {
    first_segment_and_fingerprint(path).0
}

/// [`first_segment`] and its fingerprint, equal to [`Fingerprint::of`] the segment.
#[inline]
fn first_segment_and_fingerprint(path: &[u8]) -> (&[u8], Fingerprint) {
    let rest = path.strip_prefix(b"/").unwrap_or(path);
    if let Some(eight) = rest.first_chunk::<8>() {
        let word = u64::from_le_bytes(*eight);
        // The lowest byte that equals `/` has its top bit set here (bytes above a match may
        // be marked too; the lowest mark is exact).
        let matched = word ^ SLASHES;
        let marks = matched.wrapping_sub(0x0101_0101_0101_0101) & !matched & 0x8080_8080_8080_8080;
        if marks != 0 {
            let len = (marks.trailing_zeros() / 8) as usize;
            let head = word & ((1u64 << (8 * len)) - 1);
            return (&rest[..len], Fingerprint::short(len, head));
        }
    }
    // Fewer than eight bytes left, or no `/` among the first eight.
    let len = rest.iter().position(|&b| b == b'/').unwrap_or(rest.len());
    let segment = &rest[..len];
    (segment, Fingerprint::of(segment))
}

/// Up to eight bytes as a little-endian number, zero-padded.
fn load(bytes: &[u8]) -> u64 {
    match <[u8; 8]>::try_from(bytes) {
        Ok(eight) => u64::from_le_bytes(eight),
        Err(_) => bytes
            .iter()
            .rev()
            .fold(0, |value, &b| value << 8 | u64::from(b)),
    }
}

/// A map from distinct segments to values, built once per config generation.
#[derive(Debug)]
pub(super) struct SegmentTable<V> {
    /// The entry's index + 1 at each slot, 0 for an empty slot. A power of two in length and at
    /// most half full, so every probe ends at an empty slot.
    slots: Box<[u32]>,
    entries: Box<[Entry<V>]>,
}

/// A segment's fingerprint, its text (read only for segments longer than the fingerprint) and
/// its value.
type Entry<V> = (Fingerprint, Box<[u8]>, V);

impl<V> SegmentTable<V> {
    /// A table of `entries`, whose segments are distinct.
    pub(super) fn new(entries: Vec<(Box<[u8]>, V)>) -> Self {
        let size = (entries.len() * 2).next_power_of_two().max(2);
        let mut slots = vec![0u32; size].into_boxed_slice();
        let entries: Box<[_]> = entries
            .into_iter()
            .map(|(segment, value)| (Fingerprint::of(&segment), segment, value))
            .collect();
        for (i, (print, _, _)) in entries.iter().enumerate() {
            let mut slot = print.slot(size - 1);
            while slots[slot] != 0 {
                slot = (slot + 1) & (size - 1);
            }
            slots[slot] = u32::try_from(i + 1).expect("fewer than 2^32 segments");
        }
        Self { slots, entries }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value of `path`'s first segment (see [`first_segment`]).
    #[inline]
    pub(super) fn get_for_path(&self, path: &str) -> Option<&V> {
        let (segment, print) = first_segment_and_fingerprint(path.as_bytes());
        self.find(segment, print)
    }

    #[cfg(test)]
    fn get(&self, segment: &str) -> Option<&V> {
        self.find(segment.as_bytes(), Fingerprint::of(segment.as_bytes()))
    }

    fn find(&self, segment: &[u8], print: Fingerprint) -> Option<&V> {
        let mask = self.slots.len() - 1;
        let mut slot = print.slot(mask);
        loop {
            let entry = self.slots[slot];
            if entry == 0 {
                return None;
            }
            let (candidate, text, value) = &self.entries[entry as usize - 1];
            if *candidate == print && (print.len <= WHOLE_IN_FINGERPRINT || **text == *segment) {
                return Some(value);
            }
            slot = (slot + 1) & mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_each_segment_and_nothing_else() {
        // Lengths around the fingerprint's limits, segments alike but for one byte at the
        // start, the middle or the end, and more entries than slots would hold unprobed.
        let mut segments: Vec<String> = vec![String::new(), "a".into(), "b".into()];
        for len in [7, 8, 9, 15, 16, 17, 24, 40] {
            for changed in [0, len / 2, len - 1] {
                let mut s = vec![b'x'; len];
                s[changed] = b'y';
                segments.push(String::from_utf8(s).unwrap());
            }
            segments.push("x".repeat(len));
        }
        segments.sort();
        segments.dedup();
        let table = SegmentTable::new(
            segments
                .iter()
                .enumerate()
                .map(|(i, s)| (Box::from(s.as_bytes()), i))
                .collect(),
        );
        for (i, s) in segments.iter().enumerate() {
            assert_eq!(table.get(s), Some(&i), "{s:?}");
        }
        for absent in ["c", "xx", "xxxxxxxxz", "yxxxxxxxxxxxxxxxxx", "static", "x/"] {
            assert_eq!(table.get(absent), None, "{absent:?}");
        }
        // A segment longer than 16 bytes that differs only in the middle is told apart by text.
        let long = format!("{}z{}", "x".repeat(12), "x".repeat(11));
        assert_eq!(table.get(&long), None);
    }

    #[test]
    fn a_path_s_first_segment_and_its_fingerprint() {
        let cases = [
            ("/static/1k.bin", "static"),
            ("/hello", "hello"),
            ("/", ""),
            ("", ""),
            ("//x", ""),
            ("/abcdefg/", "abcdefg"),
            ("/abcdefgh", "abcdefgh"),
            ("/abcdefgh/x", "abcdefgh"),
            ("/abcdefghi/x", "abcdefghi"),
            ("/native-proxy/a/b", "native-proxy"),
            (
                "/a-segment-longer-than-sixteen/x",
                "a-segment-longer-than-sixteen",
            ),
            ("/x/yyyyyyyyyyyyy", "x"),
            ("*", "*"),
            ("/caf\u{e9}/x", "caf\u{e9}"),
        ];
        for (path, segment) in cases {
            let (found, print) = first_segment_and_fingerprint(path.as_bytes());
            assert_eq!(found, segment.as_bytes(), "{path:?}");
            assert_eq!(print, Fingerprint::of(segment.as_bytes()), "{path:?}");
        }
        let table = SegmentTable::new(vec![
            (Box::from(&b"static"[..]), 1),
            (Box::from(&b"abcdefgh"[..]), 2),
        ]);
        assert_eq!(table.get_for_path("/static/1k.bin"), Some(&1));
        assert_eq!(table.get_for_path("/static"), Some(&1));
        assert_eq!(table.get_for_path("/abcdefgh/"), Some(&2));
        assert_eq!(table.get_for_path("/staticx/1k.bin"), None);
        assert_eq!(table.get_for_path("/stat/ic"), None);
    }

    #[test]
    fn an_empty_table_finds_nothing() {
        let table: SegmentTable<()> = SegmentTable::new(Vec::new());
        assert!(table.is_empty());
        assert_eq!(table.get("static"), None);
    }
}
