//! The hop-by-hop fields (RFC 9110 §7.6.1): those that describe one connection and are never
//! forwarded, plus the pre-standard `Keep-Alive` and `Proxy-Connection`, and HTTP/2's
//! `HTTP2-Settings`. A message's set of them is a mask with bit `i` for entry `i` of [`NAMES`],
//! so the proxy removes only the ones present, and the trailer rules
//! ([`crate::trailers::is_forbidden`]) refuse them all.

use http::header::{self, HeaderName};

/// The hop-by-hop fields, removed whatever `Connection` says.
pub static NAMES: [HeaderName; 9] = [
    header::CONNECTION,
    header::TE,
    header::UPGRADE,
    header::TRANSFER_ENCODING,
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    HeaderName::from_static("http2-settings"),
];

/// `Connection`'s bit: the fields it names go too.
pub const CONNECTION_BIT: u16 = 1;
/// `TE`'s bit: its `trailers` may be kept.
pub const TE_BIT: u16 = 1 << 1;
/// `Upgrade`'s bit: kept when the request switches protocols.
pub const UPGRADE_BIT: u16 = 1 << 2;
/// `Proxy-Authorization` and `Proxy-Authenticate`: addressed to this hop.
pub const PROXY_AUTH_BITS: u16 = 1 << 4 | 1 << 5;

/// `name`'s bit when it is one of [`NAMES`], else 0. Every field of every proxied message goes
/// through this, twice per request: the name's length picks the one or two entries worth
/// comparing, rather than comparing it with each `HeaderName` in turn. Names in a `HeaderMap`
/// are lower case and compared as they are; `Connection` tokens come in any case.
#[inline]
fn bit_by(name: &[u8], same: impl Fn(&[u8], &[u8]) -> bool) -> u16 {
    let is = |known: &str| same(name, known.as_bytes());
    let index = match name.len() {
        2 if is("te") => 1,
        7 if is("upgrade") => 2,
        10 if is("connection") => 0,
        10 if is("keep-alive") => 6,
        14 if is("http2-settings") => 8,
        16 if is("proxy-connection") => 7,
        17 if is("transfer-encoding") => 3,
        18 if is("proxy-authenticate") => 5,
        19 if is("proxy-authorization") => 4,
        _ => return 0,
    };
    1 << index
}

/// [`NAMES`]' bit for a name in a `HeaderMap` (lower case), else 0.
#[inline]
pub fn bit(name: &HeaderName) -> u16 {
    bit_by(name.as_str().as_bytes(), |a, b| a == b)
}

/// [`NAMES`]' bit for a name in any case (a `Connection` token, a raw field name), else 0.
#[inline]
pub fn token_bit(token: &[u8]) -> u16 {
    bit_by(token, <[u8]>::eq_ignore_ascii_case)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hop_by_hop_names_are_recognised() {
        // Each name has its own bit, and bit `i` is entry `i`'s: removal goes by the entry, so
        // a wrong bit would remove a header that is not there and leave one that is.
        for (i, name) in NAMES.iter().enumerate() {
            assert_eq!(bit(name), 1 << i, "{name}");
            // `Connection` tokens come in any case.
            let upper = name.as_str().to_ascii_uppercase();
            assert_eq!(token_bit(upper.as_bytes()), 1 << i, "{upper}");
        }
        // The bits handled apart are those of their names.
        assert_eq!(bit(&header::CONNECTION), CONNECTION_BIT);
        assert_eq!(bit(&header::TE), TE_BIT);
        assert_eq!(bit(&header::UPGRADE), UPGRADE_BIT);
        assert_eq!(
            bit(&header::PROXY_AUTHORIZATION) | bit(&header::PROXY_AUTHENTICATE),
            PROXY_AUTH_BITS
        );
        for name in [
            "host",
            "x-forwarded-for",
            "trailer",
            "keep",
            "content-length",
            // The lengths of hop-by-hop names, with other names.
            "tk",
            "upgrada",
            "connectiom",
            "keep-alivf",
            "http2-settingz",
            "proxy-connectioo",
            "transfer-encodinh",
            "proxy-authenticatf",
            "proxy-authorizatioo",
        ] {
            assert_eq!(bit(&HeaderName::from_static(name)), 0, "{name}");
            assert_eq!(token_bit(name.as_bytes()), 0, "{name}");
        }
    }
}
