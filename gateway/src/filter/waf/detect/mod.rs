//! The built-in detectors and what they share: stable rule ids, a one-pass byte classification
//! that lets each detector skip values it cannot match, and a cache of benign verdicts.
//!
//! Cost model: most values in real traffic (`page=2`, `sort=name`, session tokens) are plain
//! words. The classification (one table lookup per byte) proves that for them, and nothing else
//! runs. The libinjection port is the costly step, so it only runs when a cheap, sound
//! pre-check says the value could tokenize into a blacklisted fingerprint, and its benign verdicts
//! for repeated values (user agents, referers, common arguments) are remembered.

pub mod cmdi;
pub mod scanner;
pub mod sqli;
pub mod traversal;
pub mod xss;

pub(crate) mod cache;

use gateway_config::model::WafDetector;

/// Stable ids of the built-in rules, reported in logs and metrics (`rule` label).
pub mod ids {
    /// Client address in the policy's `deny` list.
    pub const DENY_LIST: u32 = 900_001;
    /// SQL injection (libinjection fingerprint).
    pub const SQLI: u32 = 900_100;
    /// Cross-site scripting (libinjection HTML5 tokenizer).
    pub const XSS: u32 = 900_200;
    /// Script-bearing URI (`javascript:`, `vbscript:`, `data:text/html`).
    pub const XSS_URI: u32 = 900_201;
    /// `..` path segments.
    pub const TRAVERSAL: u32 = 900_300;
    /// Well-known sensitive files (`/etc/passwd`, `win.ini`, `/.git/`).
    pub const SENSITIVE_FILE: u32 = 900_301;
    /// A known scanner's user agent.
    pub const SCANNER: u32 = 900_400;
    /// `Content-Length` together with `Transfer-Encoding` (request smuggling).
    pub const CL_AND_TE: u32 = 900_500;
    /// More request headers than [`super::super::inspect::MAX_HEADERS`].
    pub const TOO_MANY_HEADERS: u32 = 900_501;
    /// More arguments than [`super::super::inspect::MAX_ARGS`].
    pub const TOO_MANY_ARGS: u32 = 900_502;
    /// A `%` not followed by two hex digits.
    pub const INVALID_PERCENT: u32 = 900_503;
    /// A NUL byte in the path, an argument or a cookie.
    pub const NUL_BYTE: u32 = 900_504;
    /// `%uXXXX` or overlong UTF-8: encodings only evasion tools produce.
    pub const ENCODING_EVASION: u32 = 900_505;
    /// A body that does not parse as its declared content type.
    pub const MALFORMED_BODY: u32 = 900_506;
    /// Shell command injection.
    pub const CMDI: u32 = 900_600;
    /// Shellshock function definition in a header.
    pub const SHELLSHOCK: u32 = 900_601;

    /// Every built-in id with its detector and a short description (docs and metrics).
    pub const ALL: [(u32, Option<super::WafDetector>, &str); 16] = [
        (DENY_LIST, None, "client address in the deny list"),
        (SQLI, Some(super::WafDetector::Sqli), "SQL injection"),
        (XSS, Some(super::WafDetector::Xss), "cross-site scripting"),
        (XSS_URI, Some(super::WafDetector::Xss), "script URI"),
        (
            TRAVERSAL,
            Some(super::WafDetector::PathTraversal),
            "path traversal",
        ),
        (
            SENSITIVE_FILE,
            Some(super::WafDetector::PathTraversal),
            "sensitive file",
        ),
        (
            SCANNER,
            Some(super::WafDetector::Scanner),
            "scanner user agent",
        ),
        (
            CL_AND_TE,
            Some(super::WafDetector::Protocol),
            "Content-Length with Transfer-Encoding",
        ),
        (
            TOO_MANY_HEADERS,
            Some(super::WafDetector::Protocol),
            "too many headers",
        ),
        (
            TOO_MANY_ARGS,
            Some(super::WafDetector::Protocol),
            "too many arguments",
        ),
        (
            INVALID_PERCENT,
            Some(super::WafDetector::Protocol),
            "invalid percent-encoding",
        ),
        (NUL_BYTE, Some(super::WafDetector::Protocol), "NUL byte"),
        (
            ENCODING_EVASION,
            Some(super::WafDetector::Protocol),
            "%u or overlong UTF-8 encoding",
        ),
        (
            MALFORMED_BODY,
            Some(super::WafDetector::Protocol),
            "malformed body",
        ),
        (
            CMDI,
            Some(super::WafDetector::CommandInjection),
            "command injection",
        ),
        (
            SHELLSHOCK,
            Some(super::WafDetector::CommandInjection),
            "shellshock",
        ),
    ];
}

/// Which built-in detectors a policy runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Enabled {
    /// SQL injection.
    pub sqli: bool,
    /// Cross-site scripting.
    pub xss: bool,
    /// Path traversal and sensitive files.
    pub traversal: bool,
    /// Scanner user agents.
    pub scanner: bool,
    /// Protocol anomalies.
    pub protocol: bool,
    /// Command injection.
    pub cmdi: bool,
}

