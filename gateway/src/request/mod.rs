//! What every request must be, and is made into, when it enters: a valid `Host` (RFC 9112 §3.2)
//! and a normalized path, before routing, filters, plugins or a terminal see it. The rules are
//! pure functions over the request's head, shared by the general path (through the listener's
//! policy, for HTTP/1.1, HTTP/2 and HTTP/3 alike) and the HTTP/1.1 fast path, which takes only
//! requests these rules leave unchanged.

use http::uri::{Authority, PathAndQuery};
use http::{HeaderMap, Request, Uri, Version, header};

pub mod host;
pub mod path;
pub mod rewrite;

pub use path::{EscapedSlashes, PathRefusal, PathRules};

/// A listener's entry rules, fixed at config load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EntryRules {
    /// How paths are normalized.
    pub path: PathRules,
    /// Send the upstream the target as the client wrote it instead of the normalized one.
    pub forward_original: bool,
    /// Refuse targets with bytes outside RFC 3986 (`{`, `}`, `|`, `^`, `\`, ...) that other
    /// servers take.
    pub strict_uri: bool,
}

/// The target as the client wrote it, kept beside a request whose path was normalized when the
/// listener forwards originals.
#[derive(Debug, Clone)]
pub struct OriginalTarget(pub PathAndQuery);

/// Why a request was refused on entry; each is answered `400`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryRefusal {
    /// An HTTP/1.1 request without `Host`.
    MissingHost,
    /// More than one `Host` line.
    DuplicateHost,
    /// A `Host` (or `:authority`) that is no host.
    InvalidHost,
    /// An absolute-form target or `:authority` with userinfo (`http://user@host/`).
    Userinfo,
    /// A target with bytes outside RFC 3986, on a `strict_uri` listener.
    InvalidTarget,
    /// A path that cannot be normalized safely.
    Path(PathRefusal),
}

impl EntryRefusal {
    /// Every reason, for registering counters up front.
    pub const REASONS: [&'static str; 7] = [
        "missing_host",
        "duplicate_host",
        "invalid_host",
        "userinfo_in_target",
        "invalid_target",
        "invalid_path_escape",
        "escaped_slash",
    ];

    /// The `reason` label of `gateway_http_rejected_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::MissingHost => Self::REASONS[0],
            Self::DuplicateHost => Self::REASONS[1],
            Self::InvalidHost => Self::REASONS[2],
            Self::Userinfo => Self::REASONS[3],
            Self::InvalidTarget => Self::REASONS[4],
            Self::Path(p) => p.reason(),
        }
    }
}

/// Makes `req`'s head what every route, filter and terminal may rely on, or says why it is
/// refused: its authority checked, its target held to RFC 3986 on a strict listener, its path
/// normalized. (The listener's policy then removes the client's hop-by-hop fields with the
/// proxy's table of them.)
pub fn enter<B>(req: &mut Request<B>, rules: &EntryRules) -> Result<(), EntryRefusal> {
    check_host(req.version(), req.uri(), req.headers())?;
    let target = req.uri().path_and_query().map_or("", |p| p.as_str());
    if rules.strict_uri && !is_rfc3986_target(target) {
        return Err(EntryRefusal::InvalidTarget);
    }
    normalize_target(req, rules)
}

/// Checks the authority a request names: its `Host` lines and the target's or `:authority`'s.
pub fn check_host(version: Version, uri: &Uri, headers: &HeaderMap) -> Result<(), EntryRefusal> {
    let mut hosts = headers.get_all(header::HOST).iter();
    let first = hosts.next();
    if hosts.next().is_some() {
        return Err(EntryRefusal::DuplicateHost);
    }
    if let Some(authority) = uri.authority() {
        check_authority(authority)?;
    } else if first.is_none() && version == Version::HTTP_11 {
        return Err(EntryRefusal::MissingHost);
    }
    match first {
        Some(value) if !host::is_valid(value.as_bytes()) => Err(EntryRefusal::InvalidHost),
        _ => Ok(()),
    }
}

fn check_authority(authority: &Authority) -> Result<(), EntryRefusal> {
    let text = authority.as_str();
    if text.contains('@') {
        return Err(EntryRefusal::Userinfo);
    }
    if host::is_valid(text.as_bytes()) {
        Ok(())
    } else {
        Err(EntryRefusal::InvalidHost)
    }
}

/// Whether every byte of a request target is one RFC 3986 allows there: unreserved,
/// sub-delimiters, `:`, `@`, `/`, `?` and `%` (escapes are checked by the path rules).
pub fn is_rfc3986_target(target: &str) -> bool {
    target.bytes().all(|b| {
        b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
                    | b':'
                    | b'@'
                    | b'/'
                    | b'?'
                    | b'%'
            )
    })
}

