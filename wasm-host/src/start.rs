//! Starting a VM: instantiate from the `InstancePre` (memory cap and CPU-time deadline already
//! in force), find the guest's allocator and callbacks, run `_initialize` (a WASI reactor) or
//! `_start`, then the root context's `proxy_on_context_create`, `proxy_on_vm_start` and
//! `proxy_on_configure`. Start-up gets a larger time budget than a request callback.

use std::sync::Arc;
use std::time::Duration;

use wasmtime::Store;

use crate::abi::logging::current_level;
use crate::engine::HostEngine;
use crate::error::PluginError;
use crate::exports::Exports;
use crate::plugin::CompiledPlugin;
use crate::shared::QueueNotify;
use crate::state::{HostState, Limits};
use crate::vm::{ROOT_ID, Vm};

/// The deadline of a VM's start-up calls: start-up may legitimately take longer than a request
/// callback (large rule sets).
pub(crate) fn startup_budget(limits: Limits) -> Duration {
    (limits.time * 20).max(Duration::from_secs(5))
}

impl Vm {
    pub(crate) fn start(
        plugin: Arc<CompiledPlugin>,
        queue_owner: Option<QueueNotify>,
    ) -> Result<Self, PluginError> {
        let engine = plugin.pre.module().engine().clone();
        let mut state = HostState::new(
            plugin.info.clone(),
            plugin.shared.clone(),
            plugin.ticker.clone(),
        );
        state.root_id = ROOT_ID;
        state.effective = ROOT_ID;
        state.log_level = current_level();
        state.queue_owner = queue_owner;
        state.limiter.gauge = Some(plugin.stats.clone());
        let mut store = Store::new(&engine, state);
        store.limiter(|s| &mut s.limiter);
        store.epoch_deadline_callback(crate::cpu::on_deadline);
        let limits = plugin.info.limits;
        let startup = startup_budget(limits);
        plugin
            .ticker
            .arm(&mut store, HostEngine::ticks_for(startup));
        let start_err = |e: wasmtime::Error, s: &mut Store<HostState>| {
            if s.data().limiter.hit {
                PluginError::Start(format!("memory limit of {} bytes reached", limits.memory))
            } else {
                PluginError::Start(format!("{e:#}"))
            }
        };
        let instance = match plugin.pre.instantiate(&mut store) {
            Ok(i) => i,
            Err(e) => return Err(start_err(e, &mut store)),
        };
        let memory = instance.get_memory(&mut store, "memory");
        let malloc = instance
            .get_typed_func::<u32, u32>(&mut store, "proxy_on_memory_allocate")
            .or_else(|_| instance.get_typed_func::<u32, u32>(&mut store, "malloc"))
            .ok();
        store.data_mut().memory = memory;
        store.data_mut().malloc = malloc;
        let ex = Exports::new(&instance, &mut store);
        let init = instance
            .get_typed_func::<(), ()>(&mut store, "_initialize")
            .or_else(|_| instance.get_typed_func::<(), ()>(&mut store, "_start"));
        if let Ok(init) = init {
            init.call(&mut store, ())
                .map_err(|e| start_err(e, &mut store))?;
        }
        let mut vm = Self {
            store,
            ex,
            plugin,
            next_ctx: ROOT_ID + 1,
            failed: None,
        };
        vm.start_root(startup)?;
        Ok(vm)
    }

    fn start_root(&mut self, budget: Duration) -> Result<(), PluginError> {
        let info = self.plugin.info.clone();
        let ticks = HostEngine::ticks_for(budget);
        let run = |vm: &mut Self, f: &dyn Fn(&mut Self) -> wasmtime::Result<u32>| {
            vm.plugin.ticker.arm(&mut vm.store, ticks);
            f(vm).map_err(|e| PluginError::Start(vm.describe(e).to_string()))
        };
        let configuring = |vm: &mut Self, on: bool| vm.store.data_mut().configuring = on;
        if let Some(f) = self.ex.context_create.clone() {
            configuring(self, true);
            run(self, &|vm| f.call(&mut vm.store, (ROOT_ID, 0)).map(|()| 1))?;
            configuring(self, false);
        }
        if let Some(f) = self.ex.vm_start.clone() {
            let n = info.vm_config.len() as u32;
            if run(self, &|vm| f.call(&mut vm.store, (ROOT_ID, n)))? == 0 {
                return Err(PluginError::Start(
                    "proxy_on_vm_start returned false".into(),
                ));
            }
        }
        if let Some(f) = self.ex.configure.clone() {
            let n = info.config.len() as u32;
            configuring(self, true);
            let configured = run(self, &|vm| f.call(&mut vm.store, (ROOT_ID, n)));
            configuring(self, false);
            if configured? == 0 {
                return Err(PluginError::Start(
                    "proxy_on_configure returned false (configuration rejected)".into(),
                ));
            }
        }
        Ok(())
    }
}
