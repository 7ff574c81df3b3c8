//! What the store holds for one VM: the plugin's identity and configuration, the live contexts
//! (HTTP requests and TCP connections) with the data their callbacks may read and change, and
//! the effects a guest call produced (continue, close, local reply, new HTTP calls), which the
//! embedder applies only after the call returns (Envoy's rule: never re-enter the filter chain
//! from inside a host call).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, request, response};
use wasmtime::{Memory, ResourceLimiter, TypedFunc};

use crate::error::PluginError;
use crate::shared::Shared;

/// A plugin's identity and configuration, shared by its VMs.
#[derive(Debug, Clone, Default)]
pub struct PluginInfo {
    /// Name in the gateway config (`plugin_name` property, log target).
    pub name: Arc<str>,
    /// Root id (`plugin_root_id` property); empty by default, as in Envoy.
    pub root_id: Arc<str>,
    /// VM id (`plugin_vm_id` property).
    pub vm_id: Arc<str>,
    /// Bytes returned for `PLUGIN_CONFIGURATION`.
    pub config: Bytes,
    /// Bytes returned for `VM_CONFIGURATION`.
    pub vm_config: Bytes,
    /// Per-call limits.
    pub limits: Limits,
    /// Where shared data and queues live when not in the process (`scope: global`).
    pub global: Option<crate::shared::GlobalStoreRef>,
}

/// Per-VM resource limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest linear memory, bytes.
    pub memory: u64,
    /// Longest guest call.
    pub time: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory: 64 << 20,
            time: Duration::from_millis(100),
        }
    }
}

/// Facts about the connection a context belongs to (properties).
#[derive(Debug, Clone, Default)]
pub struct StreamInfo {
    /// Client address.
    pub source: Option<SocketAddr>,
    /// Local address the connection was accepted on.
    pub destination: Option<SocketAddr>,
    /// Route (HTTP) or stream (L4) name.
    pub route_name: Arc<str>,
    /// Listener name.
    pub listener: Arc<str>,
    /// Whether the connection is TLS.
    pub tls: bool,
    /// TLS server name requested.
    pub sni: Option<Arc<str>>,
    /// Connection id (unique in the process).
    pub connection_id: u64,
}

/// One HTTP request's data, visible to the guest while a callback runs or the request is
/// paused.
#[derive(Debug)]
pub struct HttpStream {
    /// Request head (method, URI, headers), here while the guest may change it; pseudo-headers
    /// map onto it. Read it with [`HttpStream::request`], change it with
    /// [`HttpStream::request_mut`].
    request: Option<request::Parts>,
    /// The head the terminal got, lent by the embedder for the phases after the request's
    /// (instead of the VM keeping a copy of every request's head); read in place.
    lent_request: Option<Arc<request::Parts>>,
    /// Response head, once there is one.
    pub response: response::Parts,
    /// Request trailers.
    pub request_trailers: HeaderMap,
    /// Response trailers.
    pub response_trailers: HeaderMap,
    /// Request body buffered so far (what `HTTP_REQUEST_BODY` reads and writes).
    pub request_body: BodyBuffer,
    /// Response body buffered so far.
    pub response_body: BodyBuffer,
    /// Connection facts.
    pub info: Arc<StreamInfo>,
    /// Properties the guest set (`proxy_set_property`).
    pub properties: Option<HashMap<Vec<u8>, Bytes>>,
}

/// What a request head that is neither here nor lent reads as.
static NO_REQUEST: std::sync::LazyLock<request::Parts> = std::sync::LazyLock::new(empty_request);

impl HttpStream {
    /// The request head as the guest sees it: the one here, else the lent one, else empty.
    pub fn request(&self) -> &request::Parts {
        match (&self.request, &self.lent_request) {
            (Some(p), _) => p,
            (None, Some(p)) => p,
            (None, None) => &NO_REQUEST,
        }
    }

    /// The request head to change. A lent head is copied first: a write after the request
    /// phase changes what the guest reads later, never the request (as in Envoy).
    pub fn request_mut(&mut self) -> &mut request::Parts {
        let lent = &self.lent_request;
        self.request
            .get_or_insert_with(|| lent.as_deref().map_or_else(empty_request, copy_head))
    }

    /// Moves the request head in, for the request-header phase.
    pub fn put_request(&mut self, head: request::Parts) {
        self.request = Some(head);
    }

    /// Moves the request head out, to go on to the terminal.
    pub fn take_request(&mut self) -> Option<request::Parts> {
        self.request.take()
    }

    /// Lends the head the terminal got, for the phases after the request's (a head still
    /// here, paused or copied by a write, is what the guest goes on reading).
    pub fn lend_request(&mut self, head: &Arc<request::Parts>) {
        if self.lent_request.is_none() {
            self.lent_request = Some(head.clone());
        }
    }

