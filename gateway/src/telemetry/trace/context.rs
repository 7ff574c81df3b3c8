//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): parsing an incoming
//! `traceparent`, checking `tracestate`, formatting the `traceparent` sent upstream, and fresh
//! random ids. Pure functions over bytes, so the rules are unit-tested here without a gateway.

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};

/// `traceparent`.
pub static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// `tracestate`.
pub static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Length of a version-00 `traceparent`: `00-` + 32 + `-` + 16 + `-` + 2.
pub const TRACEPARENT_LEN: usize = 55;

/// Longest `tracestate` propagated; the spec lets vendors drop what they cannot carry, and a
/// longer one is more likely abuse than 32 well-formed members.
const MAX_TRACESTATE: usize = 512;

/// 16 random bytes naming a trace; never all zero.
pub type TraceId = [u8; 16];
/// 8 random bytes naming a span; never all zero.
pub type SpanId = [u8; 8];

/// The identity of a span as it travels between processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanContext {
    /// The trace.
    pub trace_id: TraceId,
    /// The span.
    pub span_id: SpanId,
    /// Whether the trace is recorded (the `sampled` flag).
    pub sampled: bool,
}

/// A valid incoming parent: its context and the `tracestate` to carry on.
#[derive(Debug, Clone)]
pub struct RemoteParent {
    /// The caller's span.
    pub context: SpanContext,
    /// `tracestate`, when present and well formed.
    pub state: Option<HeaderValue>,
}

/// The parent a request names, if it names exactly one valid `traceparent`. Anything else
/// (absent, repeated, malformed, zero ids, version `ff`) means "start a new trace", as the spec
/// asks.
pub fn extract(headers: &HeaderMap) -> Option<RemoteParent> {
    let mut all = headers.get_all(&TRACEPARENT).iter();
    let value = all.next()?;
    if all.next().is_some() {
        return None;
    }
    let context = parse_traceparent(value.as_bytes())?;
    Some(RemoteParent {
        context,
        state: tracestate(headers),
    })
}

/// [`extract`] over a request's header lines as read off the wire, `(name, value)` in order
/// (the HTTP/1.1 fast path has no header map): the same rules, the same result.
pub fn extract_lines<'h, L>(lines: L) -> Option<RemoteParent>
where
    L: Iterator<Item = (&'h str, &'h [u8])> + Clone,
{
    let values = |name: &'static str| {
        lines
            .clone()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    };
    let mut all = values("traceparent");
    let value = all.next()?;
    if all.next().is_some() {
        return None;
    }
    let context = parse_traceparent(value)?;
    let state = joined(values("tracestate")).and_then(carried);
    Some(RemoteParent { context, state })
}

/// Parses one `traceparent` value.
pub fn parse_traceparent(v: &[u8]) -> Option<SpanContext> {
    if v.len() < TRACEPARENT_LEN {
        return None;
    }
    let version = hex_byte(v[0], v[1])?;
    match version {
        0xff => return None,
        // Version 00 is exactly 55 bytes; a later version may append fields after a dash.
        0 if v.len() != TRACEPARENT_LEN => return None,
        _ if v.len() > TRACEPARENT_LEN && v[TRACEPARENT_LEN] != b'-' => return None,
        _ => {}
    }
    if v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    let mut trace_id = [0u8; 16];
    hex_into(&v[3..35], &mut trace_id)?;
    let mut span_id = [0u8; 8];
    hex_into(&v[36..52], &mut span_id)?;
    let flags = hex_byte(v[53], v[54])?;
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(SpanContext {
        trace_id,
        span_id,
        sampled: flags & 1 == 1,
    })
}

/// The `tracestate` to carry on: several header lines joined by commas (the spec's rule for
/// combining them), dropped whole when too long or not visible ASCII.
fn tracestate(headers: &HeaderMap) -> Option<HeaderValue> {
    let mut all = headers.get_all(&TRACESTATE).iter();
    let first = all.next()?;
    let state = match all.next() {
        // One line, the common case: the value itself, not a copy.
        None => first.clone(),
        Some(second) => {
            let rest = std::iter::once(second)
                .chain(all)
                .map(HeaderValue::as_bytes);
            joined(std::iter::once(first.as_bytes()).chain(rest))?
        }
    };
    carried(state)
}

