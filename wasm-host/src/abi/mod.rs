//! The host functions, grouped by area. [`linker`] registers all 39 proxy-wasm 0.2.1 calls
//! (plus the 0.1.0 spellings some older guests import) and the WASI preview 1 subset under both
//! module names. Statuses returned are only those the Rust SDK accepts for each call
//! (see `docs/plugins.md`, "ABI coverage").

mod buffers;
mod context;
mod headers;
mod http_call;
pub(crate) mod logging;
pub(crate) mod memory;
mod metrics;
mod properties;
mod shared;
mod timers;
mod wasi;

use wasmtime::{Engine, Linker};

use crate::state::HostState;

pub(crate) const OK: u32 = 0;
pub(crate) const NOT_FOUND: u32 = 1;
pub(crate) const BAD_ARGUMENT: u32 = 2;
pub(crate) const EMPTY: u32 = 7;
pub(crate) const CAS_MISMATCH: u32 = 8;
pub(crate) const INTERNAL_FAILURE: u32 = 10;

/// A linker with every host function; clone it per module to add the unknown-import traps.
pub(crate) fn linker(engine: &Engine) -> wasmtime::Result<Linker<HostState>> {
    let mut l = Linker::new(engine);
    logging::link(&mut l)?;
    context::link(&mut l)?;
    headers::link(&mut l)?;
    buffers::link(&mut l)?;
    properties::link(&mut l)?;
    shared::link(&mut l)?;
    timers::link(&mut l)?;
    metrics::link(&mut l)?;
    http_call::link(&mut l)?;
    wasi::link(&mut l)?;
    Ok(l)
}

pub(crate) use buffers::splice;
