//! One plugin VM: a store and an instance made from the plugin's `InstancePre`, its root
//! context, and the contexts of the requests and connections it serves. Every guest call runs
//! under the epoch deadline (`limits.time`) and the memory cap (`limits.memory`); a failed call
//! marks the VM failed for good and returns a [`PluginError`], and the embedder replaces it with
//! a fresh instance. Nothing here blocks or spawns: effects are returned for the embedder.

use std::sync::Arc;
use std::time::Duration;

use wasmtime::{Store, Trap};

use crate::error::PluginError;
use crate::exports::Exports;
use crate::metrics::Callback;
use crate::plugin::CompiledPlugin;
use crate::state::{
    Effects, HostState, HttpCallResponse, HttpStream, NetStream, Stream, StreamInfo,
};

/// The root context's id in every VM.
pub const ROOT_ID: u32 = 1;

/// What a header, body or data callback answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Go on.
    Continue,
    /// Stop until `proxy_continue_stream` (headers) or the next chunk (bodies).
    Pause,
}

impl Action {
    fn from_abi(v: u32) -> Self {
        if v == 1 { Self::Pause } else { Self::Continue }
    }
}

/// The side of a connection that closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// This gateway.
    Local = 1,
    /// The other end.
    Remote = 2,
}

/// A running plugin instance.
pub struct Vm {
    pub(crate) store: Store<HostState>,
    pub(crate) ex: Exports,
    pub(crate) plugin: Arc<CompiledPlugin>,
    pub(crate) next_ctx: u32,
    pub(crate) failed: Option<String>,
}

impl Vm {
    /// The plugin this VM runs.
    pub fn plugin(&self) -> &Arc<CompiledPlugin> {
        &self.plugin
    }

    /// Why the VM failed, if it did; a failed VM refuses every call.
    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// Runs one guest call of `callback` under the limits (counted when the guest implements
    /// it); on failure the VM is marked failed.
    fn call<R>(
        &mut self,
        ctx: u32,
        callback: Callback,
        f: impl FnOnce(&Exports, &mut Store<HostState>) -> wasmtime::Result<R>,
    ) -> Result<R, PluginError> {
        if let Some(why) = &self.failed {
            return Err(PluginError::Unavailable(why.clone()));
        }
        if self.ex.has(callback) {
            self.plugin.stats.record_call(callback);
        }
        let s = self.store.data_mut();
        s.fault = None;
        s.deadline_cpu = None;
        s.effective = ctx;
        self.plugin
            .ticker
            .arm(&mut self.store, self.plugin.call_ticks);
        match f(&self.ex, &mut self.store) {
            Ok(r) => Ok(r),
            Err(e) => {
                let err = self.describe(e);
                self.failed = Some(err.to_string());
                Err(err)
            }
        }
    }