    /// A stream with empty heads.
    pub fn new(info: Arc<StreamInfo>) -> Self {
        Self {
            request: None,
            lent_request: None,
            response: empty_response(),
            request_trailers: HeaderMap::new(),
            response_trailers: HeaderMap::new(),
            request_body: BodyBuffer::default(),
            response_body: BodyBuffer::default(),
            info,
            properties: None,
        }
    }
}

/// Body or stream bytes held for a context while its callback runs or it buffers. A chunk
/// handed in is kept as it came (no copy) until a second one joins it or the guest writes into
/// it: a chunk that passes through a callback untouched, the usual case, is never copied.
#[derive(Debug, Default, Clone)]
pub struct BodyBuffer(Held);

#[derive(Debug, Default, Clone)]
enum Held {
    #[default]
    Empty,
    /// One chunk, as it was handed in.
    One(Bytes),
    /// Several chunks joined, or bytes the guest wrote.
    Joined(BytesMut),
}

impl BodyBuffer {
    /// Adds a chunk at the end.
    pub fn push(&mut self, chunk: Bytes) {
        if chunk.is_empty() {
            return;
        }
        self.0 = match std::mem::take(&mut self.0) {
            Held::Empty => Held::One(chunk),
            Held::One(first) => {
                let mut joined = BytesMut::with_capacity(first.len() + chunk.len());
                joined.extend_from_slice(&first);
                joined.extend_from_slice(&chunk);
                Held::Joined(joined)
            }
            Held::Joined(mut joined) => {
                joined.extend_from_slice(&chunk);
                Held::Joined(joined)
            }
        };
    }

    /// Copies bytes in at the end.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.to_mut().extend_from_slice(bytes);
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes held, contiguous.
    pub fn as_slice(&self) -> &[u8] {
        match &self.0 {
            Held::Empty => &[],
            Held::One(b) => b,
            Held::Joined(b) => b,
        }
    }

    /// The bytes held as `Bytes`: shared with the buffer for a single chunk, copied otherwise.
    pub fn snapshot(&self) -> Bytes {
        match &self.0 {
            Held::Empty => Bytes::new(),
            Held::One(b) => b.clone(),
            Held::Joined(b) => Bytes::copy_from_slice(b),
        }
    }

    /// The bytes held, to change in place (a single chunk is copied once to allow it).
    pub fn to_mut(&mut self) -> &mut BytesMut {
        if !matches!(self.0, Held::Joined(_)) {
            let joined = BytesMut::from(self.as_slice());
            self.0 = Held::Joined(joined);
        }
        match &mut self.0 {
            Held::Joined(b) => b,
            Held::Empty | Held::One(_) => unreachable!("made joined above"),
        }
    }

    /// Takes every byte held out, leaving the buffer empty; `None` when it held none.
    pub fn take(&mut self) -> Option<Bytes> {
        match std::mem::take(&mut self.0) {
            Held::Empty => None,
            Held::One(b) => Some(b),
            Held::Joined(b) => (!b.is_empty()).then(|| b.freeze()),
        }
    }
}

impl From<Bytes> for BodyBuffer {
    fn from(chunk: Bytes) -> Self {
        let mut buf = Self::default();
        buf.push(chunk);
        buf
    }
}

/// One TCP connection's data.
#[derive(Debug)]
pub struct NetStream {
    /// Client → upstream bytes buffered so far.
    pub downstream: BodyBuffer,
    /// Upstream → client bytes buffered so far.
    pub upstream: BodyBuffer,
    /// Connection facts.
    pub info: Arc<StreamInfo>,
    /// Properties the guest set.
    pub properties: Option<HashMap<Vec<u8>, Bytes>>,
}

/// A context's data.
#[derive(Debug)]
pub enum Stream {
    /// An HTTP request.
    Http(Box<HttpStream>),
    /// A TCP connection.
    Net(Box<NetStream>),
}

/// A head with nothing in it, to leave behind when the real one moves into a stream.
pub fn empty_request() -> request::Parts {
    http::Request::new(()).into_parts().0
}

/// See [`empty_request`].
pub fn empty_response() -> response::Parts {
    http::Response::new(()).into_parts().0
}

/// A copy of a request head: method, URI, version and headers (extensions are the host's own
/// and stay behind).
pub fn copy_head(head: &request::Parts) -> request::Parts {
    let mut copy = empty_request();
    copy.method = head.method.clone();
    copy.uri = head.uri.clone();
    copy.version = head.version;
    copy.headers = head.headers.clone();
    copy
}

