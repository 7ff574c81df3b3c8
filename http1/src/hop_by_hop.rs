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

/// Whether a `TE` value names `trailers`: the one value that means something end to end (gRPC
/// needs it), so the one kept of a removed `TE`.
pub fn wants_trailers(te: &[u8]) -> bool {
    std::str::from_utf8(te).is_ok_and(|v| {
        v.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b))
            && v.split(',').any(|t| {
                t.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .eq_ignore_ascii_case("trailers")
            })
    })
}

/// What becomes of one raw field of a message forwarded to the next hop ([`EndToEnd::judge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judged {
    /// An end-to-end field: it goes on as it is.
    Forward,
    /// A field of this hop: it stays.
    Drop,
    /// The message's first `TE`, which names `trailers`: it goes on as `TE: trailers` alone.
    Trailers,
}

/// The hop-by-hop rule for a message's raw fields, as they were read: [`NAMES`] stay on this
/// hop, and so do the fields `Connection` names; of `TE`, the first one is judged alone, and goes
/// on as `trailers` when it names it. The proxy removes the same fields from hyper's header maps
/// by the same pieces ([`NAMES`], [`connection_tokens`], [`wants_trailers`]).
pub struct EndToEnd<'f> {
    fields: &'f [httparse::Header<'f>],
    /// `Connection` names a field beyond [`NAMES`] (most messages' say only `keep-alive` or
    /// `close`, and then no field is looked up in its tokens).
    names_others: bool,
    te_seen: bool,
}

impl<'f> EndToEnd<'f> {
    /// The rule for the message of `fields`.
    pub fn of(fields: &'f [httparse::Header<'f>]) -> Self {
        let names_others = connection_tokens_of(fields).any(|token| token_bit(token) == 0);
        Self {
            fields,
            names_others,
            te_seen: false,
        }
    }

    /// What becomes of `f`, one of the message's fields, taken in order.
    pub fn judge(&mut self, f: &httparse::Header<'_>) -> Judged {
        let name = f.name.as_bytes();
        if token_bit(name) != 0 {
            if name.len() == 2 && !self.te_seen {
                self.te_seen = true;
                if wants_trailers(f.value) {
                    return Judged::Trailers;
                }
            }
            return Judged::Drop;
        }
        if self.names_others
            && connection_tokens_of(self.fields).any(|token| token.eq_ignore_ascii_case(name))
        {
            return Judged::Drop;
        }
        Judged::Forward
    }
}

/// The non-empty tokens of a message's `Connection` values, trimmed: the one reading of a
/// `Connection` list, for raw fields and header maps alike.
pub fn connection_tokens<'v>(
    values: impl IntoIterator<Item = &'v [u8]>,
) -> impl Iterator<Item = &'v [u8]> {
    values
        .into_iter()
        .flat_map(|v| v.split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|token| !token.is_empty())
}

/// The tokens of every `Connection` field among `fields`.
fn connection_tokens_of<'f>(fields: &'f [httparse::Header<'f>]) -> impl Iterator<Item = &'f [u8]> {
    connection_tokens(
        fields
            .iter()
            .filter(|f| f.name.len() == 10 && f.name.eq_ignore_ascii_case("connection"))
            .map(|f| f.value),
    )
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

    fn judged(head: &str) -> Vec<(String, Judged)> {
        let mut fields = [httparse::EMPTY_HEADER; 16];
        let mut req = httparse::Request::new(&mut fields);
        let text = format!("GET / HTTP/1.1\r\n{head}\r\n");
        assert!(req.parse(text.as_bytes()).unwrap().is_complete());
        let mut rule = EndToEnd::of(req.headers);
        req.headers
            .iter()
            .map(|f| (f.name.to_owned(), rule.judge(f)))
            .collect()
    }

    #[test]
    fn fields_of_this_hop_stay_and_the_first_te_naming_trailers_goes_on_alone() {
        use Judged::*;
        let got = judged(
            "Connection: Keep-Alive ,X-Secret,, close\r\nX-Secret: 1\r\n\
             X-Secretive: a name is matched whole\r\nclose: named\r\nKeep-Alive: 5\r\n\
             TE: gzip, trailers;q=1\r\nTE: trailers\r\nUpgrade: websocket\r\n\
             Transfer-Encoding: chunked\r\nProxy-Authorization: x\r\nAccept: */*\r\n",
        );
        let want = [
            ("Connection", Drop),
            ("X-Secret", Drop),
            ("X-Secretive", Forward),
            ("close", Drop),
            ("Keep-Alive", Drop),
            ("TE", Trailers),
            ("TE", Drop),
            ("Upgrade", Drop),
            ("Transfer-Encoding", Drop),
            ("Proxy-Authorization", Drop),
            ("Accept", Forward),
        ];
        let want: Vec<_> = want.iter().map(|(n, j)| (n.to_string(), *j)).collect();
        assert_eq!(got, want);
        assert_eq!(
            judged("TE: gzip\r\nTE: trailers\r\n")[1].1,
            Drop,
            "the first TE decides"
        );
        assert!(!wants_trailers(b"trailersx") && wants_trailers(b" Trailers "));
    }
}
