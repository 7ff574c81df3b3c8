//! Origins as the CORS protocol compares them (`scheme://host[:port]`, the serialization of
//! RFC 6454 that browsers send in `Origin`), and the `allow_origins` patterns of the `cors`
//! filter. Validation and the gateway share this parser, so a pattern accepted at load is
//! compared with requests' origins read by the same rules.

/// A parsed origin, borrowed from the text it was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin<'a> {
    /// The scheme, as written (compared without regard to case).
    pub scheme: &'a str,
    /// The host: a name, an IPv4 address or a bracketed IPv6 address, as written.
    pub host: &'a str,
    /// The port when one is written. Browsers leave out the scheme's default port, so
    /// `https://a.example` and `https://a.example:443` are different origins here, as they are
    /// different strings to a browser's comparison.
    pub port: Option<u16>,
}

impl<'a> Origin<'a> {
    /// Reads `scheme://host[:port]`; `None` for anything else (a path, a query, user
    /// information, an empty label, a stray character, the opaque origin `null`).
    pub fn parse(text: &'a str) -> Option<Self> {
        let (scheme, rest) = text.split_once("://")?;
        if !valid_scheme(scheme) {
            return None;
        }
        let (host, port) = match rest.strip_prefix('[') {
            Some(v6) => {
                let (addr, after) = v6.split_once(']')?;
                let port = match after {
                    "" => None,
                    _ => Some(after.strip_prefix(':')?),
                };
                let v6_text = |b: u8| b.is_ascii_hexdigit() || b == b':' || b == b'.';
                if addr.is_empty() || !addr.bytes().all(v6_text) {
                    return None;
                }
                (&rest[..addr.len() + 2], port)
            }
            None => match rest.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (rest, None),
            },
        };
        if !host.starts_with('[') && !valid_host_name(host) {
            return None;
        }
        let port = match port {
            None => None,
            Some(p) => Some(parse_port(p)?),
        };
        Some(Self { scheme, host, port })
    }
}

fn valid_scheme(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic())
        && bytes.all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
}

/// Dot-separated labels of letters, digits, `-` and `_`, none empty (no trailing dot).
fn valid_host_name(host: &str) -> bool {
    !host.is_empty()
        && host.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

fn parse_port(p: &str) -> Option<u16> {
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    p.parse().ok().filter(|&n| n != 0)
}

/// One `allow_origins` entry, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OriginPattern {
    /// `*`: every origin.
    Any,
    /// One origin (scheme and host lowercase).
    Exact {
        /// Scheme.
        scheme: String,
        /// Host.
        host: String,
        /// Port, when written.
        port: Option<u16>,
    },
    /// `scheme://*.example.com[:port]`: hosts one or more labels under the suffix (never the
    /// suffix itself), with that scheme and port.
    Subdomain {
        /// Scheme.
        scheme: String,
        /// The suffix with its leading dot (`.example.com`), lowercase.
        suffix: String,
        /// Port, when written.
        port: Option<u16>,
    },
}

impl OriginPattern {
    /// Compiles an entry; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text == "*" {
            return Ok(Self::Any);
        }
        let shape = "is not an origin (`scheme://host[:port]`, without a path or a trailing slash), \
                     `*` or `scheme://*.domain`";
        if let Some((scheme, rest)) = text.split_once("://")
            && let Some(domain) = rest.strip_prefix("*.")
        {
            let o = Origin::parse(&format!("{scheme}://{domain}"))
                .map(|o| {
                    (
                        o.scheme.to_ascii_lowercase(),
                        o.host.to_ascii_lowercase(),
                        o.port,
                    )
                })
                .ok_or_else(|| format!("`{text}` {shape}"))?;
            if o.1.starts_with('[') || !o.1.contains('.') {
                return Err(format!(
                    "`{text}`: a wildcard needs a domain of two labels or more under it"
                ));
            }
            return Ok(Self::Subdomain {
                scheme: o.0,
                suffix: format!(".{}", o.1),
                port: o.2,
            });
        }
        let o = Origin::parse(text).ok_or_else(|| format!("`{text}` {shape}"))?;
        Ok(Self::Exact {
            scheme: o.scheme.to_ascii_lowercase(),
            host: o.host.to_ascii_lowercase(),
            port: o.port,
        })
    }

    /// Whether `origin` is allowed by this entry.
    pub fn matches(&self, origin: &Origin<'_>) -> bool {
        match self {
            Self::Any => true,
            Self::Exact { scheme, host, port } => {
                origin.port == *port
                    && origin.scheme.eq_ignore_ascii_case(scheme)
                    && origin.host.eq_ignore_ascii_case(host)
            }
            Self::Subdomain {
                scheme,
                suffix,
                port,
            } => {
                let h = origin.host.as_bytes();
                origin.port == *port
                    && origin.scheme.eq_ignore_ascii_case(scheme)
                    && h.len() > suffix.len()
                    && h[h.len() - suffix.len()..].eq_ignore_ascii_case(suffix.as_bytes())
            }
        }
    }
}

