//! `streams:`: L4 TCP/UDP relays, their filters and connection rate limits.

use super::*;

/// One entry of `streams:`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamConfig {
    /// Unique name.
    pub name: String,
    /// `ip:port`.
    pub bind: String,
    /// `tcp` or `udp`.
    pub protocol: StreamProtocol,
    /// Upstream (the fallback when `sni_routes` are set).
    pub upstream: Option<String>,
    /// Server name → upstream, from the TLS ClientHello.
    #[serde(default)]
    pub sni_routes: IndexMap<String, String>,
    /// What to do when no SNI route matches and there is no `upstream`, or the stream is not TLS.
    #[serde(default)]
    pub sni_fallback: SniFallback,
    /// PROXY protocol header sent to the upstream.
    #[serde(default)]
    pub proxy_protocol: ProxyProtocolVersion,
    /// Expect a PROXY protocol header from the client side.
    #[serde(default)]
    pub accept_proxy_protocol: bool,
    /// Connection (TCP) or session (UDP) idle timeout.
    #[serde(default = "default_stream_idle")]
    pub idle_timeout: Duration,
    /// Cap on concurrent connections (TCP) or sessions (UDP); 0 means unlimited.
    #[serde(default)]
    pub max_connections: usize,
    /// Time allowed for the client's PROXY protocol header (`accept_proxy_protocol`) and TLS
    /// ClientHello (`sni_routes`) to arrive.
    #[serde(default = "default_header_read_timeout")]
    pub header_read_timeout: Duration,
    /// Relay TCP bytes with splice(2) (Linux, no filter inspecting data) instead of copying
    /// them through userspace buffers.
    #[serde(default = "yes")]
    pub zero_copy: bool,
    /// Stream filters, in order (each a single-key map such as `- allow: [...]`).
    #[serde(default, with = "serde_yaml::with::singleton_map_recursive")]
    #[schemars(with = "Vec<StreamFilterConfig>")]
    pub filters: Vec<StreamFilterConfig>,
}

pub(super) fn default_stream_idle() -> Duration {
    Duration::from_secs(600)
}

/// L4 protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StreamProtocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

/// Behaviour when SNI routing finds nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SniFallback {
    /// Use `upstream`, or close when there is none.
    #[default]
    Upstream,
    /// Close the connection.
    Close,
}

/// PROXY protocol version sent upstream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProxyProtocolVersion {
    /// No header.
    #[default]
    None,
    /// Text header.
    V1,
    /// Binary header.
    V2,
}

/// An entry of `streams[].filters`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum StreamFilterConfig {
    /// Only these client networks are accepted.
    Allow(#[schemars(with = "Vec<String>")] Vec<IpNet>),
    /// These client networks are refused.
    Deny(#[schemars(with = "Vec<String>")] Vec<IpNet>),
    /// A proxy-wasm network filter by name.
    Plugin(String),
    /// New connections per client address.
    ConnectionRate(ConnectionRateConfig),
}

/// `connection_rate:` stream filter.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConnectionRateConfig {
    /// Connections allowed per `per` and client address.
    pub connections: u64,
    /// Window.
    pub per: Duration,
    /// Extra connections allowed in a burst.
    #[serde(default)]
    pub burst: u64,
}