/// Whether an HTTP/1.1 request with this one `Host` value (or none) and origin-form `path`
/// passes the entry rules without a change: the HTTP/1.1 fast path answers only those and
/// leaves the rest to the general path, where they are refused or normalized.
pub fn passes_unchanged(host: Option<&[u8]>, path: &str, rules: &EntryRules) -> bool {
    host.is_some_and(host::is_valid)
        && (!rules.strict_uri || is_rfc3986_target(path))
        && matches!(
            path::normalize(path, &rules.path),
            Ok(std::borrow::Cow::Borrowed(_))
        )
}

/// Replaces the request's path with its normal form under `rules`, keeping the original beside
/// it when the listener forwards originals. Nothing is allocated for a path already normal.
pub fn normalize_target<B>(req: &mut Request<B>, rules: &EntryRules) -> Result<(), EntryRefusal> {
    let normal = match path::normalize(req.uri().path(), &rules.path) {
        Ok(std::borrow::Cow::Borrowed(_)) => return Ok(()),
        Ok(std::borrow::Cow::Owned(normal)) => normal,
        Err(refusal) => return Err(EntryRefusal::Path(refusal)),
    };
    let mut target = normal;
    if let Some(query) = req.uri().query() {
        target.push('?');
        target.push_str(query);
    }
    // The normal form of a valid path is a valid path: only ASCII the parser took, fewer dots.
    let Ok(target) = PathAndQuery::try_from(target) else {
        return Err(EntryRefusal::Path(PathRefusal::InvalidEscape));
    };
    let mut parts = std::mem::take(req.uri_mut()).into_parts();
    let original = parts.path_and_query.replace(target);
    if rules.forward_original
        && let Some(original) = original
    {
        req.extensions_mut().insert(OriginalTarget(original));
    }
    *req.uri_mut() = Uri::from_parts(parts).unwrap_or_default();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(target: &str, hosts: &[&str]) -> Request<()> {
        let mut b = Request::get(target);
        for h in hosts {
            b = b.header(header::HOST, *h);
        }
        b.body(()).unwrap()
    }

    fn host_verdict(req: &Request<()>) -> Result<(), EntryRefusal> {
        check_host(req.version(), req.uri(), req.headers())
    }

    #[test]
    fn host_lines_follow_rfc_9112() {
        assert_eq!(host_verdict(&head("/", &["a.example"])), Ok(()));
        assert_eq!(
            host_verdict(&head("/", &[])),
            Err(EntryRefusal::MissingHost)
        );
        assert_eq!(
            host_verdict(&head("/", &["a", "b"])),
            Err(EntryRefusal::DuplicateHost)
        );
        assert_eq!(
            host_verdict(&head("/", &["a\"b"])),
            Err(EntryRefusal::InvalidHost)
        );
        let mut http10 = head("/", &[]);
        *http10.version_mut() = Version::HTTP_10;
        assert_eq!(host_verdict(&http10), Ok(()));
        assert_eq!(host_verdict(&head("http://a.example/p", &[])), Ok(()));
        assert_eq!(
            host_verdict(&head("http://x@evil/p", &["evil"])),
            Err(EntryRefusal::Userinfo)
        );
    }

    #[test]
    fn a_normalized_target_keeps_its_query_and_authority() {
        let mut req = head("http://a.example/x/../y?q=/../", &[]);
        normalize_target(&mut req, &EntryRules::default()).unwrap();
        assert_eq!(req.uri().to_string(), "http://a.example/y?q=/../");
        assert!(req.extensions().get::<OriginalTarget>().is_none());

        let rules = EntryRules {
            forward_original: true,
            ..EntryRules::default()
        };
        let mut req = head("/a//b?z", &[]);
        normalize_target(&mut req, &rules).unwrap();
        assert_eq!(req.uri(), "/a/b?z");
        let original = req.extensions().get::<OriginalTarget>().unwrap();
        assert_eq!(original.0.as_str(), "/a//b?z");
    }

    #[test]
    fn rfc_3986_targets_are_told_from_what_other_servers_take() {
        assert!(is_rfc3986_target("/a-b._~/c;d=e,f?g=h&i=%20@:!$'()*+"));
        for bad in [
            "/a{b}", "/a|b", "/a^b", "/a\\b", "/a\"b", "/a<b>", "/a`b", "/a b",
        ] {
            assert!(!is_rfc3986_target(bad), "{bad}");
        }
    }

    #[test]
    fn a_refused_path_leaves_the_request_alone() {
        let mut req = head("/a%2Fb", &[]);
        assert_eq!(
            normalize_target(&mut req, &EntryRules::default()),
            Err(EntryRefusal::Path(PathRefusal::EscapedSlash))
        );
        assert_eq!(req.uri(), "/a%2Fb");
    }
}
