//! L4 streams (TCP and UDP passthrough) and the upstream target selection shared with the HTTP
//! reverse proxy.
//!
//! * [`upstream`]: balancers, health state and counters per target, used by both the HTTP
//!   proxy and the streams.
//! * [`CompiledStreams`]: a generation's `streams:` section, built with a [`Resolver`] the
//!   gateway supplies (the generation's shared upstream targets, and factories for `plugin:`
//!   filters, which are proxy-wasm network filters living in the gateway).
//! * [`StreamServer`]: binds the streams, swaps generations on reload, drains on shutdown.
//! * The pieces, usable on their own: [`sni`] (ClientHello parser and SNI routing table),
//!   [`proxy_protocol`] (v1/v2 parser and writers), [`filter`] (the [`StreamFilter`] trait and
//!   the native `allow`, `deny` and `connection_rate` filters), [`relay`] (splice, buffered and
//!   filtered copying with half-close), [`StreamStats`] (per-stream counters), [`clock`] (the
//!   coarse clock that stamps activity, here and in the gateway's HTTP connections),
//!   [`log_ids`] (the span ids a filter names for a connection's log lines).
//!
//! The life of a TCP connection is described in `tcp.rs` (its idle deadline and drain stop in
//! `watchdog.rs`); UDP sessions in `udp/mod.rs`.

pub mod clock;
mod compiled;
mod connect;
mod error;
pub mod filter;
mod hooks;
mod listener;
pub mod log_ids;
mod peek;
pub mod proxy_protocol;
pub mod relay;
mod rewind;
mod server;
pub mod sni;
mod stats;
mod tcp;
mod udp;
pub mod upstream;
pub mod watchdog;

pub use compiled::{CompiledStream, CompiledStreams, Resolver, StreamUpstream};
pub use error::StreamError;
pub use filter::{CloseSummary, ConnectionInfo, Decision, StreamFilter, StreamFilterFactory};
pub use hooks::{ConnectionHooks, set_connection_hooks};
pub use listener::{accepted_local, accepted_nodelay, bind_tcp};
pub use rewind::Rewind;
pub use server::{PreparedStreams, StreamServer};
pub use stats::{StreamStats, StreamStatsSnapshot};
pub use udp::MAX_DATAGRAM;
