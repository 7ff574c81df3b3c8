//! Hot reload: a task per plugin polls the module file ([`crate::file_watch`]). On a change,
//! the new bytes are compiled, linked and started on a blocking thread, off the request path, and
//! swapped in atomically; requests in flight finish on the VMs they started on. A module that
//! fails to compile, link or start is rejected with a log line and the old one keeps serving.
//! The task ends when the generation holding the plugin is dropped.

use std::sync::Arc;

use wasm_host::engine::short_digest;

use super::plugin::PluginHandle;

/// Starts watching `handle`'s file (inside a Tokio runtime; a no-op outside one).
pub(crate) fn watch(handle: &Arc<PluginHandle>) {
    crate::file_watch::watch(handle, handle.spec.wasm.clone(), |h| async move {
        let result = tokio::task::spawn_blocking(move || {
            let r = h.reload();
            (h, r)
        })
        .await;
        let Ok((h, result)) = result else { return };
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
    });
}
