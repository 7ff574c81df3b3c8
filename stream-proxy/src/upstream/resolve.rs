//! Host-name targets. A target written as a name (`users.internal:9001`) stands for every
//! address the name has: each becomes a target of its own with the entry's weight. Names are
//! looked up when a set is built and on each [`super::Targets::refresh`], through a [`Lookup`]
//! (the system's resolver, or a function a test feeds); a lookup that fails or finds nothing
//! keeps the addresses the name last had.

use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use super::TargetSpec;

/// Looks up a host name's addresses (blocking).
pub type Lookup = Arc<dyn Fn(&str) -> io::Result<Vec<IpAddr>> + Send + Sync>;

/// The system's resolver (`getaddrinfo`: `/etc/hosts`, then DNS).
pub fn system() -> Lookup {
    Arc::new(|host| Ok((host, 0).to_socket_addrs()?.map(|a| a.ip()).collect()))
}

/// A configured target and, for a name, what it last resolved to.
pub(super) enum Entry {
    /// Written as an address.
    Fixed(TargetSpec),
    /// Written as a name.
    Name {
        authority: String,
        host: String,
        port: u16,
        weight: u32,
        /// The addresses of the last lookup that found any, sorted.
        last: Vec<SocketAddr>,
    },
}

impl Entry {
    pub(super) fn fixed(spec: &TargetSpec) -> Self {
        Self::Fixed(spec.clone())
    }

    pub(super) fn from_config(t: &gateway_config::Target) -> Self {
        match t.addr {
            Some(addr) => Self::Fixed(TargetSpec::new(&t.authority, addr, t.weight)),
            None => Self::Name {
                authority: t.authority.clone(),
                host: t.host.clone(),
                port: t.port,
                weight: t.weight,
                last: Vec::new(),
            },
        }
    }

    /// Looks the name up again; `Err` (with the addresses kept) when the lookup failed or found
    /// none.
    pub(super) fn resolve(&mut self, lookup: &Lookup) -> Result<(), String> {
        let Self::Name {
            host, port, last, ..
        } = self
        else {
            return Ok(());
        };
        let mut found: Vec<SocketAddr> = lookup(host)
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|ip| SocketAddr::new(ip, *port))
            .collect();
        if found.is_empty() {
            return Err("the name has no address".into());
        }
        found.sort();
        found.dedup();
        *last = found;
        Ok(())
    }

    /// The targets the entry stands for now.
    pub(super) fn specs(&self) -> Vec<TargetSpec> {
        match self {
            Self::Fixed(spec) => vec![spec.clone()],
            Self::Name {
                authority,
                weight,
                last,
                ..
            } => last
                .iter()
                .map(|addr| TargetSpec::resolved(authority, *addr, *weight))
                .collect(),
        }
    }

    /// Whether the entry is written as an address (it never changes).
    pub(super) fn is_fixed(&self) -> bool {
        matches!(self, Self::Fixed(_))
    }

    /// `host:port` as written.
    pub(super) fn authority(&self) -> &str {
        match self {
            Self::Fixed(spec) => &spec.authority,
            Self::Name { authority, .. } => authority,
        }
    }

    /// The addresses the entry has now.
    pub(super) fn addresses(&self) -> usize {
        match self {
            Self::Fixed(_) => 1,
            Self::Name { last, .. } => last.len(),
        }
    }
}
