//! One configured plugin in one generation: its current runtime (compiled module + VM slots),
//! swapped atomically by a hot reload, and its host counters (kept across reloads and
//! generations, by name).

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use arc_swap::ArcSwap;
use bytes::Bytes;
use wasm_host::engine::{Digest32, short_digest};
use wasm_host::shared::GlobalStoreRef;
use wasm_host::{CompiledPlugin, Limits, PluginError, PluginInfo, PluginStats};

use super::dispatch::Dispatch;
use super::pool::Slot;

/// A module with its started VMs.
pub(crate) struct PluginRuntime {
    pub(crate) slots: Box<[Arc<Slot>]>,
    pub(crate) digest: Digest32,
}

/// A plugin as routes and streams use it.
pub struct PluginHandle {
    /// Name in the config.
    pub name: Arc<str>,
    runtime: ArcSwap<PluginRuntime>,
    /// Host counters (reloads, failures, VM replacements).
    pub stats: Arc<PluginStats>,
    pub(crate) spec: gateway_config::Plugin,
    dispatch: Arc<Dispatch>,
    workers: usize,
    /// Where shared data and queues live with `shared_data: { scope: global }`.
    global: Option<GlobalStoreRef>,
}

impl PluginHandle {
    pub(crate) fn load(
        spec: &gateway_config::Plugin,
        dispatch: Arc<Dispatch>,
        workers: usize,
        global: Option<GlobalStoreRef>,
    ) -> Result<Arc<Self>, PluginError> {
        let stats = super::host().shared.metrics.plugin(&spec.name);
        let bytes = read(spec)?;
        let runtime = build_runtime(spec, &global, &dispatch, &stats, workers, &bytes)?;
        tracing::info!(plugin = %spec.name, sha256 = %short_digest(&runtime.digest), abi = ?runtime.slots[0].compiled.abi(), "plugin loaded");
        Ok(Arc::new(Self {
            name: Arc::from(spec.name.as_str()),
            runtime: ArcSwap::from_pointee(runtime),
            stats,
            spec: spec.clone(),
            dispatch,
            workers,
            global,
        }))
    }

    /// The runtime new requests use.
    pub(crate) fn runtime(&self) -> Arc<PluginRuntime> {
        self.runtime.load_full()
    }

    /// The sha256 of the module serving new requests.
    pub fn digest(&self) -> Digest32 {
        self.runtime.load().digest
    }

    /// Reads the module file again and, if its bytes changed, builds and starts a new runtime
    /// and swaps it in. `Ok(false)`: unchanged. On error the old runtime keeps serving.
    /// Blocking (compiles): run it off the async workers.
    pub fn reload(&self) -> Result<bool, PluginError> {
        let result = self.try_reload();
        // Counted before the swap is visible, so whoever sees the new module sees the count.
        match &result {
            Ok(Some(_)) => self.stats.reloads_ok.fetch_add(1, Relaxed),
            Ok(None) => 0,
            Err(_) => self.stats.reloads_failed.fetch_add(1, Relaxed),
        };
        result.map(|runtime| match runtime {
            Some(runtime) => {
                self.runtime.store(Arc::new(runtime));
                true
            }
            None => false,
        })
    }

    fn try_reload(&self) -> Result<Option<PluginRuntime>, PluginError> {
        let bytes = read(&self.spec)?;
        let digest: Digest32 = {
            use sha2::Digest as _;
            sha2::Sha256::digest(&bytes).into()
        };
        if digest == self.digest() {
            return Ok(None);
        }
        build_runtime(
            &self.spec,
            &self.global,
            &self.dispatch,
            &self.stats,
            self.workers,
            &bytes,
        )
        .map(Some)
    }
}

fn read(spec: &gateway_config::Plugin) -> Result<Vec<u8>, PluginError> {
    std::fs::read(&spec.wasm).map_err(|source| PluginError::Read {
        path: spec.wasm.display().to_string(),
        source,
    })
}

fn info(spec: &gateway_config::Plugin, global: &Option<GlobalStoreRef>) -> PluginInfo {
    PluginInfo {
        name: Arc::from(spec.name.as_str()),
        root_id: Arc::from(""),
        vm_id: Arc::from(""),
        config: envoy_bytes(&spec.config_json),
        vm_config: envoy_bytes(&spec.vm_config_json),
        limits: Limits {
            memory: spec.limits.memory.bytes(),
            time: spec.limits.time.get(),
        },
        global: global.clone(),
    }
}

/// The bytes a plugin reads for a configuration held as JSON: a string's own bytes (Envoy hands
/// a string value over as it is), anything else the JSON text.
fn envoy_bytes(json: &[u8]) -> Bytes {
    if json.first() == Some(&b'"')
        && let Ok(text) = serde_json::from_slice::<String>(json)
    {
        return Bytes::from(text);
    }
    Bytes::copy_from_slice(json)
}

/// Compiles (cached by digest), links and starts one VM per worker.
fn build_runtime(
    spec: &gateway_config::Plugin,
    global: &Option<GlobalStoreRef>,
    dispatch: &Arc<Dispatch>,
    stats: &Arc<PluginStats>,
    workers: usize,
    bytes: &[u8],
) -> Result<PluginRuntime, PluginError> {
    let host = super::host();
    let compiled =
        CompiledPlugin::load(&host.engine, host.shared.clone(), info(spec, global), bytes)?;
    let slots = (0..workers.max(1))
        .map(|_| Slot::new(compiled.clone(), stats.clone(), dispatch.clone()))
        .collect::<Result<Box<[_]>, _>>()?;
    Ok(PluginRuntime {
        slots,
        digest: *compiled.digest(),
    })
}
