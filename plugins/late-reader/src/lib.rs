//! `late-reader`: a test plugin that reads the request head in every callback after the
//! request-header one, as logging and metrics plugins do: the request body, response head,
//! response body and log callbacks each record what they read (`:path`, the `x-tag` header and
//! the `request.path` property) in shared data, and the next response reports the records in
//! `x-late-*` headers. The response-head callback also overwrites `x-tag` and reads it back,
//! and reports both readings in `x-late-response-head`, the `route_name` property in
//! `x-late-route`, and the `jwt.claims.sub` property (set by a `jwt` filter) in
//! `x-late-jwt-sub`.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

/// The callbacks whose readings are kept, with the response header that reports each.
const RECORDED: [(&str, &str); 3] = [
    ("late-reader/request-body", "x-late-request-body"),
    ("late-reader/response-body", "x-late-response-body"),
    ("late-reader/log", "x-late-log"),
];

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root) });
}}

struct Root;

impl Context for Root {}

impl RootContext for Root {
    fn create_http_context(&self, _: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Reader))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Reader;

impl Context for Reader {}

impl Reader {
    /// What this callback sees of the request: `:path x-tag request.path`.
    fn reading(&self) -> String {
        let path = self.get_http_request_header(":path").unwrap_or_default();
        let tag = self.get_http_request_header("x-tag").unwrap_or_default();
        let property = self
            .get_property(vec!["request", "path"])
            .and_then(|v| String::from_utf8(v).ok())
            .unwrap_or_default();
        format!("{path} {tag} {property}")
    }

    fn record(&self, key: &str) {
        let _ = self.set_shared_data(key, Some(self.reading().as_bytes()), None);
    }
}

impl HttpContext for Reader {
    fn on_http_request_body(&mut self, _: usize, eos: bool) -> Action {
        if eos {
            self.record(RECORDED[0].0);
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        let before = self.reading();
        self.set_http_request_header("x-tag", Some("rewritten"));
        let after = self.reading();
        self.set_http_response_header("x-late-response-head", Some(&format!("{before}; {after}")));
        let route = self.get_property(vec!["route_name"]).unwrap_or_default();
        self.set_http_response_header("x-late-route", Some(&String::from_utf8_lossy(&route)));
        // A `jwt` filter's verified claims, when one ran before this plugin.
        if let Some(sub) = self.get_property(vec!["jwt", "claims", "sub"]) {
            self.set_http_response_header("x-late-jwt-sub", Some(&String::from_utf8_lossy(&sub)));
        }
        for (key, header) in RECORDED {
            if let (Some(v), _) = self.get_shared_data(key) {
                self.set_http_response_header(header, Some(&String::from_utf8_lossy(&v)));
            }
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, _: usize, eos: bool) -> Action {
        if eos {
            self.record(RECORDED[1].0);
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        self.record(RECORDED[2].0);
    }
}
