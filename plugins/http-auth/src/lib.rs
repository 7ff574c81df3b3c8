//! `http-auth`: external authorisation. For each request it sends the `authorization` header
//! to an auth service (`GET /check` on a configured upstream, through the gateway's pools) and
//! pauses the request until the answer arrives: 200 continues (adding `x-auth-user` from the
//! answer's `x-user` header), anything else ends the request with 403.
//!
//! Config: `{"upstream": "auth", "path": "/check", "timeout_ms": 1000}`.

use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};
use serde::Deserialize;

#[derive(Deserialize)]
struct Config {
    upstream: String,
    #[serde(default = "check")]
    path: String,
    #[serde(default = "second")]
    timeout_ms: u64,
}

fn check() -> String {
    "/check".into()
}
fn second() -> u64 {
    1000
}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { config: None }) });
}}

struct Root {
    config: Option<Rc<Config>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _: usize) -> bool {
        let bytes = self.get_plugin_configuration().unwrap_or_default();
        self.config = serde_json::from_slice(&bytes).ok().map(Rc::new);
        self.config.is_some()
    }

    fn create_http_context(&self, _: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Auth { config: self.config.clone()? }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Auth {
    config: Rc<Config>,
}

impl HttpContext for Auth {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        let token = self.get_http_request_header("authorization").unwrap_or_default();
        let c = &self.config;
        let sent = self.dispatch_http_call(
            &c.upstream,
            vec![
                (":method", "GET"),
                (":path", &c.path),
                (":authority", "auth"),
                ("authorization", &token),
            ],
            None,
            vec![],
            Duration::from_millis(c.timeout_ms),
        );
        match sent {
            Ok(_) => Action::Pause,
            Err(_) => {
                self.send_http_response(500, vec![], Some(b"auth unavailable\n"));
                Action::Pause
            }
        }
    }
}

impl Context for Auth {
    fn on_http_call_response(&mut self, _token: u32, _headers: usize, _body: usize, _trailers: usize) {
        let status = self.get_http_call_response_header(":status");
        if status.as_deref() == Some("200") {
            let user = self.get_http_call_response_header("x-user").unwrap_or_default();
            self.set_http_request_header("x-auth-user", Some(&user));
            self.resume_http_request();
        } else {
            self.send_http_response(403, vec![("x-auth", "denied")], Some(b"forbidden\n"));
        }
    }
}
