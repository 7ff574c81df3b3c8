//! Header and trailer maps: `proxy_get_header_map_pairs`, `_value`, `_size`, `proxy_add_`,
//! `proxy_replace_`, `proxy_remove_header_map_value`, `proxy_set_header_map_pairs`.
//!
//! Request heads are kept as `http::request::Parts`, so pseudo-headers map onto its fields
//! (`:method`, `:path`, `:authority`, `:scheme`) and the response's `:status` onto its status;
//! nothing is converted unless the guest asks. A request's `Host` is its `:authority`, as in
//! Envoy: the map never shows a `host` entry, whatever the HTTP version, and a write of `host`
//! is a write of `:authority` (which goes upstream as `Host` over HTTP/1.1). Names are lowercased. A value the gateway cannot
//! send (control characters) is ignored with a log line rather than reported: the Rust SDK
//! panics on any status other than OK from these calls.

use bytes::Bytes;
use http::header::{HOST, HeaderMap, HeaderValue};
use http::uri::{Authority, PathAndQuery};
use http::{Method, StatusCode, Uri};
use wasmtime::Linker;

use super::memory::{
    Cx, copy_out_with, parse_map, read, serialize_map, with_pair, with_slice, write_u32,
};
use super::{BAD_ARGUMENT, NOT_FOUND, OK};
use crate::state::{HostState, HttpStream, Stream};

const REQUEST_HEADERS: u32 = 0;
const REQUEST_TRAILERS: u32 = 1;
const RESPONSE_HEADERS: u32 = 2;
const RESPONSE_TRAILERS: u32 = 3;
const CALL_HEADERS: u32 = 6;
const CALL_TRAILERS: u32 = 7;

