//! Reloads when the config file changes. Polling the file's contents once a second is cheap and
//! behaves the same on every filesystem (inotify misses changes on some network mounts and when
//! editors replace the file); a half-written file fails validation and is simply retried on the
//! next change.

use std::hash::{Hash, Hasher};

use super::{Gateway, WATCH_INTERVAL};

fn fingerprint(path: &std::path::Path) -> Option<u64> {
    let bytes = std::fs::read(path).ok()?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    Some(h.finish())
}

/// Starts the watcher; it ends when the gateway drains.
pub(super) fn spawn(gateway: Gateway) {
    // The baseline is the file as it was loaded, taken now rather than when the task first runs.
    let path = gateway.config_path().to_owned();
    let mut last = fingerprint(&path);
    tokio::spawn(async move {
        let stop = gateway.shutdown_token();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(WATCH_INTERVAL) => {}
            }
            let path2 = path.clone();
            let now = tokio::task::spawn_blocking(move || fingerprint(&path2))
                .await
                .ok()
                .flatten();
            if now.is_some() && now != last {
                last = now;
                tracing::info!(config = %path.display(), "config file changed; reloading");
                let _ = gateway.reload().await;
            }
        }
    });
}
