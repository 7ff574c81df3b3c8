//! `body-rewrite`: replaces text in request and response bodies. The body callbacks pause
//! until the end of the body, so the whole body is rewritten at once, then replaced with
//! `set_http_*_body(0, len, new)`.
//!
//! Response trailers, when there are any, get `x-body-rewrite: trailers-seen`.
//!
//! Config: `{"from": "hello", "to": "HELLO"}`.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};
use serde::Deserialize;
use std::rc::Rc;

#[derive(Deserialize)]
struct Config {
    from: String,
    to: String,
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
        Some(Box::new(Rewrite { config: self.config.clone()? }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Rewrite {
    config: Rc<Config>,
}

impl Context for Rewrite {}

impl Rewrite {
    fn rewrite(&self, body: Option<Vec<u8>>) -> Option<Vec<u8>> {
        let text = String::from_utf8(body?).ok()?;
        text.contains(&self.config.from)
            .then(|| text.replace(&self.config.from, &self.config.to).into_bytes())
    }
}

impl HttpContext for Rewrite {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        self.set_http_request_header("content-length", None);
        Action::Continue
    }

    fn on_http_request_body(&mut self, size: usize, eos: bool) -> Action {
        if !eos {
            return Action::Pause;
        }
        if let Some(new) = self.rewrite(self.get_http_request_body(0, size)) {
            self.set_http_request_body(0, size, &new);
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        // The length changes with the body.
        self.set_http_response_header("content-length", None);
        self.set_http_response_header("x-body-rewrite", Some("on"));
        Action::Continue
    }

    fn on_http_response_trailers(&mut self, _: usize) -> Action {
        // Trailers say what happened to the body.
        self.set_http_response_trailer("x-body-rewrite", Some("trailers-seen"));
        Action::Continue
    }

    fn on_http_response_body(&mut self, size: usize, eos: bool) -> Action {
        if !eos {
            return Action::Pause;
        }
        if let Some(new) = self.rewrite(self.get_http_response_body(0, size)) {
            self.set_http_response_body(0, size, &new);
        }
        Action::Continue
    }
}
