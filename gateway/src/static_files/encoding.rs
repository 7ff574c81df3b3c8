//! Content codings for static files: the `Accept-Encoding` negotiation (q-values, `*`, ties
//! broken by the server's order) and the compressors, one-shot for the cache fill and streaming
//! for large files.

use std::pin::Pin;

use async_compression::Level;
use async_compression::tokio::bufread::{BrotliEncoder, GzipEncoder, ZstdEncoder};
use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use gateway_config::model::ContentEncoding;
use http::header::{ACCEPT_ENCODING, HeaderMap, HeaderValue};
use http_body::Frame;
use http_body_util::StreamBody;
use tokio::io::{AsyncBufRead, AsyncRead, AsyncReadExt};
use tokio_util::io::ReaderStream;

use crate::body::Body;

/// A content coding the terminal can serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Encoding {
    Br,
    Gzip,
    Zstd,
}

impl Encoding {
    pub(crate) fn from_config(c: ContentEncoding) -> Self {
        match c {
            ContentEncoding::Br => Self::Br,
            ContentEncoding::Gzip => Self::Gzip,
            ContentEncoding::Zstd => Self::Zstd,
        }
    }

    /// Position in per-coding arrays.
    pub(crate) const fn index(self) -> usize {
        match self {
            Self::Br => 0,
            Self::Gzip => 1,
            Self::Zstd => 2,
        }
    }

    /// The `Content-Encoding` token.
    pub(crate) const fn token(self) -> &'static str {
        match self {
            Self::Br => "br",
            Self::Gzip => "gzip",
            Self::Zstd => "zstd",
        }
    }

    /// The precompressed sibling's extension (`file.css.gz`), also the ETag suffix.
    pub(super) const fn extension(self) -> &'static str {
        match self {
            Self::Br => "br",
            Self::Gzip => "gz",
            Self::Zstd => "zst",
        }
    }

    pub(crate) fn header_value(self) -> HeaderValue {
        HeaderValue::from_static(self.token())
    }
}

/// Quality values (thousandths) a request gives each coding; parsed without allocating.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Accept {
    q: [u16; 3],
}

impl Accept {
    /// Reads every `Accept-Encoding` header. Absent means identity only: RFC 9110 lets a
    /// server pick any coding then, but old clients that send nothing rarely decode anything.
    pub(crate) fn from_headers(headers: &HeaderMap) -> Self {
        Self::from_values(
            headers
                .get_all(ACCEPT_ENCODING)
                .iter()
                .map(|v| v.as_bytes()),
        )
    }

    /// [`Accept::from_headers`] over the raw values of every `Accept-Encoding` header (the
    /// HTTP/1.1 fast path reads them from the request's bytes).
    pub(super) fn from_values<'a>(values: impl Iterator<Item = &'a [u8]>) -> Self {
        let mut explicit: [Option<u16>; 3] = [None; 3];
        let mut star = None;
        for value in values {
            // Only visible ASCII can name a coding we know; any other header is skipped whole.
            let Some(value) = gateway_http1::fields::field_text(value) else {
                continue;
            };
            for item in value.split(',') {
                let mut parts = item.split(';');
                let name = parts.next().unwrap_or("").trim();
                if name.is_empty() {
                    continue;
                }
                let q = parts
                    .find_map(|p| {
                        let (k, v) = p.split_once('=')?;
                        k.trim()
                            .eq_ignore_ascii_case("q")
                            .then(|| parse_q(v.trim()))
                    })
                    .unwrap_or(Some(1000))
                    // A malformed weight is taken as "not acceptable": safer than guessing.
                    .unwrap_or(0);
                let slot = if name == "*" {
                    &mut star
                } else if name.eq_ignore_ascii_case("br") {
                    &mut explicit[0]
                } else if name.eq_ignore_ascii_case("gzip") || name.eq_ignore_ascii_case("x-gzip") {
                    &mut explicit[1]
                } else if name.eq_ignore_ascii_case("zstd") {
                    &mut explicit[2]
                } else {
                    continue;
                };
                // A coding listed twice keeps its best weight.
                *slot = Some(slot.map_or(q, |old: u16| old.max(q)));
            }
        }
        let mut q = [0; 3];
        for (out, e) in q.iter_mut().zip(explicit) {
            *out = e.or(star).unwrap_or(0);
        }
        Self { q }
    }

    /// The weight of `e` (0 = not acceptable).
    pub(super) fn q(&self, e: Encoding) -> u16 {
        self.q[e.index()]
    }

    /// The best acceptable coding among `offered` (in server preference order: on equal
    /// weights the earlier wins). `None` means identity.
    pub(crate) fn choose(&self, offered: impl IntoIterator<Item = Encoding>) -> Option<Encoding> {
        let mut best: Option<(Encoding, u16)> = None;
        for e in offered {
            let q = self.q(e);
            if q > 0 && best.is_none_or(|(_, b)| q > b) {
                best = Some((e, q));
            }
        }
        best.map(|(e, _)| e)
    }
}

