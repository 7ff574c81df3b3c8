//! The chain's contract: order of phases, local replies, body hooks, the log phase.

use std::sync::Mutex as StdMutex;

use bytes::Bytes;
use http::{HeaderMap, Request, request, response};
use http_body::{Body as HttpBody, Frame};
use http_body_util::BodyExt;

use super::request_body::RequestBodyHooks;
use super::*;
use crate::terminal::Respond;

type Journal = Arc<StdMutex<Vec<String>>>;

/// A test filter's entry in the journal: `name:what`.
fn note(journal: &Journal, name: &str, what: &str) {
    journal.lock().unwrap().push(format!("{name}:{what}"));
}

/// How a test filter notes a request body chunk in the journal.
fn body_entry(chunk: &Option<Bytes>, eos: bool) -> String {
    format!("req_body:{}:{eos}", chunk.as_ref().map_or(0, |c| c.len()))
}

struct Recorder {
    name: &'static str,
    journal: Journal,
    reply_on_request: bool,
    body: BodyAccess,
    upper_response_body: bool,
}

impl FilterFactory for Recorder {
    fn name(&self) -> &'static str {
        self.name
    }
    fn create(&self) -> Box<dyn HttpFilter> {
        Box::new(RecorderFilter {
            name: self.name,
            journal: self.journal.clone(),
            reply_on_request: self.reply_on_request,
            upper: self.upper_response_body,
        })
    }
    fn request_body(&self) -> BodyAccess {
        self.body
    }
    fn response_body(&self) -> bool {
        self.upper_response_body
    }
}

struct RecorderFilter {
    name: &'static str,
    journal: Journal,
    reply_on_request: bool,
    upper: bool,
}

impl RecorderFilter {
    fn note(&self, what: &str) {
        note(&self.journal, self.name, what);
    }
}

#[async_trait::async_trait]
impl HttpFilter for RecorderFilter {
    async fn on_request_headers(
        &mut self,
        req: &mut request::Parts,
        _cx: &mut RequestCx,
    ) -> Result<Flow, BoxError> {
        self.note("req");
        req.headers
            .append("x-seen", HeaderValue::from_static(self.name));
        if self.reply_on_request {
            return Ok(Flow::Respond(Response::new(Body::from("local reply"))));
        }
        Ok(Flow::Continue)
    }
    async fn on_request_body(
        &mut self,
        chunk: &mut Option<Bytes>,
        eos: bool,
        _cx: &mut RequestCx,
    ) -> Result<Flow, BoxError> {
        self.note(&body_entry(chunk, eos));
        Ok(Flow::Continue)
    }
    async fn on_response_headers(
        &mut self,
        res: &mut response::Parts,
        _cx: &mut RequestCx,
    ) -> Result<Flow, BoxError> {
        self.note("res");
        res.headers
            .append("x-res", HeaderValue::from_static(self.name));
        Ok(Flow::Continue)
    }
    async fn on_response_body(
        &mut self,
        chunk: &mut Option<Bytes>,
        eos: bool,
        _cx: &mut RequestCx,
    ) -> Result<(), BoxError> {
        if self.upper {
            if let Some(c) = chunk.take() {
                *chunk = Some(Bytes::from(c.to_ascii_uppercase()));
            }
            if eos {
                let mut tail = chunk.take().map(|c| c.to_vec()).unwrap_or_default();
                tail.extend_from_slice(b"!");
                *chunk = Some(Bytes::from(tail));
            }
        }
        Ok(())
    }
    async fn on_log(&mut self, _cx: &RequestCx, status: StatusCode) {
        self.note(&format!("log:{}", status.as_u16()));
    }
}

fn cx() -> RequestCx {
    RequestCx::test()
}

fn respond(body: &str) -> Terminal {
    let cfg: gateway_config::model::RespondConfig =
        serde_yaml::from_str(&format!("{{ body: \"{body}\" }}")).unwrap();
    Terminal::Respond(Arc::new(Respond::new(&cfg, true, false).unwrap()))
}

fn recorder(name: &'static str, journal: &Journal) -> Recorder {
    Recorder {
        name,
        journal: journal.clone(),
        reply_on_request: false,
        body: BodyAccess::None,
        upper_response_body: false,
    }
}

