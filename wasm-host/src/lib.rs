//! The proxy-wasm host: runs plugins built for ABI 0.2.1 (and 0.2.0 / 0.1.0 guests) on
//! wasmtime, for the gateway and for the plugin SDK's test harness.
//!
//! * [`HostEngine`]: one engine per process, an epoch ticker thread (time limits), the pooling
//!   allocator when available, a compile cache by sha256.
//! * [`CompiledPlugin`]: a module linked against every host call (`abi/`), ready to
//!   instantiate; [`Vm`]: one instance with its root context and the contexts it serves.
//! * [`Shared`]: process-wide shared data (with CAS), queues and the [`Metrics`] registry.
//!
//! The host never blocks and never spawns: a guest call returns its [`Effects`] (continue,
//! local reply, HTTP calls to make) and the embedder applies them after the call, so the
//! crate needs no async runtime. Hostile guests cannot panic it: bad pointers, traps, runaway
//! loops and memory growth past the cap become a [`PluginError`] and the VM is marked failed.

mod abi;
mod cpu;
mod disk_cache;
pub mod engine;
pub mod error;
mod exports;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod metrics;
mod names;
pub mod plugin;
pub mod shared;
mod start;
pub mod state;
mod ticker;
pub mod vm;

pub use engine::HostEngine;
pub use error::PluginError;
pub use metrics::{Callback, Metrics, PluginStats};
pub use plugin::{AbiVersion, CompiledPlugin};
pub use shared::Shared;
pub use state::{
    Effect, Effects, HttpCallOut, HttpCallResponse, HttpStream, Limits, LocalResponse, NetStream,
    PluginInfo, StreamInfo, StreamType,
};
pub use vm::{Action, Peer, ROOT_ID, Vm};

/// Splices `data` into `buf` (replaces `size` bytes at `start`; past the end appends), with the
/// same rules as `proxy_set_buffer_bytes`.
pub fn splice(buf: &mut bytes::BytesMut, start: usize, size: usize, data: &[u8]) {
    abi::splice(buf, start, size, data);
}
