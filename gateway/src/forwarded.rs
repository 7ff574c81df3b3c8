//! The client a request names through its forwarding fields, believed only from a listener's
//! `trusted_proxies`: `X-Forwarded-For`, or RFC 7239 `Forwarded` when the request has no
//! `X-Forwarded-For` (as Envoy and nginx, which read only the former). The chain is walked from
//! the right, past trusted hops; the first untrusted address is the client, and when every hop
//! is trusted, the leftmost. A malformed entry, an `unknown` or obfuscated one ends the walk at
//! the last good hop; malformed ones are counted.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use http::HeaderMap;
use http::header::FORWARDED;
use ipnet::IpNet;

/// The most hops kept, from the right: a longer chain of trusted proxies ends there.
const MAX_HOPS: usize = 64;

/// The right end of a chain, as it is read left to right.
#[derive(Default)]
struct Chain(VecDeque<Hop>);

impl Chain {
    fn push(&mut self, hop: Hop) {
        if self.0.len() == MAX_HOPS {
            self.0.pop_front();
        }
        self.0.push_back(hop);
    }
}

/// A listener's `trusted_proxies`.
#[derive(Debug)]
pub struct TrustedProxies {
    nets: Box<[IpNet]>,
}

/// What the forwarding fields of a request say.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Resolved {
    /// The client they name, when they name one (with its port, 0 when not given).
    pub client: Option<SocketAddr>,
    /// The walk stopped at a malformed entry.
    pub invalid: bool,
}

/// One entry of a chain.
#[derive(Debug, PartialEq, Eq)]
enum Hop {
    Addr(SocketAddr),
    /// `unknown`, an obfuscated identifier, or a `Forwarded` element without `for`.
    Unnamed,
    Invalid,
}

impl TrustedProxies {
    /// `None` for an empty list: nothing to check, ever.
    pub fn new(nets: &[IpNet]) -> Option<Self> {
        (!nets.is_empty()).then(|| Self {
            nets: nets.iter().map(IpNet::trunc).collect(),
        })
    }

    /// Whether `ip` is a trusted proxy (an IPv4-mapped IPv6 address as its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.nets.iter().any(|n| n.contains(&ip))
    }

    /// The client `headers` name, from a trusted peer.
    pub fn resolve(&self, headers: &HeaderMap) -> Resolved {
        let xff = headers.get_all("x-forwarded-for");
        let mut hops = Chain::default();
        if xff.iter().next().is_some() {
            for v in xff {
                match v.to_str() {
                    Ok(text) => text.split(',').for_each(|e| hops.push(xff_entry(e))),
                    Err(_) => hops.push(Hop::Invalid),
                }
            }
        } else {
            for v in headers.get_all(FORWARDED) {
                match v.to_str() {
                    Ok(text) => forwarded_elements(text, &mut hops),
                    Err(_) => hops.push(Hop::Invalid),
                }
            }
        }
        self.walk(hops)
    }

    fn walk(&self, hops: Chain) -> Resolved {
        let mut last_good = None;
        for hop in hops.0.into_iter().rev() {
            match hop {
                Hop::Addr(addr) if self.contains(addr.ip()) => last_good = Some(addr),
                Hop::Addr(addr) => {
                    return Resolved {
                        client: Some(addr),
                        invalid: false,
                    };
                }
                Hop::Unnamed => break,
                Hop::Invalid => {
                    return Resolved {
                        client: last_good,
                        invalid: true,
                    };
                }
            }
        }
        Resolved {
            client: last_good,
            invalid: false,
        }
    }
}

/// What the last `X-Forwarded-Proto` value says of the scheme the client used (`https` →
/// `true`, `http` → `false`; anything else says nothing), from a trusted peer. The rightmost
/// value is the nearest proxy's, the one trusted.
pub fn forwarded_https(headers: &HeaderMap) -> Option<bool> {
    let last = headers.get_all("x-forwarded-proto").iter().next_back()?;
    let scheme = last
        .to_str()
        .ok()?
        .rsplit(',')
        .next()?
        .trim_matches([' ', '\t']);
    if scheme.eq_ignore_ascii_case("https") {
        Some(true)
    } else if scheme.eq_ignore_ascii_case("http") {
        Some(false)
    } else {
        None
    }
}

/// Whether a request carries a forwarding field (checked on the HTTP/1.1 fast path's parsed
/// head, for a trusted peer only).
pub fn names_a_client(headers: &[httparse::Header<'_>]) -> bool {
    headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("x-forwarded-for")
            || h.name.eq_ignore_ascii_case("forwarded")
            || h.name.eq_ignore_ascii_case("x-forwarded-proto")
    })
}

/// An `X-Forwarded-For` entry: an address, optionally with a port (`[v6]:port`, `v4:port`).
fn xff_entry(entry: &str) -> Hop {
    let entry = entry.trim_matches([' ', '\t']);
    if entry.eq_ignore_ascii_case("unknown") {
        return Hop::Unnamed;
    }
    address(entry).map_or(Hop::Invalid, Hop::Addr)
}

