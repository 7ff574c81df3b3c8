//! A small Kubernetes API client on the workspace's own hyper and rustls: credentials from a
//! kubeconfig or the pod's service account, JSON GETs, streamed watches and status patches.
//! Everything shares one HTTP/2 connection (the API server's own choice), re-made when it
//! closes, with pings so that a silently lost one is noticed; a server without HTTP/2 gets one
//! HTTP/1.1 connection per request.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine as _;
use bytes::{Buf, Bytes, BytesMut};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls_pki_types::pem::PemObject;
use serde::Deserialize;
use serde_json::Value;

use crate::KubeError;

const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// How requests authenticate.
#[derive(Clone)]
enum Auth {
    None,
    Token(String),
    /// Re-read per request: projected service-account tokens rotate.
    TokenFile(PathBuf),
}

/// A client of one API server (cheap to clone).
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    addr: String,
    server_name: ServerName<'static>,
    tls: tokio_rustls::TlsConnector,
    auth: Auth,
    shared: tokio::sync::Mutex<Option<Http2>>,
}

type Http2 = hyper::client::conn::http2::SendRequest<Full<Bytes>>;

/// How long the shared connection may go without an answer to a ping.
const PING_EVERY: std::time::Duration = std::time::Duration::from_secs(20);

impl Client {
    /// From a kubeconfig file (its current context), or the pod's service account when `None`.
    pub fn new(kubeconfig: Option<&Path>) -> Result<Self, KubeError> {
        match kubeconfig {
            Some(path) => from_kubeconfig(path),
            None => in_cluster(),
        }
    }

    /// GETs a JSON document.
    pub async fn get(&self, path: &str) -> Result<Value, KubeError> {
        let res = self.send(Method::GET, path, None).await?;
        let body = read_body(res, Method::GET, path).await?;
        serde_json::from_slice(&body).map_err(|e| KubeError::Decode(e.to_string()))
    }

