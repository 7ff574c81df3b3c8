//! proxy-wasm HTTP filters as [`HttpFilter`]s. Each request gets a context in the VM of the
//! worker thread it started on. The request or response head moves into the VM for the length
//! of a callback (no copy; pseudo-headers map onto its fields) and moves back after it, or stays
//! there while the request is paused. The callbacks after the request's read the request head
//! the chain keeps for them ([`RequestCx::request_head`]), lent to the VM, not copied into it.
//! A pause is an await: the hook waits until the guest calls `proxy_continue_stream` or
//! `proxy_send_local_response` for the context (typically from `proxy_on_http_call_response`),
//! the VM fails, or [`PAUSE_LIMIT`] passes.
//!
//! Every callback runs in the chain's synchronous hooks: a request the guest does not pause
//! makes no future of its own. Only a pause sends the chain on to the async hook, which waits
//! for the resume the synchronous hook registered.
//!
//! A failed guest call fails only this request (500, via the chain) and replaces the VM; other
//! requests whose context was in the replaced VM skip the plugin for their remaining phases,
//! except those paused in it, which fail.

use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode, request, response};
use tokio::sync::oneshot;
use wasm_host::state::{empty_request, empty_response};
use wasm_host::{Action, HttpStream, PluginError, StreamInfo, Vm};

use super::plugin::{PluginHandle, PluginRuntime};
use super::pool::{Own, Resume, Slot, SlotInner, pick};
use super::reply::{fail, headers_only, outcome};
use crate::body::BoxError;
use crate::context::RequestCx;
use crate::error::error_response;
use crate::filter::{BodyAccess, FilterFactory, Flow, HttpFilter};

/// The facts a plugin reads about a request's connection and route: the connection's
/// [`ConnInfo::plugin_facts`](crate::connection::ConnInfo::plugin_facts) when the request is on
/// the route they were made for (a keep-alive connection's requests mostly are), else made anew.
fn stream_info(cx: &RequestCx) -> Arc<StreamInfo> {
    if let Some(info) = cx.conn.plugin_facts.get()
        && Arc::ptr_eq(&info.route_name, &cx.route)
    {
        return info.clone();
    }
    let info = Arc::new(StreamInfo {
        source: Some(cx.conn.client),
        destination: Some(cx.conn.local),
        route_name: cx.route.clone(),
        listener: cx.conn.listener.clone(),
        tls: cx.conn.tls,
        sni: cx.conn.sni.clone(),
        connection_id: 0,
    });
    // Only the first route's facts are kept: a connection rarely moves between routes.
    let _ = cx.conn.plugin_facts.set(info.clone());
    info
}

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
            waiting: None,
            held_status: StatusCode::OK,
        })
    }

    fn request_body(&self) -> BodyAccess {
        BodyAccess::Stream
    }

    fn response_body(&self) -> bool {
        true
    }

    /// Plugins read request headers and properties in every later callback.
    fn reads_request_later(&self) -> bool {
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
    /// A head callback paused the context: the async hook waits on this for the guest to
    /// resume it (set by a `_sync` hook that answered `None`).
    waiting: Option<oneshot::Receiver<Resume>>,
    /// The status of a response head paused in the VM, should the VM die with it.
    held_status: StatusCode,
}

/// Why a hook could not run the guest.
enum Skip {
    /// The context's VM was replaced (or never created): the plugin is skipped.
    Gone,
    /// The guest call failed: the request fails.
    Failed(PluginError),
}

/// How a header callback left the context.
enum Step {
    /// Go on at once, with this outcome.
    Now(Resume),
    /// Paused: the guest resumes it through this.
    Later(oneshot::Receiver<Resume>),
}

