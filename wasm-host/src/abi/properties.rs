//! `proxy_get_property` / `proxy_set_property`. Paths are `\0`-joined segments; values use
//! Envoy's encodings (strings raw, integers as 8 bytes little-endian, booleans as one byte,
//! maps in the header-map format). Properties a guest sets are kept per context and read back.

use bytes::Bytes;
use http::header::{HOST, REFERER, USER_AGENT};
use wasmtime::Linker;

use super::memory::{Cx, copy_out, read, serialize_map, with_slice};
use super::{NOT_FOUND, OK};
use crate::state::{HostState, Stream, StreamInfo};

pub(crate) fn link(l: &mut Linker<HostState>) -> wasmtime::Result<()> {
    l.func_wrap(
        "env",
        "proxy_get_property",
        |mut c: Cx<'_>, pp: u32, pl: u32, rp: u32, rl: u32| -> wasmtime::Result<u32> {
            let value = with_slice(&mut c, pp, pl, "proxy_get_property", |p, s| get(s, p))?;
            match value {
                Some(v) => copy_out(&mut c, &v, rp, rl, "proxy_get_property").map(|()| OK),
                None => Ok(NOT_FOUND),
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_property",
        |mut c: Cx<'_>, pp: u32, pl: u32, vp: u32, vl: u32| -> wasmtime::Result<u32> {
            let path = read(&mut c, pp, pl, "proxy_set_property")?;
            let value = Bytes::from(read(&mut c, vp, vl, "proxy_set_property")?);
            let s = c.data_mut();
            let props = match s.streams.get_mut(&s.effective) {
                Some(Stream::Http(h)) => &mut h.properties,
                Some(Stream::Net(n)) => &mut n.properties,
                None => return Ok(OK),
            };
            props
                .get_or_insert_with(Default::default)
                .insert(path, value);
            Ok(OK)
        },
    )?;
    Ok(())
}

fn int(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

/// The value of a property for the effective context.
pub(crate) fn get(s: &mut HostState, path: &[u8]) -> Option<Vec<u8>> {
    let plugin = s.plugin.clone();
    match path {
        b"plugin_name" => return Some(plugin.name.as_bytes().to_vec()),
        b"plugin_root_id" => return Some(plugin.root_id.as_bytes().to_vec()),
        b"plugin_vm_id" => return Some(plugin.vm_id.as_bytes().to_vec()),
        _ => {}
    }
    let stream = s.streams.get(&s.effective)?;
    let (info, props) = match stream {
        Stream::Http(h) => (&h.info, &h.properties),
        Stream::Net(n) => (&n.info, &n.properties),
    };
    if let Some(v) = props.as_ref().and_then(|p| p.get(path)) {
        return Some(v.to_vec());
    }
    if let Some(v) = connection(info, path) {
        return Some(v);
    }
    let Stream::Http(h) = stream else {
        return None;
    };
    let req = h.request();
    let header = |name| {
        req.headers
            .get(name)
            .map(|v: &http::HeaderValue| v.as_bytes().to_vec())
    };
    Some(match path {
        b"request\0path" => req
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .as_bytes()
            .to_vec(),
        b"request\0url_path" => req.uri.path().as_bytes().to_vec(),
        b"request\0query" => req.uri.query().unwrap_or("").as_bytes().to_vec(),
        b"request\0method" => req.method.as_str().as_bytes().to_vec(),
        b"request\0host" => match req.uri.authority() {
            Some(a) => a.as_str().as_bytes().to_vec(),
            None => header(HOST)?,
        },
        b"request\0scheme" => match req.uri.scheme_str() {
            Some(s) => s.as_bytes().to_vec(),
            None if info.tls => b"https".to_vec(),
            None => b"http".to_vec(),
        },
        b"request\0protocol" => format!("{:?}", req.version).into_bytes(),
        b"request\0referer" => header(REFERER)?,
        b"request\0useragent" => header(USER_AGENT)?,
        b"request\0id" => header(http::HeaderName::from_static("x-request-id"))?,
        b"request\0headers" => {
            let mut out = Vec::new();
            let it = req
                .headers
                .iter()
                .map(|(k, v)| (k.as_str().as_bytes(), v.as_bytes()));
            serialize_map(it, &mut out);
            out
        }
        b"response\0code" => int(u64::from(h.response.status.as_u16())),
        b"response\0headers" => {
            let mut out = Vec::new();
            let it = h
                .response
                .headers
                .iter()
                .map(|(k, v)| (k.as_str().as_bytes(), v.as_bytes()));
            serialize_map(it, &mut out);
            out
        }
        _ => return None,
    })
}

fn connection(info: &StreamInfo, path: &[u8]) -> Option<Vec<u8>> {
    Some(match path {
        b"source\0address" => info.source?.to_string().into_bytes(),
        b"source\0port" => int(u64::from(info.source?.port())),
        b"destination\0address" => info.destination?.to_string().into_bytes(),
        b"destination\0port" => int(u64::from(info.destination?.port())),
        b"route_name" | b"xds\0route_name" => info.route_name.as_bytes().to_vec(),
        b"listener_name" | b"xds\0listener_name" => info.listener.as_bytes().to_vec(),
        b"connection\0id" => int(info.connection_id),
        b"connection\0mtls" => vec![0],
        b"connection\0tls" => vec![u8::from(info.tls)],
        b"connection\0requested_server_name" => info.sni.as_deref()?.as_bytes().to_vec(),
        _ => return None,
    })
}
