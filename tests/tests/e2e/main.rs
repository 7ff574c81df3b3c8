//! One end-to-end test binary (one link step) with a module per area.

mod acme;
mod cli;
mod cluster;
mod core;
mod h3;
mod observability;
mod otel;
mod otel_metrics;
mod proxy;
mod proxy_grpc;
mod proxy_http;
mod proxy_stream;
mod proxy_ws;
mod rate_limit;
mod reload;
mod static_files;
mod streams;
mod tls;
mod waf;
mod wasm;
mod wasm_auth;
mod wasm_isolation;
mod wasm_plugins;
mod wasm_reload;