    /// GETs a text document (`/readyz`).
    pub async fn get_text(&self, path: &str) -> Result<String, KubeError> {
        let res = self.send(Method::GET, path, None).await?;
        let body = read_body(res, Method::GET, path).await?;
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    /// Starts a watch; events come from [`WatchStream::next`].
    pub async fn watch(&self, path: &str) -> Result<WatchStream, KubeError> {
        let res = self.send(Method::GET, path, None).await?;
        if res.status() != StatusCode::OK {
            read_body(res, Method::GET, path).await?;
            return Err(KubeError::Http(format!("watch {path}: no body")));
        }
        Ok(WatchStream {
            body: res.into_body(),
            buf: BytesMut::new(),
        })
    }

    /// Merge-patches the `status` of an object (`path` ends in `/status`).
    pub async fn patch_status(&self, path: &str, status: &Value) -> Result<(), KubeError> {
        let body = serde_json::to_vec(&serde_json::json!({ "status": status }))
            .map_err(|e| KubeError::Decode(e.to_string()))?;
        let res = self.send(Method::PATCH, path, Some(body)).await?;
        read_body(res, Method::PATCH, path).await.map(drop)
    }

    /// Sends a POST with a JSON body (used by tests and tools to create objects).
    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, KubeError> {
        self.json(Method::POST, path, body).await
    }

    /// Sends a request with a JSON body and returns the answer's JSON.
    pub async fn json(&self, method: Method, path: &str, body: &Value) -> Result<Value, KubeError> {
        let bytes = serde_json::to_vec(body).map_err(|e| KubeError::Decode(e.to_string()))?;
        let res = self.send(method.clone(), path, Some(bytes)).await?;
        let body = read_body(res, method, path).await?;
        serde_json::from_slice(&body).map_err(|e| KubeError::Decode(e.to_string()))
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<http::Response<Incoming>, KubeError> {
        let inner = &self.inner;
        let shared = self.shared().await?;
        let uri = match &shared {
            Connection::Http2(_) => format!("https://{}{path}", inner.addr),
            Connection::Http1(_) => path.to_owned(),
        };
        let mut req = Request::builder()
            .method(method.clone())
            .uri(uri)
            .header(http::header::ACCEPT, "application/json");
        if let Connection::Http1(_) = &shared {
            req = req.header(http::header::HOST, &inner.addr);
        }
        if body.is_some() {
            let content_type = if method == Method::PATCH {
                "application/merge-patch+json"
            } else {
                "application/json"
            };
            req = req.header(http::header::CONTENT_TYPE, content_type);
        }
        if let Some(token) = inner.auth.token()? {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| KubeError::Http(e.to_string()))?;
        let sent = match shared {
            Connection::Http2(mut s) => s.send_request(req).await,
            Connection::Http1(mut s) => s.send_request(req).await,
        };
        sent.map_err(|e| KubeError::Http(e.to_string()))
    }

    /// The shared HTTP/2 connection (made if there is none or it closed), or a fresh HTTP/1.1
    /// one when the server does not speak HTTP/2.
    async fn shared(&self) -> Result<Connection, KubeError> {
        let mut slot = self.inner.shared.lock().await;
        if let Some(s) = slot.as_ref().filter(|s| !s.is_closed()) {
            return Ok(Connection::Http2(s.clone()));
        }
        let inner = &self.inner;
        let connect = |source| KubeError::Connect {
            addr: inner.addr.clone(),
            source,
        };
        let tcp = tokio::net::TcpStream::connect(&inner.addr)
            .await
            .map_err(connect)?;
        let _ = tcp.set_nodelay(true);
        let tls = inner
            .tls
            .connect(inner.server_name.clone(), tcp)
            .await
            .map_err(connect)?;
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        let http = |e: hyper::Error| KubeError::Http(e.to_string());
        if !h2 {
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .map_err(http)?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            return Ok(Connection::Http1(sender));
        }
        let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .keep_alive_interval(PING_EVERY)
            .keep_alive_timeout(PING_EVERY)
            .keep_alive_while_idle(true)
            .handshake(TokioIo::new(tls))
            .await
            .map_err(http)?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        *slot = Some(sender.clone());
        Ok(Connection::Http2(sender))
    }
}

enum Connection {
    Http2(Http2),
    Http1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
}

impl Auth {
    fn token(&self) -> Result<Option<String>, KubeError> {
        Ok(match self {
            Auth::None => None,
            Auth::Token(t) => Some(t.clone()),
            Auth::TokenFile(p) => Some(
                std::fs::read_to_string(p)
                    .map_err(|e| KubeError::Credentials(format!("{}: {e}", p.display())))?
                    .trim()
                    .to_owned(),
            ),
        })
    }
}

async fn read_body(
    res: http::Response<Incoming>,
    method: Method,
    path: &str,
) -> Result<Bytes, KubeError> {
    let status = res.status();
    let body = res
        .into_body()
        .collect()
        .await
        .map_err(|e| KubeError::Http(e.to_string()))?
        .to_bytes();
    if status == StatusCode::GONE {
        return Err(KubeError::Gone);
    }
    if !status.is_success() {
        let text = String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
        return Err(KubeError::Status {
            method: method.to_string(),
            path: path.to_owned(),
            status: status.as_u16(),
            body: text,
        });
    }
    Ok(body)
}

/// The events of one watch request, one JSON document per line.
pub struct WatchStream {
    body: Incoming,
    buf: BytesMut,
}

impl WatchStream {
    /// The next event (`{"type": ..., "object": ...}`), or `None` when the server ended the
    /// watch.
    pub async fn next(&mut self) -> Result<Option<Value>, KubeError> {
        loop {
            if let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
                let line = self.buf.split_to(end + 1);
                if line.len() <= 1 {
                    continue;
                }
                let event: Value = serde_json::from_slice(&line[..line.len() - 1])
                    .map_err(|e| KubeError::Decode(e.to_string()))?;
                return Ok(Some(event));
            }
            match self.body.frame().await {
                None => return Ok(None),
                Some(Err(e)) => return Err(KubeError::Http(e.to_string())),
                Some(Ok(frame)) => {
                    if let Ok(mut data) = frame.into_data() {
                        while data.has_remaining() {
                            let chunk = data.chunk();
                            self.buf.extend_from_slice(chunk);
                            let n = chunk.len();
                            data.advance(n);
                        }
                    }
                }
            }
        }
    }
}

// === credentials ===

#[derive(Deserialize)]
struct KubeConfig {
    #[serde(rename = "current-context")]
    current_context: Option<String>,
    #[serde(default)]
    clusters: Vec<Named<ClusterEntry>>,
    #[serde(default)]
    users: Vec<Named<UserEntry>>,
    #[serde(default)]
    contexts: Vec<Named<ContextEntry>>,
}

#[derive(Deserialize)]
struct Named<T> {
    name: String,
    #[serde(alias = "cluster", alias = "user", alias = "context")]
    value: T,
}

#[derive(Deserialize)]
struct ClusterEntry {
    server: String,
    #[serde(rename = "certificate-authority-data")]
    ca_data: Option<String>,
    #[serde(rename = "certificate-authority")]
    ca_file: Option<PathBuf>,
}

#[derive(Deserialize, Default)]
struct UserEntry {
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<PathBuf>,
    #[serde(rename = "client-certificate-data")]
    cert_data: Option<String>,
    #[serde(rename = "client-key-data")]
    key_data: Option<String>,
    #[serde(rename = "client-certificate")]
    cert_file: Option<PathBuf>,
    #[serde(rename = "client-key")]
    key_file: Option<PathBuf>,
}

#[derive(Deserialize)]
struct ContextEntry {
    cluster: String,
    user: Option<String>,
}

fn cred(msg: impl std::fmt::Display) -> KubeError {
    KubeError::Credentials(msg.to_string())
}

fn from_kubeconfig(path: &Path) -> Result<Client, KubeError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| cred(format!("{}: {e}", path.display())))?;
    let kc: KubeConfig =
        serde_yaml::from_str(&text).map_err(|e| cred(format!("{}: {e}", path.display())))?;
    let base = path.parent().unwrap_or(Path::new("."));
    let context = match &kc.current_context {
        Some(name) => kc.contexts.iter().find(|c| &c.name == name),
        None => kc.contexts.first(),
    }
    .ok_or_else(|| cred("the kubeconfig has no (current) context"))?;
    let cluster = kc
        .clusters
        .iter()
        .find(|c| c.name == context.value.cluster)
        .ok_or_else(|| cred(format!("no cluster `{}`", context.value.cluster)))?;
    let default_user = UserEntry::default();
    let user = match &context.value.user {
        Some(u) => {
            &kc.users
                .iter()
                .find(|x| &x.name == u)
                .ok_or_else(|| cred(format!("no user `{u}`")))?
                .value
        }
        None => &default_user,
    };
    let read =
        |data: &Option<String>, file: &Option<PathBuf>| -> Result<Option<Vec<u8>>, KubeError> {
            if let Some(d) = data {
                return base64::engine::general_purpose::STANDARD
                    .decode(d.trim())
                    .map(Some)
                    .map_err(|e| cred(format!("base64: {e}")));
            }
            if let Some(f) = file {
                let f = base.join(f);
                return std::fs::read(&f)
                    .map(Some)
                    .map_err(|e| cred(format!("{}: {e}", f.display())));
            }
            Ok(None)
        };
    let ca = read(&cluster.value.ca_data, &cluster.value.ca_file)?;
    let cert = read(&user.cert_data, &user.cert_file)?;
    let key = read(&user.key_data, &user.key_file)?;
    let auth = match (&user.token, &user.token_file) {
        (Some(t), _) => Auth::Token(t.clone()),
        (None, Some(f)) => Auth::TokenFile(base.join(f)),
        _ => Auth::None,
    };
    let identity = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        _ => None,
    };
    build(&cluster.value.server, ca.as_deref(), identity, auth)
}

