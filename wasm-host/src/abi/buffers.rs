//! Body and data buffers: `proxy_get_buffer_bytes`, `proxy_set_buffer_bytes` (a general splice:
//! replace `size` bytes at `start`, which covers prepend, append and whole replacement; Envoy
//! supports only the first two and the Rust SDK traps on its refusal), `proxy_get_buffer_status`.

use bytes::{Bytes, BytesMut};
use wasmtime::Linker;

use super::memory::{Cx, copy_out, read, write_u32};
use super::{NOT_FOUND, OK};
use crate::state::{BodyBuffer, HostState, Stream};

const REQUEST_BODY: u32 = 0;
const RESPONSE_BODY: u32 = 1;
const DOWNSTREAM_DATA: u32 = 2;
const UPSTREAM_DATA: u32 = 3;
const CALL_RESPONSE_BODY: u32 = 4;
const VM_CONFIGURATION: u32 = 6;
const PLUGIN_CONFIGURATION: u32 = 7;

pub(crate) fn link(l: &mut Linker<HostState>) -> wasmtime::Result<()> {
    l.func_wrap(
        "env",
        "proxy_get_buffer_bytes",
        |mut c: Cx<'_>,
         buf: u32,
         start: u32,
         max: u32,
         rp: u32,
         rl: u32|
         -> wasmtime::Result<u32> {
            let Some(bytes) = snapshot(c.data_mut(), buf) else {
                return Ok(NOT_FOUND);
            };
            let start = (start as usize).min(bytes.len());
            let end = start.saturating_add(max as usize).min(bytes.len());
            copy_out(&mut c, &bytes[start..end], rp, rl, "proxy_get_buffer_bytes")?;
            Ok(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_buffer_status",
        |mut c: Cx<'_>, buf: u32, rl: u32, rf: u32| -> wasmtime::Result<u32> {
            let Some(bytes) = snapshot(c.data_mut(), buf) else {
                return Ok(NOT_FOUND);
            };
            write_u32(&mut c, rl, bytes.len() as u32, "proxy_get_buffer_status")?;
            write_u32(&mut c, rf, 0, "proxy_get_buffer_status")?;
            Ok(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_buffer_bytes",
        |mut c: Cx<'_>,
         buf: u32,
         start: u32,
         size: u32,
         ptr: u32,
         len: u32|
         -> wasmtime::Result<u32> {
            let data = read(&mut c, ptr, len, "proxy_set_buffer_bytes")?;
            if let Some(target) = target(c.data_mut(), buf) {
                splice(target.to_mut(), start as usize, size as usize, &data);
            }
            // OK even for read-only buffers: the Rust SDK accepts no other status here.
            Ok(OK)
        },
    )?;
    Ok(())
}

/// The buffer's current bytes (cheap: `Bytes` clones share; a body buffer of several chunks
/// is copied once).
fn snapshot(s: &mut HostState, buf: u32) -> Option<Bytes> {
    match buf {
        VM_CONFIGURATION => Some(s.plugin.vm_config.clone()),
        PLUGIN_CONFIGURATION => s.configuring.then(|| s.plugin.config.clone()),
        CALL_RESPONSE_BODY => s.call_response.as_ref().map(|r| r.body.clone()),
        _ => target(s, buf).map(|b| b.snapshot()),
    }
}

fn target(s: &mut HostState, buf: u32) -> Option<&mut BodyBuffer> {
    match (s.streams.get_mut(&s.effective)?, buf) {
        (Stream::Http(h), REQUEST_BODY) => Some(&mut h.request_body),
        (Stream::Http(h), RESPONSE_BODY) => Some(&mut h.response_body),
        (Stream::Net(n), DOWNSTREAM_DATA) => Some(&mut n.downstream),
        (Stream::Net(n), UPSTREAM_DATA) => Some(&mut n.upstream),
        _ => None,
    }
}

/// Replaces `size` bytes at `start` with `data` (`start` past the end appends).
pub(crate) fn splice(buf: &mut BytesMut, start: usize, size: usize, data: &[u8]) {
    let start = start.min(buf.len());
    let end = start.saturating_add(size).min(buf.len());
    if start == buf.len() {
        buf.extend_from_slice(data);
        return;
    }
    let mut out = BytesMut::with_capacity(buf.len() - (end - start) + data.len());
    out.extend_from_slice(&buf[..start]);
    out.extend_from_slice(data);
    out.extend_from_slice(&buf[end..]);
    *buf = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splice_cases() {
        let mut b = BytesMut::from(&b"hello world"[..]);
        splice(&mut b, 0, 0, b">");
        assert_eq!(&b[..], b">hello world");
        splice(&mut b, 100, 0, b"<");
        assert_eq!(&b[..], b">hello world<");
        splice(&mut b, 1, 5, b"HEY");
        assert_eq!(&b[..], b">HEY world<");
        splice(&mut b, 0, usize::MAX, b"all");
        assert_eq!(&b[..], b"all");
    }
}
