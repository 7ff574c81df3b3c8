//! `proxy_log` and `proxy_get_log_level`: guest logs go to the gateway's `tracing` log with the
//! plugin's name, at the guest's level (TRACE 0 … CRITICAL 5).

use wasmtime::Linker;

use super::OK;
use super::memory::{Cx, with_slice, write_u32};
use crate::state::HostState;

pub(crate) fn link(l: &mut Linker<HostState>) -> wasmtime::Result<()> {
    l.func_wrap(
        "env",
        "proxy_log",
        |mut c: Cx<'_>, level: u32, ptr: u32, len: u32| -> wasmtime::Result<u32> {
            with_slice(&mut c, ptr, len, "proxy_log", |msg, s| {
                emit(&s.plugin.name, level, &String::from_utf8_lossy(msg));
            })?;
            Ok(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_log_level",
        |mut c: Cx<'_>, ret: u32| -> wasmtime::Result<u32> {
            let level = c.data().log_level;
            write_u32(&mut c, ret, level, "proxy_get_log_level")?;
            Ok(OK)
        },
    )?;
    Ok(())
}

/// Logs one guest line.
pub(crate) fn emit(plugin: &str, level: u32, msg: &str) {
    match level {
        0 => tracing::trace!(target: "plugin", plugin, "{msg}"),
        1 => tracing::debug!(target: "plugin", plugin, "{msg}"),
        2 => tracing::info!(target: "plugin", plugin, "{msg}"),
        3 => tracing::warn!(target: "plugin", plugin, "{msg}"),
        _ => tracing::error!(target: "plugin", plugin, "{msg}"),
    }
}

/// The lowest guest level the gateway's log would keep, so guests skip formatting the rest.
pub(crate) fn current_level() -> u32 {
    use tracing::level_filters::LevelFilter;
    match LevelFilter::current() {
        LevelFilter::TRACE => 0,
        LevelFilter::DEBUG => 1,
        LevelFilter::INFO => 2,
        LevelFilter::WARN => 3,
        LevelFilter::ERROR => 4,
        _ => 5,
    }
}
