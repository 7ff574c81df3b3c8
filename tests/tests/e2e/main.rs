//! One end-to-end test binary (one link step) with a module per area.

mod cli;
mod core;
mod proxy;
mod proxy_grpc;
mod proxy_http;
mod proxy_stream;
mod proxy_ws;
mod static_files;
mod tls;
