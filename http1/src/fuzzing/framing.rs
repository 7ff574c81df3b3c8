//! Fuzz checks of the request-side HTTP/1 framing checks ([`Framing`]): the verdicts do not
//! depend on how the bytes are split, and they agree with `httparse`, the parser hyper runs
//! behind them, on where a head ends, where the next request starts and which heads are refused.

use crate::framing::{Framing, Scan, Violation, escape_target};

/// What the checks made of a connection's bytes, fed the way the IO wrapper feeds them.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    /// Bytes handed to the parser.
    released: Vec<u8>,
    /// The refusal, and whether it was of a head (`Reject`) or inside a body (`Cut`).
    refused: Option<(Violation, bool)>,
    /// The stream ended inside an oversized head.
    truncated: bool,
    /// Bytes still held back at the end (an incomplete head).
    held: usize,
    off: bool,
    http2: bool,
    switch_asked: bool,
}

/// Feeds `pieces` in order as the server's IO wrapper (`CheckedIo`) does: after a `Hold`, the
/// held bytes come again in front of the next piece.
fn feed<'a>(framing: &mut Framing, pieces: impl IntoIterator<Item = &'a [u8]>) -> Outcome {
    let mut released = Vec::new();
    let mut held: Vec<u8> = Vec::new();
    let mut refused = None;
    let mut truncated = false;
    'pieces: for piece in pieces {
        held.extend_from_slice(piece);
        loop {
            match framing.scan(&held) {
                Scan::Pass => released.append(&mut held),
                Scan::Hold(n) => released.extend(held.drain(..n)),
                Scan::Reject(n, _) | Scan::Cut(n, _) | Scan::Truncate(n) | Scan::Escape(n)
                    if n > held.len() =>
                {
                    panic!("{n} bytes released of the {} scanned", held.len())
                }
                Scan::Escape(n) => {
                    // As the IO wrapper does: the head again, its target escaped, at once.
                    released.extend(held.drain(..n));
                    let escaped = escape_target(&held);
                    assert!(escaped != held, "an escape that changes nothing would loop");
                    held = escaped;
                    continue;
                }
                Scan::Truncate(n) => {
                    released.extend_from_slice(&held[..n]);
                    truncated = true;
                    break 'pieces;
                }
                Scan::Reject(n, v) => {
                    released.extend_from_slice(&held[..n]);
                    refused = Some((v, true));
                    break 'pieces;
                }
                Scan::Cut(n, v) => {
                    released.extend_from_slice(&held[..n]);
                    refused = Some((v, false));
                    break 'pieces;
                }
            }
            break;
        }
    }
    let ended = refused.is_some() || truncated;
    Outcome {
        released,
        refused,
        truncated,
        held: if ended { 0 } else { held.len() },
        off: framing.is_off(),
        http2: framing.is_http2(),
        switch_asked: framing.switch_asked(),
    }
}

/// A split point in `0..=len` from a fuzzed byte.
fn point(byte: u8, len: usize) -> usize {
    usize::from(byte) * len / 255
}

/// Input: a byte of settings (bit 0: an HTTP/2 preface may come first; the rest: the longest
/// head, 16 to 1,032 bytes), two bytes placing split points, then a connection's bytes. The
/// verdicts are the same whole, in two or three pieces and byte by byte.
pub fn request_framing(data: &[u8]) {
    let [settings, a, b, stream @ ..] = data else {
        return;
    };
    let sniff_h2 = settings & 1 == 1;
    let max_head = 16 + usize::from(settings >> 1) * 8;
    let fresh = || Framing::http1(max_head, sniff_h2);

    let whole = feed(&mut fresh(), [stream]);
    assert!(
        stream.starts_with(&whole.released),
        "released bytes that are not the input's"
    );
    if whole.truncated {
        assert!(whole.off, "checking goes on after an oversized head");
    } else if whole.refused.is_none() {
        assert_eq!(
            whole.released.len() + whole.held,
            stream.len(),
            "bytes neither released nor held"
        );
    }
    if whole.http2 {
        assert!(
            sniff_h2 && whole.off,
            "HTTP/2 without sniffing, or still checking"
        );
    }

    let (a, b) = {
        let (a, b) = (point(*a, stream.len()), point(*b, stream.len()));
        (a.min(b), a.max(b))
    };
    let two = feed(&mut fresh(), [&stream[..a], &stream[a..]]);
    assert_eq!(two, whole, "split at {a}");
    let three = feed(&mut fresh(), [&stream[..a], &stream[a..b], &stream[b..]]);
    assert_eq!(three, whole, "split at {a} and {b}");
    let bytes = feed(&mut fresh(), stream.chunks(1));
    assert_eq!(bytes, whole, "byte by byte");
}