/// What a header callback's answer means, decided under the slot's lock (so nothing resumes
/// the context before its waiter is registered).
fn step(slot: &Slot, g: &mut SlotInner, ctx: u32, action: Action, own: &mut Own) -> Step {
    if let Some(r) = own.resume.take() {
        return Step::Now(r);
    }
    if action == Action::Continue {
        return Step::Now(Resume::Continue);
    }
    if !own.started_calls && !slot.may_resume(g) {
        // Nothing in flight could ever resume it (no call, no timer): go on, as Envoy's
        // StopIteration would once the body arrives.
        return Step::Now(Resume::Continue);
    }
    Step::Later(slot.wait(g, ctx))
}

/// What a head callback run now gives: the hook's answer, or what to wait on (the guest paused).
type HeadNow = Result<Result<Flow, BoxError>, oneshot::Receiver<Resume>>;

fn flow(resume: Resume) -> Result<Flow, BoxError> {
    Ok(match outcome(resume)? {
        Some(r) => Flow::Respond(r),
        None => Flow::Continue,
    })
}

fn vm_replaced() -> BoxError {
    fail(PluginError::Unavailable("VM replaced".into()))
}

impl WasmFilter {
    /// This request's slot, locked; `Gone` when the context's VM was replaced.
    fn lock(&self) -> Result<(&Arc<Slot>, MutexGuard<'_, SlotInner>), Skip> {
        let slot = self.slot.as_ref().ok_or(Skip::Gone)?;
        let g = slot.lock();
        if g.incarnation != self.incarnation {
            return Err(Skip::Gone);
        }
        Ok((slot, g))
    }

    /// Runs `f` on this request's VM and applies the call's effects.
    fn call<R>(
        &self,
        f: impl FnOnce(&mut Vm, u32) -> Result<R, PluginError>,
    ) -> Result<(R, Own), Skip> {
        let (slot, mut g) = self.lock()?;
        let r = {
            let Some(vm) = slot_vm(&mut g) else {
                return Err(Skip::Gone);
            };
            f(vm, self.ctx)
        };
        match r {
            Ok(r) => Ok((r, slot.settle(&mut g, self.ctx))),
            Err(e) => {
                slot.fail(&mut g, &e);
                Err(Skip::Failed(e))
            }
        }
    }

    /// Reads or changes the context's data without a guest call (so with no effects).
    fn with_stream<R>(&self, f: impl FnOnce(&mut HttpStream) -> R) -> Option<R> {
        let (_, mut g) = self.lock().ok()?;
        slot_vm(&mut g)?.http(self.ctx).map(f)
    }

    /// Waits for the guest to resume a paused context.
    async fn pause(&self, action: Action, own: &mut Own) -> Resume {
        if let Some(r) = own.resume.take() {
            return r;
        }
        if action == Action::Continue {
            return Resume::Continue;
        }
        let step = match self.lock() {
            Ok((slot, mut g)) => step(slot, &mut g, self.ctx, action, own),
            Err(_) if self.slot.is_none() => return Resume::Continue,
            Err(_) => return Resume::Failed,
        };
        match step {
            Step::Now(r) => r,
            Step::Later(rx) => self.wait(rx).await,
        }
    }

    /// A head callback's answer for a `_sync` hook: the answer, or `None` with the wait kept
    /// for the async hook. Asked again while a wait is kept, it answers `None` and runs nothing.
    fn answer_now(
        &mut self,
        run: impl FnOnce(&mut Self) -> HeadNow,
    ) -> Option<Result<Flow, BoxError>> {
        if self.waiting.is_some() {
            return None;
        }
        match run(self) {
            Ok(answer) => Some(answer),
            Err(rx) => {
                self.waiting = Some(rx);
                None
            }
        }
    }

    /// For an async head hook: the wait its `_sync` hook kept, or else the callback run here.
    fn kept_wait_or(&mut self, run: impl FnOnce(&mut Self) -> HeadNow) -> HeadNow {
        match self.waiting.take() {
            Some(rx) => Err(rx),
            None => run(self),
        }
    }

