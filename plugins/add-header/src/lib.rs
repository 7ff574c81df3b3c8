//! `add-header`: sets one header on every request and response. Written against the upstream
//! `proxy-wasm` crate, unchanged from how it would run in Envoy.
//!
//! Config (JSON): `{"name": "x-powered-by", "value": "gateway"}`; `request_name` and
//! `response_name` override the name per direction.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};
use serde::Deserialize;
use std::rc::Rc;

#[derive(Deserialize, Clone)]
struct Config {
    #[serde(default = "default_name")]
    name: String,
    #[serde(default = "default_value")]
    value: String,
    request_name: Option<String>,
    response_name: Option<String>,
}

fn default_name() -> String {
    "x-plugin".into()
}
fn default_value() -> String {
    "add-header".into()
}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(Root { config: None })
    });
}}

struct Root {
    config: Option<Rc<Config>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = self.get_plugin_configuration().unwrap_or_default();
        let parsed = if bytes.is_empty() {
            serde_json::from_str("{}")
        } else {
            serde_json::from_slice(&bytes)
        };
        match parsed {
            Ok(c) => {
                self.config = Some(Rc::new(c));
                true
            }
            Err(e) => {
                proxy_wasm::hostcalls::log(LogLevel::Error, &format!("bad config: {e}")).ok();
                false
            }
        }
    }

    fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
        let config = self.config.clone()?;
        Some(Box::new(AddHeader { config }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct AddHeader {
    config: Rc<Config>,
}

impl Context for AddHeader {}

impl HttpContext for AddHeader {
    fn on_http_request_headers(&mut self, _n: usize, _eos: bool) -> Action {
        let c = &self.config;
        let name = c.request_name.as_deref().unwrap_or(&c.name);
        self.set_http_request_header(name, Some(&c.value));
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _n: usize, _eos: bool) -> Action {
        let c = &self.config;
        let name = c.response_name.as_deref().unwrap_or(&c.name);
        self.set_http_response_header(name, Some(&c.value));
        Action::Continue
    }
}
