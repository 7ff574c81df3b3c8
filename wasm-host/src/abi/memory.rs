//! Guest memory access for host calls. Every pointer and length from the guest is checked
//! against its linear memory; a bad one records [`PluginError::MemoryAccess`] and traps the
//! call (the Rust SDK has no status for "invalid memory", so a status would only make it panic).
//! Values go back through the guest's own allocator, never called with 0: an empty value is
//! returned as pointer 0, length 0 (the Go SDK crashes on a zero-size allocation).

use wasmtime::Caller;

use crate::error::PluginError;
use crate::state::HostState;

/// The caller type every host call receives.
pub(crate) type Cx<'a> = Caller<'a, HostState>;

/// Records the fault and builds the trap that ends the call.
pub(crate) fn oob(caller: &mut Cx<'_>, what: &'static str) -> wasmtime::Error {
    let state = caller.data_mut();
    if state.fault.is_none() {
        state.fault = Some(PluginError::MemoryAccess(what));
    }
    wasmtime::Error::msg(format!("out-of-bounds guest pointer passed to {what}"))
}

fn range(len_total: usize, ptr: u32, len: u32) -> Option<std::ops::Range<usize>> {
    let start = ptr as usize;
    let end = start.checked_add(len as usize)?;
    (end <= len_total).then_some(start..end)
}

/// Runs `f` on the guest bytes at `ptr..ptr+len` and the host state.
pub(crate) fn with_slice<R>(
    caller: &mut Cx<'_>,
    ptr: u32,
    len: u32,
    what: &'static str,
    f: impl FnOnce(&[u8], &mut HostState) -> R,
) -> wasmtime::Result<R> {
    let Some(mem) = caller.data().memory else {
        return Err(oob(caller, what));
    };
    let (data, state) = mem.data_and_store_mut(&mut *caller);
    match range(data.len(), ptr, len) {
        Some(r) => Ok(f(&data[r], state)),
        None => Err(oob(caller, what)),
    }
}

/// Runs `f` on two guest byte ranges (a key and its value) and the host state, without
/// copying them out.
pub(crate) fn with_pair<R>(
    caller: &mut Cx<'_>,
    (kp, kl): (u32, u32),
    (vp, vl): (u32, u32),
    what: &'static str,
    f: impl FnOnce(&[u8], &[u8], &mut HostState) -> R,
) -> wasmtime::Result<R> {
    let Some(mem) = caller.data().memory else {
        return Err(oob(caller, what));
    };
    let (data, state) = mem.data_and_store_mut(&mut *caller);
    match (range(data.len(), kp, kl), range(data.len(), vp, vl)) {
        (Some(k), Some(v)) => Ok(f(&data[k], &data[v], state)),
        _ => Err(oob(caller, what)),
    }
}

/// Copies guest bytes out.
pub(crate) fn read(
    caller: &mut Cx<'_>,
    ptr: u32,
    len: u32,
    what: &'static str,
) -> wasmtime::Result<Vec<u8>> {
    with_slice(caller, ptr, len, what, |b, _| b.to_vec())
}

/// Writes bytes into guest memory at `ptr`.
pub(crate) fn write(
    caller: &mut Cx<'_>,
    ptr: u32,
    bytes: &[u8],
    what: &'static str,
) -> wasmtime::Result<()> {
    let Some(mem) = caller.data().memory else {
        return Err(oob(caller, what));
    };
    let data = mem.data_mut(&mut *caller);
    match range(data.len(), ptr, bytes.len() as u32) {
        Some(r) if bytes.len() <= u32::MAX as usize => {
            data[r].copy_from_slice(bytes);
            Ok(())
        }
        _ => Err(oob(caller, what)),
    }
}

/// Writes a little-endian u32 at `ptr`.
pub(crate) fn write_u32(
    caller: &mut Cx<'_>,
    ptr: u32,
    v: u32,
    what: &'static str,
) -> wasmtime::Result<()> {
    write(caller, ptr, &v.to_le_bytes(), what)
}

/// Writes a little-endian u64 at `ptr`.
pub(crate) fn write_u64(
    caller: &mut Cx<'_>,
    ptr: u32,
    v: u64,
    what: &'static str,
) -> wasmtime::Result<()> {
    write(caller, ptr, &v.to_le_bytes(), what)
}