async fn body_text(res: Response<Body>) -> String {
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test]
async fn request_in_order_response_in_reverse_log_once() {
    let journal: Journal = Arc::default();
    let chain = Chain::new(vec![
        Arc::new(recorder("a", &journal)),
        Arc::new(recorder("b", &journal)),
    ]);
    let res = chain
        .run(&respond("ok"), Request::new(Body::empty()), cx(), None)
        .await;
    let order: Vec<_> = res
        .headers()
        .get_all("x-res")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect();
    assert_eq!(order, ["b", "a"]);
    assert_eq!(body_text(res).await, "ok");
    tokio::task::yield_now().await;
    assert_eq!(
        *journal.lock().unwrap(),
        ["a:req", "b:req", "b:res", "a:res", "a:log:200", "b:log:200"]
    );
}

#[tokio::test]
async fn local_reply_skips_the_rest_and_the_terminal() {
    let journal: Journal = Arc::default();
    let mut b = recorder("b", &journal);
    b.reply_on_request = true;
    let chain = Chain::new(vec![
        Arc::new(recorder("a", &journal)),
        Arc::new(b),
        Arc::new(recorder("c", &journal)),
    ]);
    let res = chain
        .run(
            &respond("terminal"),
            Request::new(Body::empty()),
            cx(),
            None,
        )
        .await;
    assert_eq!(
        res.headers().get_all("x-res").iter().count(),
        1,
        "only `a` sees the reply"
    );
    assert_eq!(body_text(res).await, "local reply");
    let j = journal.lock().unwrap().clone();
    assert!(!j.iter().any(|e| e.starts_with("c:")), "{j:?}");
}

#[tokio::test]
async fn buffered_request_body_is_seen_whole_and_limited() {
    let journal: Journal = Arc::default();
    let mut a = recorder("a", &journal);
    a.body = BodyAccess::Buffer(8);
    let chain = Chain::new(vec![Arc::new(a)]);
    let req = Request::new(Body::from("12345"));
    let res = chain.run(&respond("ok"), req, cx(), None).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert!(
        journal
            .lock()
            .unwrap()
            .contains(&"a:req_body:5:true".to_owned())
    );
    let res = chain
        .run(
            &respond("ok"),
            Request::new(Body::from("123456789")),
            cx(),
            None,
        )
        .await;
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn response_body_hooks_rewrite_and_append_at_eos() {
    let journal: Journal = Arc::default();
    let mut a = recorder("a", &journal);
    a.upper_response_body = true;
    let chain = Chain::new(vec![Arc::new(a)]);
    let res = chain
        .run(&respond("hello"), Request::new(Body::empty()), cx(), None)
        .await;
    assert_eq!(body_text(res).await, "HELLO!");
}

#[tokio::test]
async fn server_header_is_added_before_response_filters() {
    let chain = Chain::default();
    let server = HeaderValue::from_static("gw");
    let res = chain
        .run(
            &respond("x"),
            Request::new(Body::empty()),
            cx(),
            Some(&server),
        )
        .await;
    assert_eq!(res.headers()[header::SERVER], "gw");
}

/// A synchronous request hook's answer: a local reply with `body`, or on to the next.
fn reply_or_continue(reply: bool, body: &'static str) -> Option<Result<Flow, BoxError>> {
    Some(Ok(if reply {
        Flow::Respond(Response::new(Body::from(body)))
    } else {
        Flow::Continue
    }))
}

/// A filter whose response hook removes the `Server` header, noting what it found.
#[derive(Clone)]
struct ServerRemover {
    journal: Journal,
    reply: bool,
}

impl FilterFactory for ServerRemover {
    fn name(&self) -> &'static str {
        "server-remover"
    }
    fn create(&self) -> Box<dyn HttpFilter> {
        Box::new(self.clone())
    }
}

#[async_trait::async_trait]
impl HttpFilter for ServerRemover {
    fn on_request_headers_sync(
        &mut self,
        _req: &mut request::Parts,
        _cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        reply_or_continue(self.reply, "local")
    }
    fn on_response_headers_sync(
        &mut self,
        res: &mut response::Parts,
        _cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        let found = res.headers.get_all(header::SERVER).iter();
        let found: Vec<_> = found.map(|v| v.to_str().unwrap().to_owned()).collect();
        self.journal.lock().unwrap().push(found.join(","));
        res.headers.remove(header::SERVER);
        Some(Ok(Flow::Continue))
    }
}

