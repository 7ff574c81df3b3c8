//! Per-worker VMs. A plugin runtime (one compiled module) has one [`Slot`] per worker thread;
//! a request takes the slot of the thread it starts on and keeps it (its context lives in that
//! VM). The slot's lock is held only for the length of a guest call, never across an await.
//!
//! After each guest call the slot applies the call's effects: continue, close and local replies
//! for *other* contexts go to the requests waiting on them; new HTTP calls are started; a tick
//! timer is started when the root context asked for one. A failed call replaces the VM (the
//! next request instantiates a fresh one from the `InstancePre`), and the requests paused in
//! the dead VM are failed.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::oneshot;
use wasm_host::{CompiledPlugin, Effect, Effects, PluginError, PluginStats, Vm};

use super::dispatch::Dispatch;

/// How a paused request is told to go on.
#[derive(Debug)]
pub(crate) enum Resume {
    /// `proxy_continue_stream`.
    Continue,
    /// `proxy_close_stream`: end the request.
    Close,
    /// `proxy_send_local_response`.
    Local(wasm_host::LocalResponse),
    /// The VM failed while the request was paused.
    Failed,
}

/// One VM slot.
pub(crate) struct Slot {
    inner: Mutex<SlotInner>,
    pub(crate) compiled: Arc<CompiledPlugin>,
    pub(crate) stats: Arc<PluginStats>,
    pub(crate) dispatch: Arc<Dispatch>,
}

pub(crate) struct SlotInner {
    vm: Option<Vm>,
    /// Bumped whenever the VM is replaced; contexts remember theirs.
    pub(crate) incarnation: u64,
    /// Paused contexts by id (the host's own ids, so a fast hash is safe).
    waiters: rustc_hash::FxHashMap<u32, oneshot::Sender<Resume>>,
    timer: bool,
    pending_calls: usize,
}

/// The effects a guest call produced for the context that made it.
#[derive(Debug, Default)]
pub(crate) struct Own {
    pub(crate) resume: Option<Resume>,
    /// An HTTP call was started by this call (something may resume a pause).
    pub(crate) started_calls: bool,
}

fn thread_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! { static INDEX: usize = NEXT.fetch_add(1, Relaxed); }
    INDEX.with(|i| *i)
}

/// The slot for the current thread.
pub(crate) fn pick(slots: &[Arc<Slot>]) -> &Arc<Slot> {
    &slots[thread_index() % slots.len()]
}

impl SlotInner {
    /// The VM, if one is running.
    pub(crate) fn vm_mut(&mut self) -> Option<&mut Vm> {
        self.vm.as_mut()
    }
}

impl Slot {
    /// A slot with a VM already started (so a bad module is found at load, not at the first
    /// request).
    pub(crate) fn new(
        compiled: Arc<CompiledPlugin>,
        stats: Arc<PluginStats>,
        dispatch: Arc<Dispatch>,
    ) -> Result<Arc<Self>, PluginError> {
        let slot = Arc::new(Self {
            inner: Mutex::new(SlotInner {
                vm: None,
                incarnation: 0,
                waiters: rustc_hash::FxHashMap::default(),
                timer: false,
                pending_calls: 0,
            }),
            compiled,
            stats,
            dispatch,
        });
        let vm = slot.compiled.instantiate(Some(queue_notify(&slot)))?;
        {
            let mut g = slot.lock();
            g.vm = Some(vm);
            g.incarnation = 1;
            let effects = g.vm.as_mut().map(Vm::take_effects).unwrap_or_default();
            slot.after_call(&mut g, effects, 0);
        }
        Ok(slot)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, SlotInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The live VM, instantiating a fresh one if the last one failed.
    pub(crate) fn vm<'a>(
        self: &Arc<Self>,
        g: &'a mut SlotInner,
    ) -> Result<&'a mut Vm, PluginError> {
        if g.vm.as_ref().is_none_or(|vm| vm.failed().is_some()) {
            let vm = self.compiled.instantiate(Some(queue_notify(self)))?;
            g.vm = Some(vm);
            g.incarnation += 1;
            g.timer = false;
            self.stats.vm_replacements.fetch_add(1, Relaxed);
            tracing::info!(plugin = %self.compiled.info().name, "plugin VM replaced with a fresh instance");
            let effects = g.vm.as_mut().map(Vm::take_effects).unwrap_or_default();
            self.after_call(g, effects, 0);
        }
        g.vm.as_mut()
            .ok_or_else(|| PluginError::Unavailable("no VM".into()))
    }

    /// Counts and logs a failed guest call, drops the VM and fails the requests it held.
    pub(crate) fn fail(&self, g: &mut SlotInner, err: &PluginError) {
        self.stats.record_failure(err);
        tracing::warn!(plugin = %self.compiled.info().name, kind = err.kind(), error = %err, "plugin call failed; the VM will be replaced");
        g.vm = None;
        g.timer = false;
        for (_, w) in g.waiters.drain() {
            let _ = w.send(Resume::Failed);
        }
    }

    /// Registers a paused context.
    pub(crate) fn wait(&self, g: &mut SlotInner, ctx: u32) -> oneshot::Receiver<Resume> {
        let (tx, rx) = oneshot::channel();
        g.waiters.insert(ctx, tx);
        rx
    }

    /// Forgets a paused context (it ended or gave up).
    pub(crate) fn unwait(&self, g: &mut SlotInner, ctx: u32) {
        g.waiters.remove(&ctx);
    }

    /// Whether anything could still resume a paused context: calls in flight or a timer.
    pub(crate) fn may_resume(&self, g: &SlotInner) -> bool {
        g.pending_calls > 0 || g.timer
    }

    /// Applies the effects of the guest call just made for context `own`, when it left any.
    /// Most calls leave none and ask for no timer: they cost two checks.
    pub(crate) fn settle(self: &Arc<Self>, g: &mut SlotInner, own: u32) -> Own {
        let Some(vm) = g.vm.as_mut() else {
            return Own::default();
        };
        if !vm.has_effects() && (g.timer || vm.tick_period().is_zero()) {
            return Own::default();
        }
        let effects = vm.take_effects();
        self.after_call(g, effects, own)
    }

    /// Applies effects after a guest call made for context `own` (0: the root context).
    pub(crate) fn after_call(
        self: &Arc<Self>,
        g: &mut SlotInner,
        effects: Effects,
        own: u32,
    ) -> Own {
        let mut out = Own::default();
        for action in effects.actions {
            let (ctx, resume) = match action {
                Effect::Continue(ctx, _) => (ctx, Resume::Continue),
                Effect::Close(ctx, _) => (ctx, Resume::Close),
                Effect::LocalResponse(ctx, r) => (ctx, Resume::Local(r)),
            };
            if ctx == own && own != 0 {
                // A local reply wins over a continue asked for in the same call.
                if !matches!(out.resume, Some(Resume::Local(_))) {
                    out.resume = Some(resume);
                }
            } else if let Some(w) = g.waiters.remove(&ctx) {
                let _ = w.send(resume);
            }
        }
        if !effects.calls.is_empty() {
            out.started_calls = true;
            for call in effects.calls {
                g.pending_calls += 1;
                // Performed by a task of its own, still within the caller's trace (the
                // request's `traceparent` goes on with the call: telemetry/trace).
                let run = run_call(Arc::downgrade(self), g.incarnation, call);
                spawn(crate::telemetry::trace::in_current(run));
            }
        }
        if !g.timer
            && let Some(period) = g.vm.as_ref().map(Vm::tick_period).filter(|p| !p.is_zero())
        {
            g.timer = true;
            spawn(run_timer(Arc::downgrade(self), g.incarnation, period));
        }
        out
    }
}

