//! `tick`: a timer. The root context asks for a tick every `period_ms` (config) and counts
//! ticks in shared data; requests get the count in `x-ticks`.

use std::time::Duration;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};
use serde::Deserialize;

const KEY: &str = "tick/ticks";

#[derive(Deserialize)]
struct Config {
    #[serde(default = "period")]
    period_ms: u64,
}

fn period() -> u64 {
    50
}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root) });
}}

struct Root;

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _: usize) -> bool {
        let bytes = self.get_plugin_configuration().unwrap_or_default();
        let config: Config = serde_json::from_slice(&bytes).unwrap_or(Config { period_ms: 50 });
        self.set_tick_period(Duration::from_millis(config.period_ms));
        true
    }

    fn on_tick(&mut self) {
        loop {
            let (value, cas) = self.get_shared_data(KEY);
            let n = value
                .and_then(|v| v.try_into().ok())
                .map(u64::from_le_bytes)
                .unwrap_or(0)
                + 1;
            if self.set_shared_data(KEY, Some(&n.to_le_bytes()), cas).is_ok() {
                break;
            }
        }
    }

    fn create_http_context(&self, _: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Ticks))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Ticks;

impl Context for Ticks {}

impl HttpContext for Ticks {
    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        let n = self
            .get_shared_data(KEY)
            .0
            .and_then(|v| v.try_into().ok())
            .map(u64::from_le_bytes)
            .unwrap_or(0);
        self.set_http_response_header("x-ticks", Some(&n.to_string()));
        Action::Continue
    }
}
