//! Hot reload: a task per plugin polls the module file's modification time and size every
//! second (cheap; no inotify dependency, works on every filesystem). On a change, the new
//! bytes are compiled, linked and started on a blocking thread, off the request path, and
//! swapped in atomically; requests in flight finish on the VMs they started on. A module that
//! fails to compile, link or start is rejected with a log line and the old one keeps serving.
//! The task ends when the generation holding the plugin is dropped.

use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use wasm_host::engine::short_digest;

use super::plugin::PluginHandle;

/// How often the file is checked.
pub(crate) const POLL: Duration = Duration::from_secs(1);

fn stamp(handle: &PluginHandle) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(&handle.spec.wasm).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// Starts watching `handle`'s file (inside a Tokio runtime; a no-op outside one).
pub(crate) fn watch(handle: &Arc<PluginHandle>) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let weak: Weak<PluginHandle> = Arc::downgrade(handle);
    let mut last = stamp(handle);
    rt.spawn(async move {
        let mut ticks = tokio::time::interval(POLL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let Some(handle) = weak.upgrade() else { return };
            let now = stamp(&handle);
            if now == last || now.is_none() {
                continue;
            }
            last = now;
            let h = handle.clone();
            drop(handle);
            let result = tokio::task::spawn_blocking(move || {
                let r = h.reload();
                (h, r)
            })
            .await;
            let Ok((h, result)) = result else { continue };
            match result {
                Ok(true) => {
                    // What the compile freed, as after a config load.
                    crate::memory::release_freed();
                    tracing::info!(plugin = %h.name, sha256 = %short_digest(&h.digest()), "plugin reloaded");
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(plugin = %h.name, file = %h.spec.wasm.display(), error = %e, "plugin reload rejected; the previous module keeps serving");
                }
            }
        }
    });
}
