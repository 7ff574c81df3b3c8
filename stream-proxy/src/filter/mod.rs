//! The stream filter contract. A stream holds filter *factories* built once per config
//! generation; each connection (TCP) or session (UDP) gets fresh *instances* that own their
//! per-connection state. Every hook is async and returns a [`Decision`].
//!
//! Hook order on a TCP connection: `on_connect` (in order, before SNI peeking or any upstream
//! work; the first `Close` refuses the connection), then `on_downstream_data` for client bytes
//! (in order) and `on_upstream_data` for upstream bytes (reverse order), each with
//! `end_of_stream` on the last call of its direction, then `on_close` (in order) once. UDP
//! sessions get `on_connect` and `on_close` only; data filters are a TCP feature.
//!
//! The gateway plugs proxy-wasm network filters in through [`StreamFilterFactory`] (this crate
//! does not know wasmtime): see [`crate::Resolver::plugin`].

mod cidr;
mod rate;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use gateway_config::model::StreamProtocol;

use crate::StreamError;

pub use cidr::CidrFilterFactory;
pub use rate::{ConnectionRate, ConnectionRateFactory, MAX_TRACKED};

/// What a hook decided.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Go on.
    Continue,
    /// Close the connection (both directions) now; from `on_connect`, refuse it.
    Close,
}

/// Facts about one connection or UDP session.
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    /// Stream name.
    pub stream: Arc<str>,
    /// TCP or UDP.
    pub protocol: StreamProtocol,
    /// The client (from the PROXY protocol header when the stream accepts one).
    pub client: SocketAddr,
    /// The socket's peer (the front load balancer when the PROXY protocol is used).
    pub peer: SocketAddr,
    /// The address the client connected to.
    pub local: SocketAddr,
}

/// How a connection ended, for `on_close`.
#[derive(Debug, Clone, Default)]
pub struct CloseSummary {
    /// Bytes from the client to the upstream.
    pub bytes_in: u64,
    /// Bytes from the upstream to the client.
    pub bytes_out: u64,
    /// The target connected to, if any.
    pub target: Option<SocketAddr>,
    /// The TLS server name, when SNI routing read one.
    pub sni: Option<String>,
    /// How long the connection lasted.
    pub duration: Duration,
    /// Why it ended abnormally (`None`: both sides closed).
    pub error: Option<String>,
}

/// One filter's view of one connection.
#[async_trait::async_trait]
pub trait StreamFilter: Send {
    /// A connection was accepted (after the PROXY protocol header, before anything else).
    async fn on_connect(&mut self, _info: &ConnectionInfo) -> Decision {
        Decision::Continue
    }

    /// Bytes from the client, before they go upstream. The filter may change, drain (to
    /// buffer and emit later) or extend `data`; what it leaves is forwarded.
    async fn on_downstream_data(&mut self, _data: &mut BytesMut, _end_of_stream: bool) -> Decision {
        Decision::Continue
    }

    /// Bytes from the upstream, before they go to the client; as `on_downstream_data`.
    async fn on_upstream_data(&mut self, _data: &mut BytesMut, _end_of_stream: bool) -> Decision {
        Decision::Continue
    }

    /// The connection ended (also after a refusal by this or another filter).
    async fn on_close(&mut self, _info: &ConnectionInfo, _summary: &CloseSummary) {}

    /// The ids the connection's log lines carry from here on (the gateway's observer names its
    /// span's), asked once after every `on_connect` let the connection in.
    fn log_ids(&self) -> Option<crate::log_ids::LogIds> {
        None
    }
}

/// Builds one filter instance per connection; created once per config generation.
pub trait StreamFilterFactory: Send + Sync + 'static {
    /// Name used in logs and counters.
    fn name(&self) -> &str;
    /// A fresh instance for one connection.
    fn create(&self) -> Box<dyn StreamFilter>;
    /// Whether the instances have data hooks. When no filter of a stream does, its bytes are
    /// relayed without passing through userspace buffers (splice) where possible.
    fn inspects_data(&self) -> bool {
        false
    }
}

/// A stream's filter factories, in config order.
#[derive(Clone, Default)]
pub struct FilterChain {
    factories: Arc<[Arc<dyn StreamFilterFactory>]>,
    inspects_data: bool,
}

impl std::fmt::Debug for FilterChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.factories.iter().map(|x| x.name()))
            .finish()
    }
}

impl FilterChain {
    /// A chain of `factories`, in order.
    pub fn new(factories: Vec<Arc<dyn StreamFilterFactory>>) -> Self {
        let inspects_data = factories.iter().any(|f| f.inspects_data());
        Self {
            factories: factories.into(),
            inspects_data,
        }
    }

    /// Whether any filter has data hooks.
    pub fn inspects_data(&self) -> bool {
        self.inspects_data
    }

    /// Creates the instances for one connection and runs `on_connect`. `Err` carries the
    /// refusing filter's name, after every instance created so far got `on_close`.
    pub async fn connect(&self, info: &ConnectionInfo) -> Result<ActiveFilters, String> {
        let mut active = ActiveFilters {
            filters: Vec::with_capacity(self.factories.len()),
        };
        for factory in self.factories.iter() {
            let mut filter = factory.create();
            let decision = filter.on_connect(info).await;
            active.filters.push((factory.clone(), filter));
            if decision == Decision::Close {
                let summary = CloseSummary {
                    error: Some(format!("refused by filter `{}`", factory.name())),
                    ..CloseSummary::default()
                };
                active.close(info, &summary).await;
                return Err(factory.name().to_owned());
            }
        }
        Ok(active)
    }
}

/// A connection's filter instances, each with its factory (for its name).
pub struct ActiveFilters {
    filters: Vec<(Arc<dyn StreamFilterFactory>, Box<dyn StreamFilter>)>,
}

impl ActiveFilters {
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.filters.is_empty()
    }

    /// Client bytes through every filter, in order; `Err` names the filter that closed.
    pub async fn downstream(&mut self, data: &mut BytesMut, eos: bool) -> Result<(), StreamError> {
        for (factory, f) in self.filters.iter_mut() {
            if f.on_downstream_data(data, eos).await == Decision::Close {
                return Err(StreamError::FilterClosed(factory.name().to_owned()));
            }
        }
        Ok(())
    }

    /// Upstream bytes through every filter, in reverse order.
    pub async fn upstream(&mut self, data: &mut BytesMut, eos: bool) -> Result<(), StreamError> {
        for (factory, f) in self.filters.iter_mut().rev() {
            if f.on_upstream_data(data, eos).await == Decision::Close {
                return Err(StreamError::FilterClosed(factory.name().to_owned()));
            }
        }
        Ok(())
    }

    /// The first ids a filter names for the connection's log lines.
    pub fn log_ids(&self) -> Option<crate::log_ids::LogIds> {
        self.filters.iter().find_map(|(_, f)| f.log_ids())
    }

    /// `on_close` on every filter, in order.
    pub async fn close(&mut self, info: &ConnectionInfo, summary: &CloseSummary) {
        for (_, f) in self.filters.iter_mut() {
            f.on_close(info, summary).await;
        }
    }
}

#[cfg(test)]
mod tests;
