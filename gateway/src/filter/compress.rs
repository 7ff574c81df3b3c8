//! The native `compress` filter: answers of any terminal encoded with the best coding the
//! client accepts (`Accept-Encoding` weights; on a tie the configured order wins), as they
//! stream. Each chunk the terminal hands on is compressed and flushed at once, so an answer
//! that trickles (server-sent events, gRPC-web, a slow upstream) reaches the client as it
//! comes, never held until a buffer fills; a whole body in memory is one chunk and one
//! compressed frame. Answers already encoded, partial (206, `Content-Range`), marked
//! `no-transform`, bodiless (HEAD, 1xx, 204, 304), of other media types or stating a length
//! under `min_size` go as they are, each counted by reason.
//!
//! The codecs are the synchronous ones (flate2, brotli, zstd) writing into a buffer, driven
//! from the synchronous body hook: nothing waits, so no task or adapter is needed per answer.

use std::borrow::Cow;
use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{
    ACCEPT_RANGES, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE,
    ETAG, HeaderMap, HeaderValue, VARY,
};
use http::{Method, StatusCode, request, response};

use super::cors::varies_on;
use super::{FilterFactory, Flow, HttpFilter};
use crate::body::BoxError;
use crate::context::RequestCx;
use crate::static_files::encoding::{Accept, Encoding};
use crate::static_files::mime::compressible;
use crate::telemetry::LogNotes;
use crate::telemetry::{Counter, Registry};
use gateway_config::model::{CompressConfig, CompressLevels};

/// The window of the brotli and zstd encoders (log2 bytes): 512 KiB, as nginx's brotli
/// module, bounds what one answer holds in memory while keeping most of the ratio.
const WINDOW_LOG: u32 = 19;

/// Why an answer went uncompressed: the `reason` label.
#[derive(Clone, Copy)]
enum Skip {
    Status,
    Range,
    Encoded,
    NoTransform,
    Type,
    Size,
    Head,
    NotAccepted,
}

const SKIPS: [(Skip, &str); 8] = [
    (Skip::Status, "status"),
    (Skip::Range, "range"),
    (Skip::Encoded, "encoded"),
    (Skip::NoTransform, "no_transform"),
    (Skip::Type, "type"),
    (Skip::Size, "size"),
    (Skip::Head, "head"),
    (Skip::NotAccepted, "not_accepted"),
];

/// Which media types are compressed.
enum Types {
    /// The built-in list (text and text-like types).
    Default,
    /// `*`.
    Any,
    /// `type/subtype` entries and `type/` prefixes (from `type/*`), lowercase.
    Listed {
        exact: Vec<String>,
        prefixes: Vec<String>,
    },
}

impl Types {
    fn new(types: Option<&[String]>) -> Self {
        let Some(types) = types else {
            return Self::Default;
        };
        if types.iter().any(|t| t == "*") {
            return Self::Any;
        }
        let (mut exact, mut prefixes) = (Vec::new(), Vec::new());
        for t in types.iter().map(|t| t.to_ascii_lowercase()) {
            match t.strip_suffix('*') {
                Some(prefix) => prefixes.push(prefix.to_owned()),
                None => exact.push(t),
            }
        }
        Self::Listed { exact, prefixes }
    }

    /// Whether a `Content-Type` value names a type compressed here.
    fn matches(&self, content_type: Option<&HeaderValue>) -> bool {
        let Some(essence) = content_type.and_then(|v| v.to_str().ok()).map(essence) else {
            return false;
        };
        match self {
            Self::Any => true,
            Self::Default => compressible(&essence),
            Self::Listed { exact, prefixes } => {
                exact.iter().any(|t| *t == essence)
                    || prefixes.iter().any(|p| essence.starts_with(p.as_str()))
            }
        }
    }
}

/// The media type without parameters, lowercase.
fn essence(content_type: &str) -> Cow<'_, str> {
    let t = content_type.split(';').next().unwrap_or("").trim();
    if t.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(t.to_ascii_lowercase())
    } else {
        Cow::Borrowed(t)
    }
}