fn in_cluster() -> Result<Client, KubeError> {
    let host = std::env::var("KUBERNETES_SERVICE_HOST")
        .map_err(|_| cred("no `kubeconfig` and not in a pod (KUBERNETES_SERVICE_HOST unset)"))?;
    let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    let dir = Path::new(SERVICE_ACCOUNT);
    let ca = std::fs::read(dir.join("ca.crt")).map_err(|e| cred(format!("ca.crt: {e}")))?;
    build(
        &format!("https://{host}:{port}"),
        Some(&ca),
        None,
        Auth::TokenFile(dir.join("token")),
    )
}

fn build(
    server: &str,
    ca: Option<&[u8]>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    auth: Auth,
) -> Result<Client, KubeError> {
    let uri: http::Uri = server
        .parse()
        .map_err(|e| cred(format!("server `{server}`: {e}")))?;
    if uri.scheme_str() != Some("https") {
        return Err(cred(format!("server `{server}` must be an https:// URL")));
    }
    let host = uri
        .host()
        .ok_or_else(|| cred(format!("server `{server}` has no host")))?;
    let port = uri.port_u16().unwrap_or(443);
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let server_name = ServerName::try_from(bare.to_owned())
        .map_err(|e| cred(format!("server `{server}`: {e}")))?;
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| cred(format!("CA: {e}")))?;
                roots.add(cert).map_err(|e| cred(format!("CA: {e}")))?;
            }
        }
        None => return Err(cred("no certificate authority for the API server")),
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| cred(e.to_string()))?
        .with_root_certificates(roots);
    let mut tls = match identity {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(&cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| cred(format!("client certificate: {e}")))?;
            let key = PrivateKeyDer::from_pem_slice(&key)
                .map_err(|e| cred(format!("client key: {e}")))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| cred(format!("client certificate: {e}")))?
        }
        None => builder.with_no_client_auth(),
    };
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Client {
        inner: Arc::new(Inner {
            addr: format!("{host}:{port}"),
            server_name,
            tls: tokio_rustls::TlsConnector::from(Arc::new(tls)),
            auth,
            shared: tokio::sync::Mutex::new(None),
        }),
    })
}
