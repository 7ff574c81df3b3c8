//! proxy-wasm HTTP filters as [`HttpFilter`]s. Each request gets a context in the VM of the
//! worker thread it started on. The request or response head moves into the VM for the length
//! of a callback (no copy; pseudo-headers map onto its fields) and moves back after it, or stays
//! there while the request is paused. A pause is an await: the hook waits until the guest calls
//! `proxy_continue_stream` or `proxy_send_local_response` for the context (typically from
//! `proxy_on_http_call_response`), the VM fails, or [`PAUSE_LIMIT`] passes.
//!
//! A failed guest call fails only this request (500, via the chain) and replaces the VM; other
//! requests whose context was in the replaced VM skip the plugin for their remaining phases,
//! except those paused in it, which fail.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode, request, response};
use wasm_host::state::{empty_request, empty_response};
use wasm_host::{Action, HttpStream, PluginError, StreamInfo, Vm};

use super::plugin::{PluginHandle, PluginRuntime};
use super::pool::{Own, Resume, Slot, pick};
use super::reply::{fail, headers_only, outcome, take_body};
use crate::body::BoxError;
use crate::context::RequestCx;
use crate::error::error_response;
use crate::filter::{BodyAccess, FilterFactory, Flow, HttpFilter};

/// Longest a request stays paused by a plugin.
pub(crate) const PAUSE_LIMIT: Duration = Duration::from_secs(30);

/// Largest body a plugin may hold back (by pausing body callbacks).
const MAX_BUFFER: usize = 16 << 20;

/// Builds a [`WasmFilter`] per request.
pub struct WasmFilterFactory {
    handle: Arc<PluginHandle>,
    name: &'static str,
}

impl WasmFilterFactory {
    /// A factory for `handle`.
    pub fn new(handle: Arc<PluginHandle>) -> Self {
        let name = super::intern(&handle.name);
        Self { handle, name }
    }
}

impl FilterFactory for WasmFilterFactory {
    fn name(&self) -> &'static str {
        self.name
    }

    fn create(&self) -> Box<dyn HttpFilter> {
        Box::new(WasmFilter {
            handle: self.handle.clone(),
            runtime: None,
            slot: None,
            ctx: 0,
            incarnation: 0,
        })
    }

    fn request_body(&self) -> BodyAccess {
        BodyAccess::Stream
    }

    fn response_body(&self) -> bool {
        true
    }
}

/// One request's context in a plugin VM.
struct WasmFilter {
    handle: Arc<PluginHandle>,
    /// Held so a hot reload mid-request leaves this request on the VM it started on.
    runtime: Option<Arc<PluginRuntime>>,
    slot: Option<Arc<Slot>>,
    ctx: u32,
    incarnation: u64,
}

/// Why a hook could not run the guest.
enum Skip {
    /// The context's VM was replaced (or never created): the plugin is skipped.
    Gone,
    /// The guest call failed: the request fails.
    Failed(PluginError),
}

impl WasmFilter {
    /// Runs `f` on this request's VM and applies the call's effects.
    fn call<R>(
        &self,
        f: impl FnOnce(&mut Vm, u32) -> Result<R, PluginError>,
    ) -> Result<(R, Own), Skip> {
        let slot = self.slot.as_ref().ok_or(Skip::Gone)?;
        let mut g = slot.lock();
        if g.incarnation != self.incarnation {
            return Err(Skip::Gone);
        }
        let r = {
            let Some(vm) = slot_vm(&mut g) else {
                return Err(Skip::Gone);
            };
            f(vm, self.ctx)
        };
        match r {
            Ok(r) => {
                let effects = slot_vm(&mut g).map(Vm::take_effects).unwrap_or_default();
                let own = slot.after_call(&mut g, effects, self.ctx);
                Ok((r, own))
            }
            Err(e) => {
                slot.fail(&mut g, &e);
                Err(Skip::Failed(e))
            }
        }
    }

    /// Waits for the guest to resume a paused context.
    async fn pause(&self, action: Action, own: &mut Own) -> Resume {
        if let Some(r) = own.resume.take() {
            return r;
        }
        if action == Action::Continue {
            return Resume::Continue;
        }
        let Some(slot) = &self.slot else {
            return Resume::Continue;
        };
        let rx = {
            let mut g = slot.lock();
            if g.incarnation != self.incarnation {
                return Resume::Failed;
            }
            if !own.started_calls && !slot.may_resume(&g) {
                // Nothing in flight could ever resume it (no call, no timer): go on, as
                // Envoy's StopIteration would once the body arrives.
                return Resume::Continue;
            }
            slot.wait(&mut g, self.ctx)
        };
        match tokio::time::timeout(PAUSE_LIMIT, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Resume::Failed,
            Err(_) => {
                slot.unwait(&mut slot.lock(), self.ctx);
                tracing::warn!(plugin = %self.handle.name, "request paused by a plugin for too long");
                Resume::Failed
            }
        }
    }

