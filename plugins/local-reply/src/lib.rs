//! `local-reply`: answers requests whose path starts with a configured prefix itself, with a
//! configured status, body and header; other requests pass.
//!
//! Config: `{"prefix": "/blocked", "status": 418, "body": "no tea here"}`.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};
use serde::Deserialize;
use std::rc::Rc;

#[derive(Deserialize)]
struct Config {
    prefix: String,
    #[serde(default = "teapot")]
    status: u32,
    #[serde(default)]
    body: String,
}

fn teapot() -> u32 {
    418
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
        Some(Box::new(Reply { config: self.config.clone()? }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Reply {
    config: Rc<Config>,
}

impl Context for Reply {}

impl HttpContext for Reply {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        let path = self.get_http_request_header(":path").unwrap_or_default();
        if !path.starts_with(&self.config.prefix) {
            return Action::Continue;
        }
        self.send_http_response(
            self.config.status,
            vec![("x-local-reply", "yes"), ("content-type", "text/plain")],
            Some(self.config.body.as_bytes()),
        );
        Action::Pause
    }
}
