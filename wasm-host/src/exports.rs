//! The guest's `proxy_on_*` callbacks, looked up once per instance with their types checked.
//! Every callback is optional; a missing one is skipped (header callbacks answer Continue).

use wasmtime::{Instance, Store, TypedFunc};

use crate::metrics::Callback;
use crate::state::HostState;

type F1 = TypedFunc<u32, ()>;
type F2 = TypedFunc<(u32, u32), ()>;
type F1R = TypedFunc<u32, u32>;
type F2R = TypedFunc<(u32, u32), u32>;
type F3R = TypedFunc<(u32, u32, u32), u32>;
type F5 = TypedFunc<(u32, u32, u32, u32, u32), ()>;

/// Header callbacks: three arguments since ABI 0.2.0, two before.
pub(crate) enum HeadersFn {
    V2(F3R),
    V1(F2R),
}

impl HeadersFn {
    fn get(i: &Instance, s: &mut Store<HostState>, name: &str) -> Option<Self> {
        i.get_typed_func(&mut *s, name)
            .ok()
            .map(Self::V2)
            .or_else(|| i.get_typed_func(&mut *s, name).ok().map(Self::V1))
    }

    pub(crate) fn call(
        &self,
        s: &mut Store<HostState>,
        ctx: u32,
        n: u32,
        eos: bool,
    ) -> wasmtime::Result<u32> {
        match self {
            Self::V2(f) => f.call(s, (ctx, n, u32::from(eos))),
            Self::V1(f) => f.call(s, (ctx, n)),
        }
    }
}

pub(crate) struct Exports {
    pub(crate) context_create: Option<F2>,
    pub(crate) vm_start: Option<F2R>,
    pub(crate) configure: Option<F2R>,
    pub(crate) done: Option<F1R>,
    pub(crate) log: Option<F1>,
    pub(crate) delete: Option<F1>,
    pub(crate) tick: Option<F1>,
    pub(crate) queue_ready: Option<F2>,
    pub(crate) request_headers: Option<HeadersFn>,
    pub(crate) request_body: Option<F3R>,
    pub(crate) request_trailers: Option<F2R>,
    pub(crate) response_headers: Option<HeadersFn>,
    pub(crate) response_body: Option<F3R>,
    pub(crate) response_trailers: Option<F2R>,
    pub(crate) http_call_response: Option<F5>,
    pub(crate) new_connection: Option<F1R>,
    pub(crate) downstream_data: Option<F3R>,
    pub(crate) upstream_data: Option<F3R>,
    pub(crate) downstream_close: Option<F2>,
    pub(crate) upstream_close: Option<F2>,
}

impl Exports {
    /// Whether the guest implements `callback` (a call to a missing one is not counted).
    pub(crate) fn has(&self, callback: Callback) -> bool {
        use Callback as C;
        match callback {
            C::ContextCreate => self.context_create.is_some(),
            C::RequestHeaders => self.request_headers.is_some(),
            C::RequestBody => self.request_body.is_some(),
            C::RequestTrailers => self.request_trailers.is_some(),
            C::ResponseHeaders => self.response_headers.is_some(),
            C::ResponseBody => self.response_body.is_some(),
            C::ResponseTrailers => self.response_trailers.is_some(),
            C::Log => self.done.is_some() || self.log.is_some() || self.delete.is_some(),
            C::NewConnection => self.new_connection.is_some(),
            C::DownstreamData => self.downstream_data.is_some(),
            C::UpstreamData => self.upstream_data.is_some(),
            C::DownstreamClose => self.downstream_close.is_some(),
            C::UpstreamClose => self.upstream_close.is_some(),
            C::Tick => self.tick.is_some(),
            C::QueueReady => self.queue_ready.is_some(),
            C::HttpCallResponse => self.http_call_response.is_some(),
        }
    }

    pub(crate) fn new(i: &Instance, s: &mut Store<HostState>) -> Self {
        macro_rules! f {
            ($name:literal) => {
                i.get_typed_func(&mut *s, $name).ok()
            };
        }
        Self {
            context_create: f!("proxy_on_context_create"),
            vm_start: f!("proxy_on_vm_start"),
            configure: f!("proxy_on_configure"),
            done: f!("proxy_on_done"),
            log: f!("proxy_on_log"),
            delete: f!("proxy_on_delete"),
            tick: f!("proxy_on_tick"),
            queue_ready: f!("proxy_on_queue_ready"),
            request_headers: HeadersFn::get(i, s, "proxy_on_request_headers"),
            request_body: f!("proxy_on_request_body"),
            request_trailers: f!("proxy_on_request_trailers"),
            response_headers: HeadersFn::get(i, s, "proxy_on_response_headers"),
            response_body: f!("proxy_on_response_body"),
            response_trailers: f!("proxy_on_response_trailers"),
            http_call_response: f!("proxy_on_http_call_response"),
            new_connection: f!("proxy_on_new_connection"),
            downstream_data: f!("proxy_on_downstream_data"),
            upstream_data: f!("proxy_on_upstream_data"),
            downstream_close: f!("proxy_on_downstream_connection_close"),
            upstream_close: f!("proxy_on_upstream_connection_close"),
        }
    }
}
