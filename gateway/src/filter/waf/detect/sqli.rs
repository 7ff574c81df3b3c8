//! SQL injection: libinjection's tokenizer and fingerprint blacklist (the `libinjectionrs` port),
//! behind a sound pre-check.
//!
//! The pre-check skips values that cannot tokenize into a blacklisted fingerprint. Every one of
//! libinjection's ~8,300 blacklisted fingerprints contains a token other than a bareword, a
//! number, a comma or an operator (checked by a test below against the library's own table). A
//! value made only of letters, digits, whitespace, `_ . , : - / = +` and non-ASCII bytes, with no
//! `--` comment, tokenizes into exactly those unless one of its words is an SQL keyword,
//! function or operator word. So such a value with no keyword word is skipped; anything else
//! goes to libinjection.

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::OnceLock;

use super::feat;

/// The longest SQL word (bytes); longer words are barewords.
const MAX_WORD: usize = 32;

/// Whether libinjection must look at `v` (`f` = [`super::features`] of `v`).
pub fn may_match(v: &[u8], f: u32) -> bool {
    if f & feat::SQL_SPECIAL != 0 {
        return true;
    }
    if f & feat::DASH != 0 && memchr::memmem::find(v, b"--").is_some() {
        return true;
    }
    // Without letters only numbers, operators and commas can be formed.
    f & feat::ALPHA != 0 && has_sql_word(v)
}

/// The full libinjection check (all quote contexts, ANSI and MySQL).
pub fn detect(v: &[u8]) -> bool {
    super::guarded(|| libinjectionrs::detect_sqli(v).is_injection())
}

