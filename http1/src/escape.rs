//! Percent-encoding of one byte (RFC 3986 §2.1), for request targets: the framing checks
//! escape the bytes other servers take raw ([`crate::framing::escape_target`]), and the
//! gateway's path normalization writes the escapes it keeps.

/// Appends `b` percent-encoded: `%` and two upper-case hex digits (RFC 3986 §6.2.2.1).
pub fn push_escaped(out: &mut Vec<u8>, b: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_byte_becomes_a_percent_and_two_upper_case_digits() {
        let mut out = Vec::new();
        for b in [b'"', b'\\', 0x00, 0xff] {
            push_escaped(&mut out, b);
        }
        assert_eq!(out, b"%22%5C%00%FF");
    }
}