/// Header values joined by commas; `None` when there are none (or the result is no value).
fn joined<'v>(mut values: impl Iterator<Item = &'v [u8]>) -> Option<HeaderValue> {
    let first = values.next()?;
    let mut out = first.to_vec();
    for v in values {
        out.push(b',');
        out.extend_from_slice(v);
    }
    HeaderValue::from_bytes(&out).ok()
}

/// `state` when it may be carried on: not empty, not too long, visible ASCII.
fn carried(state: HeaderValue) -> Option<HeaderValue> {
    let ok = !state.is_empty()
        && state.len() <= MAX_TRACESTATE
        && state.as_bytes().iter().all(|b| (0x20..0x7f).contains(b));
    ok.then_some(state)
}

/// The `traceparent` naming `span` (version 00).
pub fn format_traceparent(span: &SpanContext) -> [u8; TRACEPARENT_LEN] {
    let mut out = [b'-'; TRACEPARENT_LEN];
    out[0] = b'0';
    out[1] = b'0';
    hex_encode(&span.trace_id, &mut out[3..35]);
    hex_encode(&span.span_id, &mut out[36..52]);
    out[53] = b'0';
    out[54] = if span.sampled { b'1' } else { b'0' };
    out
}

/// [`format_traceparent`] as a header value.
pub fn traceparent_value(span: &SpanContext) -> HeaderValue {
    let text = format_traceparent(span);
    // Always ASCII hex and dashes, so this never fails; the fallback is unreachable.
    HeaderValue::from_bytes(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Replaces whatever the client sent with the context of `span` (and the carried state).
pub fn inject(headers: &mut HeaderMap, span: &SpanContext, state: Option<&HeaderValue>) {
    headers.insert(TRACEPARENT.clone(), traceparent_value(span));
    match state {
        Some(s) => {
            headers.insert(TRACESTATE.clone(), s.clone());
        }
        None => {
            headers.remove(&TRACESTATE);
        }
    }
}

/// Lowercase hex of `bytes` (for logs and tests).
pub fn hex(bytes: &[u8]) -> String {
    let mut out = vec![0u8; bytes.len() * 2];
    hex_encode(bytes, &mut out);
    String::from_utf8(out).unwrap_or_default()
}

thread_local! {
    /// Ids need to be unique, not unpredictable: a per-thread xoshiro seeded from the OS is a
    /// few nanoseconds per id, where the thread-local ChaCha `rand::random` uses costs several
    /// times that (OpenTelemetry's SDKs make the same choice).
    static IDS: std::cell::RefCell<rand::rngs::SmallRng> =
        std::cell::RefCell::new(rand::make_rng());
}

fn random_u64() -> u64 {
    IDS.with(|r| rand::Rng::next_u64(&mut *r.borrow_mut()))
}

/// A fresh random trace id.
pub fn new_trace_id() -> TraceId {
    loop {
        let high = random_u64().to_be_bytes();
        let low = random_u64().to_be_bytes();
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&high);
        id[8..].copy_from_slice(&low);
        if id != [0; 16] {
            return id;
        }
    }
}

/// A fresh random span id.
pub fn new_span_id() -> SpanId {
    loop {
        let id = random_u64().to_be_bytes();
        if id != [0; 8] {
            return id;
        }
    }
}

fn hex_encode(bytes: &[u8], out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in bytes.iter().enumerate() {
        out[2 * i] = DIGITS[usize::from(b >> 4)];
        out[2 * i + 1] = DIGITS[usize::from(b & 0xf)];
    }
}

fn hex_into(text: &[u8], out: &mut [u8]) -> Option<()> {
    for (i, pair) in text.chunks_exact(2).enumerate() {
        out[i] = hex_byte(pair[0], pair[1])?;
    }
    Some(())
}

/// One byte from two lowercase hex digits (the spec allows no uppercase).
fn hex_byte(hi: u8, lo: u8) -> Option<u8> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(digit(hi)? << 4 | digit(lo)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_the_spec_example() {
        let c = parse_traceparent(VALID.as_bytes()).expect("valid");
        assert_eq!(hex(&c.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&c.span_id), "00f067aa0ba902b7");
        assert!(c.sampled);
        let unsampled = parse_traceparent(
            &VALID.as_bytes()[..54]
                .iter()
                .chain(b"0")
                .copied()
                .collect::<Vec<_>>(),
        );
        assert!(!unsampled.expect("valid").sampled);
    }

    #[test]
    fn round_trips() {
        let c = parse_traceparent(VALID.as_bytes()).expect("valid");
        assert_eq!(&format_traceparent(&c)[..], VALID.as_bytes());
    }

    #[test]
    fn rejects_malformed_values() {
        let bad = [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ];
        for v in bad {
            assert!(parse_traceparent(v.as_bytes()).is_none(), "{v}");
        }
    }

    #[test]
    fn accepts_later_versions_with_extra_fields() {
        let v = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds";
        assert!(parse_traceparent(v.as_bytes()).is_some());
        let v = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(parse_traceparent(v.as_bytes()).is_some());
    }

    #[test]
    fn extract_needs_exactly_one_traceparent_and_joins_tracestate() {
        let mut h = HeaderMap::new();
        assert!(extract(&h).is_none());
        h.append(&TRACEPARENT, HeaderValue::from_static(VALID));
        h.append(&TRACESTATE, HeaderValue::from_static("a=1"));
        h.append(&TRACESTATE, HeaderValue::from_static("b=2"));
        let p = extract(&h).expect("one valid parent");
        assert_eq!(
            p.state.as_ref().map(HeaderValue::as_bytes),
            Some(&b"a=1,b=2"[..])
        );
        h.append(&TRACEPARENT, HeaderValue::from_static(VALID));
        assert!(extract(&h).is_none(), "two traceparent headers");
    }

    #[test]
    fn header_lines_give_what_a_header_map_gives() {
        let long = "k=".to_owned() + &"v".repeat(600);
        let cases: &[&[(&str, &str)]] = &[
            &[],
            &[("Host", "a")],
            &[("traceparent", VALID)],
            &[
                ("TraceParent", VALID),
                ("tracestate", "a=1"),
                ("TRACESTATE", "b=2"),
            ],
            &[("traceparent", VALID), ("traceparent", VALID)],
            &[("traceparent", "00-junk")],
            &[("traceparent", VALID), ("tracestate", long.as_str())],
            &[("traceparent", VALID), ("tracestate", "")],
            &[("traceparent", VALID), ("tracestate", "caf\u{e9}=1")],
        ];
        for lines in cases {
            let mut h = HeaderMap::new();
            for (n, v) in lines.iter() {
                let name = HeaderName::from_bytes(n.as_bytes()).expect("name");
                h.append(name, HeaderValue::from_bytes(v.as_bytes()).expect("value"));
            }
            let from_map = extract(&h).map(|p| (p.context, p.state));
            let raw = lines.iter().map(|(n, v)| (*n, v.as_bytes()));
            let from_lines = extract_lines(raw).map(|p| (p.context, p.state));
            assert_eq!(from_lines, from_map, "{lines:?}");
        }
        let raw = [
            ("traceparent", VALID.as_bytes()),
            ("tracestate", &b"a=1"[..]),
        ];
        let p = extract_lines(raw.into_iter()).expect("parent");
        assert!(p.context.sampled);
        assert_eq!(p.state.expect("state"), "a=1");
    }

    #[test]
    fn oversized_tracestate_is_dropped_but_the_parent_kept() {
        let mut h = HeaderMap::new();
        h.insert(&TRACEPARENT, HeaderValue::from_static(VALID));
        let long = "k=".to_owned() + &"v".repeat(600);
        h.insert(&TRACESTATE, HeaderValue::from_str(&long).expect("ascii"));
        let p = extract(&h).expect("parent kept");
        assert!(p.state.is_none());
    }

    #[test]
    fn inject_replaces_and_removes() {
        let mut h = HeaderMap::new();
        h.insert(&TRACEPARENT, HeaderValue::from_static("junk"));
        h.insert(&TRACESTATE, HeaderValue::from_static("x=1"));
        let c = SpanContext {
            trace_id: new_trace_id(),
            span_id: new_span_id(),
            sampled: false,
        };
        inject(&mut h, &c, None);
        let sent = h.get(&TRACEPARENT).expect("set").as_bytes();
        assert_eq!(parse_traceparent(sent), Some(c));
        assert!(h.get(&TRACESTATE).is_none());
    }
}
