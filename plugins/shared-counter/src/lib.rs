//! `shared-counter`: counts requests in shared data (one key for the whole process, so every
//! worker's VM adds to the same count) with a compare-and-swap loop, and reports the count in
//! `x-request-count`. Also defines a counter metric, `shared_counter_requests`.

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MetricType, Status};

const KEY: &str = "shared-counter/requests";

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { metric: 0 }) });
}}

struct Root {
    metric: u32,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_vm_start(&mut self, _: usize) -> bool {
        self.metric = hostcalls::define_metric(MetricType::Counter, "shared_counter_requests")
            .unwrap_or(0);
        true
    }

    fn create_http_context(&self, _: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Count { metric: self.metric }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Count {
    metric: u32,
}

impl Context for Count {}

impl Count {
    /// Adds one, retrying when another VM wrote in between.
    fn increment(&self) -> u64 {
        for _ in 0..100 {
            let (value, cas) = self.get_shared_data(KEY);
            let n = value
                .and_then(|v| v.try_into().ok())
                .map(u64::from_le_bytes)
                .unwrap_or(0)
                + 1;
            match self.set_shared_data(KEY, Some(&n.to_le_bytes()), cas) {
                Ok(()) => return n,
                Err(Status::CasMismatch) => continue,
                Err(_) => return 0,
            }
        }
        0
    }
}

impl HttpContext for Count {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        let n = self.increment();
        if self.metric != 0 {
            let _ = hostcalls::increment_metric(self.metric, 1);
        }
        self.set_http_request_header("x-request-count", Some(&n.to_string()));
        self.add_http_response_header("x-request-count", &n.to_string());
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        let n = self.get_http_request_header("x-request-count").unwrap_or_default();
        self.set_http_response_header("x-request-count", Some(&n));
        Action::Continue
    }
}