#[tokio::test]
async fn response_filters_see_one_server_header_whoever_answered() {
    let journal: Journal = Arc::default();
    let server = HeaderValue::from_static("gw");
    let own: gateway_config::model::RespondConfig =
        serde_yaml::from_str("{ body: x, headers: { server: own } }").unwrap();
    let own = Terminal::Respond(Arc::new(Respond::new(&own, true, false).unwrap()));
    for (terminal, reply, seen) in [
        // The terminal's response gets it before the response hooks run.
        (respond("x"), false, "gw"),
        // The route's own `Server` header is kept.
        (own, false, "own"),
        // So does a later filter's local reply.
        (respond("x"), true, "gw"),
    ] {
        let filter = |reply| {
            let journal = journal.clone();
            Arc::new(ServerRemover { journal, reply }) as Arc<dyn FilterFactory>
        };
        let chain = Chain::new(vec![filter(false), filter(reply)]);
        let res = chain
            .run(&terminal, Request::new(Body::empty()), cx(), Some(&server))
            .await;
        // The filter nearer the terminal removed it (unless it replied): the other saw none.
        let expected = if reply { vec![seen] } else { vec![seen, ""] };
        assert_eq!(std::mem::take(&mut *journal.lock().unwrap()), expected);
        assert!(!res.headers().contains_key(header::SERVER), "{res:?}");
    }
}

/// A filter whose request hook answers synchronously (optionally with a local reply) and
/// whose response hook does too unless `sync_response` is false.
#[derive(Clone)]
struct SyncStep {
    name: &'static str,
    journal: Journal,
    reply: bool,
    sync_response: bool,
    body: BodyAccess,
}

impl SyncStep {
    fn new(name: &'static str, journal: &Journal) -> Self {
        Self {
            name,
            journal: journal.clone(),
            reply: false,
            sync_response: true,
            body: BodyAccess::None,
        }
    }

    fn note(&self, what: &str) {
        note(&self.journal, self.name, what);
    }
}

impl FilterFactory for SyncStep {
    fn name(&self) -> &'static str {
        self.name
    }
    fn create(&self) -> Box<dyn HttpFilter> {
        Box::new(self.clone())
    }
    fn request_body(&self) -> BodyAccess {
        self.body
    }
    fn after_response(&self) -> bool {
        false
    }
}

#[async_trait::async_trait]
impl HttpFilter for SyncStep {
    fn on_request_headers_sync(
        &mut self,
        req: &mut request::Parts,
        _cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        self.note("req");
        req.headers
            .append("x-seen", HeaderValue::from_static(self.name));
        reply_or_continue(self.reply, "sync reply")
    }
    fn on_response_headers_sync(
        &mut self,
        res: &mut response::Parts,
        _cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        if !self.sync_response {
            return None;
        }
        self.note("res");
        res.headers
            .append("x-res", HeaderValue::from_static(self.name));
        Some(Ok(Flow::Continue))
    }
    async fn on_response_headers(
        &mut self,
        res: &mut response::Parts,
        cx: &mut RequestCx,
    ) -> Result<Flow, BoxError> {
        if let Some(flow) = self.on_response_headers_sync(res, cx) {
            return flow;
        }
        self.note("res-async");
        res.headers
            .append("x-res", HeaderValue::from_static(self.name));
        Ok(Flow::Continue)
    }
    async fn on_request_body(
        &mut self,
        chunk: &mut Option<Bytes>,
        eos: bool,
        _cx: &mut RequestCx,
    ) -> Result<Flow, BoxError> {
        self.note(&body_entry(chunk, eos));
        Ok(Flow::Continue)
    }
}