/// `ip`, `ip:port`, `[v6]` or `[v6]:port`, the address canonical (IPv4-mapped as IPv4).
fn address(text: &str) -> Option<SocketAddr> {
    let addr = if let Ok(ip) = text.parse::<IpAddr>() {
        SocketAddr::new(ip, 0)
    } else if let Ok(sa) = text.parse::<SocketAddr>() {
        sa
    } else {
        let inner = text.strip_prefix('[')?.strip_suffix(']')?;
        SocketAddr::new(IpAddr::V6(inner.parse::<Ipv6Addr>().ok()?), 0)
    };
    Some(SocketAddr::new(addr.ip().to_canonical(), addr.port()))
}

/// Appends the hops of one `Forwarded` field value (RFC 7239 §4): elements separated by
/// commas, pairs by semicolons, values tokens or quoted strings (which may hold either).
fn forwarded_elements(text: &str, hops: &mut Chain) {
    let mut rest = text;
    loop {
        let (hop, after) = forwarded_element(rest);
        hops.push(hop);
        match after {
            Some(next) => rest = next,
            None => return,
        }
    }
}

/// One element: its hop and what follows its comma (`None` at the end, or after an error,
/// which ends the field).
fn forwarded_element(text: &str) -> (Hop, Option<&str>) {
    let mut rest = text;
    let mut hop = Hop::Unnamed;
    loop {
        rest = rest.trim_start_matches([' ', '\t']);
        let Some((name, after)) = rest.split_once('=') else {
            return (Hop::Invalid, None);
        };
        let name = name.trim_end_matches([' ', '\t']);
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return (Hop::Invalid, None);
        }
        let Some((value, after)) = pair_value(after) else {
            return (Hop::Invalid, None);
        };
        if name.eq_ignore_ascii_case("for") {
            hop = for_value(&value);
        }
        let after = after.trim_start_matches([' ', '\t']);
        match after.as_bytes().first() {
            None => return (hop, None),
            Some(b',') => return (hop, Some(&after[1..])),
            Some(b';') => rest = &after[1..],
            Some(_) => return (Hop::Invalid, None),
        }
    }
}

/// A pair's value (a token, or a quoted string unescaped) and what follows it.
fn pair_value(text: &str) -> Option<(String, &str)> {
    let Some(quoted) = text.strip_prefix('"') else {
        let end = text
            .find(|c: char| !is_tchar(c as u8) || !c.is_ascii())
            .unwrap_or(text.len());
        return (end > 0).then(|| (text[..end].to_owned(), &text[end..]));
    };
    let mut value = String::new();
    let mut chars = quoted.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((value, &quoted[i + 1..])),
            '\\' => value.push(chars.next()?.1),
            c => value.push(c),
        }
    }
    None
}