impl Enabled {
    /// From the policy's `detect:` list.
    pub fn from_list(list: &[WafDetector]) -> Self {
        let mut e = Self::default();
        for d in list {
            match d {
                WafDetector::Sqli => e.sqli = true,
                WafDetector::Xss => e.xss = true,
                WafDetector::PathTraversal => e.traversal = true,
                WafDetector::Scanner => e.scanner = true,
                WafDetector::Protocol => e.protocol = true,
                WafDetector::CommandInjection => e.cmdi = true,
            }
        }
        e
    }

    /// Whether a detector that inspects argument values is on.
    pub fn inspects_values(&self) -> bool {
        self.sqli || self.xss || self.traversal || self.cmdi
    }

    fn bits(&self) -> u8 {
        u8::from(self.sqli)
            | u8::from(self.xss) << 1
            | u8::from(self.traversal) << 2
            | u8::from(self.cmdi) << 3
    }
}

/// What kind of value is inspected; decides which detectors apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The normalised path.
    Path,
    /// A query, form, JSON or cookie name.
    Name,
    /// An argument or cookie value.
    Value,
    /// A header value inspected like an argument (`User-Agent`, `Referer`).
    Header,
    /// A multipart file name.
    Filename,
}

/// A detector's finding: the rule and a byte offset near the suspicious part (for the excerpt).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hit {
    /// Rule id (see [`ids`]).
    pub rule: u32,
    /// Offset in the inspected value.
    pub at: usize,
}

impl Hit {
    fn new(rule: u32, at: usize) -> Self {
        Self { rule, at }
    }
}

// === Byte classes ===

/// Bits of [`features`].
pub mod feat {
    /// A byte that can form a SQL token other than a word, number, comma or operator.
    pub const SQL_SPECIAL: u32 = 1;
    /// A letter.
    pub const ALPHA: u32 = 1 << 1;
    /// `<`.
    pub const LT: u32 = 1 << 2;
    /// `=`.
    pub const EQ: u32 = 1 << 3;
    /// `:`.
    pub const COLON: u32 = 1 << 4;
    /// `&`.
    pub const AMP: u32 = 1 << 5;
    /// `.`.
    pub const DOT: u32 = 1 << 6;
    /// `/` or `\`.
    pub const SEP: u32 = 1 << 7;
    /// A shell separator or substitution: `; | & $ \`` or a line break.
    pub const SHELL: u32 = 1 << 8;
    /// `-`.
    pub const DASH: u32 = 1 << 9;
    /// NUL.
    pub const NUL: u32 = 1 << 10;
    /// Whitespace.
    pub const SPACE: u32 = 1 << 11;
}

const fn class(b: u8) -> u32 {
    use feat::*;
    let sql_safe = b.is_ascii_alphanumeric()
        || b >= 0x80
        || b <= b' '
        || b == 0x7F
        || matches!(b, b'_' | b'.' | b',' | b':' | b'-' | b'/' | b'=' | b'+');
    let mut c = if sql_safe { 0 } else { SQL_SPECIAL };
    if b.is_ascii_alphabetic() {
        c |= ALPHA;
    }
    c |= match b {
        b'<' => LT,
        b'=' => EQ,
        b':' => COLON,
        b'&' => AMP | SHELL,
        b'.' => DOT,
        b'/' | b'\\' => SEP,
        b';' | b'|' | b'`' | b'$' | b'\n' | b'\r' => SHELL,
        b'-' => DASH,
        0 => NUL,
        _ => 0,
    };
    if b == b' ' || b == b'\t' || b == 0x0B || b == 0x0C {
        c |= SPACE;
    }
    c
}

static CLASSES: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = class(i as u8);
        i += 1;
    }
    t
};

/// The union of the byte classes of `v` (one table lookup per byte).
pub fn features(v: &[u8]) -> u32 {
    v.iter().fold(0, |acc, b| acc | CLASSES[*b as usize])
}

// === The detector set ===

/// The built-in value detectors of one policy.
#[derive(Debug, Clone, Copy)]
pub struct Detectors {
    enabled: Enabled,
}

impl Detectors {
    /// Detectors for `enabled`.
    pub fn new(enabled: Enabled) -> Self {
        Self { enabled }
    }

    /// What the policy runs.
    pub fn enabled(&self) -> Enabled {
        self.enabled
    }

    /// Runs the content detectors (SQLi, XSS, traversal, command injection) that apply to `kind`
    /// on an already decoded value.
    pub fn inspect(&self, kind: Kind, v: &[u8]) -> Option<Hit> {
        self.inspect_classified(kind, v, features(v))
    }