fn x_res(res: &Response<Body>) -> Vec<String> {
    res.headers()
        .get_all("x-res")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn synchronous_filters_and_terminal_finish_without_a_future() {
    let journal: Journal = Arc::default();
    let chain = Chain::new(vec![
        Arc::new(SyncStep::new("a", &journal)),
        Arc::new(SyncStep::new("b", &journal)),
    ]);
    let Started::Done(res) = chain.start(&respond("ok"), Request::new(Body::empty()), cx, None)
    else {
        panic!("every step here answers at once");
    };
    assert_eq!(x_res(&res), ["b", "a"]);
    assert_eq!(body_text(res).await, "ok");
    assert_eq!(
        *journal.lock().unwrap(),
        ["a:req", "b:req", "b:res", "a:res"]
    );
}

#[tokio::test]
async fn a_waiting_request_hook_resumes_where_the_synchronous_pass_stopped() {
    let journal: Journal = Arc::default();
    let chain = Chain::new(vec![
        Arc::new(SyncStep::new("a", &journal)),
        Arc::new(recorder("b", &journal)),
        Arc::new(SyncStep::new("c", &journal)),
    ]);
    let terminal = respond("ok");
    let Started::Wait(rest) = chain.start(&terminal, Request::new(Body::empty()), cx, None) else {
        panic!("`b` waits");
    };
    assert_eq!(
        *journal.lock().unwrap(),
        ["a:req"],
        "nothing after `b` ran yet"
    );
    let res = rest.resume(&chain, &terminal, None).await;
    assert_eq!(x_res(&res), ["c", "b", "a"]);
    assert_eq!(body_text(res).await, "ok");
    tokio::task::yield_now().await;
    assert_eq!(
        *journal.lock().unwrap(),
        [
            "a:req",
            "b:req",
            "c:req",
            "c:res",
            "b:res",
            "a:res",
            "b:log:200"
        ],
        "each hook once, in order"
    );
}

#[tokio::test]
async fn a_waiting_response_hook_resumes_below_the_synchronous_ones() {
    let journal: Journal = Arc::default();
    let mut a = SyncStep::new("a", &journal);
    a.sync_response = false;
    let chain = Chain::new(vec![Arc::new(a), Arc::new(SyncStep::new("b", &journal))]);
    let terminal = respond("ok");
    let Started::Wait(rest) = chain.start(&terminal, Request::new(Body::empty()), cx, None) else {
        panic!("`a`'s response hook waits");
    };
    let res = rest.resume(&chain, &terminal, None).await;
    assert_eq!(x_res(&res), ["b", "a"]);
    assert_eq!(
        *journal.lock().unwrap(),
        ["a:req", "b:req", "b:res", "a:res-async"]
    );
}

#[tokio::test]
async fn a_synchronous_local_reply_skips_the_rest_and_the_terminal() {
    let journal: Journal = Arc::default();
    let mut b = SyncStep::new("b", &journal);
    b.reply = true;
    let chain = Chain::new(vec![
        Arc::new(SyncStep::new("a", &journal)),
        Arc::new(b),
        Arc::new(SyncStep::new("c", &journal)),
    ]);
    let res = chain
        .run(
            &respond("terminal"),
            Request::new(Body::empty()),
            cx(),
            None,
        )
        .await;
    assert_eq!(x_res(&res), ["a"], "only `a` sees the reply");
    assert_eq!(body_text(res).await, "sync reply");
    assert_eq!(*journal.lock().unwrap(), ["a:req", "b:req", "a:res"]);
}

/// Without filters, a terminal that waits hands back its own future, for the caller to hold
/// without boxing it again; the `Server` header is the caller's to add.
#[tokio::test]
async fn without_filters_a_waiting_terminal_hands_back_its_own_future() {
    let chain = Chain::new(Vec::new());
    let terminal = respond("ok");
    let server = HeaderValue::from_static("gw");
    let bodiless = chain.start(&terminal, Request::new(Body::empty()), cx, Some(&server));
    let Started::Done(res) = bodiless else {
        panic!("a synthetic response to a bodiless request is made at once");
    };
    assert_eq!(res.headers()[header::SERVER], "gw");
    // With a body to read first, the terminal waits.
    let req = Request::new(Body::from("payload"));
    let Started::Terminal(fut, None) = chain.start(&terminal, req, cx, Some(&server)) else {
        panic!("the terminal's own future, and no filters' state");
    };
    let res = fut.await;
    assert!(!res.headers().contains_key(header::SERVER));
    assert_eq!(body_text(res).await, "ok");
}

/// With filters whose request hooks answer at once, a terminal that waits hands back its
/// own future too, with the filters' state for the response hooks: synchronous ones run in
/// `after_terminal`, and one that waits leaves the rest to resume.
#[tokio::test]
async fn with_synchronous_filters_a_waiting_terminal_hands_back_its_own_future() {
    let journal: Journal = Arc::default();
    let chain = Chain::new(vec![
        Arc::new(SyncStep::new("a", &journal)),
        Arc::new(SyncStep::new("b", &journal)),
    ]);
    let terminal = respond("ok");
    let server = HeaderValue::from_static("gw");
    let req = Request::new(Body::from("payload"));
    let Started::Terminal(fut, Some(tail)) = chain.start(&terminal, req, cx, Some(&server)) else {
        panic!("the terminal's own future, with the filters' state");
    };
    assert_eq!(*journal.lock().unwrap(), ["a:req", "b:req"]);
    let res = fut.await;
    assert!(x_res(&res).is_empty(), "no response hook has run yet");
    let Ok(res) = chain.after_terminal(tail, res, Some(&server)) else {
        panic!("both response hooks answer at once");
    };
    assert_eq!(x_res(&res), ["b", "a"]);
    assert_eq!(res.headers()[header::SERVER], "gw");
    assert_eq!(body_text(res).await, "ok");
    assert_eq!(
        *journal.lock().unwrap(),
        ["a:req", "b:req", "b:res", "a:res"]
    );

    // The first filter's response hook waits: the rest resumes from it.
    journal.lock().unwrap().clear();
    let mut a = SyncStep::new("a", &journal);
    a.sync_response = false;
    let chain = Chain::new(vec![Arc::new(a), Arc::new(SyncStep::new("b", &journal))]);
    let req = Request::new(Body::from("payload"));
    let Started::Terminal(fut, Some(tail)) = chain.start(&terminal, req, cx, None) else {
        panic!("the terminal's own future, with the filters' state");
    };
    let Err(rest) = chain.after_terminal(tail, fut.await, None) else {
        panic!("`a`'s response hook waits");
    };
    let res = rest.resume(&chain, &terminal, None).await;
    assert_eq!(x_res(&res), ["b", "a"]);
    assert_eq!(
        *journal.lock().unwrap(),
        ["a:req", "b:req", "b:res", "a:res-async"]
    );
}

#[tokio::test]
async fn a_request_body_the_filters_read_waits_for_the_asynchronous_pass() {
    let journal: Journal = Arc::default();
    let mut a = SyncStep::new("a", &journal);
    a.body = BodyAccess::Buffer(1024);
    let chain = Chain::new(vec![Arc::new(a)]);
    let terminal = respond("ok");
    // Without a body the synchronous pass goes all the way.
    let bodiless = chain.start(&terminal, Request::new(Body::empty()), cx, None);
    assert!(matches!(bodiless, Started::Done(_)));
    journal.lock().unwrap().clear();
    let req = Request::new(Body::from("payload"));
    let Started::Wait(rest) = chain.start(&terminal, req, cx, None) else {
        panic!("the body must be read first");
    };
    let res = rest.resume(&chain, &terminal, None).await;
    assert_eq!(body_text(res).await, "ok");
    assert_eq!(
        *journal.lock().unwrap(),
        ["a:req", "a:req_body:7:true", "a:res"],
        "the head hook ran once"
    );
}

#[tokio::test]
async fn a_bodiless_request_calls_no_streamed_body_hook() {
    let journal: Journal = Arc::default();
    let mut a = SyncStep::new("a", &journal);
    a.body = BodyAccess::Stream;
    let chain = Chain::new(vec![Arc::new(a)]);
    let terminal = respond("ok");
    let bodiless = chain.start(&terminal, Request::new(Body::empty()), cx, None);
    assert!(matches!(bodiless, Started::Done(_)));
    assert_eq!(*journal.lock().unwrap(), ["a:req", "a:res"]);
    journal.lock().unwrap().clear();
    let req = Request::new(Body::from("payload"));
    let Started::Wait(rest) = chain.start(&terminal, req, cx, None) else {
        panic!("the body goes through the hook");
    };
    let res = rest.resume(&chain, &terminal, None).await;
    assert_eq!(body_text(res).await, "ok");
    assert_eq!(
        *journal.lock().unwrap(),
        ["a:req", "a:req_body:7:true", "a:res"]
    );
}

/// A filter with response-body and log hooks, answered synchronously unless `sync` is
/// false. At the end of the body it appends its name.
#[derive(Clone)]
struct BodyStep {
    name: &'static str,
    journal: Journal,
    sync: bool,
    /// The body hook fails at the end of the body.
    fail: bool,
    /// The response-head hook states the body's length as the terminal made it.
    states_length: bool,
}

impl BodyStep {
    fn new(name: &'static str, journal: &Journal, sync: bool) -> Self {
        Self {
            name,
            journal: journal.clone(),
            sync,
            fail: false,
            states_length: false,
        }
    }

    fn body(&self, chunk: &mut Option<Bytes>, eos: bool, what: &str) {
        note(&self.journal, self.name, &format!("{what}:{eos}"));
        if eos {
            let mut tail = chunk.take().map(|c| c.to_vec()).unwrap_or_default();
            tail.extend_from_slice(self.name.as_bytes());
            *chunk = Some(Bytes::from(tail));
        }
    }
}

impl FilterFactory for BodyStep {
    fn name(&self) -> &'static str {
        self.name
    }
    fn create(&self) -> Box<dyn HttpFilter> {
        Box::new(self.clone())
    }
    fn response_body(&self) -> bool {
        true
    }
}