/// Allocates `bytes.len()` in the guest, copies `bytes` there and writes the pointer and
/// length to `ret_ptr` / `ret_len`.
pub(crate) fn copy_out(
    caller: &mut Cx<'_>,
    bytes: &[u8],
    ret_ptr: u32,
    ret_len: u32,
    what: &'static str,
) -> wasmtime::Result<()> {
    if bytes.is_empty() {
        write_u32(caller, ret_ptr, 0, what)?;
        return write_u32(caller, ret_len, 0, what);
    }
    let len = u32::try_from(bytes.len()).map_err(|_| oob(caller, what))?;
    let Some(malloc) = caller.data().malloc.clone() else {
        return Err(wasmtime::Error::msg(
            "guest exports no proxy_on_memory_allocate or malloc",
        ));
    };
    let ptr = malloc.call(&mut *caller, len)?;
    if ptr == 0 {
        return Err(wasmtime::Error::msg("guest allocator returned null"));
    }
    write(caller, ptr, bytes, what)?;
    write_u32(caller, ret_ptr, ptr, what)?;
    write_u32(caller, ret_len, len, what)
}

/// [`copy_out`] of bytes produced by `fill` into the VM's reusable scratch buffer.
pub(crate) fn copy_out_with(
    caller: &mut Cx<'_>,
    ret_ptr: u32,
    ret_len: u32,
    what: &'static str,
    fill: impl FnOnce(&mut HostState, &mut Vec<u8>),
) -> wasmtime::Result<()> {
    let mut buf = std::mem::take(&mut caller.data_mut().scratch);
    buf.clear();
    fill(caller.data_mut(), &mut buf);
    let r = copy_out(caller, &buf, ret_ptr, ret_len, what);
    buf.clear();
    caller.data_mut().scratch = buf;
    r
}

/// Splits a proxy-wasm map (`u32 n`, n × `(u32 klen, u32 vlen)`, then `key\0value\0` each) into
/// pairs; `None` when the encoding is inconsistent.
pub(crate) fn parse_map(bytes: &[u8]) -> Option<Vec<(&[u8], &[u8])>> {
    if bytes.len() < 4 {
        // An empty map may be encoded as zero or one byte.
        return (bytes.len() <= 1).then(Vec::new);
    }
    let n = u32::from_le_bytes(bytes[..4].try_into().ok()?) as usize;
    let mut sizes = 4usize;
    let mut data = 4usize.checked_add(n.checked_mul(8)?)?;
    if data > bytes.len() {
        return None;
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let k = u32::from_le_bytes(bytes.get(sizes..sizes + 4)?.try_into().ok()?) as usize;
        let v = u32::from_le_bytes(bytes.get(sizes + 4..sizes + 8)?.try_into().ok()?) as usize;
        sizes += 8;
        let key = bytes.get(data..data.checked_add(k)?)?;
        data += k + 1;
        let value = bytes.get(data..data.checked_add(v)?)?;
        data += v + 1;
        out.push((key, value));
    }
    Some(out)
}

/// Serialises pairs in the proxy-wasm map format.
pub(crate) fn serialize_map<'a, I>(pairs: I, out: &mut Vec<u8>)
where
    I: Iterator<Item = (&'a [u8], &'a [u8])>,
{
    let pairs: Vec<_> = pairs.collect();
    let n = pairs.len() as u32;
    out.reserve(4 + pairs.len() * 10);
    out.extend_from_slice(&n.to_le_bytes());
    for (k, v) in &pairs {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k);
        out.push(0);
        out.extend_from_slice(v);
        out.push(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_round_trip() {
        let pairs: Vec<(&[u8], &[u8])> = vec![(b":path", b"/a"), (b"x", b"")];
        let mut out = Vec::new();
        serialize_map(pairs.iter().copied(), &mut out);
        assert_eq!(parse_map(&out).unwrap(), pairs);
        assert_eq!(parse_map(&[]).unwrap(), vec![]);
        assert_eq!(parse_map(&[0]).unwrap(), vec![]);
        // Claims more pairs than there are bytes.
        assert!(parse_map(&[9, 0, 0, 0, 1]).is_none());
        let mut bad = out.clone();
        bad.truncate(out.len() - 2);
        assert!(parse_map(&bad).is_none());
    }
}
