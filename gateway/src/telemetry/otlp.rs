//! OTLP over the workspace's hyper client, one connection kept open between exports; used by
//! the trace exporter and the metrics exporter alike ([`Signal`] picks the service).
//!
//! * OTLP/gRPC: an HTTP/2 POST to the signal's Export method (for traces
//!   `/opentelemetry.proto.collector.trace.v1.TraceService/Export`) with gRPC's 5-byte length
//!   prefix; success is `grpc-status: 0` (in the trailers, or in the headers of a trailers-only
//!   reply). Cleartext endpoints speak h2c with prior knowledge.
//! * OTLP/HTTP: an HTTP/1.1 POST of the protobuf (`application/x-protobuf`) to the configured
//!   URL, which ends in `/v1/traces` (or `/v1/metrics`); success is any 2xx.
//!
//! `https://` endpoints use rustls (aws-lc-rs) with the bundled web roots, like upstreams
//! without a CA file. Every error drops the connection, so the next export starts clean.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{CONTENT_TYPE, HOST, HeaderValue, TE, USER_AGENT};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// What an endpoint receives: its gRPC method and its OTLP/HTTP path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signal {
    /// Spans.
    Traces,
    /// Metrics.
    Metrics,
}

impl Signal {
    fn grpc_path(self) -> &'static str {
        match self {
            Self::Traces => "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            Self::Metrics => "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
        }
    }

    fn http_path(self) -> &'static str {
        match self {
            Self::Traces => "/v1/traces",
            Self::Metrics => "/v1/metrics",
        }
    }
}

/// Why an export failed (for the log line; the spans are counted as dropped either way).
pub(crate) type ExportError = String;

/// Which OTLP flavour an endpoint speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// OTLP/gRPC.
    Grpc,
    /// OTLP/HTTP with protobuf bodies.
    HttpProtobuf,
}

/// A parsed `otlp_endpoint`.
#[derive(Clone)]
pub(crate) struct Endpoint {
    /// gRPC or HTTP.
    pub(crate) protocol: Protocol,
    /// Where requests go (gRPC: the Export method on the endpoint's authority).
    uri: Uri,
    host: String,
    port: u16,
    tls: Option<(TlsConnector, ServerName<'static>)>,
}

impl Endpoint {
    /// Parses `url`: `http(s)://host[:port][/path]`; a path ending in the signal's OTLP/HTTP
    /// path (`/v1/traces`, `/v1/metrics`) selects OTLP/HTTP, anything else OTLP/gRPC (whose
    /// path is fixed by the protocol).
    pub(crate) fn parse(url: &str, signal: Signal) -> Result<Self, String> {
        let uri: Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err("the scheme must be http or https".into()),
        };
        let authority = uri.authority().ok_or("the URL has no host")?.clone();
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        if host.is_empty() {
            return Err("the URL has no host".into());
        }
        let protocol = if uri
            .path()
            .trim_end_matches('/')
            .ends_with(signal.http_path())
        {
            Protocol::HttpProtobuf
        } else {
            Protocol::Grpc
        };
        let port = authority.port_u16().unwrap_or(match (protocol, https) {
            (Protocol::Grpc, _) => 4317,
            (Protocol::HttpProtobuf, false) => 80,
            (Protocol::HttpProtobuf, true) => 443,
        });
        let uri = match protocol {
            Protocol::HttpProtobuf => uri,
            Protocol::Grpc => Uri::builder()
                .scheme(uri.scheme_str().unwrap_or("http"))
                .authority(authority)
                .path_and_query(signal.grpc_path())
                .build()
                .map_err(|e| e.to_string())?,
        };
        let tls = if https {
            let name = ServerName::try_from(host.clone())
                .map_err(|e| format!("bad TLS server name: {e}"))?;
            let alpn: &[u8] = match protocol {
                Protocol::Grpc => b"h2",
                Protocol::HttpProtobuf => b"http/1.1",
            };
            Some((TlsConnector::from(tls_config(alpn)?), name))
        } else {
            None
        };
        Ok(Self {
            protocol,
            uri,
            host,
            port,
            tls,
        })
    }
}

