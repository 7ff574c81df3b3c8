//! Typed views of the request, response, bodies and HTTP call answers; each call goes to the
//! host (nothing is copied until asked for).

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType};

/// The request, during [`Filter::on_request`](crate::Filter::on_request).
pub struct Request(pub(crate) ());

/// The response, during [`Filter::on_response`](crate::Filter::on_response).
pub struct Response(pub(crate) ());

fn get(map: MapType, name: &str) -> Option<String> {
    hostcalls::get_map_value_bytes(map, name)
        .ok()
        .flatten()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}

fn set(map: MapType, name: &str, value: Option<&str>) {
    let _ = hostcalls::set_map_value(map, name, value);
}

impl Request {
    /// A header (several values comma-joined); non-UTF-8 bytes are replaced.
    pub fn header(&self, name: &str) -> Option<String> {
        get(MapType::HttpRequestHeaders, name)
    }

    /// Every header, pseudo-headers (`:method`, `:path`, `:authority`, `:scheme`) first.
    pub fn headers(&self) -> Vec<(String, String)> {
        hostcalls::get_map_bytes(MapType::HttpRequestHeaders)
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
            .collect()
    }

    /// Sets (replaces) a header.
    pub fn set_header(&mut self, name: &str, value: &str) {
        set(MapType::HttpRequestHeaders, name, Some(value));
    }

    /// Adds a header value.
    pub fn add_header(&mut self, name: &str, value: &str) {
        let _ = hostcalls::add_map_value(MapType::HttpRequestHeaders, name, value);
    }

    /// Removes a header.
    pub fn remove_header(&mut self, name: &str) {
        set(MapType::HttpRequestHeaders, name, None);
    }

    /// The method.
    pub fn method(&self) -> String {
        self.header(":method").unwrap_or_default()
    }

    /// The path with its query.
    pub fn path(&self) -> String {
        self.header(":path").unwrap_or_else(|| "/".into())
    }

    /// Rewrites the path (and query) sent on.
    pub fn set_path(&mut self, path: &str) {
        self.set_header(":path", path);
    }

    /// The authority (Host).
    pub fn authority(&self) -> String {
        self.header(":authority").unwrap_or_default()
    }

    /// The client's IP address (without the port).
    pub fn client_ip(&self) -> String {
        let addr = crate::property(&["source", "address"]).unwrap_or_default();
        let addr = String::from_utf8_lossy(&addr).into_owned();
        match addr.rsplit_once(':') {
            Some((ip, _)) => ip.trim_start_matches('[').trim_end_matches(']').to_owned(),
            None => addr,
        }
    }
}

impl Response {
    /// The status code.
    pub fn status(&self) -> u16 {
        get(MapType::HttpResponseHeaders, ":status")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    /// A header.
    pub fn header(&self, name: &str) -> Option<String> {
        get(MapType::HttpResponseHeaders, name)
    }

    /// Sets (replaces) a header.
    pub fn set_header(&mut self, name: &str, value: &str) {
        set(MapType::HttpResponseHeaders, name, Some(value));
    }

    /// Adds a header value.
    pub fn add_header(&mut self, name: &str, value: &str) {
        let _ = hostcalls::add_map_value(MapType::HttpResponseHeaders, name, value);
    }

    /// Removes a header.
    pub fn remove_header(&mut self, name: &str) {
        set(MapType::HttpResponseHeaders, name, None);
    }
}

/// The body buffered so far (the current chunk, or everything since the first paused chunk).
pub struct Body {
    pub(crate) kind: BufferType,
    pub(crate) size: usize,
}

impl Body {
    /// Its length.
    pub fn len(&self) -> usize {
        self.size
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// Its bytes.
    pub fn bytes(&self) -> Vec<u8> {
        hostcalls::get_buffer(self.kind, 0, self.size)
            .ok()
            .flatten()
            .unwrap_or_default()
    }

    /// Replaces it all.
    pub fn replace(&mut self, data: &[u8]) {
        let _ = hostcalls::set_buffer(self.kind, 0, self.size, data);
        self.size = data.len();
    }

    /// Appends.
    pub fn append(&mut self, data: &[u8]) {
        let _ = hostcalls::set_buffer(self.kind, self.size, 0, data);
        self.size += data.len();
    }
}

/// An HTTP call's answer.
#[derive(Debug, Clone)]
pub struct CallResponse {
    /// Status; `None` when the call failed (unreachable upstream, timeout).
    pub status: Option<u16>,
    /// Headers (without `:status`).
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
}

impl CallResponse {
    pub(crate) fn read(body_size: usize) -> Self {
        let all = hostcalls::get_map_bytes(MapType::HttpCallResponseHeaders).unwrap_or_default();
        let mut status = None;
        let mut headers = Vec::with_capacity(all.len());
        for (k, v) in all {
            let v = String::from_utf8_lossy(&v).into_owned();
            if k == ":status" {
                status = v.parse().ok();
            } else {
                headers.push((k, v));
            }
        }
        let body = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size)
            .ok()
            .flatten()
            .unwrap_or_default();
        Self {
            status,
            headers,
            body,
        }
    }

    /// A header of the answer.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}
