//! Request body parsers for inspection: URL-encoded forms (also used for the query string),
//! `multipart/form-data` and JSON. They hand out borrowed slices of the buffered body (JSON
//! strings are unescaped by serde) and never panic on malformed input: a body that does not
//! parse as its declared type is an error the caller reports (and then inspects raw).

use std::ops::ControlFlow;

/// A body the parsers understand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind<'a> {
    /// `application/x-www-form-urlencoded`.
    Form,
    /// `multipart/form-data` with its boundary.
    Multipart(&'a [u8]),
    /// `application/json` or `*/*+json`.
    Json,
    /// Anything else: only `body` rules see it.
    Other,
}

impl<'a> BodyKind<'a> {
    /// Classifies a `Content-Type` value.
    pub fn of(content_type: &'a [u8]) -> Self {
        let mut params = content_type.split(|b| *b == b';');
        let essence = params.next().unwrap_or_default().trim_ascii();
        let is = |s: &[u8]| essence.eq_ignore_ascii_case(s);
        if is(b"application/x-www-form-urlencoded") {
            return Self::Form;
        }
        if is(b"multipart/form-data") {
            let boundary = params.find_map(|p| {
                let (k, v) = split_once(p.trim_ascii(), b'=')?;
                k.eq_ignore_ascii_case(b"boundary")
                    .then(|| trim_quotes(v.trim_ascii()))
            });
            return match boundary {
                Some(b) if !b.is_empty() && b.len() <= 200 => Self::Multipart(b),
                _ => Self::Other,
            };
        }
        let json = is(b"application/json")
            || essence.len() > 5 && essence[essence.len() - 5..].eq_ignore_ascii_case(b"+json");
        if json { Self::Json } else { Self::Other }
    }
}

fn split_once(v: &[u8], sep: u8) -> Option<(&[u8], &[u8])> {
    let i = memchr::memchr(sep, v)?;
    Some((&v[..i], &v[i + 1..]))
}

fn trim_quotes(v: &[u8]) -> &[u8] {
    match v {
        [b'"', inner @ .., b'"'] => inner,
        _ => v,
    }
}

/// `name=value` pairs of a query string or form body, still encoded. Empty pairs are skipped;
/// a pair without `=` has an empty value.
pub fn pairs(input: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    raw_pairs(input).map(split_pair)
}

/// The `name=value` pairs of [`pairs`], not yet split.
pub fn raw_pairs(input: &[u8]) -> impl Iterator<Item = &[u8]> {
    input.split(|b| *b == b'&').filter(|p| !p.is_empty())
}

/// A pair of [`raw_pairs`] as name and value (empty without `=`).
pub fn split_pair(pair: &[u8]) -> (&[u8], &[u8]) {
    split_once(pair, b'=').unwrap_or((pair, &[]))
}

/// One multipart field.
#[derive(Debug, PartialEq, Eq)]
pub struct Part<'a> {
    /// The field name (`name=` of `Content-Disposition`).
    pub name: &'a [u8],
    /// The file name, for file uploads.
    pub filename: Option<&'a [u8]>,
    /// The content.
    pub content: &'a [u8],
}

/// The body is not what its `Content-Type` says.
#[derive(Debug, PartialEq, Eq)]
pub struct Malformed;

