//! Metrics: `proxy_define_metric`, `proxy_record_metric`, `proxy_increment_metric`,
//! `proxy_get_metric`, backed by the process-wide [`crate::metrics::Metrics`] registry.

use wasmtime::Linker;

use super::memory::{Cx, with_slice, write_u32, write_u64};
use super::{BAD_ARGUMENT, NOT_FOUND, OK};
use crate::metrics::MetricKind;
use crate::state::HostState;

pub(crate) fn link(l: &mut Linker<HostState>) -> wasmtime::Result<()> {
    l.func_wrap(
        "env",
        "proxy_define_metric",
        |mut c: Cx<'_>, kind: u32, np: u32, nl: u32, ret: u32| -> wasmtime::Result<u32> {
            let Some(kind) = MetricKind::from_abi(kind) else {
                return Ok(BAD_ARGUMENT);
            };
            let id = with_slice(&mut c, np, nl, "proxy_define_metric", |name, s| {
                s.shared
                    .metrics
                    .define(kind, &String::from_utf8_lossy(name))
            })?;
            write_u32(&mut c, ret, id, "proxy_define_metric")?;
            Ok(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_record_metric",
        |c: Cx<'_>, id: u32, v: i64| -> u32 {
            if c.data().shared.metrics.record(id, v) {
                OK
            } else {
                NOT_FOUND
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_increment_metric",
        |c: Cx<'_>, id: u32, delta: i64| -> u32 {
            match c.data().shared.metrics.increment(id, delta) {
                Ok(()) => OK,
                Err(true) => BAD_ARGUMENT,
                Err(false) => NOT_FOUND,
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_metric",
        |mut c: Cx<'_>, id: u32, ret: u32| -> wasmtime::Result<u32> {
            let Some(v) = c.data().shared.metrics.value(id) else {
                return Ok(NOT_FOUND);
            };
            write_u64(&mut c, ret, v, "proxy_get_metric")?;
            Ok(OK)
        },
    )?;
    Ok(())
}