/// Counters of one coding.
struct Coded {
    answers: Counter,
    bytes_in: Counter,
    bytes_out: Counter,
}

struct Shared {
    algorithms: Vec<Encoding>,
    min_size: u64,
    types: Types,
    levels: CompressLevels,
    /// By [`Encoding::index`].
    coded: [Coded; 3],
    /// By [`Skip`] as listed in [`SKIPS`].
    skipped: [Counter; SKIPS.len()],
}

/// Factory for the `compress` filter.
pub struct CompressFilterFactory {
    shared: Arc<Shared>,
}

impl CompressFilterFactory {
    /// Compiles the settings of the filter on route `route`.
    pub fn new(route: &str, cfg: &CompressConfig, registry: &Registry) -> Self {
        let coded = [Encoding::Br, Encoding::Gzip, Encoding::Zstd].map(|e| {
            let labels = [("route", route), ("algorithm", e.token())];
            Coded {
                answers: registry.counter(
                    "gateway_compress_responses_total",
                    "Answers compressed by the compress filter, by route and algorithm.",
                    &labels,
                ),
                bytes_in: registry.counter(
                    "gateway_compress_in_bytes_total",
                    "Bytes given to the compress filter's encoders, by route and algorithm.",
                    &labels,
                ),
                bytes_out: registry.counter(
                    "gateway_compress_out_bytes_total",
                    "Bytes the compress filter's encoders produced, by route and algorithm.",
                    &labels,
                ),
            }
        });
        let skipped = SKIPS.map(|(_, reason)| {
            registry.counter(
                "gateway_compress_skipped_total",
                "Answers the compress filter sent as they were, by route and reason.",
                &[("route", route), ("reason", reason)],
            )
        });
        Self {
            shared: Arc::new(Shared {
                algorithms: cfg
                    .algorithms
                    .iter()
                    .map(|&a| Encoding::from_config(a))
                    .collect(),
                min_size: cfg.min_size.0,
                types: Types::new(cfg.types.as_deref()),
                levels: cfg.level,
                coded,
                skipped,
            }),
        }
    }
}

impl FilterFactory for CompressFilterFactory {
    fn name(&self) -> &'static str {
        "compress"
    }

    fn create(&self) -> Box<dyn HttpFilter> {
        Box::new(CompressFilter {
            shared: self.shared.clone(),
            chosen: None,
            head: false,
            encoder: None,
        })
    }

    fn response_body(&self) -> bool {
        true
    }
}

struct CompressFilter {
    shared: Arc<Shared>,
    /// The coding the request accepts best, if any.
    chosen: Option<Encoding>,
    head: bool,
    /// Set once the answer is being compressed.
    encoder: Option<Encoder>,
}

impl CompressFilter {
    fn read_request(&mut self, method: &Method, headers: &HeaderMap) {
        self.head = method == Method::HEAD;
        self.chosen = Accept::from_headers(headers).choose(self.shared.algorithms.iter().copied());
    }

    /// Decides on the answer's head, and changes it when the body is to be compressed.
    fn start(&mut self, status: StatusCode, h: &mut HeaderMap) -> std::io::Result<()> {
        let chosen = match (self.skip(status, h), self.chosen) {
            (None, Some(e)) => e,
            (skip, _) => {
                let skip = skip.unwrap_or(Skip::NotAccepted);
                self.shared.skipped[skip as usize].inc();
                return Ok(());
            }
        };
        self.encoder = Some(Encoder::new(chosen, self.shared.levels)?);
        self.shared.coded[chosen.index()].answers.inc();
        h.remove(CONTENT_LENGTH);
        h.remove(ACCEPT_RANGES);
        h.insert(CONTENT_ENCODING, chosen.header_value());
        // The bytes differ from the identity answer's: a strong validator would lie.
        if let Some(etag) = h.get_mut(ETAG)
            && etag.as_bytes().starts_with(b"\"")
            && let Ok(weak) = HeaderValue::from_bytes(&[b"W/", etag.as_bytes()].concat())
        {
            *etag = weak;
        }
        Ok(())
    }

