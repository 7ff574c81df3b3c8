//! Time and timers: `proxy_get_current_time_nanoseconds` (wall clock) and
//! `proxy_set_tick_period_milliseconds` (one period per root context; the embedder's timer
//! task reads it after each call and calls `proxy_on_tick`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use wasmtime::Linker;

use super::OK;
use super::memory::{Cx, write_u64};
use crate::state::HostState;

pub(crate) fn link(l: &mut Linker<HostState>) -> wasmtime::Result<()> {
    l.func_wrap(
        "env",
        "proxy_get_current_time_nanoseconds",
        |mut c: Cx<'_>, ret: u32| -> wasmtime::Result<u32> {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            write_u64(&mut c, ret, now, "proxy_get_current_time_nanoseconds")?;
            Ok(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_tick_period_milliseconds",
        |mut c: Cx<'_>, ms: u32| -> u32 {
            c.data_mut().tick_period = Duration::from_millis(u64::from(ms));
            OK
        },
    )?;
    Ok(())
}
