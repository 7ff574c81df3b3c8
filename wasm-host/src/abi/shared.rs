//! Shared data (`proxy_get_shared_data`, `proxy_set_shared_data` with compare-and-swap) and
//! shared queues (`proxy_register_shared_queue`, `_resolve_`, `_enqueue_`, `_dequeue_`), backed
//! by the process-wide [`crate::shared::Shared`].

use bytes::Bytes;
use wasmtime::Linker;

use super::memory::{Cx, copy_out, read, write_u32};
use super::{CAS_MISMATCH, EMPTY, NOT_FOUND, OK};
use crate::shared::SetError;
use crate::state::HostState;

pub(crate) fn link(l: &mut Linker<HostState>) -> wasmtime::Result<()> {
    l.func_wrap(
        "env",
        "proxy_get_shared_data",
        |mut c: Cx<'_>, kp: u32, kl: u32, rp: u32, rl: u32, rc: u32| -> wasmtime::Result<u32> {
            const W: &str = "proxy_get_shared_data";
            let key = read(&mut c, kp, kl, W)?;
            let s = c.data();
            let Some((value, cas)) = s.shared.get_in(s.plugin.global.as_ref(), &key) else {
                return Ok(NOT_FOUND);
            };
            copy_out(&mut c, &value, rp, rl, W)?;
            write_u32(&mut c, rc, cas, W)?;
            Ok(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_shared_data",
        |mut c: Cx<'_>, kp: u32, kl: u32, vp: u32, vl: u32, cas: u32| -> wasmtime::Result<u32> {
            const W: &str = "proxy_set_shared_data";
            let key = read(&mut c, kp, kl, W)?;
            let value = Bytes::from(read(&mut c, vp, vl, W)?);
            let s = c.data();
            Ok(
                match s.shared.set_in(s.plugin.global.as_ref(), &key, value, cas) {
                    Ok(()) => OK,
                    Err(SetError::CasMismatch) => CAS_MISMATCH,
                },
            )
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_register_shared_queue",
        |mut c: Cx<'_>, np: u32, nl: u32, ret: u32| -> wasmtime::Result<u32> {
            let name = read(&mut c, np, nl, "proxy_register_shared_queue")?;
            let s = c.data();
            let owner = s.queue_owner.clone();
            let id = s.shared.register_queue_in(
                s.plugin.global.as_ref(),
                &s.plugin.vm_id,
                &String::from_utf8_lossy(&name),
                owner,
            );
            write_u32(&mut c, ret, id, "proxy_register_shared_queue")?;
            Ok(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_resolve_shared_queue",
        |mut c: Cx<'_>, vp: u32, vl: u32, np: u32, nl: u32, ret: u32| -> wasmtime::Result<u32> {
            const W: &str = "proxy_resolve_shared_queue";
            let vm = read(&mut c, vp, vl, W)?;
            let name = read(&mut c, np, nl, W)?;
            let id = c.data().shared.resolve_queue(
                &String::from_utf8_lossy(&vm),
                &String::from_utf8_lossy(&name),
            );
            match id {
                Some(id) => write_u32(&mut c, ret, id, W).map(|()| OK),
                None => Ok(NOT_FOUND),
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_enqueue_shared_queue",
        |mut c: Cx<'_>, id: u32, ptr: u32, len: u32| -> wasmtime::Result<u32> {
            let v = Bytes::from(read(&mut c, ptr, len, "proxy_enqueue_shared_queue")?);
            let shared = c.data().shared.clone();
            Ok(if shared.enqueue(id, v) { OK } else { NOT_FOUND })
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_dequeue_shared_queue",
        |mut c: Cx<'_>, id: u32, rp: u32, rl: u32| -> wasmtime::Result<u32> {
            match c.data().shared.dequeue(id) {
                None => Ok(NOT_FOUND),
                Some(None) => Ok(EMPTY),
                Some(Some(v)) => {
                    copy_out(&mut c, &v, rp, rl, "proxy_dequeue_shared_queue")?;
                    Ok(OK)
                }
            }
        },
    )?;
    Ok(())
}