    /// Why the answer is sent as it is, or `None` to compress it with `self.chosen`.
    fn skip(&self, status: StatusCode, h: &mut HeaderMap) -> Option<Skip> {
        if status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED
        {
            return Some(Skip::Status);
        }
        if status == StatusCode::PARTIAL_CONTENT || h.contains_key(CONTENT_RANGE) {
            return Some(Skip::Range);
        }
        if h.get_all(CONTENT_ENCODING)
            .iter()
            .any(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"))
        {
            return Some(Skip::Encoded);
        }
        if has_directive(h, b"no-transform") {
            return Some(Skip::NoTransform);
        }
        if !self.shared.types.matches(h.get(CONTENT_TYPE)) {
            return Some(Skip::Type);
        }
        let length = h
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if length.is_some_and(|n| n == 0 || n < self.shared.min_size) {
            return Some(Skip::Size);
        }
        // From here the answer depends on `Accept-Encoding`: caches must know.
        if !varies_on(h, "accept-encoding") {
            h.append(VARY, HeaderValue::from_static("Accept-Encoding"));
        }
        if self.head {
            return Some(Skip::Head);
        }
        if self.chosen.is_none() {
            return Some(Skip::NotAccepted);
        }
        None
    }
}

/// Whether `Cache-Control` holds `directive`.
fn has_directive(h: &HeaderMap, directive: &[u8]) -> bool {
    h.get_all(CACHE_CONTROL).iter().any(|v| {
        v.as_bytes()
            .split(|&b| b == b',')
            .any(|d| d.trim_ascii().eq_ignore_ascii_case(directive))
    })
}

impl HttpFilter for CompressFilter {
    fn on_request_headers_sync(
        &mut self,
        req: &mut request::Parts,
        _cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        self.read_request(&req.method, &req.headers);
        Some(Ok(Flow::Continue))
    }

    fn on_response_headers_sync(
        &mut self,
        res: &mut response::Parts,
        _cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        let started = self.start(res.status, &mut res.headers);
        if let (Ok(()), Some(_), Some(chosen)) = (&started, &self.encoder, self.chosen) {
            LogNotes::on(&mut res.extensions).compress = Some(chosen.token());
        }
        Some(started.map(|()| Flow::Continue).map_err(Into::into))
    }

