//! The `Host` a request may name (RFC 9112 §3.2, RFC 3986 §3.2.2): a registered name, an IPv4
//! address or a bracketed IPv6 literal, with an optional port of digits. The value is copied
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
        [b'[', literal @ .., b']'] => {
            !literal.is_empty()
                && literal
                    .iter()
                    .all(|&b| b.is_ascii_hexdigit() || matches!(b, b':' | b'.'))
        }
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
}