    /// [`Self::inspect`] for a caller that already has `f` = [`features`] of `v` (it needs them
    /// for its own checks too, so the value is classified once).
    pub fn inspect_classified(&self, kind: Kind, v: &[u8], f: u32) -> Option<Hit> {
        if v.is_empty() || self.enabled.bits() == 0 {
            return None;
        }
        let traversal = self.enabled.traversal && kind != Kind::Name;
        let cmdi = self.enabled.cmdi && matches!(kind, Kind::Value | Kind::Header | Kind::Filename);
        let sqli = self.enabled.sqli && sqli::may_match(v, f);
        let xss = self.enabled.xss && xss::may_match(f);
        if !sqli && !xss {
            return Self::cheap(kind, v, f, traversal, cmdi);
        }
        // A remembered benign verdict covers every detector of the set (the tag includes it),
        // so a repeated user agent or referer costs one lookup.
        let tag = cache::Tag::detectors(self.enabled.bits(), kind as u8);
        if cache::is_benign(tag, v) {
            return None;
        }
        let hit = Self::cheap(kind, v, f, traversal, cmdi)
            .or_else(|| self.expensive(kind, v, f, sqli, xss));
        if hit.is_none() {
            cache::remember_benign(tag, v);
        }
        hit
    }

    /// The detectors that cost a scan at most: traversal and command injection.
    fn cheap(kind: Kind, v: &[u8], f: u32, traversal: bool, cmdi: bool) -> Option<Hit> {
        if traversal && let Some(h) = traversal::detect(v, f, kind == Kind::Path) {
            return Some(h);
        }
        if cmdi {
            return cmdi::detect(v, f);
        }
        None
    }

    fn expensive(&self, kind: Kind, v: &[u8], f: u32, sqli: bool, xss: bool) -> Option<Hit> {
        if xss && let Some(h) = xss::detect(v, f) {
            return Some(h);
        }
        if sqli {
            if kind == Kind::Path {
                // Per segment: a leading `/api/users/` would otherwise shift the fingerprint.
                let mut start = 0;
                for seg in v.split(|b| *b == b'/') {
                    if sqli::may_match(seg, features(seg)) && sqli::detect(seg) {
                        return Some(Hit::new(ids::SQLI, start));
                    }
                    start += seg.len() + 1;
                }
            } else if sqli::detect(v) {
                return Some(Hit::new(ids::SQLI, 0));
            }
        }
        None
    }
}

/// Runs a third-party parser on hostile input without letting a bug in it take the request
/// task down; a parser that panics on a value has been handed something crafted, so it counts
/// as a match.
fn guarded(f: impl FnOnce() -> bool + std::panic::UnwindSafe) -> bool {
    std::panic::catch_unwind(f).unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Detectors {
        Detectors::new(Enabled {
            sqli: true,
            xss: true,
            traversal: true,
            scanner: true,
            protocol: true,
            cmdi: true,
        })
    }

    #[test]
    fn plain_words_have_no_special_features() {
        let f = features(b"running shoes, size 42");
        assert_eq!(f & feat::SQL_SPECIAL, 0);
        assert_ne!(f & feat::ALPHA, 0);
        assert_ne!(features(b"a'b") & feat::SQL_SPECIAL, 0);
    }

    #[test]
    fn benign_values_pass_and_attacks_do_not() {
        let d = all();
        for v in [
            "page",
            "2",
            "running shoes",
            "name,email",
            "2024-01-01",
            "O'Brien",
        ] {
            assert_eq!(d.inspect(Kind::Value, v.as_bytes()), None, "{v}");
        }
        let rule = |v: &str| d.inspect(Kind::Value, v.as_bytes()).map(|h| h.rule);
        assert_eq!(rule("1' OR '1'='1"), Some(ids::SQLI));
        assert_eq!(rule("<script>alert(1)</script>"), Some(ids::XSS));
        assert_eq!(rule("../../etc/passwd"), Some(ids::TRAVERSAL));
        assert_eq!(rule("x; ls -la"), Some(ids::CMDI));
        // Twice: the second answer may come from the cache and must agree.
        assert_eq!(rule("1' OR '1'='1"), Some(ids::SQLI));
        assert_eq!(d.inspect(Kind::Value, b"a plain sentence for you"), None);
        assert_eq!(d.inspect(Kind::Value, b"a plain sentence for you"), None);
    }

    #[test]
    fn path_sqli_is_checked_per_segment() {
        let d = all();
        let h = d
            .inspect(Kind::Path, b"/api/users/1 or 1=1")
            .map(|h| h.rule);
        assert_eq!(h, Some(ids::SQLI));
        assert_eq!(d.inspect(Kind::Path, b"/api/v1/users/42/orders"), None);
    }

    #[test]
    fn disabled_detectors_do_not_run() {
        let d = Detectors::new(Enabled {
            xss: true,
            ..Enabled::default()
        });
        assert_eq!(d.inspect(Kind::Value, b"1' OR '1'='1"), None);
    }
}