/// Calls `each` for every part of a multipart body.
pub fn multipart<'a>(
    body: &'a [u8],
    boundary: &[u8],
    mut each: impl FnMut(Part<'a>) -> ControlFlow<()>,
) -> Result<ControlFlow<()>, Malformed> {
    let mut delim = Vec::with_capacity(boundary.len() + 2);
    delim.extend_from_slice(b"--");
    delim.extend_from_slice(boundary);
    let finder = memchr::memmem::Finder::new(&delim);
    // The first delimiter starts the body or a line.
    let mut pos = finder
        .find_iter(body)
        .find(|&i| i == 0 || body[i - 1] == b'\n')
        .ok_or(Malformed)?;
    loop {
        let after = pos + delim.len();
        let rest = body.get(after..).ok_or(Malformed)?;
        if rest.starts_with(b"--") {
            return Ok(ControlFlow::Continue(()));
        }
        let line_end = memchr::memchr(b'\n', rest).ok_or(Malformed)?;
        let start = after + line_end + 1;
        // The next delimiter, at the start of a line.
        let next = finder
            .find_iter(&body[start..])
            .map(|i| start + i)
            .find(|&i| body[i - 1] == b'\n')
            .ok_or(Malformed)?;
        let mut end = next - 1;
        if end > start && body[end - 1] == b'\r' {
            end -= 1;
        }
        let part = parse_part(&body[start..end.max(start)])?;
        if each(part).is_break() {
            return Ok(ControlFlow::Break(()));
        }
        pos = next;
    }
}

fn parse_part(raw: &[u8]) -> Result<Part<'_>, Malformed> {
    let (head, content) = match memchr::memmem::find(raw, b"\r\n\r\n") {
        Some(i) => (&raw[..i], &raw[i + 4..]),
        None => {
            let i = memchr::memmem::find(raw, b"\n\n").ok_or(Malformed)?;
            (&raw[..i], &raw[i + 2..])
        }
    };
    let mut name = None;
    let mut filename = None;
    for line in head.split(|b| *b == b'\n') {
        let Some((k, v)) = split_once(line, b':') else {
            continue;
        };
        if !k.trim_ascii().eq_ignore_ascii_case(b"content-disposition") {
            continue;
        }
        for param in v.split(|b| *b == b';').skip(1) {
            let Some((pk, pv)) = split_once(param.trim_ascii(), b'=') else {
                continue;
            };
            let pv = trim_quotes(pv.trim_ascii());
            if pk.eq_ignore_ascii_case(b"name") {
                name = Some(pv);
            } else if pk.eq_ignore_ascii_case(b"filename") || pk.eq_ignore_ascii_case(b"filename*")
            {
                filename = Some(pv);
            }
        }
    }
    Ok(Part {
        name: name.ok_or(Malformed)?,
        filename,
        content,
    })
}

/// Calls `each(name, value, is_key)` for every object key and string value of a JSON document;
/// `name` is the dotted path (`user.address.city`, array items by index: `tags.0`).
pub fn json(
    body: &[u8],
    mut each: impl FnMut(&[u8], &[u8], bool) -> ControlFlow<()>,
) -> Result<ControlFlow<()>, Malformed> {
    // serde_json refuses documents nested deeper than 128 levels, which also bounds the walk.
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|_| Malformed)?;
    let mut path = Vec::new();
    Ok(walk(&value, &mut path, &mut each))
}