/// Spawns on the current runtime; outside one (`gateway validate` builds VMs to check plugins)
/// there is nothing to run timers or calls for.
fn spawn(fut: impl std::future::Future<Output = ()> + Send + 'static) {
    if let Ok(h) = tokio::runtime::Handle::try_current() {
        h.spawn(fut);
    }
}

/// Performs one `proxy_http_call` and delivers the response to the root context.
async fn run_call(slot: Weak<Slot>, incarnation: u64, call: wasm_host::HttpCallOut) {
    let Some(dispatch) = slot.upgrade().map(|s| s.dispatch.clone()) else {
        return;
    };
    let (response, status) = match tokio::time::timeout(call.timeout, dispatch.send(&call)).await {
        Ok(Ok(r)) => (r, (0, "")),
        Ok(Err(e)) => {
            tracing::debug!(upstream = %call.upstream, error = %e, "plugin HTTP call failed");
            (Default::default(), (14, "reset"))
        }
        Err(_) => (Default::default(), (14, "timeout")),
    };
    let Some(slot) = slot.upgrade() else { return };
    let mut g = slot.lock();
    g.pending_calls = g.pending_calls.saturating_sub(1);
    if g.incarnation != incarnation {
        return;
    }
    let Some(vm) = g.vm.as_mut().filter(|vm| vm.failed().is_none()) else {
        return;
    };
    match vm.on_http_call_response(call.token, response, status) {
        Ok(()) => {
            let effects = vm.take_effects();
            slot.after_call(&mut g, effects, 0);
        }
        Err(e) => slot.fail(&mut g, &e),
    }
}

/// Calls `proxy_on_tick` every period until the VM changes, the period becomes zero, or the
/// runtime is dropped (a hot reload or a new generation).
async fn run_timer(slot: Weak<Slot>, incarnation: u64, mut period: Duration) {
    loop {
        tokio::time::sleep(period).await;
        let Some(slot) = slot.upgrade() else { return };
        let mut g = slot.lock();
        if g.incarnation != incarnation {
            return;
        }
        let Some(vm) = g.vm.as_mut().filter(|vm| vm.failed().is_none()) else {
            return;
        };
        match vm.on_tick() {
            Ok(()) => {
                period = vm.tick_period();
                let effects = vm.take_effects();
                if period.is_zero() {
                    g.timer = false;
                    slot.after_call(&mut g, effects, 0);
                    return;
                }
                slot.after_call(&mut g, effects, 0);
            }
            Err(e) => {
                slot.fail(&mut g, &e);
                return;
            }
        }
    }
}

/// Tells the slot's VM about data on a queue it registered, from a task (the enqueuing guest
/// call may hold this very slot's lock).
fn queue_notify(slot: &Arc<Slot>) -> wasm_host::shared::QueueNotify {
    let weak = Arc::downgrade(slot);
    let handle = tokio::runtime::Handle::try_current().ok();
    Arc::new(move |queue| {
        let (Some(handle), weak) = (handle.clone(), weak.clone()) else {
            return;
        };
        handle.spawn(async move {
            let Some(slot) = weak.upgrade() else { return };
            let mut g = slot.lock();
            let Some(vm) = g.vm.as_mut().filter(|vm| vm.failed().is_none()) else {
                return;
            };
            match vm.on_queue_ready(queue) {
                Ok(()) => {
                    let effects = vm.take_effects();
                    slot.after_call(&mut g, effects, 0);
                }
                Err(e) => slot.fail(&mut g, &e),
            }
        });
    })
}
