//! Pingora as a peer of the side-by-side harness (benches/harness): the routes the other peers
//! serve for the proxy scenarios, on one plain HTTP/1.1 listener, one worker thread.
//!
//!   /api...    the API route: a local rate limit keyed by client IP that refuses nothing, then
//!              the proxy with header edits both ways (set `X-Api-Version`, remove `X-Debug`
//!              on the way up; add `X-Content-Type-Options`, hide `X-Powered-By` on the way
//!              down)
//!   /proxy...  the bare route: the proxy alone
//!
//! Both add the forwarding fields the gateway adds by default (X-Forwarded-For/-Proto/-Host,
//! Forwarded, Via both ways), as every peer's config does, so all do the same work.
//!
//!   pingora-proxy-peer LISTEN_ADDR BACKEND_ADDR

use std::net::IpAddr;
use std::time::Duration;

use async_trait::async_trait;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use pingora::server::configuration::ServerConf;
use pingora_limits::rate::Rate;

/// Far above what one load generator sends: every request pays for the decision, none is
/// refused.
const LIMIT_PER_SEC: isize = 1_000_000_000;

#[derive(Clone, Copy, PartialEq)]
enum Route {
    Api,
    Bare,
}

struct Peer {
    backend: HttpPeer,
    limiter: Rate,
}

/// Per request: the route and the client's address, read once.
#[derive(Default)]
struct Ctx {
    route: Option<Route>,
    client: Option<IpAddr>,
}

fn client_ip(session: &Session) -> Option<IpAddr> {
    session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(|a| a.ip())
}

fn field(head: &RequestHeader, name: &str) -> Option<String> {
    head.headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

#[async_trait]
impl ProxyHttp for Peer {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx::default()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        let path = session.req_header().uri.path();
        ctx.route = if path.starts_with("/api") {
            Some(Route::Api)
        } else if path.starts_with("/proxy") {
            Some(Route::Bare)
        } else {
            None
        };
        ctx.client = client_ip(session);
        match ctx.route {
            None => {
                session.respond_error(404).await?;
                Ok(true)
            }
            Some(Route::Api) => {
                let key = ctx.client.unwrap_or(IpAddr::from([0, 0, 0, 0]));
                if self.limiter.observe(&key, 1) > LIMIT_PER_SEC {
                    let mut head = ResponseHeader::build(429, None)?;
                    head.insert_header("Retry-After", "1")?;
                    head.insert_header("Content-Length", "0")?;
                    session.write_response_header(Box::new(head), true).await?;
                    return Ok(true);
                }
                Ok(false)
            }
            Some(Route::Bare) => Ok(false),
        }
    }

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut Ctx) -> Result<Box<HttpPeer>> {
        Ok(Box::new(self.backend.clone()))
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        up: &mut RequestHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        let ip = ctx.client.map(|ip| ip.to_string()).unwrap_or_default();
        let host = field(up, "host").unwrap_or_default();
        // Appended to the client's list, as nginx's `$proxy_add_x_forwarded_for` does.
        let xff = match field(up, "x-forwarded-for") {
            Some(prev) => format!("{prev}, {ip}"),
            None => ip.clone(),
        };
        up.insert_header("X-Forwarded-For", xff)?;
        up.insert_header("X-Forwarded-Proto", "http")?;
        up.insert_header("X-Forwarded-Host", host.as_str())?;
        up.insert_header("Forwarded", format!("for={ip};proto=http;host=\"{host}\""))?;
        up.insert_header("Via", "1.1 pingora")?;
        if ctx.route == Some(Route::Api) {
            up.insert_header("X-Api-Version", "1")?;
            up.remove_header("X-Debug");
        }
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        res: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        res.append_header("Via", "1.1 pingora")?;
        if ctx.route == Some(Route::Api) {
            res.append_header("X-Content-Type-Options", "nosniff")?;
            res.remove_header("X-Powered-By");
        }
        Ok(())
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(backend)) = (args.next(), args.next()) else {
        eprintln!("usage: pingora-proxy-peer LISTEN_ADDR BACKEND_ADDR");
        std::process::exit(2);
    };
    // One worker thread, as every peer gets (the harness pins the process to one core); as
    // many pooled upstream connections as nginx's `keepalive 1024`.
    let conf = ServerConf {
        threads: 1,
        upstream_keepalive_pool_size: 1024,
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let peer = Peer {
        backend: HttpPeer::new(backend.as_str(), false, String::new()),
        limiter: Rate::new(Duration::from_secs(1)),
    };
    let mut service = http_proxy_service(&server.configuration, peer);
    service.add_tcp(&listen);
    server.add_service(service);
    server.run_forever();
}