#[async_trait::async_trait]
impl HttpFilter for BodyStep {
    fn on_request_headers_sync(
        &mut self,
        _req: &mut request::Parts,
        _cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        Some(Ok(Flow::Continue))
    }
    fn on_response_headers_sync(
        &mut self,
        res: &mut response::Parts,
        _cx: &mut RequestCx,
    ) -> Option<Result<Flow, BoxError>> {
        if self.states_length {
            res.headers
                .insert(header::CONTENT_LENGTH, HeaderValue::from_static("2"));
        }
        Some(Ok(Flow::Continue))
    }
    fn on_response_body_sync(
        &mut self,
        chunk: &mut Option<Bytes>,
        eos: bool,
        _cx: &mut RequestCx,
    ) -> Option<Result<(), BoxError>> {
        if !self.sync {
            return None;
        }
        self.body(chunk, eos, "body");
        if self.fail && eos {
            return Some(Err("the body hook failed".into()));
        }
        Some(Ok(()))
    }
    async fn on_response_body(
        &mut self,
        chunk: &mut Option<Bytes>,
        eos: bool,
        cx: &mut RequestCx,
    ) -> Result<(), BoxError> {
        if let Some(r) = self.on_response_body_sync(chunk, eos, cx) {
            return r;
        }
        self.body(chunk, eos, "body-async");
        if self.fail && eos {
            return Err("the body hook failed".into());
        }
        Ok(())
    }
    fn on_log_sync(&mut self, _cx: &RequestCx, status: StatusCode) -> bool {
        if !self.sync {
            return false;
        }
        note(
            &self.journal,
            self.name,
            &format!("log:{}", status.as_u16()),
        );
        true
    }
    async fn on_log(&mut self, cx: &RequestCx, status: StatusCode) {
        if !self.on_log_sync(cx, status) {
            note(&self.journal, self.name, "log-async");
        }
    }
}

