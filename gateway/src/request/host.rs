//! The `Host` a request may name (RFC 9112 §3.2, RFC 3986 §3.2.2): a registered name, an IPv4
//! address or a bracketed IPv6 address, with an optional port of digits. The value is copied
//! into `Host`, `X-Forwarded-Host` and `Forwarded` towards the upstream and into logs, so
//! anything that could end a field, start another list element or quote (quotes, commas,
//! semicolons, spaces, controls) is refused, even where RFC 3986 lets a registered name carry
//! it. An empty value is allowed (RFC 9112 §3.2: a target without an authority).

/// Whether `value` is a `Host` the gateway accepts.
pub fn is_valid(value: &[u8]) -> bool {
    let (host, port) = split_port(value);
    if !port.iter().all(u8::is_ascii_digit) {
        return false;
    }
    match host {
        // An address, not just its characters: `[:::::::::]` is none, and `http` refuses an
        // authority with more colons than an address can have.
        [b'[', literal @ .., b']'] => std::str::from_utf8(literal)
            .is_ok_and(|text| text.parse::<std::net::Ipv6Addr>().is_ok()),
        _ => host
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')),
    }
}

/// `value` split at its port's colon; the port is empty when there is none.
fn split_port(value: &[u8]) -> (&[u8], &[u8]) {
    let after_literal = if value.first() == Some(&b'[') {
        value.iter().position(|&b| b == b']').map_or(0, |i| i + 1)
    } else {
        0
    };
    match value[after_literal..].iter().rposition(|&b| b == b':') {
        Some(i) if after_literal == 0 || i == 0 => {
            let colon = after_literal + i;
            (&value[..colon], &value[colon + 1..])
        }
        // Bytes between `]` and a colon: not a host, refused by the host check.
        Some(_) => (value, &[]),
        None => (value, &[]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_addresses_and_ports_are_accepted() {
        for ok in [
            "example.com",
            "Example.COM:8080",
            "a-b_c~d.example",
            "127.0.0.1",
            "127.0.0.1:80",
            "[::1]",
            "[::1]:443",
            "[2001:db8::7]:8443",
            "[::ffff:10.0.0.1]",
            "host:",
            "",
        ] {
            assert!(is_valid(ok.as_bytes()), "{ok}");
        }
    }

    #[test]
    fn characters_that_could_split_a_forwarded_field_are_refused() {
        for bad in [
            "evil\"x",
            "a,b",
            "a;b",
            "a b",
            "a\tb",
            "a/b",
            "a@b",
            "a:b:c",
            "a:8o",
            "[::1",
            "[]",
            "[::1]x:80",
            "[::1]x",
            "[zz]",
            "a\x00",
            "é.example",
        ] {
            assert!(!is_valid(bad.as_bytes()), "{bad:?}");
        }
    }

    #[test]
    fn a_bracketed_host_is_an_ipv6_address() {
        // Hex digits and colons are not enough: none of these is an address, and `http` refuses
        // an authority with more colons than an address can have (`[:::::::::]`).
        for bad in [
            "[:]",
            "[:::::::::]",
            "[1:2:3:4:5:6:7:8:9]",
            "[1:::2]",
            "[::1%25eth0]",
        ] {
            assert!(!is_valid(bad.as_bytes()), "{bad:?}");
        }
        for ok in [
            "[1:2:3:4:5:6:7:8]",
            "[::]",
            "[1:2:3:4:5:6:7::]",
            "[::ffff:1.2.3.4]:1",
        ] {
            assert!(is_valid(ok.as_bytes()), "{ok}");
            assert!(ok.parse::<http::uri::Authority>().is_ok(), "{ok}");
        }
    }
}