/// `proxy_stream_type_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamType {
    /// HTTP request.
    Request,
    /// HTTP response.
    Response,
    /// Client side of a TCP connection.
    Downstream,
    /// Upstream side of a TCP connection.
    Upstream,
}

impl StreamType {
    pub(crate) fn from_abi(v: u32) -> Option<Self> {
        Some(match v {
            0 => Self::Request,
            1 => Self::Response,
            2 => Self::Downstream,
            3 => Self::Upstream,
            _ => return None,
        })
    }
}

/// A local reply a guest asked for.
#[derive(Debug, Clone)]
pub struct LocalResponse {
    /// Status code.
    pub status: u16,
    /// Details (logged).
    pub details: String,
    /// Body.
    pub body: Bytes,
    /// Headers (lowercase names).
    pub headers: Vec<(String, Bytes)>,
}

/// Something a guest asked for that takes effect after its call returns.
#[derive(Debug, Clone)]
pub enum Effect {
    /// `proxy_continue_stream`.
    Continue(u32, StreamType),
    /// `proxy_close_stream`.
    Close(u32, StreamType),
    /// `proxy_send_local_response`.
    LocalResponse(u32, LocalResponse),
}

/// An HTTP call the guest dispatched (`proxy_http_call`), for the embedder to perform.
#[derive(Debug, Clone)]
pub struct HttpCallOut {
    /// Token the response is delivered with.
    pub token: u32,
    /// Upstream name (the first argument).
    pub upstream: String,
    /// Headers, pseudo-headers included.
    pub headers: Vec<(String, Bytes)>,
    /// Body.
    pub body: Bytes,
    /// Trailers.
    pub trailers: Vec<(String, Bytes)>,
    /// Timeout.
    pub timeout: Duration,
}

/// A finished HTTP call, readable by the guest during `proxy_on_http_call_response`.
#[derive(Debug, Clone, Default)]
pub struct HttpCallResponse {
    /// Headers with `:status`; empty when the call failed.
    pub headers: Vec<(String, Bytes)>,
    /// Body.
    pub body: Bytes,
    /// Trailers.
    pub trailers: Vec<(String, Bytes)>,
}

/// What the last guest call(s) asked for, drained by the embedder.
#[derive(Debug, Default)]
pub struct Effects {
    /// Deferred stream actions, in order.
    pub actions: Vec<Effect>,
    /// HTTP calls to start.
    pub calls: Vec<HttpCallOut>,
    /// Contexts the guest finished with `proxy_done`.
    pub done: Vec<u32>,
}

impl Effects {
    /// Whether nothing was asked for.
    pub fn is_empty(&self) -> bool {
        self.actions.is_empty() && self.calls.is_empty() && self.done.is_empty()
    }
}

/// Caps linear memory and table growth; remembers that the cap was hit so the trap that
/// follows is reported as [`PluginError::MemoryLimit`].
#[derive(Debug)]
pub(crate) struct Limiter {
    pub(crate) memory: u64,
    pub(crate) hit: bool,
    /// This VM's linear memory, bytes, added to `gauge` as it grows and taken off when the
    /// VM is dropped.
    pub(crate) held: u64,
    pub(crate) gauge: Option<Arc<crate::metrics::PluginStats>>,
}