#[tokio::test]
async fn synchronous_body_and_log_hooks_run_in_the_body_stream_itself() {
    let journal: Journal = Arc::default();
    let chain = Chain::new(vec![
        Arc::new(BodyStep::new("a", &journal, true)),
        Arc::new(BodyStep::new("b", &journal, true)),
    ]);
    let Started::Done(res) = chain.start(&respond("ok"), Request::new(Body::empty()), cx, None)
    else {
        panic!("every hook answers synchronously");
    };
    // The body was whole before the head went out: the hooks ran on it then, once each
    // and with the end of the stream, so the response states its final length.
    assert_eq!(res.body().size_hint().exact(), Some(4));
    assert_eq!(
        *journal.lock().unwrap(),
        ["b:body:true", "a:body:true"],
        "body hooks in reverse order, before the head went out"
    );
    assert_eq!(body_text(res).await, "okba");
    // Then the log phase in filter order, before the body's end was handed on.
    assert_eq!(
        *journal.lock().unwrap(),
        ["b:body:true", "a:body:true", "a:log:200", "b:log:200"]
    );
}

/// A streamed body (not whole in memory when the head goes out) goes through the hooks
/// chunk by chunk, then once more at its end, and out without a stated length.
#[tokio::test]
async fn a_streamed_body_goes_through_the_hooks_as_it_comes() {
    let journal: Journal = Arc::default();
    let chain = Chain::new(vec![Arc::new(BodyStep::new("a", &journal, true))]);
    let (parts, ()) = Response::new(()).into_parts();
    let streamed = Body::new(http_body_util::StreamBody::new(futures_util::stream::iter(
        [Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"ok")))],
    )));
    let mut st = chain.fresh_state(cx());
    st.started = 1;
    let res = chain.with_body_hooks(st, 1, Response::from_parts(parts, streamed));
    assert_eq!(res.body().size_hint().exact(), None);
    assert_eq!(body_text(res).await, "oka");
    assert_eq!(
        *journal.lock().unwrap(),
        ["a:body:false", "a:body:true", "a:log:200"]
    );
}

