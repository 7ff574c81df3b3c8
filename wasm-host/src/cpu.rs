//! `limits.time` is CPU time, not wall time. The epoch ticker measures wall time, so on a busy
//! machine a guest descheduled by the kernel would pass its deadline without running. When a
//! call reaches its epoch deadline, the thread's CPU clock is read; the call is stopped only
//! once it has used another half limit of CPU since that first deadline (checked at short
//! extensions), so a starved guest is not blamed for the kernel's scheduling. The fast path
//! (calls that end before their deadline) reads no clock.

use std::time::Duration;

use wasmtime::{StoreContextMut, UpdateDeadline};

use crate::engine::HostEngine;
use crate::error::PluginError;
use crate::state::HostState;

/// CPU time consumed by the calling thread (`None` where the platform has no such clock).
#[allow(
    unsafe_code,
    reason = "clock_gettime on a stack timespec; std has no thread CPU clock"
)]
pub(crate) fn thread_cpu_time() -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// The store's epoch-deadline callback.
pub(crate) fn on_deadline(
    mut cx: StoreContextMut<'_, HostState>,
) -> wasmtime::Result<UpdateDeadline> {
    let limit = cx.data().plugin.limits.time;
    let s = cx.data_mut();
    // The call runs on past a deadline: the ticker must go on to its next one.
    s.ticker.keep_awake();
    let Some(now) = thread_cpu_time() else {
        s.fault = Some(PluginError::Timeout(limit));
        return Ok(UpdateDeadline::Interrupt);
    };
    match s.deadline_cpu {
        // Half a limit of CPU since the first deadline (which itself came after about a limit
        // of wall time): a runaway.
        Some(first) if now.saturating_sub(first) >= limit / 2 => {
            s.fault = Some(PluginError::Timeout(limit));
            Ok(UpdateDeadline::Interrupt)
        }
        Some(_) => Ok(UpdateDeadline::Continue(HostEngine::ticks_for(limit / 4))),
        None => {
            s.deadline_cpu = Some(now);
            Ok(UpdateDeadline::Continue(HostEngine::ticks_for(limit / 2)))
        }
    }
}