fn tls_config(alpn: &[u8]) -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(Arc::new(config))
}

enum Conn {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
}

impl Conn {
    fn is_closed(&self) -> bool {
        match self {
            Self::H1(s) => s.is_closed(),
            Self::H2(s) => s.is_closed(),
        }
    }
}

/// One endpoint and the connection to it.
pub(crate) struct Transport {
    endpoint: Endpoint,
    conn: Option<Conn>,
    user_agent: HeaderValue,
    /// The configured `headers` (a collector's API key), sent with every export.
    headers: http::HeaderMap,
}

/// The `headers` of `telemetry.traces` or `telemetry.metrics`, checked.
pub(crate) fn export_headers(
    headers: &indexmap::IndexMap<String, String>,
) -> Result<http::HeaderMap, String> {
    let mut out = http::HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let name = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("`{name}` is not a header name"))?;
        let value = HeaderValue::from_str(value)
            .map_err(|_| format!("the value of `{name}` is not a header value"))?;
        out.append(name, value);
    }
    Ok(out)
}

impl Transport {
    /// A transport that connects on first use.
    pub(crate) fn new(endpoint: Endpoint, headers: http::HeaderMap) -> Self {
        let user_agent = HeaderValue::from_str(&format!("gateway/{}", crate::VERSION))
            .unwrap_or_else(|_| HeaderValue::from_static("gateway"));
        Self {
            endpoint,
            conn: None,
            user_agent,
            headers,
        }
    }

    /// Drops the connection (after a timeout, its state is unknown).
    pub(crate) fn reset(&mut self) {
        self.conn = None;
    }

    /// Sends one export request; on any error the connection is dropped.
    pub(crate) async fn export(&mut self, message: &impl Message) -> Result<(), ExportError> {
        let body = match self.endpoint.protocol {
            Protocol::Grpc => grpc_frame(message),
            Protocol::HttpProtobuf => Bytes::from(message.encode_to_vec()),
        };
        let result = self.send(body).await;
        if result.is_err() {
            self.conn = None;
        }
        result
    }

    async fn send(&mut self, body: Bytes) -> Result<(), ExportError> {
        if self.conn.as_ref().is_some_and(Conn::is_closed) {
            self.conn = None;
        }
        let reused = self.conn.is_some();
        let mut req = self.request(body);
        // A kept connection the collector closed while idle hands the request back unsent:
        // send it once more on a fresh one.
        for attempt in 0..2 {
            if self.conn.is_none() {
                self.conn = Some(self.connect().await?);
            }
            let sent = match self.conn.as_mut() {
                Some(Conn::H1(s)) => {
                    s.ready().await.map_err(|e| e.to_string())?;
                    s.try_send_request(req).await
                }
                Some(Conn::H2(s)) => {
                    s.ready().await.map_err(|e| e.to_string())?;
                    s.try_send_request(req).await
                }
                None => return Err("no connection".into()),
            };
            match sent {
                Ok(res) => return self.check(res).await,
                Err(mut e) => match e.take_message() {
                    Some(again) if reused && attempt == 0 => {
                        self.conn = None;
                        req = again;
                    }
                    _ => return Err(e.into_error().to_string()),
                },
            }
        }
        Err("the collector closed the connection".into())
    }

