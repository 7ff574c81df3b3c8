//! Fuzz checks of the entry rules every request passes (`crate::request`): path normalization,
//! the `Host` check, and the fast path's test that a request passes them unchanged.

use std::borrow::Cow;

use http::uri::{Authority, PathAndQuery};
use http::{HeaderMap, HeaderValue, Request, Uri, Version, header};

use crate::request::path::normalize;
use crate::request::{
    EntryRules, EscapedSlashes, OriginalTarget, PathRefusal, PathRules, check_host, enter, host,
    passes_unchanged,
};

/// Every combination of path rules, for the checks that hold under each.
const ALL_PATH_RULES: [PathRules; 6] = [
    rules(true, EscapedSlashes::Reject),
    rules(true, EscapedSlashes::Keep),
    rules(true, EscapedSlashes::Decode),
    rules(false, EscapedSlashes::Reject),
    rules(false, EscapedSlashes::Keep),
    rules(false, EscapedSlashes::Decode),
];

const fn rules(merge_slashes: bool, escaped_slashes: EscapedSlashes) -> PathRules {
    PathRules {
        merge_slashes,
        escaped_slashes,
    }
}

/// Whether `path` holds an escaped slash or backslash (either case) or a raw backslash.
fn has_escaped_separator(path: &str) -> bool {
    let upper = path.to_ascii_uppercase();
    upper.contains("%2F") || upper.contains("%5C") || path.contains('\\')
}

/// Input: a byte choosing the rules (bit 0 off: slashes merged; the rest modulo 3: `%2F` and
/// `\` refused, kept or decoded), then the path. Its normal form is normal (normalizing it again
/// borrows), starts with `/` and has no dot segment, no `//` when slashes merge, no escaped or
/// raw separator unless they are kept (and no raw `\` then either), only ASCII when the path
/// was ASCII, only escapes of characters that are not unreserved, in upper case; it is never
/// longer than the path, but for the two bytes a raw `\` gains as `%5C`; and a path `http`
/// takes has a normal form `http` takes.
pub fn path_normalize(data: &[u8]) {
    let [control, path @ ..] = data else {
        return;
    };
    let Ok(path) = std::str::from_utf8(path) else {
        return;
    };
    let rules = ALL_PATH_RULES[usize::from(*control & 1) * 3 + usize::from(*control >> 1) % 3];
    let out = match normalize(path, &rules) {
        Ok(out) => out,
        Err(PathRefusal::InvalidEscape) => {
            assert!(path.contains('%'), "an escape refused in {path:?}");
            return;
        }
        Err(PathRefusal::EscapedSlash) => {
            assert!(
                rules.escaped_slashes == EscapedSlashes::Reject && has_escaped_separator(path),
                "an escaped slash refused in {path:?} under {rules:?}"
            );
            return;
        }
    };
    if let Cow::Owned(owned) = &out {
        assert_ne!(owned, path, "an unchanged path was copied");
    }
    assert!(
        matches!(normalize(&out, &rules), Ok(Cow::Borrowed(again)) if again == out),
        "{path:?} -> {out:?} is not normal under {rules:?}"
    );
    if !path.starts_with('/') {
        assert_eq!(out, path, "a path without a leading `/` changed");
        return;
    }
    assert!(out.starts_with('/'));
    assert!(
        !out[1..].split('/').any(|s| s == "." || s == ".."),
        "{path:?} -> {out:?} has a dot segment"
    );
    if rules.merge_slashes {
        assert!(
            !out.contains("//"),
            "{path:?} -> {out:?}: slashes not merged"
        );
    }
    match rules.escaped_slashes {
        EscapedSlashes::Keep => assert!(!out.contains('\\'), "{out:?} has a raw `\\`"),
        _ => assert!(
            !has_escaped_separator(&out),
            "{out:?} has a separator escaped"
        ),
    }
    if path.is_ascii() {
        assert!(out.is_ascii(), "{path:?} -> {out:?} is not ASCII");
    }
    for (i, _) in out.match_indices('%') {
        let hex = out.get(i + 1..i + 3).unwrap_or_default();
        assert!(
            hex.len() == 2
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b)),
            "{out:?}: an escape that is not two upper-case hex digits"
        );
        let value = u8::from_str_radix(hex, 16).expect("two hex digits");
        assert!(
            !(value.is_ascii_alphanumeric() || b"-._~".contains(&value)),
            "{out:?}: an unreserved character left escaped"
        );
    }
    let gained = match rules.escaped_slashes {
        EscapedSlashes::Keep => 2 * path.matches('\\').count(),
        _ => 0,
    };
    assert!(out.len() <= path.len() + gained, "{path:?} -> {out:?} grew");
    if let Ok(parsed) = PathAndQuery::try_from(path)
        && parsed.path() == path
    {
        let normal = PathAndQuery::try_from(&*out).expect("a normal form http takes");
        assert_eq!(normal.path(), out);
    }
}

