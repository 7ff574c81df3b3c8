//! `Cache-Control` (RFC 9111 §5.2) parsed from any number of field lines, for requests and
//! answers alike. Hostile input cannot make it fail: unknown directives are skipped, a value
//! that is not delta-seconds makes the directive mean "stale now" (the RFC's advice for invalid
//! freshness), an overlong number saturates at 2^31 seconds, and the first occurrence of a
//! repeated directive wins. Quoted strings may hold commas; an unterminated one ends the field.

use http::HeaderValue;

/// Delta-seconds beyond what can be represented are this (RFC 9111 §1.2.2).
const MAX_DELTA: u64 = 1 << 31;

/// The directives a shared cache acts on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct CacheControl {
    /// `max-age`.
    pub max_age: Option<u64>,
    /// `s-maxage`.
    pub s_maxage: Option<u64>,
    /// `no-store`.
    pub no_store: bool,
    /// `no-cache`, with or without field names (the qualified form is treated as the whole).
    pub no_cache: bool,
    /// `private`, with or without field names (likewise).
    pub private: bool,
    /// `public`.
    pub public: bool,
    /// `must-revalidate` or `proxy-revalidate`.
    pub must_revalidate: bool,
    /// `stale-while-revalidate` (RFC 5861).
    pub stale_while_revalidate: Option<u64>,
    /// `stale-if-error` (RFC 5861).
    pub stale_if_error: Option<u64>,
}

impl CacheControl {
    /// Parses every `Cache-Control` line of a message.
    pub(super) fn parse<'a>(lines: impl IntoIterator<Item = &'a HeaderValue>) -> Self {
        let mut cc = Self::default();
        for line in lines {
            for (name, value) in Directives(line.as_bytes()) {
                cc.apply(name, value);
            }
        }
        cc
    }

    fn apply(&mut self, name: &[u8], value: Option<&[u8]>) {
        let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
        if is("max-age") {
            self.max_age.get_or_insert(delta(value));
        } else if is("s-maxage") {
            self.s_maxage.get_or_insert(delta(value));
        } else if is("no-store") {
            self.no_store = true;
        } else if is("no-cache") {
            self.no_cache = true;
        } else if is("private") {
            self.private = true;
        } else if is("public") {
            self.public = true;
        } else if is("must-revalidate") || is("proxy-revalidate") {
            self.must_revalidate = true;
        } else if is("stale-while-revalidate") {
            self.stale_while_revalidate.get_or_insert(delta(value));
        } else if is("stale-if-error") {
            self.stale_if_error.get_or_insert(delta(value));
        }
    }
}

/// A delta-seconds value; 0 (stale) when missing or malformed.
fn delta(value: Option<&[u8]>) -> u64 {
    let Some(v) = value else { return 0 };
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return 0;
    }
    v.iter()
        .try_fold(0u64, |n, d| {
            n.checked_mul(10)
                .and_then(|n| n.checked_add(u64::from(d - b'0')))
                .filter(|n| *n <= MAX_DELTA)
        })
        .unwrap_or(MAX_DELTA)
}

/// The directives of one field line: `name[=value]`, comma separated, value a token or a
/// quoted string (returned without its quotes; escapes are left as they are, no directive
/// read here needs them).
struct Directives<'a>(&'a [u8]);

impl<'a> Iterator for Directives<'a> {
    type Item = (&'a [u8], Option<&'a [u8]>);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let s = trim_start(self.0);
            if s.is_empty() {
                self.0 = s;
                return None;
            }
            let name_end = s
                .iter()
                .position(|b| matches!(b, b',' | b'='))
                .unwrap_or(s.len());
            let name = trim_end(&s[..name_end]);
            let mut rest = &s[name_end..];
            let mut value = None;
            if rest.first() == Some(&b'=') {
                let v = trim_start(&rest[1..]);
                if v.first() == Some(&b'"') {
                    let end = quoted_end(&v[1..]);
                    value = Some(&v[1..1 + end]);
                    rest = v.get(end + 2..).unwrap_or(&[]);
                } else {
                    let end = v.iter().position(|b| *b == b',').unwrap_or(v.len());
                    value = Some(trim_end(&v[..end]));
                    rest = &v[end..];
                }
            }
            // Skip anything up to the next comma (junk after a quoted value).
            let next = rest
                .iter()
                .position(|b| *b == b',')
                .map_or(rest.len(), |i| i + 1);
            self.0 = &rest[next..];
            if !name.is_empty() {
                return Some((name, value));
            }
        }
    }
}