impl Drop for Limiter {
    fn drop(&mut self) {
        if let Some(g) = &self.gauge {
            g.memory_bytes
                .fetch_sub(self.held, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired as u64 > self.memory {
            self.hit = true;
            // Trap at the growth itself: a guest allocator that ignores a failed grow would
            // otherwise fail somewhere less obvious.
            return Err(wasmtime::Error::msg("plugin memory limit reached"));
        }
        let more = desired.saturating_sub(current) as u64;
        self.held += more;
        if let Some(g) = &self.gauge {
            g.memory_bytes
                .fetch_add(more, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1 << 20)
    }
}

/// The store's data for one VM.
pub struct HostState {
    pub(crate) plugin: Arc<PluginInfo>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) limiter: Limiter,
    pub(crate) memory: Option<Memory>,
    pub(crate) malloc: Option<TypedFunc<u32, u32>>,
    pub(crate) root_id: u32,
    /// The context host calls act on (changed by `proxy_set_effective_context`).
    pub(crate) effective: u32,
    /// Live contexts by id. The ids are the host's own (sequential), so a fast hash is safe.
    pub(crate) streams: rustc_hash::FxHashMap<u32, Stream>,
    pub(crate) effects: Effects,
    pub(crate) next_token: u32,
    pub(crate) call_response: Option<HttpCallResponse>,
    pub(crate) status: (u32, Bytes),
    pub(crate) tick_period: Duration,
    /// The first host-detected fault of the current call; it explains the trap that follows.
    pub(crate) fault: Option<PluginError>,
    pub(crate) log_level: u32,
    /// Reused for serialising maps before they are copied into the guest.
    pub(crate) scratch: Vec<u8>,
    /// The header names the guest has written, parsed.
    pub(crate) names: crate::names::HeaderNames,
    pub(crate) queue_owner: Option<crate::shared::QueueNotify>,
    /// Thread CPU time when the current call first passed its epoch deadline.
    pub(crate) deadline_cpu: Option<std::time::Duration>,
    /// The engine's epoch ticker (the deadline callback keeps it awake).
    pub(crate) ticker: Arc<crate::engine::Ticker>,
    /// Whether the plugin configuration can be read: only while the root context is created
    /// and configured, as in Envoy, which has no plugin at hand in any other callback.
    pub(crate) configuring: bool,
}

impl HostState {
    pub(crate) fn new(
        plugin: Arc<PluginInfo>,
        shared: Arc<Shared>,
        ticker: Arc<crate::engine::Ticker>,
    ) -> Self {
        Self {
            limiter: Limiter {
                memory: plugin.limits.memory,
                hit: false,
                held: 0,
                gauge: None,
            },
            plugin,
            shared,
            memory: None,
            malloc: None,
            root_id: 0,
            effective: 0,
            streams: rustc_hash::FxHashMap::default(),
            effects: Effects::default(),
            next_token: 1,
            call_response: None,
            status: (0, Bytes::new()),
            tick_period: Duration::ZERO,
            fault: None,
            log_level: 0,
            scratch: Vec::new(),
            names: crate::names::HeaderNames::default(),
            queue_owner: None,
            deadline_cpu: None,
            ticker,
            configuring: false,
        }
    }

    /// The HTTP stream host calls currently act on.
    pub(crate) fn http(&mut self) -> Option<&mut HttpStream> {
        match self.streams.get_mut(&self.effective)? {
            Stream::Http(h) => Some(h),
            Stream::Net(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lent_request_head_is_read_in_place_and_copied_on_a_write() {
        let mut h = HttpStream::new(Arc::new(StreamInfo::default()));
        assert!(h.request().headers.is_empty(), "nothing here, nothing lent");
        let head = http::Request::get("/a?b")
            .header("x-tag", "1")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        h.put_request(head);
        let head = h.take_request().expect("moved in, so it moves out");
        assert!(h.take_request().is_none());
        let lent = Arc::new(head);
        h.lend_request(&lent);
        assert_eq!(h.request().uri, "/a?b");
        assert_eq!(h.request().headers["x-tag"], "1");
        assert_eq!(Arc::strong_count(&lent), 2, "read in place, not copied");
        h.request_mut()
            .headers
            .insert("x-tag", "2".parse().unwrap());
        assert_eq!(h.request().headers["x-tag"], "2");
        assert_eq!(h.request().uri, "/a?b", "the copy has the whole head");
        assert_eq!(
            lent.headers["x-tag"], "1",
            "the request itself is unchanged"
        );
    }

    #[test]
    fn a_chunk_passes_through_a_body_buffer_without_a_copy() {
        let chunk = Bytes::from(vec![7u8; 4096]);
        let at = chunk.as_ptr();
        let mut buf = BodyBuffer::default();
        buf.push(chunk);
        assert_eq!(buf.len(), 4096);
        assert_eq!(
            buf.snapshot().as_ptr(),
            at,
            "a snapshot of one chunk shares it"
        );
        let out = buf.take().expect("the chunk");
        assert_eq!(out.as_ptr(), at, "the chunk comes back as it went in");
        assert!(buf.is_empty());
        assert_eq!(buf.take(), None);
    }

    #[test]
    fn chunks_join_and_guest_writes_land_in_order() {
        let mut buf = BodyBuffer::from(Bytes::from_static(b"hello"));
        buf.push(Bytes::new());
        buf.push(Bytes::from_static(b" world"));
        assert_eq!(buf.as_slice(), b"hello world");
        buf.to_mut().extend_from_slice(b"!");
        buf.extend_from_slice(b"?");
        assert_eq!(buf.snapshot(), Bytes::from_static(b"hello world!?"));
        assert_eq!(buf.take(), Some(Bytes::from_static(b"hello world!?")));
        // A single chunk the guest writes into becomes writable first.
        let mut buf = BodyBuffer::from(Bytes::from_static(b"abc"));
        buf.to_mut()[0] = b'X';
        assert_eq!(buf.as_slice(), b"Xbc");
        assert_eq!(buf.take(), Some(Bytes::from_static(b"Xbc")));
    }
}
