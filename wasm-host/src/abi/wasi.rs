//! The WASI preview 1 functions plugins import, hand-written and registered under both
//! `wasi_snapshot_preview1` and `wasi_unstable`: no files, no environment, no arguments (the
//! spec's advice); stdout/stderr go to the log; clocks and randomness are real; `proc_exit`
//! traps. Anything else a module imports is linked as a trap by
//! `define_unknown_imports_as_traps` (stock Go links file calls it never makes).

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use rand::Rng;
use wasmtime::Linker;

use super::logging::emit;
use super::memory::{Cx, oob, read, with_slice, write, write_u32, write_u64};
use crate::state::HostState;

const SUCCESS: u32 = 0;
const BADF: u32 = 8;
const INVAL: u32 = 28;

/// Most bytes one `fd_write` call takes (a log line, not a file).
const MAX_WRITE: usize = 64 * 1024;

fn start() -> Instant {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *START.get_or_init(Instant::now)
}

pub(crate) fn link(l: &mut Linker<HostState>) -> wasmtime::Result<()> {
    for m in ["wasi_snapshot_preview1", "wasi_unstable"] {
        link_module(l, m)?;
    }
    Ok(())
}

fn zero_pair(c: &mut Cx<'_>, a: u32, b: u32, what: &'static str) -> wasmtime::Result<u32> {
    write_u32(c, a, 0, what)?;
    write_u32(c, b, 0, what)?;
    Ok(SUCCESS)
}

fn link_module(l: &mut Linker<HostState>, m: &str) -> wasmtime::Result<()> {
    l.func_wrap(m, "args_sizes_get", |mut c: Cx<'_>, a: u32, b: u32| {
        zero_pair(&mut c, a, b, "args_sizes_get")
    })?;
    l.func_wrap(m, "environ_sizes_get", |mut c: Cx<'_>, a: u32, b: u32| {
        zero_pair(&mut c, a, b, "environ_sizes_get")
    })?;
    l.func_wrap(m, "args_get", |_: Cx<'_>, _: u32, _: u32| SUCCESS)?;
    l.func_wrap(m, "environ_get", |_: Cx<'_>, _: u32, _: u32| SUCCESS)?;
    l.func_wrap(
        m,
        "fd_write",
        |mut c: Cx<'_>, fd: u32, iovs: u32, n: u32, ret: u32| -> wasmtime::Result<u32> {
            const W: &str = "fd_write";
            if n > 1024 {
                return Err(oob(&mut c, W));
            }
            let vecs = read(&mut c, iovs, n * 8, W)?;
            let mut text = Vec::new();
            for iov in vecs.chunks_exact(8) {
                let ptr = u32::from_le_bytes([iov[0], iov[1], iov[2], iov[3]]);
                let len = u32::from_le_bytes([iov[4], iov[5], iov[6], iov[7]]);
                // Iovecs may all point at the same bytes: without a cap, one call could make
                // the host copy 1024 times the guest's memory. Beyond it the write is short,
                // which WASI allows (callers write the rest again).
                let room = MAX_WRITE - text.len();
                with_slice(&mut c, ptr, len, W, |b, _| {
                    text.extend_from_slice(&b[..b.len().min(room)]);
                })?;
                if text.len() == MAX_WRITE {
                    break;
                }
            }
            if fd != 1 && fd != 2 {
                return Ok(BADF);
            }
            let msg = String::from_utf8_lossy(&text);
            let msg = msg.trim_end();
            if !msg.is_empty() {
                emit(&c.data().plugin.name, if fd == 1 { 2 } else { 4 }, msg);
            }
            write_u32(&mut c, ret, text.len() as u32, W)?;
            Ok(SUCCESS)
        },
    )?;
    l.func_wrap(
        m,
        "proc_exit",
        |_: Cx<'_>, code: u32| -> wasmtime::Result<()> {
            Err(wasmtime::Error::msg(format!(
                "guest called proc_exit({code})"
            )))
        },
    )?;
    l.func_wrap(
        m,
        "clock_time_get",
        |mut c: Cx<'_>, id: u32, _precision: u64, ret: u32| -> wasmtime::Result<u32> {
            let t = match id {
                0 => SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64),
                1..=3 => start().elapsed().as_nanos() as u64 + 1,
                _ => return Ok(INVAL),
            };
            write_u64(&mut c, ret, t, "clock_time_get")?;
            Ok(SUCCESS)
        },
    )?;
    l.func_wrap(
        m,
        "clock_res_get",
        |mut c: Cx<'_>, _id: u32, ret: u32| -> wasmtime::Result<u32> {
            write_u64(&mut c, ret, 1, "clock_res_get")?;
            Ok(SUCCESS)
        },
    )?;
    l.func_wrap(
        m,
        "random_get",
        |mut c: Cx<'_>, ptr: u32, len: u32| -> wasmtime::Result<u32> {
            if len > 1 << 20 {
                return Ok(INVAL);
            }
            let mut buf = vec![0u8; len as usize];
            rand::rng().fill_bytes(&mut buf);
            write(&mut c, ptr, &buf, "random_get")?;
            Ok(SUCCESS)
        },
    )?;
    l.func_wrap(m, "sched_yield", |_: Cx<'_>| SUCCESS)?;
    l.func_wrap(
        m,
        "poll_oneoff",
        |mut c: Cx<'_>, sin: u32, sout: u32, n: u32, ret: u32| -> wasmtime::Result<u32> {
            // Never blocks: every subscription is reported as ready at once (a guest that
            // sleeps just does not sleep; blocking a gateway worker would be worse).
            const W: &str = "poll_oneoff";
            if n > 1024 {
                return Ok(INVAL);
            }
            let subs = read(&mut c, sin, n * 48, W)?;
            let mut events = Vec::with_capacity(n as usize * 32);
            for sub in subs.chunks_exact(48) {
                let mut ev = [0u8; 32];
                ev[..8].copy_from_slice(&sub[..8]); // userdata
                ev[10] = sub[8]; // type (clock 0, fd_read 1, fd_write 2)
                events.extend_from_slice(&ev);
            }
            write(&mut c, sout, &events, W)?;
            write_u32(&mut c, ret, n, W)?;
            Ok(SUCCESS)
        },
    )?;
    l.func_wrap(m, "fd_close", |_: Cx<'_>, _fd: u32| BADF)?;
    l.func_wrap(
        m,
        "fd_fdstat_get",
        |mut c: Cx<'_>, fd: u32, ret: u32| -> wasmtime::Result<u32> {
            if fd > 2 {
                return Ok(BADF);
            }
            // filetype CHARACTER_DEVICE (2), no flags, rights: all for fd_write.
            let mut stat = [0u8; 24];
            stat[0] = 2;
            stat[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
            write(&mut c, ret, &stat, "fd_fdstat_get")?;
            Ok(SUCCESS)
        },
    )?;
    l.func_wrap(m, "fd_fdstat_set_flags", |_: Cx<'_>, _: u32, _: u32| BADF)?;
    l.func_wrap(m, "fd_prestat_get", |_: Cx<'_>, _: u32, _: u32| BADF)?;
    l.func_wrap(
        m,
        "fd_prestat_dir_name",
        |_: Cx<'_>, _: u32, _: u32, _: u32| BADF,
    )?;
    Ok(())
}
