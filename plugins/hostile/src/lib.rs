//! `hostile`: a plugin that misbehaves on purpose, for the isolation tests. By request path:
//! `/trap` panics (a trap), `/trap-body` panics in the response-body callback, `/oob` passes
//! an out-of-bounds pointer to a host call, `/loop` never returns, `/loop-body` (also under a
//! prefix) and `/loop-response-body` never return from a body callback, `/memory` grows its
//! memory until the limit; anything else gets an `x-hostile: calm` response header.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

unsafe extern "C" {
    fn proxy_log(level: u32, ptr: *const u8, len: usize) -> u32;
}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root) });
}}

struct Root;

impl Context for Root {}

impl RootContext for Root {
    fn create_http_context(&self, _: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Hostile {
            trap_body: false,
            loop_body: false,
            loop_response_body: false,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Hostile {
    trap_body: bool,
    loop_body: bool,
    loop_response_body: bool,
}

fn spin() -> ! {
    let mut n: u64 = 0;
    loop {
        n = std::hint::black_box(n.wrapping_add(1));
    }
}

impl Context for Hostile {}

impl HttpContext for Hostile {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        let path = self.get_http_request_header(":path").unwrap_or_default();
        match path.as_str() {
            "/trap" => panic!("hostile plugin: trap requested"),
            "/trap-body" => self.trap_body = true,
            "/oob" => {
                // A pointer far past the end of linear memory.
                unsafe { proxy_log(2, 0xFFFF_FF00usize as *const u8, 4096) };
            }
            "/loop" => spin(),
            "/memory" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                for _ in 0..4096 {
                    hoard.push(std::hint::black_box(vec![1u8; 1 << 20]));
                }
                std::hint::black_box(&hoard);
            }
            // Also behind a proxy route's prefix, which forwards the body.
            p if p.ends_with("/loop-body") => self.loop_body = true,
            "/loop-response-body" => self.loop_response_body = true,
            _ => {}
        }
        Action::Continue
    }

    fn on_http_request_body(&mut self, _: usize, _: bool) -> Action {
        if self.loop_body {
            spin();
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        self.set_http_response_header("x-hostile", Some("calm"));
        Action::Continue
    }

    fn on_http_response_body(&mut self, _: usize, _: bool) -> Action {
        if self.trap_body {
            panic!("hostile plugin: trap in the body requested");
        }
        if self.loop_response_body {
            spin();
        }
        Action::Continue
    }
}
