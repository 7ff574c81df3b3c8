//! Connects a [`Filter`] to the proxy-wasm dispatcher: a root context that parses the typed
//! configuration, and an HTTP context per request that turns callbacks into the filter's phases
//! and [`Flow`]s into actions, local replies and resumes.

use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel};

use super::{Body, CallResponse, Filter, Request, Response};
use crate::{Flow, Reply};

/// Registers `F` with the dispatcher (called by `export_filter!`).
pub fn register<F: Filter>() {
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(Root::<F> { config: None })
    });
}

struct Root<F: Filter> {
    config: Option<Rc<F::Config>>,
}

impl<F: Filter> Context for Root<F> {}

impl<F: Filter> RootContext for Root<F> {
    fn on_configure(&mut self, _: usize) -> bool {
        let bytes = self.get_plugin_configuration().unwrap_or_default();
        let text: &[u8] = if bytes.is_empty() { b"{}" } else { &bytes };
        // A YAML string reaches the plugin as its bytes, not as JSON: read it as a string.
        let parsed = serde_json::from_slice(text).or_else(|e| {
            std::str::from_utf8(text)
                .map_err(|_| e)
                .and_then(|s| serde_json::from_value(serde_json::Value::String(s.to_owned())))
        });
        match parsed {
            Ok(c) => {
                self.config = Some(Rc::new(c));
                true
            }
            Err(e) => {
                let _ = proxy_wasm::hostcalls::log(
                    LogLevel::Error,
                    &format!("plugin configuration rejected: {e}"),
                );
                false
            }
        }
    }

    fn create_http_context(&self, _: u32) -> Option<Box<dyn HttpContext>> {
        let config = self.config.as_ref()?;
        Some(Box::new(Adapter {
            filter: F::create(config),
            paused: None,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Request,
    Response,
}

struct Adapter<F> {
    filter: F,
    paused: Option<Phase>,
}

fn reply(r: Reply) {
    let headers: Vec<(&str, &str)> = r
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let body = (!r.body.is_empty()).then_some(&r.body[..]);
    let _ = proxy_wasm::hostcalls::send_http_response(u32::from(r.status), headers, body);
}

impl<F> Adapter<F> {
    fn act(&mut self, flow: Flow, phase: Phase) -> Action {
        match flow {
            Flow::Continue => Action::Continue,
            Flow::Pause => {
                self.paused = Some(phase);
                Action::Pause
            }
            Flow::Reply(r) => {
                reply(r);
                Action::Pause
            }
        }
    }
}

impl<F: Filter> Context for Adapter<F> {
    fn on_http_call_response(
        &mut self,
        _token: u32,
        _headers: usize,
        body: usize,
        _trailers: usize,
    ) {
        let call = CallResponse::read(body);
        match self.filter.on_call_response(call) {
            Flow::Continue => match self.paused.take() {
                Some(Phase::Request) => {
                    let _ = proxy_wasm::hostcalls::resume_http_request();
                }
                Some(Phase::Response) => {
                    let _ = proxy_wasm::hostcalls::resume_http_response();
                }
                None => {}
            },
            Flow::Pause => {}
            Flow::Reply(r) => reply(r),
        }
    }
}

impl<F: Filter> HttpContext for Adapter<F> {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        let flow = self.filter.on_request(&mut Request(()));
        self.act(flow, Phase::Request)
    }

    fn on_http_request_body(&mut self, size: usize, eos: bool) -> Action {
        let mut body = Body {
            kind: BufferType::HttpRequestBody,
            size,
        };
        let flow = self.filter.on_request_body(&mut body, eos);
        self.act(flow, Phase::Request)
    }

    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        let flow = self.filter.on_response(&mut Response(()));
        self.act(flow, Phase::Response)
    }

    fn on_http_response_body(&mut self, size: usize, eos: bool) -> Action {
        let mut body = Body {
            kind: BufferType::HttpResponseBody,
            size,
        };
        let flow = self.filter.on_response_body(&mut body, eos);
        self.act(flow, Phase::Response)
    }

    fn on_log(&mut self) {
        self.filter.on_log();
    }
}
