//! How matches are reported: one `tracing` event per match (target `waf`) with the policy, the
//! rule id, what was done, where in the request, and a short excerpt of the offending value.
//! Values are attacker-controlled: the excerpt is truncated to [`EXCERPT_CHARS`] characters and
//! control characters, quotes and invalid UTF-8 are escaped, so a payload cannot forge log lines
//! or flood them.

use std::fmt;

/// The most characters of a value shown in a log line.
pub const EXCERPT_CHARS: usize = 64;

/// Characters of context shown before the matching offset.
const LEAD: usize = 16;

/// Where in the request a match was found.
#[derive(Debug, Clone, Copy)]
pub enum Location<'a> {
    /// The request as a whole (protocol anomalies, the deny list).
    Request,
    /// The method.
    Method,
    /// The normalised path.
    Path,
    /// The decoded query string.
    Query,
    /// A query argument's value.
    Arg(&'a [u8]),
    /// A query argument's name.
    ArgName(&'a [u8]),
    /// A body field's value (form, multipart or JSON).
    BodyArg(&'a [u8]),
    /// A body field's name.
    BodyArgName(&'a [u8]),
    /// A multipart file name, by field.
    File(&'a [u8]),
    /// A header value.
    Header(&'a str),
    /// A cookie value.
    Cookie(&'a [u8]),
    /// A cookie name.
    CookieName(&'a [u8]),
    /// The raw body.
    Body,
    /// The client address.
    ClientIp,
}

impl fmt::Display for Location<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, name) = match self {
            Self::Request => ("request", None),
            Self::Method => ("method", None),
            Self::Path => ("path", None),
            Self::Query => ("query", None),
            Self::Arg(n) => ("arg:", Some(*n)),
            Self::ArgName(n) => ("arg-name:", Some(*n)),
            Self::BodyArg(n) => ("body-arg:", Some(*n)),
            Self::BodyArgName(n) => ("body-arg-name:", Some(*n)),
            Self::File(n) => ("file:", Some(*n)),
            Self::Header(n) => return write!(f, "header:{n}"),
            Self::Cookie(n) => ("cookie:", Some(*n)),
            Self::CookieName(n) => ("cookie-name:", Some(*n)),
            Self::Body => ("body", None),
            Self::ClientIp => ("client_ip", None),
        };
        f.write_str(kind)?;
        match name {
            Some(n) => Excerpt::new(n, 0).fmt(f),
            None => Ok(()),
        }
    }
}

/// A bounded, escaped view of an inspected value, starting a little before `at`.
pub struct Excerpt<'a> {
    value: &'a [u8],
    at: usize,
}

impl<'a> Excerpt<'a> {
    /// The excerpt of `value` around byte offset `at`.
    pub fn new(value: &'a [u8], at: usize) -> Self {
        Self { value, at }
    }
}

impl fmt::Display for Excerpt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut start = self.at.min(self.value.len()).saturating_sub(LEAD);
        // Start on a character boundary.
        while start > 0 && self.value[start] & 0xC0 == 0x80 {
            start -= 1;
        }
        if start > 0 {
            f.write_str("…")?;
        }
        let mut shown = 0;
        for chunk in self.value[start..].utf8_chunks() {
            for c in chunk.valid().chars() {
                if shown == EXCERPT_CHARS {
                    return f.write_str("…");
                }
                shown += 1;
                match c {
                    '\\' => f.write_str("\\\\")?,
                    '"' => f.write_str("\\\"")?,
                    c if c.is_control() => write!(f, "{}", c.escape_default())?,
                    c => write!(f, "{c}")?,
                }
            }
            for b in chunk.invalid() {
                if shown == EXCERPT_CHARS {
                    return f.write_str("…");
                }
                shown += 1;
                write!(f, "\\x{b:02x}")?;
            }
        }
        Ok(())
    }
}

/// What one match led to (the `action` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The request was refused.
    Block,
    /// A `log` rule: reported only.
    Log,
    /// A blocking rule in a `detect` policy: reported only.
    Detect,
}

impl Outcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Block => "block",
            Self::Log => "log",
            Self::Detect => "detect",
        }
    }
}

/// The facts of one match, logged as one event.
pub struct MatchEvent<'a> {
    /// Policy name.
    pub policy: &'a str,
    /// Route name.
    pub route: &'a str,
    /// Rule id.
    pub rule: u32,
    /// What was done.
    pub outcome: Outcome,
    /// Where.
    pub location: Location<'a>,
    /// The inspected value and the offset of the match.
    pub value: &'a [u8],
    /// Offset in `value`.
    pub at: usize,
    /// The request id (also in the 403 response).
    pub request_id: &'a str,
    /// The client address.
    pub client: std::net::IpAddr,
}

impl MatchEvent<'_> {
    /// Emits the event (target `waf`): `warn` for blocks, `info` otherwise.
    pub fn emit(&self) {
        let excerpt = Excerpt::new(self.value, self.at);
        macro_rules! event {
            ($level:ident) => {
                tracing::$level!(
                    target: "waf",
                    policy = self.policy,
                    route = self.route,
                    rule = self.rule,
                    action = self.outcome.as_str(),
                    location = %self.location,
                    excerpt = %excerpt,
                    request_id = self.request_id,
                    client = %self.client,
                    "WAF match"
                )
            };
        }
        match self.outcome {
            Outcome::Block => event!(warn),
            Outcome::Log | Outcome::Detect => event!(info),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpt_is_bounded_and_escaped() {
        let long = "a".repeat(200);
        let e = Excerpt::new(long.as_bytes(), 0).to_string();
        assert_eq!(e.chars().count(), EXCERPT_CHARS + 1);
        assert!(e.ends_with('…'));
        let e = Excerpt::new(b"x\r\nInjected: 1\x00\"\\", 0).to_string();
        assert_eq!(e, "x\\r\\nInjected: 1\\u{0}\\\"\\\\");
        let e = Excerpt::new(b"caf\xc3\xa9 \xff", 0).to_string();
        assert_eq!(e, "café \\xff");
    }

    #[test]
    fn excerpt_starts_near_the_match_on_a_char_boundary() {
        let v = format!("{}é<script>", "x".repeat(40));
        let at = v.find('<').unwrap();
        let e = Excerpt::new(v.as_bytes(), at).to_string();
        assert!(e.starts_with('…'));
        assert!(e.contains("<script>"));
    }

    #[test]
    fn locations_escape_names() {
        assert_eq!(Location::Arg(b"q").to_string(), "arg:q");
        assert_eq!(Location::Cookie(b"a\nb").to_string(), "cookie:a\\nb");
        assert_eq!(
            Location::Header("user-agent").to_string(),
            "header:user-agent"
        );
    }
}
