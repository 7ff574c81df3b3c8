//! The shared wasmtime [`Engine`]: epoch interruption driven by a ticker thread (off the async
//! executor, so a runaway guest is stopped even when every worker is busy; see [`Ticker`]), the
//! pooling allocator when a probe shows this machine can reserve its address space, and a
//! compile cache keyed by the sha256 of the module bytes, so reloading an unchanged file never
//! recompiles, and optionally one on disk ([`DiskCache`]), so a restart does not either.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, Module, PoolingAllocationConfig};

pub use crate::disk_cache::{DiskCache, DiskCacheStats};
use crate::error::PluginError;
pub use crate::ticker::{EPOCH_TICK, Ticker};

/// Compiled modules kept for reuse; older entries are dropped first.
const CACHE_ENTRIES: usize = 32;

/// A module's bytes digest.
pub type Digest32 = [u8; 32];

/// One engine for the process, its ticker and its compile cache.
pub struct HostEngine {
    engine: Engine,
    pooling: bool,
    ticker: Arc<Ticker>,
    cache: Mutex<Vec<(Digest32, Module)>>,
    /// Compiled code on disk, when the config has a `server.wasm_cache`.
    disk: Mutex<Option<DiskCache>>,
    disk_stats: DiskCacheStats,
    /// Runs first on every compile thread (see `with_compile_thread_init`).
    compile_thread_init: Option<fn()>,
}

impl HostEngine {
    /// Builds the engine (pooling allocator if the probe succeeds) and starts the ticker.
    pub fn new() -> Arc<Self> {
        Self::build(None)
    }

    /// As `new`, with `init` run first on each thread that compiles a plugin. The gateway
    /// points such a thread's allocations at an arena of their own: almost everything a
    /// compile allocates is garbage when it ends, and in pages of its own that garbage can be
    /// returned whole instead of leaving holes between the config's long-lived allocations.
    pub fn with_compile_thread_init(init: fn()) -> Arc<Self> {
        Self::build(Some(init))
    }

    fn build(compile_thread_init: Option<fn()>) -> Arc<Self> {
        let (engine, pooling) = match pooled_engine() {
            Some(e) => (e, true),
            None => (base_engine(), false),
        };
        tracing::debug!(pooling, "wasm engine ready");
        let ticker = Ticker::start(engine.weak());
        Arc::new(Self {
            engine,
            pooling,
            ticker,
            cache: Mutex::new(Vec::new()),
            disk: Mutex::new(None),
            disk_stats: DiskCacheStats::default(),
            compile_thread_init,
        })
    }

    /// The wasmtime engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The epoch ticker.
    pub fn ticker(&self) -> &Arc<Ticker> {
        &self.ticker
    }

    /// Whether instances come from the pooling allocator.
    pub fn pooling(&self) -> bool {
        self.pooling
    }

    /// Uses `cache` for the compiles from now on (`None`: no cache on disk).
    pub fn set_disk_cache(&self, cache: Option<DiskCache>) {
        *self.disk.lock().unwrap_or_else(|p| p.into_inner()) = cache;
    }

    /// What the disk cache did.
    pub fn disk_cache_stats(&self) -> &DiskCacheStats {
        &self.disk_stats
    }

    /// Compiles `bytes`, or returns the cached module with the same digest (from memory, else
    /// from the disk cache). Slow (tens of milliseconds to seconds) when it compiles: call it
    /// off the request path.
    pub fn compile(&self, bytes: &[u8]) -> Result<(Module, Digest32), PluginError> {
        let digest: Digest32 = Sha256::digest(bytes).into();
        if let Some(m) = self.cached(&digest) {
            return Ok((m, digest));
        }
        let disk = self.disk.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let from_disk = disk
            .as_ref()
            .and_then(|d| d.load(&self.engine, &digest, &self.disk_stats));
        let module = match from_disk {
            Some(m) => m,
            None => {
                let (module, artifact) = self.compile_detached(bytes)?;
                if let (Some(d), Some(artifact)) = (&disk, artifact) {
                    d.store(&self.engine, &digest, &artifact, &self.disk_stats);
                }
                module
            }
        };
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= CACHE_ENTRIES {
            cache.remove(0);
        }
        cache.push((digest, module.clone()));
        Ok((module, digest))
    }