    /// `proxy_on_request_trailers` / `proxy_on_response_trailers`: the trailers move into the
    /// VM for the callback and back after it (changed or not).
    fn trailers(&self, trailers: &mut HeaderMap, response: bool) -> Result<(), BoxError> {
        let mut incoming = Some(std::mem::take(trailers));
        let r = self.call(|vm, id| {
            let Some(h) = vm.http(id) else {
                return Ok(None);
            };
            let slot = if response {
                &mut h.response_trailers
            } else {
                &mut h.request_trailers
            };
            *slot = incoming.take().unwrap_or_default();
            if response {
                vm.on_response_trailers(id)?;
            } else {
                vm.on_request_trailers(id)?;
            }
            Ok(vm.http(id).map(|h| {
                std::mem::take(if response {
                    &mut h.response_trailers
                } else {
                    &mut h.request_trailers
                })
            }))
        });
        match r {
            Ok((Some(out), _)) => *trailers = out,
            Ok((None, _)) | Err(Skip::Gone) => *trailers = incoming.unwrap_or_default(),
            Err(Skip::Failed(e)) => return Err(fail(e)),
        }
        Ok(())
    }

    fn finish(&mut self) {
        let Some(slot) = self.slot.take() else { return };
        let mut g = slot.lock();
        slot.unwait(&mut g, self.ctx);
        if g.incarnation != self.incarnation {
            return;
        }
        let Some(vm) = slot_vm(&mut g) else { return };
        match vm.finish(self.ctx) {
            Ok(()) => {
                if vm.has_effects() {
                    let effects = vm.take_effects();
                    slot.after_call(&mut g, effects, 0);
                }
            }
            Err(e) => slot.fail(&mut g, &e),
        }
    }
}

fn slot_vm(g: &mut super::pool::SlotInner) -> Option<&mut Vm> {
    g.vm_mut().filter(|vm| vm.failed().is_none())
}

#[async_trait::async_trait]
impl HttpFilter for WasmFilter {
    async fn on_request_headers(
        &mut self,
        req: &mut request::Parts,
        cx: &mut RequestCx,
    ) -> Result<Flow, BoxError> {
        let runtime = self.handle.runtime();
        let slot = pick(&runtime.slots).clone();
        let eos = headers_only(req);
        let info = Arc::new(StreamInfo {
            source: Some(cx.conn.client),
            destination: Some(cx.conn.local),
            route_name: cx.route.clone(),
            listener: cx.conn.listener.clone(),
            tls: cx.conn.tls,
            sni: cx.conn.sni.clone(),
            connection_id: 0,
        });
        let mut stream = HttpStream::new(info);
        stream.request = std::mem::replace(req, empty_request());
        {
            let mut g = slot.lock();
            let vm = match slot.vm(&mut g) {
                Ok(vm) => vm,
                Err(e) => {
                    *req = stream.request;
                    slot.fail(&mut g, &e);
                    return Err(fail(e));
                }
            };
            match vm.create_http(stream) {
                Ok(id) => self.ctx = id,
                Err(e) => {
                    slot.fail(&mut g, &e);
                    return Err(fail(e));
                }
            }
            self.incarnation = g.incarnation;
        }
        self.slot = Some(slot);
        self.runtime = Some(runtime);
        let (action, mut own) = match self.call(|vm, id| vm.on_request_headers(id, eos)) {
            Ok(r) => r,
            Err(Skip::Failed(e)) => return Err(fail(e)),
            Err(Skip::Gone) => return Err(fail(PluginError::Unavailable("VM replaced".into()))),
        };
        let resume = self.pause(action, &mut own).await;
        // Take the head back. A copy stays behind: plugins read request headers and
        // properties in later phases (writes there change nothing, as in Envoy).
        let back = self.call(|vm, id| {
            Ok(vm.http(id).map(|h| {
                let parts = std::mem::replace(&mut h.request, empty_request());
                h.request.method = parts.method.clone();
                h.request.uri = parts.uri.clone();
                h.request.version = parts.version;
                h.request.headers = parts.headers.clone();
                parts
            }))
        });
        match back {
            Ok((Some(parts), _)) => *req = parts,
            Ok((None, _)) | Err(Skip::Gone) => {
                return Err(fail(PluginError::Unavailable("VM replaced".into())));
            }
            Err(Skip::Failed(e)) => return Err(fail(e)),
        }
        Ok(match outcome(resume)? {
            Some(r) => Flow::Respond(r),
            None => Flow::Continue,
        })
    }