/// The length of a quoted string's content (`s` starts after the opening quote); all of `s`
/// when it is not closed.
fn quoted_end(s: &[u8]) -> usize {
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'\\' => i += 2,
            b'"' => return i,
            _ => i += 1,
        }
    }
    s.len()
}

fn trim_start(s: &[u8]) -> &[u8] {
    let i = s
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(s.len());
    &s[i..]
}

fn trim_end(s: &[u8]) -> &[u8] {
    let i = s
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t'))
        .map_or(0, |i| i + 1);
    &s[..i]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cc(lines: &[&str]) -> CacheControl {
        let values: Vec<HeaderValue> = lines
            .iter()
            .map(|l| HeaderValue::from_bytes(l.as_bytes()).unwrap())
            .collect();
        CacheControl::parse(&values)
    }

    #[test]
    fn reads_the_usual_directives() {
        let c = cc(&["public, max-age=60", "S-MAXAGE=120, must-revalidate"]);
        assert_eq!(c.max_age, Some(60));
        assert_eq!(c.s_maxage, Some(120));
        assert!(c.public && c.must_revalidate && !c.no_store && !c.private);
        assert!(cc(&["no-store"]).no_store);
        assert!(cc(&["private=\"set-cookie, x\""]).private);
        assert!(cc(&["no-cache=\"a,b\", max-age=5"]).no_cache);
        assert_eq!(cc(&["no-cache=\"a,b\", max-age=5"]).max_age, Some(5));
        assert!(cc(&["proxy-revalidate"]).must_revalidate);
        let c = cc(&["max-age=1, stale-while-revalidate=30, stale-if-error=300"]);
        assert_eq!(
            (c.stale_while_revalidate, c.stale_if_error),
            (Some(30), Some(300))
        );
    }

    #[test]
    fn first_occurrence_wins_and_quoted_values_count() {
        assert_eq!(cc(&["max-age=10, max-age=1000"]).max_age, Some(10));
        assert_eq!(cc(&["max-age=\"30\""]).max_age, Some(30));
        assert_eq!(cc(&[" max-age = 7 "]).max_age, Some(7));
    }

    #[test]
    fn bad_values_mean_stale_and_big_ones_saturate() {
        assert_eq!(cc(&["max-age=abc"]).max_age, Some(0));
        assert_eq!(cc(&["max-age"]).max_age, Some(0));
        assert_eq!(cc(&["max-age=-5"]).max_age, Some(0));
        assert_eq!(cc(&["max-age=1.5"]).max_age, Some(0));
        assert_eq!(
            cc(&["max-age=99999999999999999999999999"]).max_age,
            Some(MAX_DELTA)
        );
        assert_eq!(cc(&["max-age=2147483649"]).max_age, Some(MAX_DELTA));
    }

    #[test]
    fn hostile_input_is_survived() {
        assert_eq!(cc(&[""]), CacheControl::default());
        assert_eq!(cc(&[",,,, ,=,=5,"]), CacheControl::default());
        assert!(cc(&["private=\"unterminated, no-store"]).private);
        assert!(!cc(&["private=\"unterminated, no-store"]).no_store);
        assert!(cc(&["x=\"a\\\"b\" junk, no-store"]).no_store);
        assert!(cc(&["x=\"\\"]).max_age.is_none());
        let long = "a,".repeat(50_000) + "no-store";
        assert!(cc(&[&long]).no_store);
    }

    /// Every byte string a header value can hold parses without panicking (a cheap stand-in
    /// for the fuzz target, run on every test).
    #[test]
    fn random_bytes_never_panic() {
        let alphabet = b" \t,=\"\\max-age0123456789nostrecpublivatd";
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            let len = (seed % 40) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    alphabet[(seed % alphabet.len() as u64) as usize]
                })
                .collect();
            if let Ok(v) = HeaderValue::from_bytes(&bytes) {
                let _ = CacheControl::parse([&v]);
            }
            seed = seed.wrapping_add(1);
        }
    }
}