    /// Waits, at most [`PAUSE_LIMIT`], for the guest to resume the context.
    async fn wait(&self, rx: oneshot::Receiver<Resume>) -> Resume {
        match tokio::time::timeout(PAUSE_LIMIT, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Resume::Failed,
            Err(_) => {
                if let Some(slot) = &self.slot {
                    slot.unwait(&mut slot.lock(), self.ctx);
                }
                tracing::warn!(plugin = %self.handle.name, "request paused by a plugin for too long");
                Resume::Failed
            }
        }
    }

    /// Creates the request's context and runs `proxy_on_request_headers` with the head moved
    /// into the VM: the hook's answer, or what to wait on when the guest paused.
    fn request_headers_now(&mut self, req: &mut request::Parts, cx: &RequestCx) -> HeadNow {
        let runtime = self.handle.runtime();
        let slot = pick(&runtime.slots).clone();
        let eos = headers_only(req);
        let mut stream = Box::new(HttpStream::new(stream_info(cx)));
        if let Some(claims) = &cx.jwt {
            stream.properties = Some(jwt_properties(claims));
        }
        stream.put_request(std::mem::replace(req, empty_request()));
        let step = {
            let mut g = slot.lock();
            let vm = match slot.vm(&mut g) {
                Ok(vm) => vm,
                Err(e) => {
                    if let Some(head) = stream.take_request() {
                        *req = head;
                    }
                    slot.fail(&mut g, &e);
                    return Ok(Err(fail(e)));
                }
            };
            let id = match vm.create_http(stream) {
                Ok(id) => id,
                Err(e) => {
                    slot.fail(&mut g, &e);
                    return Ok(Err(fail(e)));
                }
            };
            let called = vm.on_request_headers(id, eos);
            self.ctx = id;
            self.incarnation = g.incarnation;
            self.slot = Some(slot.clone());
            self.runtime = Some(runtime);
            match called {
                Ok(action) => {
                    let mut own = slot.settle(&mut g, id);
                    step(&slot, &mut g, id, action, &mut own)
                }
                Err(e) => {
                    slot.fail(&mut g, &e);
                    return Ok(Err(fail(e)));
                }
            }
        };
        match step {
            Step::Now(resume) => Ok(self.request_head_back(req, resume)),
            Step::Later(rx) => Err(rx),
        }
    }

    /// Takes the request head back from the VM and turns the resume into the hook's answer.
    /// Nothing stays behind: the later callbacks read the head the chain keeps for them
    /// ([`RequestCx::request_head`], lent to the VM by [`lend_head`]).
    fn request_head_back(
        &self,
        req: &mut request::Parts,
        resume: Resume,
    ) -> Result<Flow, BoxError> {
        let back = self.with_stream(HttpStream::take_request);
        *req = back.flatten().ok_or_else(vm_replaced)?;
        flow(resume)
    }

    /// Runs `proxy_on_response_headers` with the head moved into the VM: the hook's answer, or
    /// what to wait on when the guest paused (the head stays in the VM meanwhile).
    fn response_headers_now(&mut self, res: &mut response::Parts, cx: &RequestCx) -> HeadNow {
        let status = res.status;
        self.held_status = status;
        let called = (|| {
            let (slot, mut g) = self.lock()?;
            let r = {
                let Some(vm) = slot_vm(&mut g) else {
                    return Err(Skip::Gone);
                };
                let Some(h) = vm.http(self.ctx) else {
                    return Err(Skip::Gone);
                };
                h.response = std::mem::replace(res, empty_response());
                lend_head(h, cx);
                vm.on_response_headers(self.ctx, false)
            };
            match r {
                Ok(action) => {
                    let mut own = slot.settle(&mut g, self.ctx);
                    Ok(step(slot, &mut g, self.ctx, action, &mut own))
                }
                Err(e) => {
                    slot.fail(&mut g, &e);
                    Err(Skip::Failed(e))
                }
            }
        })();
        match called {
            Ok(Step::Now(resume)) => Ok(self.response_head_back(res, resume)),
            Ok(Step::Later(rx)) => Err(rx),
            // The head never moved: the plugin is skipped for this response.
            Err(Skip::Gone) => Ok(Ok(Flow::Continue)),
            Err(Skip::Failed(e)) => {
                // The head died with the VM; the plugin is gone but the response is not.
                *res = empty_response();
                res.status = status;
                Ok(Err(fail(e)))
            }
        }
    }

