//! The guest SDK for gateway plugins (proxy-wasm ABI). Filled in by the Wasm plugin work.
#![deny(missing_docs)]