    /// Compiles with a throwaway engine of the same settings, on a thread of its own, and
    /// loads the result into the shared engine. An engine keeps every Cranelift context it
    /// compiled with (register allocator and code buffers, megabytes for a small plugin) for
    /// its next compile, and the allocator keeps a cache of freed blocks per thread; a
    /// gateway compiles only when it loads a config, so either would hold the compile's
    /// garbage resident for good. Dropping the engine frees the first, the thread's exit the
    /// second (hence one thread, not wasmtime's parallel compile on a pool that lives on).
    /// The artifact comes back too when the shared engine took it (for the disk cache).
    fn compile_detached(&self, bytes: &[u8]) -> Result<(Module, Option<Vec<u8>>), PluginError> {
        let compile_error = |e: wasmtime::Error| PluginError::Compile(format!("{e:#}"));
        let artifact = std::thread::scope(|scope| {
            let compiling = std::thread::Builder::new()
                .name("wasm-compile".into())
                .spawn_scoped(scope, || {
                    if let Some(init) = self.compile_thread_init {
                        init();
                    }
                    Engine::new(&compiler_config())?.precompile_module(bytes)
                });
            match compiling {
                Ok(handle) => handle
                    .join()
                    .unwrap_or_else(|_| Err(wasmtime::Error::msg("the compiler panicked"))),
                Err(e) => Err(wasmtime::Error::msg(format!(
                    "cannot start a compile thread: {e}"
                ))),
            }
        })
        .map_err(compile_error)?;
        match load_own_artifact(&self.engine, &artifact) {
            Ok(module) => Ok((module, Some(artifact))),
            Err(e) => {
                // Not expected (both engines have the same settings); compiling in the
                // shared engine costs only the memory above.
                tracing::debug!(error = %e, "precompiled plugin not accepted; compiling in place");
                Module::new(&self.engine, bytes)
                    .map(|m| (m, None))
                    .map_err(compile_error)
            }
        }
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

/// The throwaway compiling engine's: the shared settings, compiled on the calling thread.
fn compiler_config() -> Config {
    let mut cfg = base_config();
    cfg.parallel_compilation(false);
    cfg
}

fn base_engine() -> Engine {
    // The default configuration always builds; a failure here would be a wasmtime bug.
    Engine::new(&base_config()).unwrap_or_default()
}

/// Loads code this process compiled a moment ago with an engine of the same settings.
#[allow(
    unsafe_code,
    reason = "wasmtime's deserialize trusts its input to be its own compiler's output"
)]
fn load_own_artifact(engine: &Engine, artifact: &[u8]) -> wasmtime::Result<Module> {
    // SAFETY: `artifact` is what `Engine::precompile_module` returned in this process, never
    // read from outside it, so it is a well-formed artifact of this wasmtime build; wasmtime
    // still checks that the engine's settings match the ones it was compiled with.
    unsafe { Module::deserialize(engine, artifact) }
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

#[cfg(test)]
mod tests {
    use super::*;

    const ANSWER: &str =
        r#"(module (memory 1) (func (export "answer") (result i32) i32.const 42))"#;

    fn call_answer(engine: &Engine, module: &Module) -> i32 {
        let mut store = wasmtime::Store::new(engine, ());
        store.set_epoch_deadline(u64::MAX / 2);
        let instance = wasmtime::Instance::new(&mut store, module, &[]).expect("instantiates");
        let answer = instance
            .get_typed_func::<(), i32>(&mut store, "answer")
            .expect("exported");
        answer.call(&mut store, ()).expect("runs")
    }

    /// The compiling engine is built from `compiler_config`; the shared one adds the pooling
    /// allocator when it can. Were their settings to diverge, every plugin would silently be
    /// compiled in the shared engine again and keep the compiler's memory.
    #[test]
    fn code_compiled_by_a_throwaway_engine_loads_into_either_shared_engine() {
        let artifact = Engine::new(&compiler_config())
            .expect("engine")
            .precompile_module(ANSWER.as_bytes())
            .expect("compiles");
        let mut shared = vec![base_engine()];
        shared.extend(pooled_engine());
        for engine in &shared {
            let module = load_own_artifact(engine, &artifact).expect("same settings");
            assert_eq!(call_answer(engine, &module), 42);
        }
    }

    #[test]
    fn the_compile_thread_init_runs_on_the_thread_that_compiles() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static ON_COMPILE_THREAD: AtomicUsize = AtomicUsize::new(0);
        fn init() {
            if std::thread::current().name() == Some("wasm-compile") {
                ON_COMPILE_THREAD.fetch_add(1, Ordering::SeqCst);
            }
        }
        let host = HostEngine::with_compile_thread_init(init);
        host.compile(ANSWER.as_bytes()).expect("compiles");
        assert_eq!(ON_COMPILE_THREAD.load(Ordering::SeqCst), 1);
        host.compile(ANSWER.as_bytes()).expect("cached");
        assert_eq!(
            ON_COMPILE_THREAD.load(Ordering::SeqCst),
            1,
            "a cached module compiles nothing"
        );
    }

    #[test]
    fn compile_runs_in_the_shared_engine_and_caches_by_digest() {
        let host = HostEngine::new();
        let (module, digest) = host.compile(ANSWER.as_bytes()).expect("compiles");
        assert!(Engine::same(module.engine(), host.engine()));
        assert_eq!(call_answer(host.engine(), &module), 42);
        let (_, again) = host.compile(ANSWER.as_bytes()).expect("cached");
        assert_eq!(again, digest);
        assert_eq!(host.cached_modules(), 1);

        let err = host
            .compile(b"\0asm\x01\0\0\0\x01")
            .expect_err("truncated module");
        assert!(matches!(err, PluginError::Compile(_)), "{err:?}");
        assert_eq!(host.cached_modules(), 1);
    }
}