/// A `for` value: `unknown`, an obfuscated `_name`, or an address (IPv6 in brackets), each
/// optionally with a port (which may itself be obfuscated).
fn for_value(value: &str) -> Hop {
    if value.eq_ignore_ascii_case("unknown") || value.starts_with('_') {
        return Hop::Unnamed;
    }
    if let Some(addr) = address(value) {
        return Hop::Addr(addr);
    }
    // An obfuscated port after a real address.
    let node = match value.rsplit_once(':') {
        Some((node, port)) if port.starts_with('_') => node,
        _ => return Hop::Invalid,
    };
    match address(node) {
        Some(addr) if node.starts_with('[') || addr.is_ipv4() => Hop::Addr(addr),
        _ => Hop::Invalid,
    }
}

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trusted() -> TrustedProxies {
        let nets = ["10.0.0.0/8", "127.0.0.1/32", "2001:db8::/32"].map(|n| n.parse().unwrap());
        TrustedProxies::new(&nets).unwrap()
    }

    fn resolve(fields: &[(&str, &str)]) -> Resolved {
        let mut headers = HeaderMap::new();
        for (name, value) in fields {
            headers.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                http::HeaderValue::from_bytes(value.as_bytes()).unwrap(),
            );
        }
        trusted().resolve(&headers)
    }

    fn client(fields: &[(&str, &str)]) -> Option<String> {
        resolve(fields).client.map(|a| a.to_string())
    }

    #[test]
    fn xff_is_walked_from_the_right_past_trusted_hops() {
        let xff = |v| client(&[("x-forwarded-for", v)]);
        assert_eq!(xff("203.0.113.7").as_deref(), Some("203.0.113.7:0"));
        assert_eq!(
            xff("198.51.100.1, 203.0.113.7, 10.0.0.2").as_deref(),
            Some("203.0.113.7:0")
        );
        // Every hop trusted: the leftmost.
        assert_eq!(xff("10.1.1.1, 10.0.0.2").as_deref(), Some("10.1.1.1:0"));
        assert_eq!(
            xff("[2001:db9::1]:4711").as_deref(),
            Some("[2001:db9::1]:4711")
        );
        assert_eq!(xff("2001:db9::1").as_deref(), Some("[2001:db9::1]:0"));
        assert_eq!(xff("::ffff:192.0.2.1").as_deref(), Some("192.0.2.1:0"));
        assert_eq!(xff("192.0.2.1:80").as_deref(), Some("192.0.2.1:80"));
        // Several lines are one list, in order.
        let two = client(&[
            ("x-forwarded-for", "192.0.2.1"),
            ("x-forwarded-for", "10.0.0.1"),
        ]);
        assert_eq!(two.as_deref(), Some("192.0.2.1:0"));
    }

    #[test]
    fn malformed_entries_stop_the_walk_at_the_last_good_hop_and_are_counted() {
        for bad in [
            "192.0.2.1, nonsense, 10.0.0.2",
            "192.0.2.1,, 10.0.0.2",
            "192.0.2.1, 999.1.1.1, 10.0.0.2",
            "192.0.2.1, [::1, 10.0.0.2",
            "192.0.2.1, 1.2.3.4:99999, 10.0.0.2",
        ] {
            let r = resolve(&[("x-forwarded-for", bad)]);
            assert_eq!(
                r.client.map(|a| a.to_string()).as_deref(),
                Some("10.0.0.2:0"),
                "{bad}"
            );
            assert!(r.invalid, "{bad}");
        }
        let r = resolve(&[("x-forwarded-for", "garbage")]);
        assert_eq!(
            r,
            Resolved {
                client: None,
                invalid: true
            }
        );
        // `unknown` is not malformed: the walk ends there, uncounted.
        let r = resolve(&[("x-forwarded-for", "192.0.2.1, unknown, 10.0.0.2")]);
        assert_eq!(
            r.client.map(|a| a.to_string()).as_deref(),
            Some("10.0.0.2:0")
        );
        assert!(!r.invalid);
    }

    #[test]
    fn forwarded_elements_quotes_ports_and_identifiers() {
        let fwd = |v| client(&[("forwarded", v)]);
        assert_eq!(
            fwd("for=192.0.2.60;proto=http;by=203.0.113.43").as_deref(),
            Some("192.0.2.60:0")
        );
        assert_eq!(
            fwd(r#"for="[2001:db9:cafe::17]:4711", for=10.0.0.1"#).as_deref(),
            Some("[2001:db9:cafe::17]:4711")
        );
        assert_eq!(
            fwd(r#"For="192.0.2.43:_hidden""#).as_deref(),
            Some("192.0.2.43:0")
        );
        assert_eq!(
            fwd(r#"for=192.0.2.1;host="a,b;c", for=10.0.0.3"#).as_deref(),
            Some("192.0.2.1:0")
        );
        // Obfuscated and unknown nodes end the walk at the last good hop.
        assert_eq!(
            fwd("for=_gazonk, for=10.0.0.5").as_deref(),
            Some("10.0.0.5:0")
        );
        assert_eq!(fwd("for=unknown").as_deref(), None);
        assert_eq!(
            fwd("proto=https, for=10.0.0.6").as_deref(),
            Some("10.0.0.6:0")
        );
    }

    #[test]
    fn hostile_forwarded_values_are_malformed_never_a_panic() {
        for bad in [
            "for=",
            "for",
            "=1.2.3.4",
            r#"for="1.2.3.4"#,
            r#"for="1.2.3.4\"#,
            "for=1.2.3.4 junk",
            "for=[::1]x",
            "for=\"[::1\"",
            ";;;",
            ",,,",
            "for=2001:db8::1:_x:_y",
            "for=\"[zz]:80\"",
        ] {
            let r = resolve(&[("forwarded", bad), ("forwarded", "for=10.0.0.9")]);
            assert!(r.invalid, "{bad}: {r:?}");
            assert_eq!(
                r.client.map(|a| a.to_string()).as_deref(),
                Some("10.0.0.9:0"),
                "{bad}"
            );
        }
        // A very long chain of trusted hops is kept from the right only.
        let long = vec!["10.0.0.1"; 10_000].join(", ");
        assert_eq!(
            client(&[("x-forwarded-for", &long)]).as_deref(),
            Some("10.0.0.1:0")
        );
        let long = vec!["for=10.0.0.1"; 10_000].join(", ");
        assert!(resolve(&[("forwarded", &long)]).client.is_some());
    }

    #[test]
    fn x_forwarded_for_wins_over_forwarded() {
        let both = [
            ("forwarded", "for=198.51.100.9"),
            ("x-forwarded-for", "192.0.2.1"),
        ];
        assert_eq!(client(&both).as_deref(), Some("192.0.2.1:0"));
    }

    #[test]
    fn bare_addresses_and_mapped_peers() {
        let t = trusted();
        assert!(t.contains("127.0.0.1".parse().unwrap()));
        assert!(!t.contains("127.0.0.2".parse().unwrap()));
        assert!(t.contains("::ffff:10.1.2.3".parse().unwrap()));
        assert!(TrustedProxies::new(&[]).is_none());
    }
}