pub(crate) fn link(l: &mut Linker<HostState>) -> wasmtime::Result<()> {
    l.func_wrap(
        "env",
        "proxy_get_header_map_pairs",
        |mut c: Cx<'_>, map: u32, ret_ptr: u32, ret_len: u32| -> wasmtime::Result<u32> {
            copy_out_with(
                &mut c,
                ret_ptr,
                ret_len,
                "proxy_get_header_map_pairs",
                |s, out| serialize(s, map, out),
            )?;
            Ok(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_header_map_size",
        |mut c: Cx<'_>, map: u32, ret: u32| -> wasmtime::Result<u32> {
            let mut buf = Vec::new();
            serialize(c.data_mut(), map, &mut buf);
            write_u32(&mut c, ret, buf.len() as u32, "proxy_get_header_map_size")?;
            Ok(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_header_map_value",
        |mut c: Cx<'_>, map: u32, kp: u32, kl: u32, rp: u32, rl: u32| -> wasmtime::Result<u32> {
            const W: &str = "proxy_get_header_map_value";
            let value = with_slice(&mut c, kp, kl, W, |k, s| get(s, map, k))?;
            match value {
                Some(v) => copy_out_with(&mut c, rp, rl, W, |_, out| out.extend_from_slice(&v))
                    .map(|()| OK),
                None => Ok(NOT_FOUND),
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_add_header_map_value",
        |mut c: Cx<'_>, map: u32, kp: u32, kl: u32, vp: u32, vl: u32| -> wasmtime::Result<u32> {
            with_pair(
                &mut c,
                (kp, kl),
                (vp, vl),
                "proxy_add_header_map_value",
                |k, v, s| set(s, map, k, v, false),
            )?;
            Ok(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_replace_header_map_value",
        |mut c: Cx<'_>, map: u32, kp: u32, kl: u32, vp: u32, vl: u32| -> wasmtime::Result<u32> {
            with_pair(
                &mut c,
                (kp, kl),
                (vp, vl),
                "proxy_replace_header_map_value",
                |k, v, s| set(s, map, k, v, true),
            )?;
            Ok(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_remove_header_map_value",
        |mut c: Cx<'_>, map: u32, kp: u32, kl: u32| -> wasmtime::Result<u32> {
            with_slice(&mut c, kp, kl, "proxy_remove_header_map_value", |k, s| {
                remove(s, map, k)
            })?;
            Ok(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_header_map_pairs",
        |mut c: Cx<'_>, map: u32, ptr: u32, len: u32| -> wasmtime::Result<u32> {
            let bytes = read(&mut c, ptr, len, "proxy_set_header_map_pairs")?;
            let Some(pairs) = parse_map(&bytes) else {
                return Ok(BAD_ARGUMENT);
            };
            let s = c.data_mut();
            clear(s, map);
            for (k, v) in pairs {
                set(s, map, k, v, false);
            }
            Ok(OK)
        },
    )?;
    Ok(())
}

/// The request's pseudo-headers, borrowed.
fn request_pseudo(h: &HttpStream) -> [(&'static [u8], &[u8]); 4] {
    let r = h.request();
    let path = r.uri.path_and_query().map_or("/", PathAndQuery::as_str);
    let authority = match r.uri.authority() {
        Some(a) => a.as_str().as_bytes(),
        None => r.headers.get(HOST).map_or(&b""[..], HeaderValue::as_bytes),
    };
    let scheme = match r.uri.scheme_str() {
        Some(s) => s,
        None if h.info.tls => "https",
        None => "http",
    };
    [
        (b":method", r.method.as_str().as_bytes()),
        (b":path", path.as_bytes()),
        (b":authority", authority),
        (b":scheme", scheme.as_bytes()),
    ]
}

fn plain(headers: &HeaderMap) -> impl Iterator<Item = (&[u8], &[u8])> {
    headers
        .iter()
        .map(|(k, v)| (k.as_str().as_bytes(), v.as_bytes()))
}

fn call_pairs(v: &[(String, Bytes)]) -> impl Iterator<Item = (&[u8], &[u8])> {
    v.iter().map(|(k, v)| (k.as_bytes(), &v[..]))
}

fn serialize(s: &mut HostState, map: u32, out: &mut Vec<u8>) {
    match map {
        CALL_HEADERS | CALL_TRAILERS => {
            if let Some(r) = &s.call_response {
                let v = if map == CALL_HEADERS {
                    &r.headers
                } else {
                    &r.trailers
                };
                serialize_map(call_pairs(v), out);
                return;
            }
        }
        _ => {
            if let Some(h) = s.http() {
                match map {
                    REQUEST_HEADERS => {
                        let pseudo = request_pseudo(h);
                        let plain = plain(&h.request().headers).filter(|(k, _)| *k != b"host");
                        let it = pseudo.iter().copied().chain(plain);
                        return serialize_map(it, out);
                    }
                    RESPONSE_HEADERS => {
                        let status = h.response.status.as_str().as_bytes();
                        let it = std::iter::once((&b":status"[..], status))
                            .chain(plain(&h.response.headers));
                        return serialize_map(it, out);
                    }
                    REQUEST_TRAILERS => return serialize_map(plain(&h.request_trailers), out),
                    RESPONSE_TRAILERS => return serialize_map(plain(&h.response_trailers), out),
                    _ => {}
                }
            }
        }
    }
    serialize_map(std::iter::empty(), out);
}

fn get(s: &mut HostState, map: u32, key: &[u8]) -> Option<Vec<u8>> {
    if map == CALL_HEADERS || map == CALL_TRAILERS {
        let r = s.call_response.as_ref()?;
        let v = if map == CALL_HEADERS {
            &r.headers
        } else {
            &r.trailers
        };
        return v
            .iter()
            .find(|(k, _)| k.as_bytes().eq_ignore_ascii_case(key))
            .map(|(_, v)| v.to_vec());
    }
    let h = s.http()?;
    if map == REQUEST_HEADERS && key.eq_ignore_ascii_case(b"host") {
        return None;
    }
    if key.first() == Some(&b':') {
        return match map {
            REQUEST_HEADERS => request_pseudo(h)
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.to_vec()),
            RESPONSE_HEADERS if key == b":status" => {
                Some(h.response.status.as_str().as_bytes().to_vec())
            }
            _ => None,
        };
    }
    let headers = headers(h, map)?;
    // Looked up by its text, which makes no `HeaderName` (nor its allocation).
    let mut values = headers.get_all(std::str::from_utf8(key).ok()?).iter();
    let first = values.next()?;
    // Several values of one name read as one, comma-joined (Envoy does the same).
    let mut v = first.as_bytes().to_vec();
    for more in values {
        v.extend_from_slice(b",");
        v.extend_from_slice(more.as_bytes());
    }
    Some(v)
}

fn headers(h: &HttpStream, map: u32) -> Option<&HeaderMap> {
    Some(match map {
        REQUEST_HEADERS => &h.request().headers,
        REQUEST_TRAILERS => &h.request_trailers,
        RESPONSE_HEADERS => &h.response.headers,
        RESPONSE_TRAILERS => &h.response_trailers,
        _ => return None,
    })
}

fn headers_mut(h: &mut HttpStream, map: u32) -> Option<&mut HeaderMap> {
    Some(match map {
        REQUEST_HEADERS => &mut h.request_mut().headers,
        REQUEST_TRAILERS => &mut h.request_trailers,
        RESPONSE_HEADERS => &mut h.response.headers,
        RESPONSE_TRAILERS => &mut h.response_trailers,
        _ => return None,
    })
}

fn set(s: &mut HostState, map: u32, key: &[u8], value: &[u8], replace: bool) {
    let plugin = &s.plugin.name;
    let Some(Stream::Http(h)) = s.streams.get_mut(&s.effective) else {
        return;
    };
    let key = if map == REQUEST_HEADERS && key.eq_ignore_ascii_case(b"host") {
        &b":authority"[..]
    } else {
        key
    };
    if key.first() == Some(&b':') {
        if !set_pseudo(h, map, key, value) {
            tracing::debug!(plugin = %plugin, key = %String::from_utf8_lossy(key), "ignored pseudo-header write");
        }
        return;
    }
    let Some(headers) = headers_mut(h, map) else {
        return;
    };
    match (s.names.parse(key), HeaderValue::from_bytes(value)) {
        (Some(k), Ok(v)) => {
            if replace {
                headers.insert(k, v);
            } else {
                headers.append(k, v);
            }
        }
        _ => {
            tracing::warn!(plugin = %plugin, key = %String::from_utf8_lossy(key), "plugin set an invalid header; ignored");
        }
    }
}

fn set_pseudo(h: &mut HttpStream, map: u32, key: &[u8], value: &[u8]) -> bool {
    match (map, key) {
        (REQUEST_HEADERS, b":method") => Method::from_bytes(value)
            .map(|m| h.request_mut().method = m)
            .is_ok(),
        (REQUEST_HEADERS, b":path") => {
            let Ok(pq) = PathAndQuery::try_from(value) else {
                return false;
            };
            let request = h.request_mut();
            let mut parts = std::mem::take(&mut request.uri).into_parts();
            parts.path_and_query = Some(pq);
            match Uri::from_parts(parts) {
                Ok(u) => {
                    request.uri = u;
                    true
                }
                Err(_) => false,
            }
        }
        (REQUEST_HEADERS, b":authority") => {
            let (Ok(a), Ok(v)) = (Authority::try_from(value), HeaderValue::from_bytes(value))
            else {
                return false;
            };
            let request = h.request_mut();
            if request.uri.authority().is_some() {
                let mut parts = std::mem::take(&mut request.uri).into_parts();
                parts.authority = Some(a);
                request.uri = Uri::from_parts(parts).unwrap_or_default();
            }
            request.headers.insert(HOST, v);
            true
        }
        (RESPONSE_HEADERS, b":status") => std::str::from_utf8(value)
            .ok()
            .and_then(|v| v.parse::<u16>().ok())
            .and_then(|v| StatusCode::from_u16(v).ok())
            .map(|st| h.response.status = st)
            .is_some(),
        _ => false,
    }
}

fn remove(s: &mut HostState, map: u32, key: &[u8]) {
    if map == REQUEST_HEADERS && key.eq_ignore_ascii_case(b"host") {
        // `host` is `:authority`, which a request cannot be without.
        return;
    }
    let Some(h) = s.http() else { return };
    if let (Some(headers), Ok(k)) = (headers_mut(h, map), std::str::from_utf8(key)) {
        headers.remove(k);
    }
}

fn clear(s: &mut HostState, map: u32) {
    if let Some(headers) = s.http().and_then(|h| headers_mut(h, map)) {
        // The request keeps its authority unless the new pairs give another `:authority`.
        let host = (map == REQUEST_HEADERS)
            .then(|| headers.remove(HOST))
            .flatten();
        headers.clear();
        if let Some(host) = host {
            headers.insert(HOST, host);
        }
    }
}
