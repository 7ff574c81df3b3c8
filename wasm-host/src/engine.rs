//! The shared wasmtime [`Engine`]: epoch interruption driven by a ticker thread (off the async
//! executor, so a runaway guest is stopped even when every worker is busy), the pooling
//! allocator when a probe shows this machine can reserve its address space, and a compile cache
//! keyed by the sha256 of the module bytes, so reloading an unchanged file never recompiles.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, Module, PoolingAllocationConfig};

use crate::error::PluginError;

/// How often the epoch advances; `limits.time` is rounded up to a multiple of this.
pub const EPOCH_TICK: Duration = Duration::from_millis(2);

/// Compiled modules kept for reuse; older entries are dropped first.
const CACHE_ENTRIES: usize = 32;

/// A module's bytes digest.
pub type Digest32 = [u8; 32];

/// One engine for the process, its ticker and its compile cache.
pub struct HostEngine {
    engine: Engine,
    pooling: bool,
    cache: Mutex<Vec<(Digest32, Module)>>,
}

impl HostEngine {
    /// Builds the engine (pooling allocator if the probe succeeds) and starts the ticker.
    pub fn new() -> Arc<Self> {
        let (engine, pooling) = match pooled_engine() {
            Some(e) => (e, true),
            None => (base_engine(), false),
        };
        tracing::debug!(pooling, "wasm engine ready");
        let weak = engine.weak();
        let spawned = std::thread::Builder::new()
            .name("wasm-epoch".into())
            .spawn(move || {
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(EPOCH_TICK);
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the wasm epoch ticker; plugin time limits are not enforced");
        }
        Arc::new(Self {
            engine,
            pooling,
            cache: Mutex::new(Vec::new()),
        })
    }

    /// The wasmtime engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Whether instances come from the pooling allocator.
    pub fn pooling(&self) -> bool {
        self.pooling
    }

    /// Compiles `bytes`, or returns the cached module with the same digest. Slow (tens of
    /// milliseconds to seconds): call it off the request path.
    pub fn compile(&self, bytes: &[u8]) -> Result<(Module, Digest32), PluginError> {
        let digest: Digest32 = Sha256::digest(bytes).into();
        if let Some(m) = self.cached(&digest) {
            return Ok((m, digest));
        }
        let module =
            Module::new(&self.engine, bytes).map_err(|e| PluginError::Compile(format!("{e:#}")))?;
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= CACHE_ENTRIES {
            cache.remove(0);
        }
        cache.push((digest, module.clone()));
        Ok((module, digest))
    }

    fn cached(&self, digest: &Digest32) -> Option<Module> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .iter()
            .find(|(d, _)| d == digest)
            .map(|(_, m)| m.clone())
    }

    /// Number of modules in the compile cache (for tests and metrics).
    pub fn cached_modules(&self) -> usize {
        self.cache.lock().map(|c| c.len()).unwrap_or(0)
    }

    /// Epoch ticks that make up `time` (at least one full tick beyond the current one).
    pub fn ticks_for(time: Duration) -> u64 {
        let tick = EPOCH_TICK.as_nanos().max(1);
        (time.as_nanos().div_ceil(tick) as u64).max(1) + 1
    }
}

/// Settings every engine shares.
fn base_config() -> Config {
    let mut cfg = Config::new();
    cfg.epoch_interruption(true);
    cfg.memory_init_cow(true);
    cfg
}

fn base_engine() -> Engine {
    // The default configuration always builds; a failure here would be a wasmtime bug.
    Engine::new(&base_config()).unwrap_or_default()
}

/// The pooling allocator reserves address space up front, which fails on some kernels and
/// emulators (spin #2119): build it, then instantiate a tiny module as a probe.
fn pooled_engine() -> Option<Engine> {
    let mut pool = PoolingAllocationConfig::default();
    pool.total_core_instances(2048)
        .total_memories(2048)
        .total_tables(2048)
        .max_memory_size(4 << 30)
        .table_elements(100_000)
        .max_core_instance_size(4 << 20)
        .max_unused_warm_slots(64);
    let mut cfg = base_config();
    cfg.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    let engine = Engine::new(&cfg).ok()?;
    let module = Module::new(&engine, "(module (memory 1) (table 1 funcref))").ok()?;
    let mut store = wasmtime::Store::new(&engine, ());
    store.set_epoch_deadline(u64::MAX / 2);
    wasmtime::Instance::new(&mut store, &module, &[]).ok()?;
    Some(engine)
}

/// The first bytes of a digest in hex, for logs.
pub fn short_digest(d: &Digest32) -> String {
    d[..6].iter().map(|b| format!("{b:02x}")).collect()
}
