//! The serde form of the YAML file: one struct per section, mirroring the contract in
//! `gateway.example.yaml`. These types are strict about unknown keys and permissive about
//! defaults; cross-references (upstream names, certificates, plugins, WAF policies) are checked
//! later by [`crate::validate`], which turns this form into the runtime [`crate::Config`].

mod cluster;
mod filters;
mod listeners;
mod plugins;
mod routes;
mod server;
mod streams;
mod terminals;
mod upstreams;

use std::path::PathBuf;

use indexmap::IndexMap;
use ipnet::IpNet;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::units::{ByteSize, Duration};

pub use cluster::*;
pub use filters::*;
pub use listeners::*;
pub use plugins::*;
pub use routes::*;
pub use server::*;
pub use streams::*;
pub use terminals::*;
pub use upstreams::*;

/// The whole file.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// Process-wide settings (drain timeout, worker threads).
    #[serde(default)]
    pub server: ServerSettings,
    /// The admin API; off when absent.
    pub admin: Option<AdminConfig>,
    /// Traces and access logs.
    pub telemetry: Option<TelemetryConfig>,
    /// Named certificate/key pairs.
    #[serde(default)]
    pub certificates: IndexMap<String, CertificateConfig>,
    /// HTTP listeners.
    #[serde(default)]
    pub listeners: Vec<ListenerConfig>,
    /// Named upstream pools.
    #[serde(default)]
    pub upstreams: IndexMap<String, UpstreamConfig>,
    /// Named proxy-wasm plugins.
    #[serde(default)]
    pub plugins: IndexMap<String, PluginConfig>,
    /// Named WAF policies.
    #[serde(default)]
    pub waf: IndexMap<String, WafPolicyConfig>,
    /// Named HTTP response caches, used by the `cache` filter.
    #[serde(default)]
    pub caches: IndexMap<String, CacheStoreConfig>,
    /// HTTP routes, first match wins.
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    /// L4 TCP/UDP streams.
    #[serde(default)]
    pub streams: Vec<StreamConfig>,
    /// State shared with other gateway instances through Redis; everything is local when absent.
    pub cluster: Option<ClusterConfig>,
    /// Routes taken from a Kubernetes cluster's Gateway API objects; off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesConfig>,
}

impl RawConfig {
    /// Adds the listeners, certificates, upstreams, routes and streams of `other` (made by the
    /// Kubernetes controller) to this file's own: its routes go first, so that the cluster's
    /// hostnames and paths are matched on its listeners before the file's catch-alls.
    pub fn merge(&mut self, other: &RawConfig) {
        self.listeners.extend(other.listeners.iter().cloned());
        for (name, cert) in &other.certificates {
            self.certificates.insert(name.clone(), cert.clone());
        }
        for (name, upstream) in &other.upstreams {
            self.upstreams.insert(name.clone(), upstream.clone());
        }
        let own = std::mem::take(&mut self.routes);
        self.routes = other.routes.iter().cloned().chain(own).collect();
        self.streams.extend(other.streams.iter().cloned());
    }
}
