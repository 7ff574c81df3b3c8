//! A compiled plugin: the module (from the engine's cache), its ABI version, and an
//! `InstancePre` with every import resolved, so making a VM is only instantiation plus the
//! guest's start-up calls. Built off the request path, once per module and configuration.

use std::sync::Arc;

use wasmtime::{InstancePre, Module};

use crate::abi;
use crate::engine::{Digest32, HostEngine, Ticker};
use crate::error::PluginError;
use crate::metrics::PluginStats;
use crate::shared::{QueueNotify, Shared};
use crate::state::PluginInfo;
use crate::vm::Vm;

/// The proxy-wasm ABI a module declares through its marker export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbiVersion {
    /// `proxy_abi_version_0_1_0` (two-argument header callbacks).
    V0_1_0,
    /// `proxy_abi_version_0_2_0`.
    V0_2_0,
    /// `proxy_abi_version_0_2_1`.
    V0_2_1,
}

/// A module ready to instantiate.
pub struct CompiledPlugin {
    pub(crate) info: Arc<PluginInfo>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) pre: InstancePre<crate::state::HostState>,
    /// The plugin's host counters, found by name once here so a guest call counts itself
    /// with one atomic add.
    pub(crate) stats: Arc<PluginStats>,
    /// `limits.time` in epoch ticks, the deadline every guest call starts with (worked out
    /// here: it is a 128-bit division, and a request makes several calls).
    pub(crate) call_ticks: u64,
    /// The engine's epoch ticker, woken by every call (see `ticker`).
    pub(crate) ticker: Arc<Ticker>,
    digest: Digest32,
    abi: AbiVersion,
}

impl CompiledPlugin {
    /// Compiles (or takes from the cache) and links `bytes`. Slow: call it off the request path.
    pub fn load(
        engine: &HostEngine,
        shared: Arc<Shared>,
        info: PluginInfo,
        bytes: &[u8],
    ) -> Result<Arc<Self>, PluginError> {
        let (module, digest) = engine.compile(bytes)?;
        let abi = abi_version(&module)?;
        let mut linker =
            abi::linker(engine.engine()).map_err(|e| PluginError::Link(format!("{e:#}")))?;
        // Imports nobody provides trap when called instead of failing the whole module: stock
        // Go links file and socket calls it never makes.
        linker
            .define_unknown_imports_as_traps(&module)
            .map_err(|e| PluginError::Link(format!("{e:#}")))?;
        let pre = linker
            .instantiate_pre(&module)
            .map_err(|e| PluginError::Link(format!("{e:#}")))?;
        let stats = shared.metrics.plugin(&info.name);
        let ticker = engine.ticker().clone();
        // Start-up's deadline is the longest any of its calls is given.
        ticker.linger_at_least(HostEngine::ticks_for(crate::start::startup_budget(
            info.limits,
        )));
        Ok(Arc::new(Self {
            call_ticks: HostEngine::ticks_for(info.limits.time),
            ticker,
            info: Arc::new(info),
            stats,
            shared,
            pre,
            digest,
            abi,
        }))
    }

    /// A fresh VM, started and configured (`_initialize`, root context, `on_vm_start`,
    /// `on_configure`). `queue_owner` is told when data arrives on queues this VM registers.
    pub fn instantiate(
        self: &Arc<Self>,
        queue_owner: Option<QueueNotify>,
    ) -> Result<Vm, PluginError> {
        Vm::start(self.clone(), queue_owner)
    }

    /// The sha256 of the module bytes.
    pub fn digest(&self) -> &Digest32 {
        &self.digest
    }

    /// The ABI the module declared.
    pub fn abi(&self) -> AbiVersion {
        self.abi
    }

    /// The plugin's identity and configuration.
    pub fn info(&self) -> &Arc<PluginInfo> {
        &self.info
    }

    /// The process-wide shared state.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

fn abi_version(module: &Module) -> Result<AbiVersion, PluginError> {
    let mut found = None;
    for e in module.exports() {
        let v = match e.name() {
            "proxy_abi_version_0_2_1" => AbiVersion::V0_2_1,
            "proxy_abi_version_0_2_0" => AbiVersion::V0_2_0,
            "proxy_abi_version_0_1_0" => AbiVersion::V0_1_0,
            _ => continue,
        };
        found = Some(found.map_or(
            v,
            |f: AbiVersion| if v == AbiVersion::V0_2_1 { v } else { f },
        ));
    }
    found.ok_or_else(|| {
        PluginError::Link(
            "the module exports no proxy_abi_version_* marker; is it a proxy-wasm plugin?".into(),
        )
    })
}