    async fn on_request_body(
        &mut self,
        chunk: &mut Option<Bytes>,
        eos: bool,
        _cx: &mut RequestCx,
    ) -> Result<Flow, BoxError> {
        let mut data = chunk.take();
        let r = self.call(|vm, id| {
            let Some(h) = vm.http(id) else {
                return Ok(None);
            };
            if let Some(d) = data.take() {
                h.request_body.extend_from_slice(&d);
            }
            if h.request_body.len() > MAX_BUFFER {
                return Ok(Some(None));
            }
            Ok(Some(Some(vm.on_request_body(id, eos)?)))
        });
        let (action, mut own) = match r {
            Ok((Some(Some(action)), own)) => (action, own),
            Ok((Some(None), _)) => {
                return Ok(Flow::Respond(error_response(StatusCode::PAYLOAD_TOO_LARGE)));
            }
            Ok((None, _)) | Err(Skip::Gone) => {
                // No context (the VM was replaced): the plugin is skipped for this request.
                *chunk = data;
                return Ok(Flow::Continue);
            }
            Err(Skip::Failed(e)) => return Err(fail(e)),
        };
        let resume = if eos {
            self.pause(action, &mut own).await
        } else if action == Action::Pause {
            // Buffer: the bytes stay in the VM until a later callback continues.
            match own.resume.take() {
                Some(r) => r,
                None => return Ok(Flow::Continue),
            }
        } else {
            own.resume.take().unwrap_or(Resume::Continue)
        };
        if let Some(r) = outcome(resume)? {
            return Ok(Flow::Respond(r));
        }
        if let Ok((out, _)) =
            self.call(|vm, id| Ok(vm.http(id).and_then(|h| take_body(&mut h.request_body))))
        {
            *chunk = out;
        }
        Ok(Flow::Continue)
    }

    async fn on_response_headers(
        &mut self,
        res: &mut response::Parts,
        _cx: &mut RequestCx,
    ) -> Result<Flow, BoxError> {
        let head = std::mem::replace(res, empty_response());
        let status = head.status;
        let mut head = Some(head);
        let r = self.call(|vm, id| {
            let Some(h) = vm.http(id) else {
                return Ok(Action::Continue);
            };
            if let Some(head) = head.take() {
                h.response = head;
            }
            vm.on_response_headers(id, false)
        });
        let (action, mut own) = match r {
            Ok(r) => r,
            Err(skip) => {
                if let Some(head) = head.take() {
                    *res = head;
                } else {
                    // The head died with the VM; the plugin is gone but the response is not.
                    *res = empty_response();
                    res.status = status;
                }
                return match skip {
                    Skip::Gone => Ok(Flow::Continue),
                    Skip::Failed(e) => Err(fail(e)),
                };
            }
        };
        let resume = self.pause(action, &mut own).await;
        let back = self.call(|vm, id| {
            Ok(vm.http(id).map(|h| {
                let parts = std::mem::replace(&mut h.response, empty_response());
                h.response.status = parts.status;
                parts
            }))
        });
        match back {
            Ok((Some(parts), _)) => *res = parts,
            _ => {
                *res = empty_response();
                res.status = status;
                if head.is_none() {
                    return Err(fail(PluginError::Unavailable("VM replaced".into())));
                }
            }
        }
        Ok(match outcome(resume)? {
            Some(r) => Flow::Respond(r),
            None => Flow::Continue,
        })
    }

    async fn on_response_body(
        &mut self,
        chunk: &mut Option<Bytes>,
        eos: bool,
        _cx: &mut RequestCx,
    ) -> Result<(), BoxError> {
        let mut data = chunk.take();
        let r = self.call(|vm, id| {
            let Some(h) = vm.http(id) else {
                return Ok(None);
            };
            if let Some(d) = data.take() {
                h.response_body.extend_from_slice(&d);
            }
            let held = h.response_body.len();
            let action = vm.on_response_body(id, eos)?;
            let Some(h) = vm.http(id) else {
                return Ok(None);
            };
            // Paused chunks stay buffered until the guest continues or the body ends.
            Ok(Some(
                if action == Action::Continue || eos || held > MAX_BUFFER {
                    take_body(&mut h.response_body)
                } else {
                    None
                },
            ))
        });
        match r {
            Ok((Some(out), _)) => *chunk = out,
            Ok((None, _)) | Err(Skip::Gone) => *chunk = data,
            Err(Skip::Failed(e)) => return Err(fail(e)),
        }
        Ok(())
    }

    async fn on_request_trailers(
        &mut self,
        trailers: &mut HeaderMap,
        _cx: &mut RequestCx,
    ) -> Result<(), BoxError> {
        self.trailers(trailers, false)
    }

    async fn on_response_trailers(
        &mut self,
        trailers: &mut HeaderMap,
        _cx: &mut RequestCx,
    ) -> Result<(), BoxError> {
        self.trailers(trailers, true)
    }

    async fn on_log(&mut self, _cx: &RequestCx, status: StatusCode) {
        let _ = self.call(|vm, id| {
            if let Some(h) = vm.http(id) {
                h.response.status = status;
            }
            Ok(())
        });
        self.finish();
    }
}

impl Drop for WasmFilter {
    fn drop(&mut self) {
        // The log phase normally ends the context; this covers an abandoned request.
        let Some(slot) = self.slot.take() else { return };
        let mut g = slot.lock();
        slot.unwait(&mut g, self.ctx);
        if g.incarnation == self.incarnation
            && let Some(vm) = g.vm_mut()
        {
            vm.forget(self.ctx);
        }
    }
}