fn walk(
    v: &serde_json::Value,
    path: &mut Vec<u8>,
    each: &mut impl FnMut(&[u8], &[u8], bool) -> ControlFlow<()>,
) -> ControlFlow<()> {
    use serde_json::Value;
    let len = path.len();
    let child = |path: &mut Vec<u8>, segment: &[u8]| {
        if !path.is_empty() {
            path.push(b'.');
        }
        path.extend_from_slice(segment);
    };
    match v {
        Value::String(s) => each(path, s.as_bytes(), false)?,
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                child(path, i.to_string().as_bytes());
                let flow = walk(item, path, each);
                path.truncate(len);
                flow?;
            }
        }
        Value::Object(map) => {
            for (k, item) in map {
                child(path, k.as_bytes());
                let flow = match each(path, k.as_bytes(), true) {
                    ControlFlow::Continue(()) => walk(item, path, each),
                    stop => stop,
                };
                path.truncate(len);
                flow?;
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
    ControlFlow::Continue(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types() {
        assert_eq!(
            BodyKind::of(b"application/x-www-form-urlencoded; charset=UTF-8"),
            BodyKind::Form
        );
        assert_eq!(
            BodyKind::of(b"multipart/form-data; boundary=\"abc\""),
            BodyKind::Multipart(b"abc")
        );
        assert_eq!(BodyKind::of(b"multipart/form-data"), BodyKind::Other);
        assert_eq!(BodyKind::of(b"Application/JSON"), BodyKind::Json);
        assert_eq!(BodyKind::of(b"application/vnd.api+json"), BodyKind::Json);
        assert_eq!(BodyKind::of(b"text/plain"), BodyKind::Other);
        assert_eq!(BodyKind::of(b""), BodyKind::Other);
    }

    #[test]
    fn form_pairs() {
        let p: Vec<_> = pairs(b"a=1&&b&c=x=y").collect();
        assert_eq!(p, [(&b"a"[..], &b"1"[..]), (b"b", b""), (b"c", b"x=y")]);
    }

    #[test]
    fn multipart_fields_and_files() {
        let body = b"preamble\r\n--XyZ\r\nContent-Disposition: form-data; name=\"comment\"\r\n\r\nhello\r\nworld\r\n--XyZ\r\nContent-Disposition: form-data; name=\"up\"; filename=\"a.txt\"\r\nContent-Type: text/plain\r\n\r\nfile body\r\n--XyZ--\r\n";
        let mut parts = Vec::new();
        let r = multipart(body, b"XyZ", |p| {
            parts.push((
                p.name.to_vec(),
                p.filename.map(<[u8]>::to_vec),
                p.content.to_vec(),
            ));
            ControlFlow::Continue(())
        });
        assert_eq!(r, Ok(ControlFlow::Continue(())));
        assert_eq!(
            parts[0],
            (b"comment".to_vec(), None, b"hello\r\nworld".to_vec())
        );
        assert_eq!(
            parts[1],
            (
                b"up".to_vec(),
                Some(b"a.txt".to_vec()),
                b"file body".to_vec()
            )
        );
    }

    #[test]
    fn malformed_multipart() {
        let ok = |b: &[u8]| multipart(b, b"B", |_| ControlFlow::Continue(())).is_ok();
        assert!(!ok(b"no delimiter"));
        assert!(!ok(
            b"--B\r\nContent-Disposition: form-data; name=a\r\n\r\nunterminated"
        ));
        assert!(!ok(b"--B\r\nno blank line\r\n--B--"));
        assert!(!ok(b"--B"));
        assert!(ok(b"--B--"));
    }

    #[test]
    fn json_paths() {
        let mut seen = Vec::new();
        let r = json(
            br#"{"user":{"name":"O'Brien","tags":["a",1,"b"]},"n":2}"#,
            |n, v, key| {
                seen.push((
                    String::from_utf8_lossy(n).into_owned(),
                    String::from_utf8_lossy(v).into_owned(),
                    key,
                ));
                ControlFlow::Continue(())
            },
        );
        assert!(r.is_ok());
        let names: Vec<_> = seen
            .iter()
            .map(|s| (s.0.as_str(), s.1.as_str(), s.2))
            .collect();
        assert!(names.contains(&("user.name", "O'Brien", false)));
        assert!(names.contains(&("user.tags.2", "b", false)));
        assert!(names.contains(&("user", "user", true)));
        assert!(json(b"{bad", |_, _, _| ControlFlow::Continue(())).is_err());
        let deep = "[".repeat(10_000);
        assert!(json(deep.as_bytes(), |_, _, _| ControlFlow::Continue(())).is_err());
    }

    #[test]
    fn hostile_multipart_never_panics() {
        for b in [
            &b"--B\n"[..],
            b"--B\r",
            b"x\n--B\n\n--B",
            b"--B\nContent-Disposition:;;=\n\n\n--B--",
            b"\n--B\r\n\r\n\r\n--B",
        ] {
            let _ = multipart(b, b"B", |_| ControlFlow::Continue(()));
        }
    }
}