/// Input: a `Host` value, optionally followed by a line feed and an origin-form path. A host
/// the rules accept holds no `"`, `,`, `;`, space, control or non-ASCII byte and, when not
/// empty, is an `http` authority; as a `Host` line it is judged the same on HTTP/1.1 and
/// HTTP/1.0, and a second line always refuses the request; as the authority of an absolute-form
/// target it passes exactly when it has no userinfo and the rules accept it. The fast path's
/// test agrees with the general path: a request passes unchanged exactly when its `Host` passes
/// and normalizing leaves the request as it is, under every path rule.
pub fn host(data: &[u8]) {
    let (value, path) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], Some(&data[i + 1..])),
        None => (data, None),
    };
    let valid = host::is_valid(value);
    if valid {
        assert!(
            !value.iter().any(|&b| matches!(b, b'"' | b',' | b';' | b' ')
                || b.is_ascii_control()
                || !b.is_ascii()),
            "accepted {:?}",
            String::from_utf8_lossy(value)
        );
        if !value.is_empty() {
            assert!(
                Authority::try_from(value).is_ok(),
                "accepted {:?}, which http refuses as an authority",
                String::from_utf8_lossy(value)
            );
        }
    }
    let Ok(line) = HeaderValue::from_bytes(value) else {
        return;
    };
    let origin = Uri::from_static("/");
    let mut headers = HeaderMap::new();
    headers.insert(header::HOST, line.clone());
    for version in [Version::HTTP_11, Version::HTTP_10] {
        assert_eq!(
            check_host(version, &origin, &headers).is_ok(),
            valid,
            "{line:?} on {version:?}"
        );
    }
    let mut twice = headers.clone();
    twice.append(header::HOST, line.clone());
    assert!(check_host(Version::HTTP_11, &origin, &twice).is_err());
    if let Ok(absolute) = Uri::try_from([b"http://", value, b"/"].concat())
        && let Some(authority) = absolute.authority()
    {
        let passes = check_host(Version::HTTP_11, &absolute, &HeaderMap::new()).is_ok();
        let expected =
            !authority.as_str().contains('@') && host::is_valid(authority.as_str().as_bytes());
        assert_eq!(passes, expected, "authority {authority}");
    }
    if let Some(path) = path {
        fast_path_agrees(&line, path);
    }
}

/// [`passes_unchanged`] against the general path's own rules for an HTTP/1.1 request with this
/// `Host` line and origin-form `path`.
fn fast_path_agrees(line: &HeaderValue, path: &[u8]) {
    let Ok(target) = PathAndQuery::try_from(path) else {
        return;
    };
    // Origin form only: the fast path is given the path, without the query.
    if !target.as_str().starts_with('/') || target.query().is_some() {
        return;
    }
    for path_rules in ALL_PATH_RULES {
        for (forward_original, strict_uri) in [(false, false), (true, false), (false, true)] {
            let rules = EntryRules {
                path: path_rules,
                forward_original,
                strict_uri,
            };
            let Ok(mut request) = Request::get(target.as_str())
                .header(header::HOST, line.clone())
                .body(())
            else {
                // A path `http` takes only as part of a larger target.
                return;
            };
            let before = request.uri().clone();
            // The general path's own rules, as its policy applies them.
            let unchanged = enter(&mut request, &rules).is_ok()
                && *request.uri() == before
                && request.extensions().get::<OriginalTarget>().is_none();
            assert_eq!(
                passes_unchanged(Some(line.as_bytes()), target.path(), &rules),
                unchanged,
                "host {line:?}, path {:?}, {rules:?}",
                target.path()
            );
        }
    }
}
