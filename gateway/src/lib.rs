//! The gateway: HTTP/1.1 and HTTP/2 listeners (cleartext and TLS), a router compiled once per
//! config generation, a filter chain with native filters, and the `respond`, `static` and
//! `proxy` terminals. `main.rs` is only the command line; everything else is here so tests and
//! benchmarks drive the real thing in-process.

pub mod admin;
pub mod body;
pub mod certs;
pub mod cluster;
pub mod collectors;
pub mod connection;
pub mod context;
pub mod error;
pub(crate) mod file_watch;
pub mod filter;
pub mod forwarded;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod gcra;
pub mod generation;
pub mod ip_text;
pub mod memory;
pub mod per_gateway;
pub mod proxy;
pub mod request;
pub mod router;
pub mod server;
pub mod static_files;
pub mod systemd;
pub mod telemetry;
pub mod terminal;
pub mod wasm;

pub use body::Body;
pub use error::GatewayError;
pub use server::Gateway;

/// The log filter when `RUST_LOG` is not set.
const DEFAULT_LOG_FILTER: &str = "info,rustls=error";

/// The gateway's version, as printed by `gateway version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Installs the process's log output (stderr), honouring `RUST_LOG` (default `info`, with
/// rustls at `error`).
pub fn init_logging(format: gateway_config::model::LogFormat) {
    // rustls logs what a peer got wrong at `warn` (an IP address sent as SNI, as wrk and
    // h2load do, is a warning on every handshake): any client could fill the log with lines
    // the operator can do nothing about. Failed handshakes are counted instead
    // (`gateway_listener_handshake_failures_total`).
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    // Colour codes are for a person at a terminal; in a file or a journal they are noise.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // Lines written while a traced request is served carry its span's ids.
    let subscriber = telemetry::log_format::subscriber(format, filter, std::io::stderr, ansi);
    let _ = tracing_subscriber::util::SubscriberInitExt::try_init(subscriber);
}
