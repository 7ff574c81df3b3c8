//! `allow: [CIDR, ...]` and `deny: [CIDR, ...]`: refuse a connection at accept by the client's
//! address (the one from the PROXY protocol header when the stream accepts one). Several
//! entries apply in order, so two `allow` lists both have to admit a client.

use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use super::{ConnectionInfo, Decision, StreamFilter, StreamFilterFactory};

/// Builds `allow` or `deny` filters over one list of networks.
#[derive(Debug, Clone)]
pub struct CidrFilterFactory {
    nets: Arc<[IpNet]>,
    allow: bool,
}

impl CidrFilterFactory {
    /// Only clients in `nets` pass.
    pub fn allow(nets: &[IpNet]) -> Self {
        Self {
            nets: nets.iter().map(IpNet::trunc).collect(),
            allow: true,
        }
    }

    /// Clients in `nets` are refused.
    pub fn deny(nets: &[IpNet]) -> Self {
        Self {
            allow: false,
            ..Self::allow(nets)
        }
    }

    /// Whether `ip` passes.
    pub fn admits(&self, ip: IpAddr) -> bool {
        // An IPv4 client on a dual-stack socket shows up as ::ffff:a.b.c.d.
        let ip = ip.to_canonical();
        self.nets.iter().any(|n| n.contains(&ip)) == self.allow
    }
}

impl StreamFilterFactory for CidrFilterFactory {
    fn name(&self) -> &str {
        if self.allow { "allow" } else { "deny" }
    }

    fn create(&self) -> Box<dyn StreamFilter> {
        Box::new(self.clone())
    }
}

#[async_trait::async_trait]
impl StreamFilter for CidrFilterFactory {
    async fn on_connect(&mut self, info: &ConnectionInfo) -> Decision {
        if self.admits(info.client.ip()) {
            Decision::Continue
        } else {
            Decision::Close
        }
    }
}