    pub(crate) fn describe(&mut self, e: wasmtime::Error) -> PluginError {
        let limits = self.plugin.info.limits;
        let s = self.store.data_mut();
        if s.limiter.hit {
            return PluginError::MemoryLimit(limits.memory);
        }
        if let Some(f) = s.fault.take() {
            return f;
        }
        if e.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
            return PluginError::Timeout(limits.time);
        }
        tracing::debug!(plugin = %self.plugin.info.name, error = ?e, "guest trap");
        PluginError::Trap(e.root_cause().to_string())
    }

    fn new_id(&mut self) -> u32 {
        let id = self.next_ctx;
        self.next_ctx = self.next_ctx.checked_add(1).unwrap_or(ROOT_ID + 1);
        id
    }

    /// Creates an HTTP context (`proxy_on_context_create(id, root)`) holding `stream` (pass it
    /// boxed to spare a copy of its several hundred bytes).
    pub fn create_http(&mut self, stream: impl Into<Box<HttpStream>>) -> Result<u32, PluginError> {
        let id = self.new_id();
        self.store
            .data_mut()
            .streams
            .insert(id, Stream::Http(stream.into()));
        self.create(id)
    }

    /// Creates a TCP context for a connection.
    pub fn create_net(&mut self, info: Arc<StreamInfo>) -> Result<u32, PluginError> {
        let id = self.new_id();
        let stream = NetStream {
            downstream: Default::default(),
            upstream: Default::default(),
            info,
            properties: None,
        };
        self.store
            .data_mut()
            .streams
            .insert(id, Stream::Net(Box::new(stream)));
        self.create(id)
    }

    fn create(&mut self, id: u32) -> Result<u32, PluginError> {
        self.call(id, Callback::ContextCreate, |ex, s| {
            match &ex.context_create {
                Some(f) => f.call(s, (id, ROOT_ID)),
                None => Ok(()),
            }
        })?;
        Ok(id)
    }

    /// The HTTP data of context `id`.
    pub fn http(&mut self, id: u32) -> Option<&mut HttpStream> {
        match self.store.data_mut().streams.get_mut(&id)? {
            Stream::Http(h) => Some(h),
            Stream::Net(_) => None,
        }
    }

    /// The TCP data of context `id`.
    pub fn net(&mut self, id: u32) -> Option<&mut NetStream> {
        match self.store.data_mut().streams.get_mut(&id)? {
            Stream::Net(n) => Some(n),
            Stream::Http(_) => None,
        }
    }

    fn header_count(&mut self, id: u32, response: bool) -> u32 {
        self.http(id).map_or(0, |h| {
            if response {
                h.response.headers.len() as u32 + 1
            } else {
                h.request().headers.len() as u32 + 4
            }
        })
    }

    /// `proxy_on_request_headers`.
    pub fn on_request_headers(&mut self, id: u32, eos: bool) -> Result<Action, PluginError> {
        let n = self.header_count(id, false);
        self.call(id, Callback::RequestHeaders, |ex, s| {
            match &ex.request_headers {
                Some(f) => f.call(s, id, n, eos).map(Action::from_abi),
                None => Ok(Action::Continue),
            }
        })
    }

    /// `proxy_on_response_headers`.
    pub fn on_response_headers(&mut self, id: u32, eos: bool) -> Result<Action, PluginError> {
        let n = self.header_count(id, true);
        self.call(id, Callback::ResponseHeaders, |ex, s| {
            match &ex.response_headers {
                Some(f) => f.call(s, id, n, eos).map(Action::from_abi),
                None => Ok(Action::Continue),
            }
        })
    }

    /// `proxy_on_request_body` with the size buffered so far.
    pub fn on_request_body(&mut self, id: u32, eos: bool) -> Result<Action, PluginError> {
        let n = self.http(id).map_or(0, |h| h.request_body.len() as u32);
        self.call3(id, n, eos, Callback::RequestBody, |ex| {
            ex.request_body.as_ref()
        })
    }

    /// `proxy_on_response_body` with the size buffered so far.
    pub fn on_response_body(&mut self, id: u32, eos: bool) -> Result<Action, PluginError> {
        let n = self.http(id).map_or(0, |h| h.response_body.len() as u32);
        self.call3(id, n, eos, Callback::ResponseBody, |ex| {
            ex.response_body.as_ref()
        })
    }

    /// `proxy_on_request_trailers`.
    pub fn on_request_trailers(&mut self, id: u32) -> Result<Action, PluginError> {
        let n = self.http(id).map_or(0, |h| h.request_trailers.len() as u32);
        self.call(id, Callback::RequestTrailers, |ex, s| {
            match &ex.request_trailers {
                Some(f) => f.call(s, (id, n)).map(Action::from_abi),
                None => Ok(Action::Continue),
            }
        })
    }

    /// `proxy_on_response_trailers`.
    pub fn on_response_trailers(&mut self, id: u32) -> Result<Action, PluginError> {
        let n = self
            .http(id)
            .map_or(0, |h| h.response_trailers.len() as u32);
        self.call(id, Callback::ResponseTrailers, |ex, s| {
            match &ex.response_trailers {
                Some(f) => f.call(s, (id, n)).map(Action::from_abi),
                None => Ok(Action::Continue),
            }
        })
    }

    /// `proxy_on_new_connection`.
    pub fn on_new_connection(&mut self, id: u32) -> Result<Action, PluginError> {
        self.call(id, Callback::NewConnection, |ex, s| {
            match &ex.new_connection {
                Some(f) => f.call(s, id).map(Action::from_abi),
                None => Ok(Action::Continue),
            }
        })
    }

    /// `proxy_on_downstream_data` with the size buffered so far.
    pub fn on_downstream_data(&mut self, id: u32, eos: bool) -> Result<Action, PluginError> {
        let n = self.net(id).map_or(0, |d| d.downstream.len() as u32);
        self.call3(id, n, eos, Callback::DownstreamData, |ex| {
            ex.downstream_data.as_ref()
        })
    }

    /// `proxy_on_upstream_data` with the size buffered so far.
    pub fn on_upstream_data(&mut self, id: u32, eos: bool) -> Result<Action, PluginError> {
        let n = self.net(id).map_or(0, |d| d.upstream.len() as u32);
        self.call3(id, n, eos, Callback::UpstreamData, |ex| {
            ex.upstream_data.as_ref()
        })
    }

    /// `proxy_on_downstream_connection_close` / `proxy_on_upstream_connection_close`.
    pub fn on_connection_close(
        &mut self,
        id: u32,
        downstream: bool,
        peer: Peer,
    ) -> Result<(), PluginError> {
        let callback = if downstream {
            Callback::DownstreamClose
        } else {
            Callback::UpstreamClose
        };
        self.call(id, callback, |ex, s| {
            let f = if downstream {
                &ex.downstream_close
            } else {
                &ex.upstream_close
            };
            match f {
                Some(f) => f.call(s, (id, peer as u32)),
                None => Ok(()),
            }
        })
    }

    fn call3(
        &mut self,
        id: u32,
        n: u32,
        eos: bool,
        callback: Callback,
        pick: impl FnOnce(&Exports) -> Option<&wasmtime::TypedFunc<(u32, u32, u32), u32>>,
    ) -> Result<Action, PluginError> {
        self.call(id, callback, |ex, s| match pick(ex) {
            Some(f) => f.call(s, (id, n, u32::from(eos))).map(Action::from_abi),
            None => Ok(Action::Continue),
        })
    }

    /// Ends context `id`: `proxy_on_done`, `proxy_on_log`, `proxy_on_delete`, then drops its
    /// data. On a failed VM only the data is dropped.
    pub fn finish(&mut self, id: u32) -> Result<(), PluginError> {
        if !self.store.data().streams.contains_key(&id) {
            return Ok(());
        }
        let r = self.call(id, Callback::Log, |ex, s| {
            if let Some(f) = &ex.done {
                f.call(&mut *s, id)?;
            }
            if let Some(f) = &ex.log {
                f.call(&mut *s, id)?;
            }
            if let Some(f) = &ex.delete {
                f.call(&mut *s, id)?;
            }
            Ok(())
        });
        self.store.data_mut().streams.remove(&id);
        r
    }

    /// Drops a context's data without calling the guest (after a failure).
    pub fn forget(&mut self, id: u32) -> Option<Stream> {
        self.store.data_mut().streams.remove(&id)
    }

    /// `proxy_on_tick` on the root context.
    pub fn on_tick(&mut self) -> Result<(), PluginError> {
        self.call(ROOT_ID, Callback::Tick, |ex, s| match &ex.tick {
            Some(f) => f.call(s, ROOT_ID),
            None => Ok(()),
        })
    }

    /// `proxy_on_queue_ready` on the root context.
    pub fn on_queue_ready(&mut self, queue: u32) -> Result<(), PluginError> {
        self.call(ROOT_ID, Callback::QueueReady, |ex, s| {
            match &ex.queue_ready {
                Some(f) => f.call(s, (ROOT_ID, queue)),
                None => Ok(()),
            }
        })
    }

    /// Delivers a finished HTTP call to the root context; `status` is what `proxy_get_status`
    /// reports (code 0 on success; on failure the headers are empty).
    pub fn on_http_call_response(
        &mut self,
        token: u32,
        response: HttpCallResponse,
        status: (u32, &str),
    ) -> Result<(), PluginError> {
        let counts = (
            response.headers.len() as u32,
            response.body.len() as u32,
            response.trailers.len() as u32,
        );
        let s = self.store.data_mut();
        s.call_response = Some(response);
        s.status = (status.0, bytes::Bytes::copy_from_slice(status.1.as_bytes()));
        let r = self.call(ROOT_ID, Callback::HttpCallResponse, |ex, s| {
            match &ex.http_call_response {
                Some(f) => f.call(s, (ROOT_ID, token, counts.0, counts.1, counts.2)),
                None => Ok(()),
            }
        });
        self.store.data_mut().call_response = None;
        r
    }

    /// Takes the effects recorded by the calls so far.
    pub fn take_effects(&mut self) -> Effects {
        std::mem::take(&mut self.store.data_mut().effects)
    }

    /// Whether effects are waiting (cheap check before [`Vm::take_effects`]).
    pub fn has_effects(&self) -> bool {
        !self.store.data().effects.is_empty()
    }

    /// The tick period the root context asked for (zero: no timer).
    pub fn tick_period(&self) -> Duration {
        self.store.data().tick_period
    }

    /// Ids of the live contexts (requests and connections).
    pub fn contexts(&self) -> Vec<u32> {
        self.store.data().streams.keys().copied().collect()
    }
}
