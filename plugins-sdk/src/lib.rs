//! `gateway-plugin-sdk`: write gateway filter plugins in Rust, compiled to `wasm32-wasip1`.
//!
//! The SDK is a small, typed layer over the proxy-wasm ABI 0.2.1 (it runs on the upstream
//! `proxy-wasm` crate's dispatcher, so plugins behave exactly like upstream-SDK plugins). Its
//! [`Filter`] trait mirrors the gateway's native `HttpFilter`: a request phase, a response
//! phase, bodies, a log phase, each returning a [`Flow`] (continue, pause, or a local
//! [`Reply`]). The configuration is a typed struct deserialised from the plugin's JSON config.
//!
//! ```ignore
//! use gateway_plugin_sdk::{Filter, Flow, Reply, Request};
//!
//! #[derive(serde::Deserialize)]
//! struct Config { header: String }
//!
//! struct RequireHeader(std::rc::Rc<Config>);
//!
//! impl Filter for RequireHeader {
//!     type Config = Config;
//!     fn create(config: &std::rc::Rc<Config>) -> Self { Self(config.clone()) }
//!     fn on_request(&mut self, req: &mut Request) -> Flow {
//!         match req.header(&self.0.header) {
//!             Some(_) => Flow::Continue,
//!             None => Flow::Reply(Reply::new(400).body("missing header\n")),
//!         }
//!     }
//! }
//!
//! gateway_plugin_sdk::export_filter!(RequireHeader);
//! ```
//!
//! The guest API ([`Filter`], [`Request`], [`Response`], [`Body`], [`shared`], [`http_call`],
//! [`log`]) exists when compiling for `wasm32`. The `harness` feature (host side, any target)
//! adds [`harness`]: it loads a built `.wasm` into the gateway's own proxy-wasm host and drives
//! it with requests, for unit tests without a gateway.
#![deny(missing_docs)]

mod reply;

pub use reply::Reply;

#[cfg(target_arch = "wasm32")]
mod guest;
#[cfg(target_arch = "wasm32")]
pub use guest::*;

#[cfg(feature = "harness")]
pub mod harness;

/// What a phase decided.
#[derive(Debug)]
#[must_use]
pub enum Flow {
    /// Go on.
    Continue,
    /// Stop until resumed: from a header phase, until an [`http_call`] answer's
    /// `on_call_response` returns `Continue`; from a body phase, buffer until the end of the
    /// body.
    Pause,
    /// End the request with this response.
    Reply(Reply),
}