    fn on_response_body_sync(
        &mut self,
        chunk: &mut Option<Bytes>,
        eos: bool,
        _cx: &mut RequestCx,
    ) -> Option<Result<(), BoxError>> {
        let Some(encoder) = self.encoder.as_mut() else {
            return Some(Ok(()));
        };
        let input = chunk.take().unwrap_or_default();
        let coded = &self.shared.coded[encoder.encoding().index()];
        coded.bytes_in.add(input.len() as u64);
        let out = if eos {
            self.encoder.take().map(|e| e.finish(&input))
        } else if input.is_empty() {
            return Some(Ok(()));
        } else {
            Some(encoder.flushed(&input))
        };
        match out {
            Some(Ok(out)) => {
                coded.bytes_out.add(out.len() as u64);
                *chunk = Some(Bytes::from(out));
                Some(Ok(()))
            }
            Some(Err(e)) => Some(Err(e.into())),
            None => Some(Ok(())),
        }
    }
}

/// One answer's encoder, writing into a buffer taken after each chunk.
enum Encoder {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Br(Box<brotli::CompressorWriter<Vec<u8>>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

impl Encoder {
    fn new(e: Encoding, levels: CompressLevels) -> std::io::Result<Self> {
        Ok(match e {
            Encoding::Gzip => Self::Gzip(flate2::write::GzEncoder::new(
                Vec::new(),
                flate2::Compression::new(levels.gzip),
            )),
            Encoding::Br => Self::Br(Box::new(brotli::CompressorWriter::new(
                Vec::new(),
                16 * 1024,
                levels.br,
                WINDOW_LOG,
            ))),
            Encoding::Zstd => {
                let level = i32::try_from(levels.zstd).unwrap_or(3);
                let mut z = zstd::stream::write::Encoder::new(Vec::new(), level)?;
                z.window_log(WINDOW_LOG)?;
                Self::Zstd(z)
            }
        })
    }

    fn encoding(&self) -> Encoding {
        match self {
            Self::Gzip(_) => Encoding::Gzip,
            Self::Br(_) => Encoding::Br,
            Self::Zstd(_) => Encoding::Zstd,
        }
    }

    /// Compresses `input` and flushes, so the client can decode everything sent so far.
    fn flushed(&mut self, input: &[u8]) -> std::io::Result<Vec<u8>> {
        let out = match self {
            Self::Gzip(w) => {
                w.write_all(input)?;
                w.flush()?;
                w.get_mut()
            }
            Self::Br(w) => {
                w.write_all(input)?;
                w.flush()?;
                w.get_mut()
            }
            Self::Zstd(w) => {
                w.write_all(input)?;
                w.flush()?;
                w.get_mut()
            }
        };
        Ok(std::mem::take(out))
    }

    /// Compresses the last `input` and ends the stream.
    fn finish(self, input: &[u8]) -> std::io::Result<Vec<u8>> {
        match self {
            Self::Gzip(mut w) => {
                w.write_all(input)?;
                w.finish()
            }
            Self::Br(mut w) => {
                w.write_all(input)?;
                Ok(w.into_inner())
            }
            Self::Zstd(mut w) => {
                w.write_all(input)?;
                w.finish()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_config::model::ContentEncoding;
    use gateway_config::units::ByteSize;
    use std::io::Read;

    fn config(types: Option<&[&str]>) -> CompressConfig {
        CompressConfig {
            algorithms: vec![
                ContentEncoding::Zstd,
                ContentEncoding::Br,
                ContentEncoding::Gzip,
            ],
            min_size: ByteSize(1024),
            types: types.map(|t| t.iter().map(|s| s.to_string()).collect()),
            level: CompressLevels::default(),
        }
    }

    fn decode(e: Encoding, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        match e {
            Encoding::Gzip => flate2::read::GzDecoder::new(data).read_to_end(&mut out),
            Encoding::Br => brotli::Decompressor::new(data, 4096).read_to_end(&mut out),
            Encoding::Zstd => zstd::stream::read::Decoder::new(data)
                .unwrap()
                .read_to_end(&mut out),
        }
        .unwrap();
        out
    }

    #[test]
    fn chunks_decode_as_they_come_and_whole() {
        let text = b"data: hello compressed world\n\n".repeat(40);
        for e in [Encoding::Gzip, Encoding::Br, Encoding::Zstd] {
            let mut enc = Encoder::new(e, CompressLevels::default()).unwrap();
            let first = enc.flushed(&text).unwrap();
            // A flush leaves a prefix the client can decode now (zstd and brotli need the end
            // of the stream to finish decoding, so only gzip's prefix is decoded here).
            if e == Encoding::Gzip {
                let mut d = flate2::write::GzDecoder::new(Vec::new());
                d.write_all(&first).unwrap();
                d.flush().unwrap();
                assert_eq!(d.get_ref(), &text);
            }
            let mut all = first;
            all.extend(enc.flushed(b"").unwrap());
            all.extend(enc.finish(b"tail").unwrap());
            let mut want = text.clone();
            want.extend(b"tail");
            assert_eq!(decode(e, &all), want, "{e:?}");
            assert!(all.len() < want.len());
        }
    }

    #[test]
    fn types() {
        let ct = |v: &'static str| Some(HeaderValue::from_static(v));
        let d = Types::new(None);
        assert!(d.matches(ct("text/html; charset=utf-8").as_ref()));
        assert!(d.matches(ct("Application/JSON").as_ref()));
        assert!(d.matches(ct("image/svg+xml").as_ref()));
        assert!(!d.matches(ct("image/png").as_ref()));
        assert!(!d.matches(None));
        let l = Types::new(
            config(Some(&["text/*", "application/json"]))
                .types
                .as_deref(),
        );
        assert!(l.matches(ct("text/event-stream").as_ref()));
        assert!(!l.matches(ct("application/xml").as_ref()));
        assert!(Types::new(config(Some(&["*"])).types.as_deref()).matches(ct("x/y").as_ref()));
    }

    fn answer(f: &mut CompressFilter, status: u16, headers: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.append(
                http::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        f.start(StatusCode::from_u16(status).unwrap(), &mut h)
            .unwrap();
        h
    }

    fn filter(accept: &str, method: Method) -> CompressFilter {
        let factory = CompressFilterFactory::new("r", &config(None), &Registry::new());
        let mut f = CompressFilter {
            shared: factory.shared.clone(),
            chosen: None,
            head: false,
            encoder: None,
        };
        let mut h = HeaderMap::new();
        h.insert("accept-encoding", HeaderValue::from_str(accept).unwrap());
        f.read_request(&method, &h);
        f
    }

    #[test]
    fn compressed_heads_change_as_they_must() {
        let mut f = filter("gzip;q=0.5, br;q=0.5, zstd;q=0, *;q=0.1", Method::GET);
        let h = answer(
            &mut f,
            200,
            &[
                ("content-type", "text/plain"),
                ("content-length", "5000"),
                ("etag", "\"v1\""),
                ("vary", "Cookie"),
                ("accept-ranges", "bytes"),
            ],
        );
        assert_eq!(h["content-encoding"], "br");
        assert_eq!(h["etag"], "W/\"v1\"");
        assert!(!h.contains_key("content-length") && !h.contains_key("accept-ranges"));
        let vary: Vec<_> = h.get_all("vary").iter().collect();
        assert_eq!(vary, ["Cookie", "Accept-Encoding"]);
    }

    /// Accept-Encoding, method, status, answer headers, whether `Vary` is added.
    type Case<'a> = (&'a str, Method, u16, &'a [(&'a str, &'a str)], bool);

    #[test]
    fn skips() {
        let text = ("content-type", "text/plain");
        let cases: &[Case] = &[
            ("gzip", Method::GET, 206, &[text], false),
            (
                "gzip",
                Method::GET,
                200,
                &[text, ("content-range", "bytes 0-1/2")],
                false,
            ),
            ("gzip", Method::GET, 304, &[text], false),
            ("gzip", Method::GET, 204, &[text], false),
            ("gzip", Method::GET, 101, &[text], false),
            (
                "gzip",
                Method::GET,
                200,
                &[text, ("content-encoding", "br")],
                false,
            ),
            (
                "gzip",
                Method::GET,
                200,
                &[text, ("cache-control", "public, No-Transform")],
                false,
            ),
            (
                "gzip",
                Method::GET,
                200,
                &[("content-type", "image/png")],
                false,
            ),
            (
                "gzip",
                Method::GET,
                200,
                &[text, ("content-length", "1023")],
                false,
            ),
            ("gzip", Method::HEAD, 200, &[text], true),
            ("gzip;q=0, identity", Method::GET, 200, &[text], true),
            (
                "garbage;;q=x,,br;q=2, gzip;q=",
                Method::GET,
                200,
                &[text],
                true,
            ),
        ];
        for (accept, method, status, headers, vary) in cases {
            let mut f = filter(accept, method.clone());
            let h = answer(&mut f, *status, headers);
            assert!(f.encoder.is_none(), "{accept} {status} {headers:?}");
            assert!(!h.contains_key("content-encoding") || h["content-encoding"] == "br");
            assert_eq!(
                h.contains_key("vary"),
                *vary,
                "{accept} {status} {headers:?}"
            );
            assert_eq!(f.shared.skipped.iter().map(Counter::get).sum::<u64>(), 1);
        }
    }
}