/// Parses a qvalue (`0`, `0.5`, `1.000`) into thousandths; `None` when malformed.
fn parse_q(v: &str) -> Option<u16> {
    let (int, frac) = v.split_once('.').unwrap_or((v, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut thousandths = 0u16;
    for i in 0..3 {
        let digit = frac.as_bytes().get(i).map_or(0, |b| u16::from(b - b'0'));
        thousandths = thousandths * 10 + digit;
    }
    match int {
        "0" => Some(thousandths),
        "1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

/// Compression levels. The cache fill runs once per file version, so it can afford more
/// effort than the streaming path, which runs per request.
#[derive(Clone, Copy)]
pub(super) enum Effort {
    Fill,
    Stream,
}

fn level(e: Encoding, effort: Effort) -> Level {
    match (e, effort) {
        // Brotli's default (11) is far too slow for a server; 5-7 is the usual sweet spot.
        (Encoding::Br, Effort::Fill) => Level::Precise(7),
        (Encoding::Br, Effort::Stream) => Level::Precise(4),
        (Encoding::Gzip, Effort::Fill) => Level::Precise(6),
        (Encoding::Gzip, Effort::Stream) => Level::Precise(5),
        (Encoding::Zstd, Effort::Fill) => Level::Precise(9),
        (Encoding::Zstd, Effort::Stream) => Level::Precise(3),
    }
}

/// Compresses a buffer at cache fill (called on a blocking thread). Returns `None` when the
/// result would not be smaller, so incompressible data is served as is.
pub(super) fn compress_buffer(e: Encoding, data: &[u8]) -> Option<Bytes> {
    let mut out = Vec::with_capacity(data.len() / 2 + 64);
    // The encoders read from a slice and write to a Vec, neither of which ever returns
    // `Pending`, so the future finishes in one poll and needs no runtime.
    let done = match e {
        Encoding::Br => read_all(
            BrotliEncoder::with_quality(data, level(e, Effort::Fill)),
            &mut out,
        ),
        Encoding::Gzip => read_all(
            GzipEncoder::with_quality(data, level(e, Effort::Fill)),
            &mut out,
        ),
        Encoding::Zstd => read_all(
            ZstdEncoder::with_quality(data, level(e, Effort::Fill)),
            &mut out,
        ),
    };
    (done && out.len() < data.len()).then(|| Bytes::from(out))
}

fn read_all(mut r: impl AsyncRead + Unpin, out: &mut Vec<u8>) -> bool {
    matches!(r.read_to_end(out).now_or_never(), Some(Ok(_)))
}

/// Wraps an uncompressed byte stream in a streaming encoder (large files compressed per
/// request). The output is read in 64 KiB pieces so memory stays bounded.
pub(super) fn compress_stream<R>(e: Encoding, input: R) -> Body
where
    R: AsyncBufRead + Send + 'static,
{
    let lvl = level(e, Effort::Stream);
    match e {
        Encoding::Br => body_of(BrotliEncoder::with_quality(input, lvl)),
        Encoding::Gzip => body_of(GzipEncoder::with_quality(input, lvl)),
        Encoding::Zstd => body_of(ZstdEncoder::with_quality(input, lvl)),
    }
}

fn body_of<R: AsyncRead + Send + 'static>(r: R) -> Body {
    let stream = ReaderStream::with_capacity(Box::pin(r) as Pin<Box<_>>, 64 * 1024);
    Body::new(StreamBody::new(stream.map(|chunk| chunk.map(Frame::data))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(v: &str) -> Accept {
        let mut h = HeaderMap::new();
        h.insert(ACCEPT_ENCODING, HeaderValue::from_str(v).unwrap());
        Accept::from_headers(&h)
    }

    const ALL: [Encoding; 3] = [Encoding::Zstd, Encoding::Br, Encoding::Gzip];

    #[test]
    fn q_values() {
        assert_eq!(parse_q("1"), Some(1000));
        assert_eq!(parse_q("1.000"), Some(1000));
        assert_eq!(parse_q("0.5"), Some(500));
        assert_eq!(parse_q("0.05"), Some(50));
        assert_eq!(parse_q("0"), Some(0));
        assert_eq!(parse_q("1.5"), None);
        assert_eq!(parse_q("2"), None);
        assert_eq!(parse_q("0.1234"), None);
        assert_eq!(parse_q("abc"), None);
        assert_eq!(parse_q(""), None);
        assert_eq!(parse_q("0.x"), None);
    }

    #[test]
    fn browser_header_takes_server_order() {
        let a = accept("gzip, deflate, br, zstd");
        assert_eq!(a.choose(ALL), Some(Encoding::Zstd));
        assert_eq!(
            a.choose([Encoding::Gzip, Encoding::Br]),
            Some(Encoding::Gzip)
        );
    }

    #[test]
    fn higher_q_wins_over_server_order() {
        let a = accept("zstd;q=0.5, br;q=0.9, gzip;q=0.8");
        assert_eq!(a.choose(ALL), Some(Encoding::Br));
        let a = accept("gzip;q=1.0, br;q=0.999");
        assert_eq!(a.choose(ALL), Some(Encoding::Gzip));
    }

    #[test]
    fn zero_and_star() {
        assert_eq!(accept("br;q=0, gzip").choose(ALL), Some(Encoding::Gzip));
        assert_eq!(accept("*").choose(ALL), Some(Encoding::Zstd));
        assert_eq!(accept("*;q=0.1, gzip").choose(ALL), Some(Encoding::Gzip));
        assert_eq!(accept("*;q=0").choose(ALL), None);
        assert_eq!(accept("br;q=0, *;q=0.5").choose([Encoding::Br]), None);
        assert_eq!(accept("identity").choose(ALL), None);
        assert_eq!(accept("").choose(ALL), None);
        assert_eq!(Accept::from_headers(&HeaderMap::new()).choose(ALL), None);
        // A request without the header is given the default without reading the map.
        assert_eq!(Accept::from_headers(&HeaderMap::new()), Accept::default());
    }

    #[test]
    fn case_spaces_aliases_and_junk() {
        assert_eq!(accept(" GZIP ; Q=0.7 ").q(Encoding::Gzip), 700);
        assert_eq!(accept("x-gzip").q(Encoding::Gzip), 1000);
        assert_eq!(accept("br;q=abc").q(Encoding::Br), 0);
        assert_eq!(accept("br;level=3").q(Encoding::Br), 1000);
        assert_eq!(accept(",,;;=,br;q=,zstd;q=0.").q(Encoding::Zstd), 0);
        assert_eq!(accept("gzip;q=0, gzip;q=0.4").q(Encoding::Gzip), 400);
        let mut h = HeaderMap::new();
        h.append(ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
        h.append(ACCEPT_ENCODING, HeaderValue::from_static("br"));
        h.append(
            ACCEPT_ENCODING,
            HeaderValue::from_bytes(b"zstd\xff").unwrap(),
        );
        let a = Accept::from_headers(&h);
        assert_eq!(
            (a.q(Encoding::Gzip), a.q(Encoding::Br), a.q(Encoding::Zstd)),
            (1000, 1000, 0)
        );
    }

    #[test]
    fn not_offered_is_never_chosen() {
        assert_eq!(accept("br").choose([Encoding::Gzip]), None);
        assert_eq!(accept("br").choose([]), None);
    }

    #[test]
    fn buffer_compression_round_trips() {
        let data = "hello static world ".repeat(200);
        for e in [Encoding::Br, Encoding::Gzip, Encoding::Zstd] {
            let c = compress_buffer(e, data.as_bytes()).expect("compressible");
            assert!(c.len() < data.len());
            let mut out = Vec::new();
            let mut dec: Box<dyn AsyncRead + Unpin> = match e {
                Encoding::Br => Box::new(async_compression::tokio::bufread::BrotliDecoder::new(
                    &c[..],
                )),
                Encoding::Gzip => {
                    Box::new(async_compression::tokio::bufread::GzipDecoder::new(&c[..]))
                }
                Encoding::Zstd => {
                    Box::new(async_compression::tokio::bufread::ZstdDecoder::new(&c[..]))
                }
            };
            dec.read_to_end(&mut out).now_or_never().unwrap().unwrap();
            assert_eq!(out, data.as_bytes());
        }
        // Random-looking data does not shrink: no variant.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()[0]
            })
            .collect();
        assert!(compress_buffer(Encoding::Gzip, &noise).is_none());
    }
}
