//! Header-value text written by hand: client addresses on the request path (forwarding headers,
//! WAF inspection), without the formatting machinery for IPv4, which costs more than the rest of
//! those headers together; quoted strings; and decimal numbers (rate-limit fields, log lines).

use std::net::IpAddr;

/// Appends `text` as a quoted string: in quotes, with `"` and `\` escaped, so the value cannot
/// end the string early and add parameters of its own. For printable ASCII this is both an HTTP
/// quoted-string (RFC 9110 §5.6.4) and a structured-field string (RFC 8941 §3.3.3).
pub fn push_quoted(out: &mut String, text: &str) {
    out.reserve(text.len() + 2);
    quoted_pieces(text, |piece| out.push_str(piece));
}

/// [`push_quoted`] into bytes: the fast path's request text takes it in place, sparing every
/// proxied request the allocation and copy of a `String` made for it.
pub fn push_quoted_bytes(out: &mut Vec<u8>, text: &str) {
    out.reserve(text.len() + 2);
    quoted_pieces(text, |piece| out.extend_from_slice(piece.as_bytes()));
}

/// Hands `text` as a quoted string to `put`, piece by piece: one rule for both forms above.
fn quoted_pieces<'a>(text: &'a str, mut put: impl FnMut(&'a str)) {
    put("\"");
    // Most texts (a host, a route name) need no escape: copied whole, not a char at a time.
    let mut rest = text;
    while let Some(i) = memchr::memchr2(b'"', b'\\', rest.as_bytes()) {
        put(&rest[..i]);
        put("\\");
        put(&rest[i..=i]);
        rest = &rest[i + 1..];
    }
    put(rest);
    put("\"");
}

/// `n` in decimal.
pub fn push_decimal(out: &mut Vec<u8>, n: u64) {
    push_padded(out, n, 1);
}

/// `n` in decimal, with leading zeros to at least `width` digits.
pub fn push_padded(out: &mut Vec<u8>, mut n: u64, width: usize) {
    let mut digits = [b'0'; 20];
    let mut start = digits.len();
    while n > 0 || start == digits.len() {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
    }
    let start = start.min(digits.len() - width.min(digits.len()));
    out.extend_from_slice(&digits[start..]);
}

/// `ip` as text, formatted on the stack (an address is at most 45 characters); IPv4 by hand,
/// the common case, without the formatting machinery.
pub fn ip_text(ip: IpAddr, buf: &mut [u8; 48]) -> &[u8] {
    match ip {
        IpAddr::V4(v4) => {
            let mut n = 0;
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    buf[n] = b'.';
                    n += 1;
                }
                if octet >= 100 {
                    buf[n] = b'0' + octet / 100;
                    n += 1;
                }
                if octet >= 10 {
                    buf[n] = b'0' + octet / 10 % 10;
                    n += 1;
                }
                buf[n] = b'0' + octet % 10;
                n += 1;
            }
            &buf[..n]
        }
        IpAddr::V6(_) => {
            let mut w = &mut buf[..];
            let _ = std::io::Write::write_fmt(&mut w, format_args!("{ip}"));
            let len = 48 - w.len();
            &buf[..len]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_display() {
        for ip in [
            "0.0.0.0",
            "1.2.3.4",
            "9.10.99.100",
            "255.255.255.255",
            "10.0.200.7",
            "::1",
            "2001:db8::8a2e:370:7334",
            "::ffff:192.0.2.1",
            "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            let mut buf = [0u8; 48];
            assert_eq!(ip_text(ip, &mut buf), ip.to_string().as_bytes());
        }
    }

    #[test]
    fn quoted_strings_escape_quotes_and_backslashes_only() {
        for (text, quoted) in [
            ("", r#""""#),
            ("api.example.com:8080", r#""api.example.com:8080""#),
            (r#"a";by=evil"#, r#""a\";by=evil""#),
            (r"\", r#""\\""#),
            (r#"""#, r#""\"""#),
            (r#"x"y\z""#, r#""x\"y\\z\"""#),
            ("é", "\"é\""),
        ] {
            let mut out = String::from("host=");
            push_quoted(&mut out, text);
            assert_eq!(out, format!("host={quoted}"), "{text:?}");
            let mut bytes = b"host=".to_vec();
            push_quoted_bytes(&mut bytes, text);
            assert_eq!(bytes, out.as_bytes(), "{text:?}");
        }
    }
}
