//! Wasm plugins in the gateway: the proxy-wasm host (crate `gateway-wasm-host`) wired to the
//! filter chain, the L4 stream filters, the upstream pools and the metrics registry.
//!
//! * [`Plugins`]: a generation's plugins, each a [`PluginHandle`] built when the generation is
//!   (compiled once, cached by sha256; one VM per worker thread, started and configured before
//!   the generation serves).
//! * `reload`: a watcher per plugin that swaps in a changed `.wasm` without a restart.
//! * `http_filter` / `network_filter`: the `HttpFilter` and `StreamFilter` implementations.
//! * `pool`: the per-worker VM slots, effects, timers and HTTP calls; `dispatch`: HTTP calls
//!   through the upstream pools.
//!
//! The host lives in its own crate so the plugin SDK's test harness runs the very same code
//! without depending on the gateway.

mod dispatch;
mod http_filter;
mod network_filter;
mod plugin;
mod pool;
mod reload;
mod reply;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use gateway_config::Config;
use wasm_host::{HostEngine, Shared};

pub use http_filter::WasmFilterFactory;
pub use network_filter::WasmStreamFilterFactory;
pub use plugin::PluginHandle;
pub use wasm_host::PluginError;

use crate::cluster::Cluster;
use crate::error::GatewayError;
use crate::proxy::Upstreams;

/// The process-wide host: one engine (with its ticker thread and compile cache) and one shared
/// store (shared data, queues, metrics), kept across generations and reloads.
pub struct WasmHost {
    /// The engine.
    pub engine: Arc<HostEngine>,
    /// Shared data, queues, metrics.
    pub shared: Arc<Shared>,
}

static HOST: OnceLock<WasmHost> = OnceLock::new();

/// The process-wide host, created on first use (no engine thread without plugins).
pub fn host() -> &'static WasmHost {
    HOST.get_or_init(|| {
        crate::cluster::on_global_queue(notify_global_queue);
        WasmHost {
            engine: HostEngine::with_compile_thread_init(crate::memory::use_private_arena),
            shared: Shared::new(),
        }
    })
}

/// Appends plugin metrics (guest-defined and the host's per-plugin counters) in Prometheus
/// text format; nothing when no plugin was ever loaded.
pub fn render_prometheus(out: &mut String) {
    if let Some(h) = HOST.get() {
        h.shared.metrics.render_prometheus(out);
        h.engine.disk_cache_stats().render_prometheus(out);
    }
}

/// Tells the local owner of a global queue that another instance (or this one) enqueued on it
/// (the cluster's subscriber calls it once the host exists).
fn notify_global_queue(vm_id: &str, name: &str) {
    if let Some(h) = HOST.get() {
        h.shared.notify_queue(vm_id, name);
    }
}

/// A generation's plugins by name.
#[derive(Default)]
pub struct Plugins {
    by_name: HashMap<String, Arc<PluginHandle>>,
}

impl Plugins {
    /// Loads every configured plugin (compile, link, start a VM per worker, configure). A
    /// plugin that fails is a located config error, so the generation is not used.
    /// Plugins with `shared_data: { scope: global }` keep it in `cluster`. Their files are not
    /// watched until [`Plugins::watch`].
    pub fn build(
        config: &Config,
        upstreams: &Upstreams,
        cluster: Option<&Arc<Cluster>>,
    ) -> Result<Self, GatewayError> {
        if config.plugins.is_empty() {
            return Ok(Self::default());
        }
        // Each generation's setting holds for its compiles, hot reloads of its plugins too.
        host().engine.set_disk_cache(
            config
                .server
                .wasm_cache
                .as_ref()
                .map(|c| wasm_host::engine::DiskCache::new(c.path.clone(), c.max_size.bytes())),
        );
        let dispatch = Arc::new(dispatch::Dispatch::new(config, upstreams));
        let workers = match config.server.worker_threads {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
            n => n,
        };
        let mut by_name = HashMap::with_capacity(config.plugins.len());
        for (name, spec) in &config.plugins {
            let global = config
                .raw
                .plugins
                .get(name)
                .filter(|p| p.shared_data.scope == gateway_config::model::Scope::Global)
                .and(cluster)
                .map(|c| c.shared_data());
            let handle = PluginHandle::load(spec, dispatch.clone(), workers, global)
                .map_err(|e| config.error(format!("plugins.{name}.wasm"), e.to_string()))?;
            by_name.insert(name.clone(), handle);
        }
        Ok(Self { by_name })
    }

    /// Starts watching every plugin's file for hot reload, on the current Tokio runtime; a
    /// watcher ends when its plugin is dropped.
    pub fn watch(&self) {
        for h in self.by_name.values() {
            reload::watch(h);
        }
    }

    /// A plugin by name.
    pub fn get(&self, name: &str) -> Option<&Arc<PluginHandle>> {
        self.by_name.get(name)
    }
}

/// A `&'static str` for a plugin name (filter names are static in the chain's contract); each
/// distinct name is leaked once.
pub(crate) fn intern(name: &str) -> &'static str {
    static NAMES: OnceLock<std::sync::Mutex<Vec<&'static str>>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(n) = names.iter().find(|n| **n == name) {
        return n;
    }
    let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.push(leaked);
    leaked
}