    /// Takes the response head back from the VM and turns the resume into the hook's answer.
    fn response_head_back(
        &self,
        res: &mut response::Parts,
        resume: Resume,
    ) -> Result<Flow, BoxError> {
        let back = self.with_stream(|h| {
            let parts = std::mem::replace(&mut h.response, empty_response());
            h.response.status = parts.status;
            parts
        });
        match back {
            Some(parts) => *res = parts,
            None => {
                *res = empty_response();
                res.status = self.held_status;
                return Err(vm_replaced());
            }
        }
        flow(resume)
    }

    /// `proxy_on_request_trailers` / `proxy_on_response_trailers`: the trailers move into the
    /// VM for the callback and back after it (changed or not).
    fn trailers(
        &self,
        trailers: &mut HeaderMap,
        response: bool,
        cx: &RequestCx,
    ) -> Result<(), BoxError> {
        let mut incoming = Some(std::mem::take(trailers));
        let r = self.call(|vm, id| {
            let Some(h) = vm.http(id) else {
                return Ok(None);
            };
            lend_head(h, cx);
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

    /// The log phase: the final status goes in, then the context ends.
    fn finish(&mut self, status: StatusCode, cx: &RequestCx) {
        let Some(slot) = self.slot.take() else { return };
        let mut g = slot.lock();
        slot.unwait(&mut g, self.ctx);
        if g.incarnation != self.incarnation {
            return;
        }
        let Some(vm) = slot_vm(&mut g) else { return };
        if let Some(h) = vm.http(self.ctx) {
            h.response.status = status;
            lend_head(h, cx);
        }
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

/// The verified claims of a `jwt` filter as properties: `jwt.payload` (the JSON text) and
/// `jwt.claims.NAME` (a string as it is, other values as JSON text).
fn jwt_properties(
    claims: &crate::filter::jwt::JwtClaims,
) -> std::collections::HashMap<Vec<u8>, Bytes> {
    let mut props = std::collections::HashMap::with_capacity(claims.claims().len() + 1);
    props.insert(
        b"jwt\0payload".to_vec(),
        Bytes::copy_from_slice(claims.payload().as_bytes()),
    );
    for name in claims.claims().keys() {
        if let Some(text) = claims.text(name) {
            let mut path = b"jwt\0claims\0".to_vec();
            path.extend_from_slice(name.as_bytes());
            props.insert(path, Bytes::from(text));
        }
    }
    props
}

/// Lends the VM the request head the chain kept, for a callback after the request's.
fn lend_head(h: &mut HttpStream, cx: &RequestCx) {
    if let Some(head) = &cx.request_head {
        h.lend_request(head);
    }
}

fn slot_vm(g: &mut SlotInner) -> Option<&mut Vm> {
    g.vm_mut().filter(|vm| vm.failed().is_none())
}

#[async_trait::async_trait]
impl HttpFilter for WasmFilter {
    fn on_request_headers_sync(
        &mut self,
        req: &mut request::Parts,
        cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        self.answer_now(|f| f.request_headers_now(req, cx))
    }

    async fn on_request_headers(
        &mut self,
        req: &mut request::Parts,
        cx: &mut RequestCx,
    ) -> Result<Flow, BoxError> {
        let rx = match self.kept_wait_or(|f| f.request_headers_now(req, cx)) {
            Ok(answer) => return answer,
            Err(rx) => rx,
        };
        let resume = self.wait(rx).await;
        self.request_head_back(req, resume)
    }

    async fn on_request_body(
        &mut self,
        chunk: &mut Option<Bytes>,
        eos: bool,
        cx: &mut RequestCx,
    ) -> Result<Flow, BoxError> {
        let mut data = chunk.take();
        let r = self.call(|vm, id| {
            let Some(h) = vm.http(id) else {
                return Ok(None);
            };
            lend_head(h, cx);
            if let Some(d) = data.take() {
                h.request_body.push(d);
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
            self.call(|vm, id| Ok(vm.http(id).and_then(|h| h.request_body.take())))
        {
            *chunk = out;
        }
        Ok(Flow::Continue)
    }

    fn on_response_headers_sync(
        &mut self,
        res: &mut response::Parts,
        cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        self.answer_now(|f| f.response_headers_now(res, cx))
    }

    async fn on_response_headers(
        &mut self,
        res: &mut response::Parts,
        cx: &mut RequestCx,
    ) -> Result<Flow, BoxError> {
        let rx = match self.kept_wait_or(|f| f.response_headers_now(res, cx)) {
            Ok(answer) => return answer,
            Err(rx) => rx,
        };
        let resume = self.wait(rx).await;
        self.response_head_back(res, resume)
    }

    /// Response body callbacks never wait: a paused chunk stays buffered in the VM.
    fn on_response_body_sync(
        &mut self,
        chunk: &mut Option<Bytes>,
        eos: bool,
        cx: &mut RequestCx,
    ) -> Option<Result<(), BoxError>> {
        let mut data = chunk.take();
        let r = self.call(|vm, id| {
            let Some(h) = vm.http(id) else {
                return Ok(None);
            };
            lend_head(h, cx);
            if let Some(d) = data.take() {
                h.response_body.push(d);
            }
            let held = h.response_body.len();
            let action = vm.on_response_body(id, eos)?;
            let Some(h) = vm.http(id) else {
                return Ok(None);
            };
            // Paused chunks stay buffered until the guest continues or the body ends.
            Ok(Some(
                if action == Action::Continue || eos || held > MAX_BUFFER {
                    h.response_body.take()
                } else {
                    None
                },
            ))
        });
        Some(match r {
            Ok((Some(out), _)) => {
                *chunk = out;
                Ok(())
            }
            Ok((None, _)) | Err(Skip::Gone) => {
                *chunk = data;
                Ok(())
            }
            Err(Skip::Failed(e)) => Err(fail(e)),
        })
    }

    async fn on_request_trailers(
        &mut self,
        trailers: &mut HeaderMap,
        cx: &mut RequestCx,
    ) -> Result<(), BoxError> {
        self.trailers(trailers, false, cx)
    }

    async fn on_response_trailers(
        &mut self,
        trailers: &mut HeaderMap,
        cx: &mut RequestCx,
    ) -> Result<(), BoxError> {
        self.trailers(trailers, true, cx)
    }

    fn on_log_sync(&mut self, cx: &RequestCx, status: StatusCode) -> bool {
        self.finish(status, cx);
        true
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::ConnInfo;

    #[test]
    fn a_plugin_sees_the_client_a_trusted_proxy_named_as_the_source() {
        let peer = "10.0.0.1:40000".parse().unwrap();
        let conn = ConnInfo::new(
            peer,
            "10.0.0.2:80".parse().unwrap(),
            "l".into(),
            false,
            None,
        );
        let client = "192.0.2.9:0".parse().unwrap();
        let cx = RequestCx {
            conn: Arc::new(conn.for_client(client)),
            route: "r".into(),
            start: tokio::time::Instant::now(),
            trace: None,
            request_head: None,
            jwt: None,
            user: None,
            private_head: false,
        };
        assert_eq!(stream_info(&cx).source, Some(client));
    }
}