/// A streamed body whose last chunk says nothing follows hands that chunk to the hooks
/// with the end of the stream, synchronously or awaited: no call with nothing after it.
#[tokio::test]
async fn a_streamed_body_that_knows_its_end_ends_on_its_last_chunk() {
    for (waits, expected, journaled) in [
        (false, "oka", &["a:body:true", "a:log:200"][..]),
        (
            true,
            "okba",
            &[
                "b:body-async:true",
                "a:body:true",
                "a:log:200",
                "b:log-async",
            ][..],
        ),
    ] {
        let journal: Journal = Arc::default();
        let mut factories: Vec<Arc<dyn FilterFactory>> =
            vec![Arc::new(BodyStep::new("a", &journal, true))];
        if waits {
            factories.push(Arc::new(BodyStep::new("b", &journal, false)));
        }
        let chain = Chain::new(factories);
        let mut st = chain.fresh_state(cx());
        st.started = chain.factories.len();
        // One buffer, but boxed: not a body the chain sees whole before the head.
        let body = Body::new(http_body_util::Full::new(Bytes::from_static(b"ok")));
        let (parts, ()) = Response::new(()).into_parts();
        let upto = chain.factories.len();
        let res = chain.with_body_hooks(st, upto, Response::from_parts(parts, body));
        assert_eq!(res.body().size_hint().exact(), None);
        assert_eq!(body_text(res).await, expected);
        assert_eq!(*journal.lock().unwrap(), journaled, "waits: {waits}");
    }
}

/// A synchronous hook runs on the whole body before the head goes out; one that waits
/// below it gets what it left, in the body stream.
#[tokio::test]
async fn a_waiting_body_hook_below_a_synchronous_one_gets_the_rest_in_the_stream() {
    let journal: Journal = Arc::default();
    let chain = Chain::new(vec![
        Arc::new(BodyStep::new("a", &journal, false)),
        Arc::new(BodyStep::new("b", &journal, true)),
    ]);
    let res = chain
        .run(&respond("ok"), Request::new(Body::empty()), cx(), None)
        .await;
    assert_eq!(res.body().size_hint().exact(), None, "length not known yet");
    assert_eq!(body_text(res).await, "okba");
    assert_eq!(
        *journal.lock().unwrap(),
        [
            "b:body:true",
            "a:body-async:true",
            "a:log-async",
            "b:log:200"
        ]
    );
}

/// A hook that fails on a whole body turns the response into an error response (its head
/// has not gone out), and the log phase sees that status.
#[tokio::test]
async fn a_failing_hook_on_a_whole_body_gives_an_error_response() {
    let journal: Journal = Arc::default();
    let mut b = BodyStep::new("b", &journal, true);
    b.fail = true;
    let chain = Chain::new(vec![
        Arc::new(BodyStep::new("a", &journal, true)),
        Arc::new(b),
    ]);
    let res = chain
        .run(&respond("ok"), Request::new(Body::empty()), cx(), None)
        .await;
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body_text(res).await.starts_with("500"));
    assert_eq!(
        *journal.lock().unwrap(),
        ["b:body:true", "a:log:500", "b:log:500"],
        "the hooks below the failed one do not run"
    );
}

/// A hook that waits and fails at the end of a streamed body ends the body with its
/// error; the log phase still runs.
#[tokio::test]
async fn a_waiting_hook_that_fails_at_the_end_still_leaves_the_log_phase() {
    let journal: Journal = Arc::default();
    let mut a = BodyStep::new("a", &journal, false);
    a.fail = true;
    let chain = Chain::new(vec![Arc::new(a)]);
    let res = chain
        .run(&respond("ok"), Request::new(Body::empty()), cx(), None)
        .await;
    assert!(res.into_body().collect().await.is_err());
    assert_eq!(
        *journal.lock().unwrap(),
        ["a:body-async:true", "a:log-async"]
    );
}

/// A `Content-Length` the response states is corrected when the hooks change the length.
#[tokio::test]
async fn a_stated_length_follows_what_the_hooks_left() {
    let journal: Journal = Arc::default();
    let mut a = BodyStep::new("a", &journal, true);
    a.states_length = true;
    let chain = Chain::new(vec![Arc::new(a)]);
    let res = chain
        .run(&respond("ok"), Request::new(Body::empty()), cx(), None)
        .await;
    assert_eq!(res.headers()[header::CONTENT_LENGTH], "3");
    assert_eq!(body_text(res).await, "oka");
}

#[tokio::test]
async fn a_body_or_log_hook_that_waits_hands_the_rest_to_the_asynchronous_pass() {
    let journal: Journal = Arc::default();
    let chain = Chain::new(vec![
        Arc::new(BodyStep::new("a", &journal, true)),
        Arc::new(BodyStep::new("b", &journal, false)),
    ]);
    let res = chain
        .run(&respond("ok"), Request::new(Body::empty()), cx(), None)
        .await;
    assert_eq!(body_text(res).await, "okba");
    // The first hook waits, so the body streams; its one chunk is its last, so it goes
    // through the hooks with the end of the stream.
    assert_eq!(
        *journal.lock().unwrap(),
        [
            "b:body-async:true",
            "a:body:true",
            "a:log:200",
            "b:log-async"
        ]
    );
}

