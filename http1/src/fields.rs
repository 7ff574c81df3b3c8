//! Field lines as the gateway writes and reads them raw, without an `http::HeaderMap`: the
//! writer every hand-made head uses (requests to upstreams, responses of the fast path, static
//! files, fixed responses), and the rule for reading a raw value as text.

/// Appends one field line as hyper writes it: `name: value` and CRLF.
pub fn push_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// A raw field value as text when `http::HeaderValue::to_str` would take it (visible ASCII and
/// tab), without making a `HeaderValue`: the one place the readers of raw values (the fast
/// path's `Host`, the static files' `Accept-Encoding`, the proxy's forwarded host) apply that
/// rule.
pub fn field_text(value: &[u8]) -> Option<&str> {
    if !value
        .iter()
        .all(|&b| b == b'\t' || (0x20..0x7f).contains(&b))
    {
        return None;
    }
    std::str::from_utf8(value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_is_name_colon_space_value_crlf() {
        let mut out = Vec::new();
        push_field(&mut out, b"content-length", b"5");
        push_field(&mut out, b"x-empty", b"");
        assert_eq!(out, b"content-length: 5\r\nx-empty: \r\n");
    }

    #[test]
    fn text_is_what_header_value_to_str_takes() {
        for value in [
            &b"a b\tc"[..],
            b"",
            b"\x7f",
            b"caf\xc3\xa9",
            b"\x01",
            b"\x80",
        ] {
            let by_http = http::HeaderValue::from_bytes(value)
                .ok()
                .and_then(|v| v.to_str().ok().map(str::to_owned));
            assert_eq!(field_text(value).map(str::to_owned), by_http, "{value:?}");
        }
    }
}