/// Heads as long as any fuzzed input fit, so the differential never meets the size limit.
const DIFFERENTIAL_MAX_HEAD: usize = 1 << 20;
/// Field lines `httparse` may report, as many as hyper takes (`max_headers`).
const DIFFERENTIAL_FIELDS: usize = 128;
/// Longest body the differential writes out to find where the next request starts.
const DIFFERENTIAL_MAX_BODY: u64 = 64 * 1024;

/// The framing fields of a head as `httparse` read them.
#[derive(Default)]
struct Fields<'a> {
    lengths: Vec<&'a [u8]>,
    codings: Vec<&'a [u8]>,
}

impl<'a> Fields<'a> {
    fn of(headers: &[httparse::Header<'a>]) -> Self {
        let mut fields = Self::default();
        for h in headers {
            if h.name.eq_ignore_ascii_case("content-length") {
                fields.lengths.push(h.value);
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                fields.codings.push(h.value);
            }
        }
        fields
    }

    /// Whether `violation` is visible in these fields (or, for the line-level ones, in the
    /// head's bytes): a refusal the framing checks make must name something that is there.
    fn show(&self, violation: Violation, head: &[u8]) -> bool {
        match violation {
            Violation::BareLf => head
                .iter()
                .enumerate()
                .any(|(i, &b)| b == b'\n' && (i == 0 || head[i - 1] != b'\r')),
            Violation::ObsFold => head.windows(2).any(|w| matches!(w, [b'\n', b' ' | b'\t'])),
            Violation::LengthWithChunked => !self.lengths.is_empty() && !self.codings.is_empty(),
            Violation::DuplicateLength => self.lengths.len() > 1,
            Violation::InvalidLength => self.lengths.iter().any(|v| plain_length(v).is_none()),
            Violation::InvalidTransferEncoding => {
                self.codings.len() > 1
                    || self
                        .codings
                        .iter()
                        .any(|v| !v.eq_ignore_ascii_case(b"chunked"))
            }
            // The first chunk-size line follows the head; the head must be a chunked one.
            Violation::InvalidChunk => self.codings.len() == 1,
        }
    }
}

/// `1*DIGIT` that fits 64 bits.
fn plain_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// What the framing checks say of the first request of `data`.
#[derive(Debug, PartialEq, Eq)]
enum First {
    /// Its head (with a chunked head's first chunk-size line) is not complete.
    Incomplete,
    Refused(Violation),
    /// Its head passed.
    Passed,
}

fn first_request(data: &[u8]) -> First {
    match scan(data) {
        Scan::Hold(0) => First::Incomplete,
        Scan::Reject(0, v) => First::Refused(v),
        Scan::Truncate(0) => unreachable!("every input is shorter than the head limit"),
        _ => First::Passed,
    }
}

/// Scans `data` on a fresh connection that leaves targets as they are (httparse is given the
/// same bytes; escaping a target is what `request_framing` checks).
fn scan(data: &[u8]) -> Scan {
    Framing::http1(DIFFERENTIAL_MAX_HEAD, false)
        .strict_targets(true)
        .scan(data)
}

/// Input: the bytes a client sends. They go to the framing checks and to
/// `httparse::Request::parse` (hyper's parser, as hyper configures it by default):
///
/// * both complete the head: the checks pass it exactly when it shows none of the refused
///   shapes in the fields `httparse` read, and they end it, and start the next request, where
///   `httparse`'s head and `Content-Length` (or the chunked body) say;
/// * `httparse` completes a head the checks refuse: the refusal is one of the documented ones
///   and its shape is there (bare LF, obs-fold, `Content-Length` with `Transfer-Encoding`, two
///   `Content-Length`, a length that is not plain digits, `Transfer-Encoding` other than one
///   `chunked`, a malformed first chunk-size line after a chunked head);
/// * the checks pass a head `httparse` refuses: `httparse` refuses that head by itself (hyper
///   answers it `400`), never only for bytes after it. This is the one leniency: the checks
///   judge framing only and leave the request line's and the field lines' syntax to the parser.
///
/// A head `httparse` has not completed is never one the checks pass.
pub fn h1_differential(data: &[u8]) {
    // No bytes is no head (the checks pass nothing at all).
    if data.is_empty() || data.len() >= DIFFERENTIAL_MAX_HEAD {
        return;
    }
    let mut headers = [httparse::EMPTY_HEADER; DIFFERENTIAL_FIELDS];
    let mut request = httparse::Request::new(&mut headers);
    let parsed = request.parse(data);
    let first = first_request(data);
    match parsed {
        Ok(httparse::Status::Complete(len)) => {
            let fields = Fields::of(request.headers);
            both_complete(data, len, &fields, first);
        }
        Ok(httparse::Status::Partial) => assert_ne!(
            first,
            First::Passed,
            "the checks passed a head httparse has not completed"
        ),
        Err(error) => {
            if first == First::Passed {
                let end = framing_head_end(data);
                let mut headers = [httparse::EMPTY_HEADER; DIFFERENTIAL_FIELDS];
                let own = httparse::Request::new(&mut headers).parse(&data[..end]);
                assert!(
                    own.is_err(),
                    "httparse refused ({error}) only past the head the checks passed \
                     ({end} bytes): {own:?}"
                );
            }
        }
    }
}

fn both_complete(data: &[u8], len: usize, fields: &Fields<'_>, first: First) {
    let head = &data[..len];
    let refused = [
        Violation::BareLf,
        Violation::ObsFold,
        Violation::LengthWithChunked,
        Violation::DuplicateLength,
        Violation::InvalidLength,
        Violation::InvalidTransferEncoding,
    ]
    .into_iter()
    .find(|&v| fields.show(v, head));
    match first {
        First::Refused(v) => assert!(
            fields.show(v, head),
            "refused for {v:?}, which httparse's head does not show"
        ),
        First::Incomplete => assert!(
            refused.is_none() && fields.codings.len() == 1,
            "the checks still wait on a head httparse completed, and it is not chunked"
        ),
        First::Passed => {
            assert_eq!(
                refused, None,
                "the checks passed a head with a refused shape"
            );
            next_request_starts_where_httparse_says(data, len, fields);
        }
    }
}

/// The head httparse completed at `len` passed: the checks did not see its end earlier, and the
/// next request starts after the body its fields frame.
fn next_request_starts_where_httparse_says(data: &[u8], len: usize, fields: &Fields<'_>) {
    if len > 1 {
        assert_eq!(
            scan(&data[..len - 1]),
            Scan::Hold(0),
            "the checks ended the head before httparse did"
        );
    }
    let mut probe = data[..len].to_vec();
    let body = if fields.codings.is_empty() {
        let length = fields.lengths.first().map_or(Some(0), |v| plain_length(v));
        let length = length.expect("a passed head's length is plain digits");
        if length > DIFFERENTIAL_MAX_BODY {
            // Too long to write out: the body at least goes on past a first byte.
            probe.push(b'G');
            assert_eq!(scan(&probe), Scan::Pass, "a body of {length} bytes");
            return;
        }
        probe.resize(len + length as usize, b'x');
        length as usize
    } else {
        // An empty chunked body: its last chunk and the end of its (empty) trailers.
        probe.extend_from_slice(b"0\r\n\r\n");
        5
    };
    // A next request's first byte: held as the start of an incomplete head.
    probe.push(b'G');
    assert_eq!(
        scan(&probe),
        Scan::Hold(len + body),
        "the next request does not start after the {len}-byte head and its {body}-byte body"
    );
}

/// Where the head the checks passed ends: after the first empty line that follows the request
/// line (the checks passed it, so every line ends in CRLF).
fn framing_head_end(data: &[u8]) -> usize {
    let mut at = 0;
    while data[at..].starts_with(b"\r\n") {
        at += 2;
    }
    let end = data[at..]
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a passed head ends with an empty line");
    at + end + 4
}
