//! A small HTTP client for the certificate machinery: ACME requests to the CA's directory and OCSP
//! requests to responders. One connection per request (these are a handful of requests a day),
//! HTTPS on the workspace's rustls/aws-lc-rs with the public roots or a configured CA bundle, and
//! plain HTTP for OCSP responders, which serve it by design (RFC 6960, appendix A). Responses are
//! read whole, up to a size cap, within one deadline.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use rustls::crypto::aws_lc_rs;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;

use crate::error::GatewayError;

/// Largest response body accepted (certificate chains and OCSP responses are a few KiB).
const MAX_BODY: usize = 1024 * 1024;

/// The client: TLS settings and a deadline per request.
#[derive(Clone)]
pub struct HttpClient {
    tls: Arc<ClientConfig>,
    timeout: Duration,
}

impl HttpClient {
    /// Trusts `ca` (a PEM bundle) when given, else the public web roots.
    pub fn new(ca: Option<&Path>, timeout: Duration) -> Result<Self, String> {
        let mut roots = RootCertStore::empty();
        match ca {
            Some(ca) => {
                let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca)
                    .and_then(|it| it.collect::<Result<_, _>>())
                    .map_err(|e| format!("cannot read {}: {e}", ca.display()))?;
                let (added, _) = roots.add_parsable_certificates(certs);
                if added == 0 {
                    return Err(format!("no CA certificate in {}", ca.display()));
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let tls = ClientConfig::builder_with_provider(Arc::new(aws_lc_rs::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Self {
            tls: Arc::new(tls),
            timeout,
        })
    }

    /// Sends `req` (absolute URI) and returns the response with its whole body.
    pub async fn send<B>(&self, req: Request<B>) -> Result<Response<Bytes>, GatewayError>
    where
        B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let uri = req.uri().to_string();
        tokio::time::timeout(self.timeout, self.send_inner(req))
            .await
            .map_err(|_| fetch_error(&uri, format!("no answer within {:?}", self.timeout)))?
    }

    async fn send_inner<B>(&self, req: Request<B>) -> Result<Response<Bytes>, GatewayError>
    where
        B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (mut parts, body) = req.into_parts();
        let uri = parts.uri.clone();
        let shown = uri.to_string();
        let fail = |m: String| fetch_error(&shown, m);
        let host = uri.host().ok_or_else(|| fail("no host".into()))?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(fail("only http:// and https:// URLs are fetched".into())),
        };
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        // Origin-form request target with a Host header, as HTTP/1.1 servers expect.
        let authority = uri.authority().map(|a| a.as_str().to_owned());
        parts.uri = uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .parse()
            .map_err(|e: http::uri::InvalidUri| fail(e.to_string()))?;
        if let Some(a) = authority {
            let value = header::HeaderValue::from_str(&a).map_err(|e| fail(e.to_string()))?;
            parts.headers.insert(header::HOST, value);
        }
        let req = Request::from_parts(parts, body);
        let tcp = TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| fail(format!("connect: {e}")))?;
        let _ = tcp.set_nodelay(true);
        let res = if https {
            let name = ServerName::try_from(host.clone()).map_err(|e| fail(e.to_string()))?;
            let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
                .connect(name, tcp)
                .await
                .map_err(|e| fail(format!("TLS: {e}")))?;
            exchange(TokioIo::new(tls), req).await
        } else {
            exchange(TokioIo::new(tcp), req).await
        };
        res.map_err(fail)
    }
}

async fn exchange<IO, B>(io: IO, req: Request<B>) -> Result<Response<Bytes>, String>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    // The connection task ends with the response (the request is the connection's only one).
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let res = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let (parts, body) = res.into_parts();
    let body = Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map_err(|e| format!("reading the response: {e}"))?
        .to_bytes();
    Ok(Response::from_parts(parts, body))
}

fn fetch_error(uri: &str, message: String) -> GatewayError {
    GatewayError::Certificate(format!("{uri}: {message}"))
}

/// The ACME library's view of [`HttpClient`].
pub struct AcmeHttp(pub HttpClient);

impl instant_acme::HttpClient for AcmeHttp {
    fn request(
        &self,
        req: Request<instant_acme::BodyWrapper<Bytes>>,
    ) -> Pin<
        Box<dyn Future<Output = Result<instant_acme::BytesResponse, instant_acme::Error>> + Send>,
    > {
        let client = self.0.clone();
        Box::pin(async move {
            let res = client
                .send(req)
                .await
                .map_err(|e| instant_acme::Error::Other(Box::new(e)))?;
            Ok(instant_acme::BytesResponse::from(res.map(Full::new)))
        })
    }
}
