//! proxy-wasm network (L4) filters as `stream_proxy::StreamFilter`s: `proxy_on_new_connection`,
//! `proxy_on_downstream_data` / `proxy_on_upstream_data` (bytes buffered while the guest
//! pauses; `DOWNSTREAM_DATA` / `UPSTREAM_DATA` buffers), and the close callbacks. A failed
//! guest call closes only that connection and replaces the VM; `proxy_close_stream` closes it.

use std::sync::Arc;

use bytes::BytesMut;
use stream_proxy::filter::{
    CloseSummary, ConnectionInfo, Decision, StreamFilter, StreamFilterFactory,
};
use wasm_host::{Action, Peer, PluginError, StreamInfo, Vm};

use super::plugin::{PluginHandle, PluginRuntime};
use super::pool::{Resume, Slot, pick};

/// Builds a [`WasmStreamFilter`] per connection.
pub struct WasmStreamFilterFactory {
    handle: Arc<PluginHandle>,
}

impl WasmStreamFilterFactory {
    /// A factory for `handle`.
    pub fn new(handle: Arc<PluginHandle>) -> Self {
        Self { handle }
    }
}

impl StreamFilterFactory for WasmStreamFilterFactory {
    fn name(&self) -> &str {
        &self.handle.name
    }

    fn create(&self) -> Box<dyn StreamFilter> {
        Box::new(WasmStreamFilter {
            handle: self.handle.clone(),
            runtime: None,
            slot: None,
            ctx: 0,
            incarnation: 0,
        })
    }

    fn inspects_data(&self) -> bool {
        true
    }
}

/// One connection's context in a plugin VM.
struct WasmStreamFilter {
    handle: Arc<PluginHandle>,
    runtime: Option<Arc<PluginRuntime>>,
    slot: Option<Arc<Slot>>,
    ctx: u32,
    incarnation: u64,
}

impl WasmStreamFilter {
    /// Runs `f` on the connection's VM; `None` when the VM is gone (the plugin is skipped),
    /// `Some(Err)` when the call failed or the guest asked to close.
    fn call<R>(
        &self,
        f: impl FnOnce(&mut Vm, u32) -> Result<R, PluginError>,
    ) -> Option<Result<R, ()>> {
        let slot = self.slot.as_ref()?;
        let mut g = slot.lock();
        if g.incarnation != self.incarnation {
            return None;
        }
        let vm = g.vm_mut().filter(|vm| vm.failed().is_none())?;
        match f(vm, self.ctx) {
            Ok(r) => {
                let effects = g.vm_mut().map(Vm::take_effects).unwrap_or_default();
                let own = slot.after_call(&mut g, effects, self.ctx);
                match own.resume {
                    Some(Resume::Close | Resume::Failed | Resume::Local(_)) => Some(Err(())),
                    _ => Some(Ok(r)),
                }
            }
            Err(e) => {
                tracing::warn!(plugin = %self.handle.name, "closing the connection after a plugin failure");
                slot.fail(&mut g, &e);
                Some(Err(()))
            }
        }
    }

    fn data(&self, data: &mut BytesMut, eos: bool, downstream: bool) -> Decision {
        let mut incoming = Some(std::mem::take(data));
        let r = self.call(|vm, id| {
            let Some(n) = vm.net(id) else {
                return Ok(None);
            };
            let buf = if downstream {
                &mut n.downstream
            } else {
                &mut n.upstream
            };
            if let Some(d) = incoming.take() {
                buf.push(d.freeze());
            }
            let action = if downstream {
                vm.on_downstream_data(id, eos)?
            } else {
                vm.on_upstream_data(id, eos)?
            };
            let Some(n) = vm.net(id) else {
                return Ok(None);
            };
            let buf = if downstream {
                &mut n.downstream
            } else {
                &mut n.upstream
            };
            // `BytesMut::from` takes a chunk that nothing else shares back without a copy.
            Ok(Some(if action == Action::Continue || eos {
                buf.take().map(BytesMut::from).unwrap_or_default()
            } else {
                BytesMut::new()
            }))
        });
        match r {
            Some(Ok(Some(out))) => {
                *data = out;
                Decision::Continue
            }
            Some(Err(())) => Decision::Close,
            Some(Ok(None)) | None => {
                if let Some(d) = incoming {
                    *data = d;
                }
                Decision::Continue
            }
        }
    }
}

#[async_trait::async_trait]
impl StreamFilter for WasmStreamFilter {
    async fn on_connect(&mut self, info: &ConnectionInfo) -> Decision {
        let runtime = self.handle.runtime();
        let slot = pick(&runtime.slots).clone();
        let info = Arc::new(StreamInfo {
            source: Some(info.client),
            destination: Some(info.local),
            route_name: info.stream.clone(),
            listener: info.stream.clone(),
            ..Default::default()
        });
        {
            let mut g = slot.lock();
            let created = slot.vm(&mut g).and_then(|vm| vm.create_net(info));
            match created {
                Ok(id) => self.ctx = id,
                Err(e) => {
                    slot.fail(&mut g, &e);
                    return Decision::Close;
                }
            }
            self.incarnation = g.incarnation;
        }
        self.slot = Some(slot);
        self.runtime = Some(runtime);
        match self.call(|vm, id| vm.on_new_connection(id)) {
            Some(Err(())) => Decision::Close,
            _ => Decision::Continue,
        }
    }

    async fn on_downstream_data(&mut self, data: &mut BytesMut, end_of_stream: bool) -> Decision {
        self.data(data, end_of_stream, true)
    }

    async fn on_upstream_data(&mut self, data: &mut BytesMut, end_of_stream: bool) -> Decision {
        self.data(data, end_of_stream, false)
    }

    async fn on_close(&mut self, _info: &ConnectionInfo, summary: &CloseSummary) {
        let peer = if summary.error.is_some() {
            Peer::Local
        } else {
            Peer::Remote
        };
        let _ = self.call(|vm, id| {
            vm.on_connection_close(id, true, peer)?;
            vm.on_connection_close(id, false, peer)?;
            vm.finish(id)
        });
        self.forget();
    }
}

impl WasmStreamFilter {
    fn forget(&mut self) {
        let Some(slot) = self.slot.take() else { return };
        let mut g = slot.lock();
        if g.incarnation == self.incarnation
            && let Some(vm) = g.vm_mut()
        {
            vm.forget(self.ctx);
        }
    }
}

impl Drop for WasmStreamFilter {
    fn drop(&mut self) {
        self.forget();
    }
}
