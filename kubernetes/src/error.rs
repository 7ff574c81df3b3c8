//! The controller's one error type.

/// What can go wrong talking to the API server or reading credentials.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The kubeconfig or service-account files could not be read or understood.
    #[error("credentials: {0}")]
    Credentials(String),
    /// Connecting (TCP or TLS) to the API server failed.
    #[error("connect to {addr}: {source}")]
    Connect {
        /// `host:port` of the API server.
        addr: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP exchange failed.
    #[error("http: {0}")]
    Http(String),
    /// The API server answered with an error status.
    #[error("{method} {path}: {status}: {body}")]
    Status {
        /// Request method.
        method: String,
        /// Request path.
        path: String,
        /// The status code.
        status: u16,
        /// The first bytes of the answer (a `Status` object).
        body: String,
    },
    /// The resource version asked for is too old (410 Gone): list again.
    #[error("resource version expired")]
    Gone,
    /// An answer was not the JSON expected.
    #[error("decode: {0}")]
    Decode(String),
}