#[tokio::test]
async fn an_abandoned_response_body_still_gets_the_log_phase() {
    let journal: Journal = Arc::default();
    let chain = Chain::new(vec![Arc::new(BodyStep::new("a", &journal, true))]);
    let res = chain
        .run(&respond("ok"), Request::new(Body::empty()), cx(), None)
        .await;
    drop(res);
    // The whole body went through the hook before the head was handed on; synchronous
    // log hooks run in the body's drop, not in a task spawned for them (this test's
    // runtime has one thread, and the test has not yielded to other tasks).
    assert_eq!(*journal.lock().unwrap(), ["a:body:true", "a:log:200"]);
}

/// Marks the trailers it sees, both ways.
struct TrailerTag(&'static str);

impl FilterFactory for TrailerTag {
    fn name(&self) -> &'static str {
        self.0
    }
    fn create(&self) -> Box<dyn HttpFilter> {
        Box::new(TrailerTag(self.0))
    }
    fn after_response(&self) -> bool {
        true
    }
}

impl TrailerTag {
    fn tag(&self, trailers: &mut HeaderMap) -> Result<(), BoxError> {
        trailers.append("x-seen-by", HeaderValue::from_static(self.0));
        Ok(())
    }
}

#[async_trait::async_trait]
impl HttpFilter for TrailerTag {
    async fn on_request_trailers(
        &mut self,
        trailers: &mut HeaderMap,
        _cx: &mut RequestCx,
    ) -> Result<(), BoxError> {
        self.tag(trailers)
    }
    async fn on_response_trailers(
        &mut self,
        trailers: &mut HeaderMap,
        _cx: &mut RequestCx,
    ) -> Result<(), BoxError> {
        self.tag(trailers)
    }
}

/// A body of one chunk, then trailers `x-sum: 1` when `with_trailers`.
fn body_with_trailers(with_trailers: bool) -> Body {
    let mut frames = vec![Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"ok")))];
    if with_trailers {
        let mut t = HeaderMap::new();
        t.insert("x-sum", HeaderValue::from_static("1"));
        frames.push(Ok(Frame::trailers(t)));
    }
    Body::new(http_body_util::StreamBody::new(futures_util::stream::iter(
        frames,
    )))
}

fn seen_by(trailers: Option<&HeaderMap>) -> Vec<String> {
    let Some(t) = trailers else {
        return vec!["none".into()];
    };
    let mut out = vec![format!("x-sum={}", t["x-sum"].to_str().unwrap())];
    out.extend(
        t.get_all("x-seen-by")
            .iter()
            .map(|v| v.to_str().unwrap().to_owned()),
    );
    out
}

/// Response trailers go through the trailer hooks in reverse order, after the body, and a
/// body without trailers ends without any.
#[tokio::test]
async fn response_trailers_go_through_the_hooks_after_the_body() {
    for (with_trailers, expected) in [(true, &["x-sum=1", "b", "a"][..]), (false, &["none"])] {
        let chain = Chain::new(vec![Arc::new(TrailerTag("a")), Arc::new(TrailerTag("b"))]);
        let mut st = chain.fresh_state(cx());
        st.started = 2;
        let body = body_with_trailers(with_trailers);
        let res = chain.with_body_hooks(st, 2, Response::new(body));
        let collected = res.into_body().collect().await.unwrap();
        assert_eq!(seen_by(collected.trailers()), expected);
        assert_eq!(collected.to_bytes(), "ok");
    }
}

/// Request trailers go through the trailer hooks in filter order once the body is read.
#[tokio::test]
async fn request_trailers_go_through_the_hooks_after_the_body() {
    for (with_trailers, expected) in [(true, &["x-sum=1", "a", "b"][..]), (false, &["none"])] {
        let chain = Chain::new(vec![Arc::new(TrailerTag("a")), Arc::new(TrailerTag("b"))]);
        let state = Arc::new(Mutex::new(chain.fresh_state(cx())));
        let body = Body::new(RequestBodyHooks::new(
            body_with_trailers(with_trailers),
            state,
            chain.clone(),
        ));
        let collected = body.collect().await.unwrap();
        assert_eq!(seen_by(collected.trailers()), expected);
        assert_eq!(collected.to_bytes(), "ok");
    }
}