    fn request(&self, body: Bytes) -> Request<Full<Bytes>> {
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = Method::POST;
        let h = req.headers_mut();
        h.extend(self.headers.clone());
        h.insert(USER_AGENT, self.user_agent.clone());
        match self.endpoint.protocol {
            Protocol::Grpc => {
                *req.uri_mut() = self.endpoint.uri.clone();
                *req.version_mut() = http::Version::HTTP_2;
                let h = req.headers_mut();
                h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
                h.insert(TE, HeaderValue::from_static("trailers"));
            }
            Protocol::HttpProtobuf => {
                let path = self
                    .endpoint
                    .uri
                    .path_and_query()
                    .map_or("/", |p| p.as_str());
                *req.uri_mut() = Uri::try_from(path).unwrap_or_default();
                let h = req.headers_mut();
                h.insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static("application/x-protobuf"),
                );
                if let Some(a) = self.endpoint.uri.authority()
                    && let Ok(v) = HeaderValue::from_str(a.as_str())
                {
                    h.insert(HOST, v);
                }
            }
        }
        req
    }

    /// Reads the whole reply (so the connection can be reused) and checks it succeeded.
    async fn check(&self, res: http::Response<hyper::body::Incoming>) -> Result<(), ExportError> {
        let (head, body) = res.into_parts();
        let collected = body.collect().await.map_err(|e| e.to_string())?;
        if !head.status.is_success() {
            return Err(format!("the collector answered {}", head.status));
        }
        if self.endpoint.protocol == Protocol::HttpProtobuf {
            return Ok(());
        }
        let trailers = collected.trailers();
        let field = |name: &str| {
            trailers
                .and_then(|t| t.get(name))
                .or_else(|| head.headers.get(name))
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        };
        match field("grpc-status").as_deref() {
            Some("0") => Ok(()),
            Some(code) => Err(format!(
                "the collector answered grpc-status {code}: {}",
                field("grpc-message").unwrap_or_default()
            )),
            None => Err("the collector's reply has no grpc-status".into()),
        }
    }

    async fn connect(&self) -> Result<Conn, ExportError> {
        let e = &self.endpoint;
        let tcp = TcpStream::connect((e.host.as_str(), e.port))
            .await
            .map_err(|err| format!("connect to {}:{}: {err}", e.host, e.port))?;
        let _ = tcp.set_nodelay(true);
        let h2 = e.protocol == Protocol::Grpc;
        match &e.tls {
            None => handshake(tcp, h2).await,
            Some((connector, name)) => {
                let tls = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(|err| format!("TLS with {}: {err}", e.host))?;
                handshake(tls, h2).await
            }
        }
    }
}

async fn handshake<IO>(io: IO, h2: bool) -> Result<Conn, ExportError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(io);
    if h2 {
        let (tx, conn) = http2::handshake(TokioExecutor::new(), io)
            .await
            .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn::H2(tx))
    } else {
        let (tx, conn) = http1::handshake(io)
            .await
            .map_err(|e| format!("HTTP/1.1 handshake: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn::H1(tx))
    }
}

/// gRPC's length-prefixed message: flag 0 (uncompressed), 4-byte big-endian length.
fn grpc_frame(message: &impl Message) -> Bytes {
    let len = message.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    buf.put_u32(len as u32);
    // Encoding into a buffer with room for the whole message cannot fail.
    let _ = message.encode(&mut buf);
    buf.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_pick_the_protocol_by_path() {
        let parse = |url| Endpoint::parse(url, Signal::Traces);
        let g = parse("http://127.0.0.1:4317").expect("grpc");
        assert_eq!(g.protocol, Protocol::Grpc);
        assert_eq!(g.uri.path(), Signal::Traces.grpc_path());
        let h = parse("http://collector:4318/v1/traces").expect("http");
        assert_eq!(h.protocol, Protocol::HttpProtobuf);
        assert_eq!((h.host.as_str(), h.port), ("collector", 4318));
        let d = parse("http://collector/v1/traces").expect("default port");
        assert_eq!(d.port, 80);
        assert!(parse("ftp://x").is_err());
        assert!(parse("not a url").is_err());
        assert!(parse("http://").is_err());
        assert!(parse("http:///v1/traces").is_err());
        // Each signal recognises its own OTLP/HTTP path.
        let m = Endpoint::parse("http://collector:4318/v1/metrics", Signal::Metrics).expect("m");
        assert_eq!(m.protocol, Protocol::HttpProtobuf);
        assert_eq!(
            parse("http://collector:4318/v1/metrics")
                .expect("t")
                .protocol,
            Protocol::Grpc
        );
        let g = Endpoint::parse("https://collector", Signal::Metrics).expect("grpc");
        assert_eq!(g.uri.path(), Signal::Metrics.grpc_path());
    }

    #[test]
    fn grpc_frames_are_length_prefixed() {
        let msg =
            opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest::default();
        let f = grpc_frame(&msg);
        assert_eq!(&f[..5], &[0, 0, 0, 0, 0]);
    }
}
