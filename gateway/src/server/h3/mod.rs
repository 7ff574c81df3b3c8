//! HTTP/3 over QUIC for listeners whose `protocols` include `http3`. The listener also binds
//! UDP on its port; quinn runs QUIC (TLS 1.3 from the listener's certificates, ALPN `h3`) and h3
//! the HTTP layer. Every request goes through the same [`crate::server::service::ConnService`] as
//! HTTP/1.1 and HTTP/2, so routes, filters, terminals, metrics and the access log are shared.
//!
//! * `endpoint`: the quinn endpoint, transport settings, accept loop and connection cap;
//! * `conn`: one connection: handshake, request streams, 0-RTT policy, GOAWAY drain;
//! * `body`: request bodies in, responses out;
//! * `quic`: h3's QUIC traits over quinn (delivery-aware finish, 0-RTT stream marks).

mod body;
mod conn;
mod endpoint;
mod quic;

use std::sync::Arc;

use gateway_config::{Config, Listener};
use http::HeaderValue;

pub use endpoint::{H3Runtime, QuicListener, bind_udp};

use super::listeners::ListenerContext;
use super::tls::{self, CertSet};
use crate::error::GatewayError;
use crate::telemetry::ListenerMetrics;

/// The quinn config and connection settings of listener `index` (an `http3` listener).
pub fn prepare(
    config: &Config,
    index: usize,
    l: &Listener,
    certs: &CertSet,
    cx: &ListenerContext,
) -> Result<(quinn::ServerConfig, Arc<H3Runtime>), GatewayError> {
    let key = format!("listeners[{index}]");
    let tls = tls::quic_server_config(config, index, l, certs)?
        .ok_or_else(|| config.error(format!("{key}.protocols"), "http3 requires `tls`"))?;
    let settings = &l.settings;
    let quinn = endpoint::server_config(tls, &settings.http3, settings.idle_timeout.get())
        .map_err(|m| config.error(format!("{key}.http3"), m))?;
    let runtime = H3Runtime {
        name: Arc::from(l.name.as_str()),
        metrics: ListenerMetrics::quic(&cx.telemetry.registry, &l.name),
        service: Arc::new(crate::server::service::ServiceSettings {
            generation: cx.generation.clone(),
            policy: Arc::new(crate::server::policy::ListenerPolicy::new(
                l,
                &cx.telemetry.registry,
            )),
            // Flow control and QUIC's idle timeout bound a stalled stream here.
            body_read_timeout: None,
            telemetry: cx.telemetry.clone(),
            // HTTP/3 responses need no pointer to HTTP/3.
            alt_svc: None,
            // ACME validates HTTP-01 over plain HTTP/1.1 only.
            http01: None,
        }),
        max_field_section: settings.max_header_size.bytes(),
        handshake_timeout: settings.header_read_timeout.get(),
        early_data: settings.http3.enable_0rtt,
        max_connections: settings
            .http3
            .max_connections
            .unwrap_or(settings.max_connections),
    };
    Ok((quinn, Arc::new(runtime)))
}

/// The `Alt-Svc` value the TCP side of a listener advertises when HTTP/3 is on `port`: same
/// host, a day's validity (what browsers cache it for). Built once per listener and reload.
pub fn alt_svc(port: u16) -> HeaderValue {
    // Digits and ASCII always make a valid value; `clear` (no alternative) is the safe fallback.
    HeaderValue::try_from(format!("h3=\":{port}\"; ma=86400"))
        .unwrap_or_else(|_| HeaderValue::from_static("clear"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn alt_svc_names_the_udp_port_for_a_day() {
        assert_eq!(super::alt_svc(8443), "h3=\":8443\"; ma=86400");
    }
}
