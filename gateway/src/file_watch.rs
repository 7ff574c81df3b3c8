//! Watching a file that is reloaded without a config reload (plugin modules, htpasswd files):
//! a task polls its modification time and size every second (cheap; no inotify dependency,
//! works on every filesystem) and hands each change to its owner. The task ends when the owner
//! (usually part of a config generation) is dropped.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

/// How often the file is checked.
pub(crate) const POLL: Duration = Duration::from_secs(1);

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// Calls `changed` with `owner` each time `path` changes (not when it disappears), the calls
/// one after another; a no-op outside a Tokio runtime.
pub(crate) fn watch<T, F, Fut>(owner: &Arc<T>, path: PathBuf, changed: F)
where
    T: Send + Sync + 'static,
    F: Fn(Arc<T>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let weak: Weak<T> = Arc::downgrade(owner);
    let mut last = stamp(&path);
    rt.spawn(async move {
        let mut ticks = tokio::time::interval(POLL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let Some(owner) = weak.upgrade() else { return };
            let now = stamp(&path);
            if now == last || now.is_none() {
                continue;
            }
            last = now;
            changed(owner).await;
        }
    });
}