/// The fuzz target's check (`fuzz/fuzz_targets/origin.rs`, replayed on its seed corpus by a
/// test): any text parses or not without a panic; an origin that parses is matched by itself as
/// an entry; what a subdomain wildcard matches is a host under its domain, with its scheme and
/// nothing after the host but a port.
#[doc(hidden)]
pub fn fuzz_origin(text: &str) {
    let _ = OriginPattern::parse(text);
    let Some(origin) = Origin::parse(text) else {
        return;
    };
    let exact = OriginPattern::parse(text).expect("an origin is a valid entry");
    assert!(exact.matches(&origin), "{text}");
    let wildcard = OriginPattern::parse("https://*.example.com").expect("pattern");
    if wildcard.matches(&origin) {
        let host = origin.host.to_ascii_lowercase();
        assert!(origin.scheme.eq_ignore_ascii_case("https"), "{text}");
        assert!(
            host.ends_with(".example.com") && host.len() > ".example.com".len(),
            "{text}"
        );
        assert!(!host.contains(['/', '@', '?', '#', ' ']), "{text}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allows(pattern: &str, origin: &str) -> bool {
        let p = OriginPattern::parse(pattern).unwrap();
        Origin::parse(origin).is_some_and(|o| p.matches(&o))
    }

    #[test]
    fn origins_parse_strictly() {
        let o = Origin::parse("https://App.Example.com:8443").unwrap();
        assert_eq!(
            (o.scheme, o.host, o.port),
            ("https", "App.Example.com", Some(8443))
        );
        assert_eq!(Origin::parse("http://[::1]:8080").unwrap().host, "[::1]");
        assert_eq!(Origin::parse("http://[::1]").unwrap().port, None);
        for bad in [
            "null",
            "",
            "https://",
            "https://a.example/",
            "https://a.example/path",
            "https://a.example?x",
            "https://a.example#x",
            "https://user@a.example",
            "https://a..example",
            "https://a.example.",
            "https://a.example:",
            "https://a.example:0",
            "https://a.example:65536",
            "https://a.example:+80",
            "https://a.example:80:80",
            "https://a example",
            "1https://a.example",
            "https//a.example",
            "http://[::1",
            "http://[::1]x",
            "http://[]",
            "http://[zz]",
        ] {
            assert_eq!(Origin::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn exact_entries_ignore_case_but_not_ports() {
        assert!(allows("https://app.example.com", "https://app.example.com"));
        assert!(allows("https://app.example.com", "HTTPS://APP.example.COM"));
        assert!(!allows(
            "https://app.example.com",
            "https://app.example.com:443"
        ));
        assert!(!allows("https://app.example.com", "http://app.example.com"));
        assert!(!allows(
            "https://app.example.com:8443",
            "https://app.example.com"
        ));
        assert!(allows(
            "https://app.example.com:8443",
            "https://app.example.com:8443"
        ));
        assert!(!allows(
            "https://app.example.com",
            "https://app.example.com.evil.com"
        ));
        assert!(!allows(
            "https://app.example.com",
            "https://evilapp.example.com"
        ));
    }

    #[test]
    fn wildcards_take_one_label_or_more_and_never_the_bare_domain() {
        let p = "https://*.example.com";
        assert!(allows(p, "https://a.example.com"));
        assert!(allows(p, "https://a.b.example.com"));
        assert!(allows(p, "https://A.EXAMPLE.COM"));
        assert!(!allows(p, "https://example.com"));
        assert!(!allows(p, "https://.example.com"));
        assert!(!allows(p, "https://example.com.evil.com"));
        assert!(!allows(p, "https://a.example.com.evil.com"));
        assert!(!allows(p, "https://evilexample.com"));
        assert!(!allows(p, "https://evil.com/.example.com"));
        assert!(!allows(p, "https://evil.com?.example.com"));
        assert!(!allows(p, "https://evil.com#.example.com"));
        assert!(!allows(p, "https://a.example.com@evil.com"));
        assert!(!allows(p, "http://a.example.com"));
        assert!(!allows(p, "https://a.example.com:8443"));
        assert!(allows(
            "https://*.example.com:8443",
            "https://a.example.com:8443"
        ));
    }

    #[test]
    fn bad_patterns_are_refused() {
        for bad in [
            "app.example.com",
            "https://app.example.com/",
            "https://*",
            "https://*.com",
            "https://*example.com",
            "https://a.*.example.com",
            "*.example.com",
            "https://*.[::1]",
        ] {
            assert!(OriginPattern::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(OriginPattern::parse("*"), Ok(OriginPattern::Any));
    }
}
