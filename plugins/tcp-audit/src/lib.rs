//! `tcp-audit`: a network (L4) filter. It counts bytes in each direction, logs a line per
//! connection when it closes, keeps process-wide totals in shared data
//! (`tcp-audit/connections`, `tcp-audit/bytes_in`, `tcp-audit/bytes_out`, as decimal text),
//! and closes connections whose client data contains a configured pattern.
//!
//! Config: `{"block": "DROP TABLE"}` (optional).

use proxy_wasm::traits::{Context, RootContext, StreamContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, PeerType};
use serde::Deserialize;
use std::rc::Rc;

#[derive(Deserialize, Default)]
struct Config {
    block: Option<String>,
}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { config: Rc::default() }) });
}}

struct Root {
    config: Rc<Config>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _: usize) -> bool {
        let bytes = self.get_plugin_configuration().unwrap_or_default();
        if !bytes.is_empty() {
            match serde_json::from_slice(&bytes) {
                Ok(c) => self.config = Rc::new(c),
                Err(_) => return false,
            }
        }
        true
    }

    fn create_stream_context(&self, _: u32) -> Option<Box<dyn StreamContext>> {
        Some(Box::new(Audit { config: self.config.clone(), bytes_in: 0, bytes_out: 0 }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::StreamContext)
    }
}

struct Audit {
    config: Rc<Config>,
    bytes_in: u64,
    bytes_out: u64,
}

impl Context for Audit {}

impl Audit {
    fn add(&self, key: &str, n: u64) {
        for _ in 0..100 {
            let (v, cas) = self.get_shared_data(key);
            let cur: u64 = v
                .and_then(|v| String::from_utf8(v).ok())
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            if self.set_shared_data(key, Some((cur + n).to_string().as_bytes()), cas).is_ok() {
                return;
            }
        }
    }
}

impl StreamContext for Audit {
    fn on_new_connection(&mut self) -> Action {
        self.add("tcp-audit/connections", 1);
        Action::Continue
    }

    fn on_downstream_data(&mut self, size: usize, _eos: bool) -> Action {
        self.bytes_in += size as u64;
        if let (Some(block), Some(data)) = (&self.config.block, self.get_downstream_data(0, size)) {
            if data.windows(block.len()).any(|w| w == block.as_bytes()) {
                proxy_wasm::hostcalls::log(LogLevel::Warn, "blocked pattern; closing").ok();
                proxy_wasm::hostcalls::close_downstream().ok();
            }
        }
        Action::Continue
    }

    fn on_upstream_data(&mut self, size: usize, _eos: bool) -> Action {
        self.bytes_out += size as u64;
        Action::Continue
    }

    fn on_downstream_close(&mut self, _peer: PeerType) {}

    fn on_log(&mut self) {
        self.add("tcp-audit/bytes_in", self.bytes_in);
        self.add("tcp-audit/bytes_out", self.bytes_out);
        let line = format!("connection closed: in={} out={}", self.bytes_in, self.bytes_out);
        proxy_wasm::hostcalls::log(LogLevel::Info, &line).ok();
    }
}
