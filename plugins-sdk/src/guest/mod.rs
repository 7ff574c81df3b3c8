//! The guest side: the [`Filter`] trait, typed views of the request, response and bodies, and
//! the glue ([`export_filter!`](crate::export_filter)) that registers a filter with the
//! proxy-wasm dispatcher.

mod glue;
mod views;

pub use views::{Body, CallResponse, Request, Response};

use std::rc::Rc;
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::Flow;

#[doc(hidden)]
pub use glue::register;
#[doc(hidden)]
pub use proxy_wasm;

/// A filter: one instance per request, created from the plugin's typed configuration.
pub trait Filter: Sized + 'static {
    /// The configuration, deserialised from the plugin's JSON `config` (a YAML string as a
    /// JSON string; an absent config deserialises from `{}`). A config that does not deserialise rejects the plugin.
    type Config: DeserializeOwned + 'static;

    /// The instance for one request.
    fn create(config: &Rc<Self::Config>) -> Self;

    /// The request head arrived.
    fn on_request(&mut self, _req: &mut Request) -> Flow {
        Flow::Continue
    }

    /// Request body data; [`Flow::Pause`] buffers until the end of the body.
    fn on_request_body(&mut self, _body: &mut Body, _end_of_stream: bool) -> Flow {
        Flow::Continue
    }

    /// The response head is about to be sent.
    fn on_response(&mut self, _res: &mut Response) -> Flow {
        Flow::Continue
    }

    /// Response body data; [`Flow::Pause`] buffers until the end of the body.
    fn on_response_body(&mut self, _body: &mut Body, _end_of_stream: bool) -> Flow {
        Flow::Continue
    }

    /// The answer to an [`http_call`] made by this request (`None` status: the call failed
    /// or timed out). A paused phase resumes on `Continue`.
    fn on_call_response(&mut self, _call: CallResponse) -> Flow {
        Flow::Continue
    }

    /// The exchange is over.
    fn on_log(&mut self) {}
}

/// Starts an HTTP call to upstream `upstream` (a name from the gateway config). The answer is
/// delivered to [`Filter::on_call_response`] of the request that made it; return
/// [`Flow::Pause`] from the phase to wait for it.
pub fn http_call(
    upstream: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<u32, String> {
    let mut all = vec![
        (":method", method),
        (":path", path),
        (":authority", upstream),
    ];
    all.extend_from_slice(headers);
    proxy_wasm::hostcalls::dispatch_http_call(upstream, all, body, vec![], timeout)
        .map_err(|s| format!("http call refused: {s:?}"))
}

/// Logs a line in the gateway's log, attributed to the plugin.
pub fn log(level: Level, message: &str) {
    use proxy_wasm::types::LogLevel;
    let level = match level {
        Level::Debug => LogLevel::Debug,
        Level::Info => LogLevel::Info,
        Level::Warn => LogLevel::Warn,
        Level::Error => LogLevel::Error,
    };
    let _ = proxy_wasm::hostcalls::log(level, message);
}

/// Log levels for [`log`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Debug.
    Debug,
    /// Info.
    Info,
    /// Warning.
    Warn,
    /// Error.
    Error,
}

/// Shared data: a key-value store shared by every VM of every plugin in the gateway process,
/// with compare-and-swap.
pub mod shared {
    use proxy_wasm::hostcalls;
    use proxy_wasm::types::Status;

    /// The value of `key` and its version (for [`set`]).
    pub fn get(key: &str) -> Option<(Vec<u8>, u32)> {
        match hostcalls::get_shared_data(key) {
            Ok((Some(v), cas)) => Some((v, cas.unwrap_or(0))),
            _ => None,
        }
    }

    /// Writes `key` if its version is still `version` (0: unconditionally). `false` when
    /// another writer came first.
    pub fn set(key: &str, value: &[u8], version: u32) -> bool {
        let cas = (version != 0).then_some(version);
        !matches!(
            hostcalls::set_shared_data(key, Some(value), cas),
            Err(Status::CasMismatch)
        )
    }

    /// Adds `delta` to the decimal counter at `key` atomically (a compare-and-swap loop) and
    /// returns the new value.
    pub fn add(key: &str, delta: i64) -> i64 {
        loop {
            let (current, version) = get(key)
                .map(|(v, c)| {
                    let n = std::str::from_utf8(&v).ok().and_then(|s| s.parse().ok());
                    (n.unwrap_or(0i64), c)
                })
                .unwrap_or((0, 0));
            let next = current.saturating_add(delta);
            if set(key, next.to_string().as_bytes(), version) {
                return next;
            }
        }
    }
}

/// Reads a property (`["source", "address"]`, `["request", "path"]`, ...).
pub fn property(path: &[&str]) -> Option<Vec<u8>> {
    proxy_wasm::hostcalls::get_property(path.to_vec())
        .ok()
        .flatten()
}

/// The wall-clock time, in seconds since the Unix epoch.
pub fn now_unix() -> u64 {
    proxy_wasm::hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs())
}

/// Registers filter `$t` as the plugin's HTTP filter. Use once per plugin crate (a `cdylib`).
#[macro_export]
macro_rules! export_filter {
    ($t:ty) => {
        $crate::proxy_wasm::main! {{
            $crate::register::<$t>();
        }}
    };
}
