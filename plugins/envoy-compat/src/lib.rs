//! `envoy-compat`: reports what a plugin sees where a host may differ from Envoy (see the
//! README). The plugin configuration is read with the raw host call, so the test sees the
//! host's status and pointer rather than the SDK's reading of them.

use std::cell::RefCell;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

unsafe extern "C" {
    fn proxy_get_buffer_bytes(
        buffer: u32,
        start: usize,
        max: usize,
        ret_ptr: *mut *mut u8,
        ret_len: *mut usize,
    ) -> u32;
}

const PLUGIN_CONFIGURATION: u32 = 7;
const BODY_KEY: &str = "envoy-compat/body";

/// The plugin configuration as read now: `(status, pointer was null, bytes)`.
fn read_config() -> (u32, bool, Vec<u8>) {
    let mut ptr: *mut u8 = std::ptr::null_mut();
    let mut len: usize = 0;
    let status =
        unsafe { proxy_get_buffer_bytes(PLUGIN_CONFIGURATION, 0, u32::MAX as usize, &mut ptr, &mut len) };
    if ptr.is_null() {
        return (status, true, Vec::new());
    }
    // The host allocated it with this module's allocator for us to own.
    let bytes = unsafe { Vec::from_raw_parts(ptr, len, len) };
    (status, false, bytes)
}

thread_local! {
    /// What `proxy_on_configure` read: `(configure size, status, null, bytes)`.
    static CONFIGURED: RefCell<(usize, u32, bool, Vec<u8>)> = const { RefCell::new((0, 99, false, Vec::new())) };
}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root) });
}}

struct Root;

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, size: usize) -> bool {
        let (status, null, bytes) = read_config();
        CONFIGURED.with(|c| *c.borrow_mut() = (size, status, null, bytes));
        true
    }

    fn create_http_context(&self, _: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Compat { body: 0, eos: false }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Compat {
    body: usize,
    eos: bool,
}

impl Context for Compat {}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Compat {
    fn inspect(&self) {
        let (size, status, null, bytes) = CONFIGURED.with(|c| c.borrow().clone());
        let (later_status, later_null, _) = read_config();
        let mut names: Vec<String> = self
            .get_http_request_headers()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        names.sort();
        let authority = self.get_http_request_header(":authority").unwrap_or_default();
        let host = self
            .get_http_request_header("host")
            .unwrap_or_else(|| "(none)".into());
        let seen = self
            .get_shared_data(BODY_KEY)
            .0
            .map(|v| String::from_utf8_lossy(&v).into_owned())
            .unwrap_or_else(|| "(none)".into());
        let headers = vec![
            ("x-config-size", size.to_string()),
            ("x-config-status", status.to_string()),
            ("x-config-null", null.to_string()),
            ("x-config-hex", hex(&bytes)),
            ("x-config-later", format!("{later_status} {later_null}")),
            ("x-names", names.join(",")),
            ("x-authority", authority),
            ("x-host", host),
            ("x-body-seen", seen),
        ];
        let refs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        self.send_http_response(200, refs, Some(b"inspected\n"));
    }
}

impl HttpContext for Compat {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        let path = self.get_http_request_header(":path").unwrap_or_default();
        if path.ends_with("/inspect") {
            self.inspect();
            return Action::Pause;
        }
        if path.contains("/authority/") {
            self.set_http_request_header(":authority", Some("rewritten.example"));
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, size: usize, eos: bool) -> Action {
        self.body += size;
        self.eos |= eos;
        Action::Continue
    }

    fn on_log(&mut self) {
        let path = self.get_http_request_header(":path").unwrap_or_default();
        if path.contains("/body/") {
            let v = format!("{} {}", self.body, self.eos);
            let _ = self.set_shared_data(BODY_KEY, Some(v.as_bytes()), None);
        }
    }
}