/// Whether any word libinjection could read out of `v` is in its keyword table.
fn has_sql_word(v: &[u8]) -> bool {
    let words = sql_words();
    // Runs of word bytes, found with one table lookup per byte (this runs on most values).
    let is_word = |b: u8| CLASS[usize::from(b)] != NON_WORD;
    let mut i = 0;
    while i < v.len() {
        if !is_word(v[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < v.len() && is_word(v[i]) {
            i += 1;
        }
        if has_sql_word_in_run(words, &v[start..i]) {
            return true;
        }
    }
    false
}

fn has_sql_word_in_run(words: &Words, run: &[u8]) -> bool {
    if !run[0].is_ascii_digit() {
        return lookup(words, run);
    }
    // libinjection reads `1union` as the number `1` then the word `union` (also `1e1union`,
    // `0x1fUNION`): try every suffix that starts with a letter.
    (1..run.len())
        .filter(|&i| !run[i].is_ascii_digit() && run.len() - i <= MAX_WORD)
        .any(|i| lookup(words, &run[i..]))
}

#[inline]
fn lookup(words: &Words, w: &[u8]) -> bool {
    let (Some(&first), Some(&last)) = (w.first(), w.last()) else {
        return false;
    };
    if w.len() > MAX_WORD {
        return false;
    }
    // Exact pre-check: a keyword of this length starting and ending with these bytes exists.
    if words.lens[pair(first, last)] & 1u64 << w.len() == 0 {
        return false;
    }
    // Everyday words pass that one about one time in ten (`size`, `sort`, `price`, `theme`):
    // a Bloom filter of the keywords rejects nearly all of them for a few instructions per
    // byte, before the copy, case folding and hashing of the exact lookup.
    words.may_contain(fold_hash(w)) && contains(words, w)
}

/// FNV-1a of `w` with ASCII letters folded to lower case (`| 0x20`: digits are unchanged and
/// `_` becomes 0x7F, so word bytes stay distinct), finished so that all bits depend on it.
fn fold_hash(w: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in w {
        h = (h ^ u64::from(b | 0x20)).wrapping_mul(0x0100_0000_01b3);
    }
    (h ^ h >> 29).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

#[inline(never)]
fn contains(words: &Words, w: &[u8]) -> bool {
    let mut buf = [0u8; MAX_WORD];
    let up = &mut buf[..w.len()];
    up.copy_from_slice(w);
    up.make_ascii_uppercase();
    words.set.contains(&*up)
}

/// FNV-1a: the set is fixed and built from the library's table, so no keyed hash is needed.
#[derive(Default)]
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for b in bytes {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

/// The keyword words, and by first and last byte (see [`pair`]) a mask of the lengths of the
/// words that start and end with them (bit `n` for length `n`).
struct Words {
    set: HashSet<Box<[u8]>, BuildHasherDefault<Fnv>>,
    lens: Box<[u64; CLASSES * CLASSES]>,
    /// Bloom filter of the words' [`fold_hash`]es, two bits each.
    bloom: Box<[u64; BLOOM_BITS / 64]>,
}

/// 32 Kib for ~900 words: about 0.3% of non-keywords pass.
const BLOOM_BITS: usize = 1 << 15;

impl Words {
    fn bloom_bits(h: u64) -> [usize; 2] {
        [(h >> 49) as usize, (h >> 34) as usize & (BLOOM_BITS - 1)]
    }

    fn may_contain(&self, h: u64) -> bool {
        Self::bloom_bits(h)
            .iter()
            .all(|&bit| self.bloom[bit / 64] & 1 << (bit % 64) != 0)
    }
}

/// Word bytes: letters (any case), digits, `_`; everything else is one more class.
const CLASSES: usize = 38;
const NON_WORD: u8 = 37;

/// [`class_of`] by byte.
static CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = class_of(i as u8);
        i += 1;
    }
    t
};

const fn class_of(b: u8) -> u8 {
    match b {
        b'A'..=b'Z' => b - b'A',
        b'a'..=b'z' => b - b'a',
        b'0'..=b'9' => 26 + (b - b'0'),
        b'_' => 36,
        _ => NON_WORD,
    }
}

fn pair(first: u8, last: u8) -> usize {
    usize::from(CLASS[usize::from(first)]) * CLASSES + usize::from(CLASS[usize::from(last)])
}

/// Every word of every non-fingerprint entry of libinjection's keyword table, split the way
/// [`has_sql_word`] splits input (so multi-word keywords such as `UNION ALL` and dotted names
/// are covered by their parts).
fn sql_words() -> &'static Words {
    static WORDS: OnceLock<Words> = OnceLock::new();
    WORDS.get_or_init(|| {
        let set: HashSet<Box<[u8]>, BuildHasherDefault<Fnv>> =
            libinjectionrs::sqli::sqli_data::SQL_KEYWORDS
                .iter()
                .filter(|k| k.token_type != b'F')
                .flat_map(|k| {
                    k.word
                        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                })
                .filter(|w| !w.is_empty() && w.len() <= MAX_WORD)
                .map(|w| w.to_ascii_uppercase().into_bytes().into_boxed_slice())
                .collect();
        let mut lens = Box::new([0u64; CLASSES * CLASSES]);
        let mut bloom = Box::new([0u64; BLOOM_BITS / 64]);
        for w in &set {
            lens[pair(w[0], w[w.len() - 1])] |= 1u64 << w.len();
            for bit in Words::bloom_bits(fold_hash(w)) {
                bloom[bit / 64] |= 1 << (bit % 64);
            }
        }
        Words { set, lens, bloom }
    })
}

#[cfg(test)]
mod tests {
    use super::super::features;
    use super::*;

    fn full(v: &str) -> bool {
        may_match(v.as_bytes(), features(v.as_bytes())) && detect(v.as_bytes())
    }

    #[test]
    fn blacklist_has_no_fingerprint_of_only_inert_tokens() {
        // The soundness argument of the pre-check, checked against the table in use.
        for k in libinjectionrs::sqli::sqli_data::SQL_KEYWORDS {
            if k.token_type == b'F' {
                let fp = k.word.strip_prefix('0').unwrap_or(k.word);
                assert!(
                    !fp.bytes().all(|b| matches!(b, b'N' | b'1' | b',' | b'O')),
                    "fingerprint {fp} is made of inert tokens"
                );
            }
        }
    }

    #[test]
    fn length_masks_never_hide_a_keyword() {
        let words = sql_words();
        for w in &words.set {
            assert!(lookup(words, w), "{}", String::from_utf8_lossy(w));
            assert!(lookup(words, &w.to_ascii_lowercase()));
        }
        assert!(!lookup(words, b"shoes"));
        assert!(!lookup(words, b""));
        // The Bloom filter keeps out the common words that pass the length masks.
        for w in ["size", "sort", "price", "theme"] {
            assert!(!words.may_contain(fold_hash(w.as_bytes())), "{w}");
        }
    }

    #[test]
    fn pre_check_skips_plain_text_but_not_keywords() {
        let m = |v: &str| may_match(v.as_bytes(), features(v.as_bytes()));
        assert!(!m("running shoes"));
        assert!(!m("550e8400-e29b-41d4-a716-446655440000"));
        assert!(!m("42"));
        assert!(m("1 union select password from users"));
        assert!(m("1union"));
        assert!(m("1e1union"));
        assert!(m("x' --"));
        assert!(m("admin'--"));
        assert!(m("1--"));
    }

    #[test]
    fn the_pre_check_never_hides_a_libinjection_hit() {
        // Random values from the inert alphabet and SQL words: whenever libinjection flags one,
        // the pre-check must have let it through.
        let words = [
            "1", "union", "select", "or", "and", "0x1", "sleep", "admin", "null", "from", "having",
            "by", "a", "x", "char", "3e1", "0", "_", "e", "version", "shoes",
        ];
        let seps = ["", " ", ".", "-", "_", ",", ":", "/", "=", "+", "é"];
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for _ in 0..20_000 {
            let mut v = String::new();
            for _ in 0..1 + next() % 5 {
                v.push_str(words[(next() % words.len() as u64) as usize]);
                v.push_str(seps[(next() % seps.len() as u64) as usize]);
            }
            if libinjectionrs::detect_sqli(v.as_bytes()).is_injection() {
                assert!(may_match(v.as_bytes(), features(v.as_bytes())), "{v:?}");
            }
        }
    }

    #[test]
    fn detects_classic_payloads() {
        for v in [
            "1' OR '1'='1",
            "' or 1=1--",
            "1 UNION SELECT username, password FROM users",
            "1; DROP TABLE users",
            "admin'--",
            "1' AND SLEEP(5)#",
            "') or ('a'='a",
        ] {
            assert!(full(v), "{v}");
        }
    }

    #[test]
    fn passes_prose() {
        for v in [
            "O'Brien",
            "select a plan",
            "drop me a line",
            "Order by phone or email",
            "I'd like to update my address",
            "page 2 of 10",
        ] {
            assert!(!full(v), "{v}");
        }
    }
}
