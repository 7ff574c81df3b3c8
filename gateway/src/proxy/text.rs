//! The reverse proxy on the HTTP/1.1 fast path ([`crate::server::fast_path`]): a `GET` or `HEAD`
//! without a body, forwarded from the client's raw head to an HTTP/1.1 upstream and answered
//! from the upstream's raw head, with no header map on either side.
//!
//! It does what [`super::ProxyRoute::forward`] does for such a request, with the same rules:
//! the request's fields are written by [`forward_fields`], the one writer of a forwarded
//! request's fields for both paths (the general path lends it a header map's fields); the
//! answer's fields are judged by the codec's hop-by-hop rule, as the general path's decoder
//! judges them; the balancer, the retries on another target (a connect failure, a timeout, a
//! broken response, a 502–504), the passive health (by the same rule, [`super::outcome`]), the
//! attempt's `timeout` around the response head and then the body ([`super::body`]), and the
//! pool. The request is rewritten once, as text, and each attempt writes it with its own
//! `Host`, so a retry costs a copy of a few hundred bytes.
//!
//! Requests the general path has to see go there before anything is sent: an HTTP/2 upstream,
//! a traced request (its spans and `traceparent` are the general path's). The balancer's key is
//! read from the raw head by the general path's rule ([`super::Upstream::hash_key_text`]). The
//! fast path itself takes only plain heads (no body, no upgrade, `Connection` only `keep-alive`
//! or `close`).

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode, Version};

use super::body::{Lease, RawBody};
use super::deadline::Deadline;
use super::headers::{self, ClientText};
use super::outcome::{Tries, Turn};
use super::pool::{Checkout, Pool};
use super::{ProxyRoute, connect_error, until};
use crate::body::Body;
use crate::error::GatewayError;
use gateway_http1::decode::BareResponseHead;
use gateway_http1::fields::push_field;
use gateway_http1::hop_by_hop::{EndToEnd, Judged};

/// What the fast path read of a client's request head.
pub struct TextRequest<'b> {
    /// `HEAD` (else `GET`).
    pub head: bool,
    /// The request target (path and query).
    pub target: &'b str,
    /// The target's path, without the query.
    pub path: &'b str,
    /// The `Host` value (one at most).
    pub host: Option<&'b [u8]>,
    pub fields: &'b [httparse::Header<'b>],
}

/// A request rewritten for its upstream, owned: the client's read buffer moves on while the
/// upstream answers.
pub struct Forwarding {
    /// The request line, the fields (without `Host`, which each attempt writes) and then the
    /// client's `Host` value when it is sent upstream (`preserve_host`).
    text: Vec<u8>,
    /// Where the request line ends.
    line: usize,
    /// Where the fields end (and the client's `Host` begins, when kept).
    fields: usize,
    preserve_host: bool,
    key: u64,
    /// How many other targets the request may try after its first.
    retries: usize,
    head: bool,
}

/// Fields the listener sets that replace an upstream's of the same name (the general path
/// inserts them over the upstream's).
#[derive(Debug, Clone, Copy, Default)]
pub struct Replaced {
    pub hsts: bool,
    pub alt_svc: bool,
}

/// What the fast path writes to the client from an upstream's response.
pub struct Answer {
    pub(crate) status: StatusCode,
    /// The body's framing on the upstream side, and its declared length.
    pub(crate) head: BareResponseHead,
    /// The upstream's fields already include `Server`, `Date`.
    pub(crate) has_server: bool,
    pub(crate) has_date: bool,
    /// The upstream's `Trailer` values, comma-joined, when it sent any: an HTTP/1.1 client gets
    /// only the trailers named there ([`gateway_http1::trailers::is_declared`]), as hyper's encoder
    /// sends them on the general path.
    pub(crate) declared_trailers: Option<Box<[u8]>>,
    /// The body, with the attempt's bookkeeping (pool, health, `timeout`) around it.
    pub(crate) body: Body,
}

/// What the rewritten response fields came with.
#[derive(Debug, Clone, Default)]
struct Written {
    has_server: bool,
    has_date: bool,
    /// See [`Answer::declared_trailers`].
    declared_trailers: Option<Box<[u8]>>,
}

impl Forwarding {
    /// The request is a `HEAD`.
    pub(crate) fn is_head(&self) -> bool {
        self.head
    }

    /// The `Host` an attempt on a target of `target_host` sends: the client's when kept.
    fn host_for<'a>(&'a self, target_host: &'a [u8]) -> &'a [u8] {
        if self.preserve_host {
            &self.text[self.fields..]
        } else {
            target_host
        }
    }

    /// The request's head as one attempt writes it, with `host` after the request line.
    fn write_head(&self, w: &mut Vec<u8>, host: &[u8]) {
        w.extend_from_slice(&self.text[..self.line]);
        push_field(w, b"host", host);
        w.extend_from_slice(&self.text[self.line..self.fields]);
        w.extend_from_slice(b"\r\n");
    }
}

impl ProxyRoute {
    /// The request rewritten for the upstream as text, or `None` when the general path has to
    /// forward it (see the module's header).
    pub fn rewrite_text(
        &self,
        req: &TextRequest<'_>,
        client: &ClientText,
        client_ip: IpAddr,
    ) -> Option<Forwarding> {
        let up = &self.upstream;
        if up.connector.is_h2() {
            return None;
        }
        let key = up.hash_key_text(req.path, req.fields, client_ip);
        let mut text = Vec::with_capacity(text_room(req, client));
        text.extend_from_slice(if req.head { b"HEAD " } else { b"GET " });
        text.extend_from_slice(self.upstream_target(req.target, req.path).as_bytes());
        text.extend_from_slice(b" HTTP/1.1\r\n");
        let line = text.len();
        let via = headers::via(Version::HTTP_11);
        let hop = Hop {
            host: req.host,
            upgrading: false,
            via: via.as_bytes(),
        };
        forward_fields(&mut text, req.fields, &hop, client);
        let fields = text.len();
        let preserve_host = self.preserve_host && req.host.is_some();
        if preserve_host && let Some(host) = req.host {
            text.extend_from_slice(host);
        }
        let method = if req.head { Method::HEAD } else { Method::GET };
        let retries = self.retries_for(&method, false);
        Some(Forwarding {
            text,
            line,
            fields,
            preserve_host,
            key,
            retries,
            head: req.head,
        })
    }

    /// Forwards `fwd` to the upstream's targets in the balancer's order until one answers or
    /// the retries run out, as [`Self::forward`] does. `out` gets the client's status line and
    /// the upstream's fields as the client is to see them (the caller adds its own and ends the
    /// head); `Err` is the response the request gets instead (a 502, 503 or 504).
    pub async fn forward_text(
        self: &Arc<Self>,
        fwd: &Forwarding,
        replaced: Replaced,
        out: &mut Vec<u8>,
    ) -> Result<Answer, http::Response<Body>> {
        let up = &self.upstream;
        // Every attempt writes the request's text again: it can always be sent again.
        let resendable = true;
        let mut tries = Tries::new(fwd.key, fwd.retries);
        let answered = loop {
            let selection = match tries.next(up) {
                Turn::Try(selection) => selection,
                Turn::End(Ok(answered)) => break answered,
                Turn::End(Err(error)) => return Err(self.fail(error)),
            };
            let index = selection.index();
            let Some(pool) = super::Upstream::pool(&selection) else {
                return Err(self.fail(GatewayError::NoHealthyTarget(up.name.to_string())));
            };
            match self.attempt_text(pool, fwd, replaced, out).await {
                Ok((head, written, body, deadline)) => {
                    let retry = tries.answered(up, &selection, head.status, resendable);
                    let answered = Answered {
                        head,
                        written,
                        body,
                        lease: Lease {
                            upstream: up.clone(),
                            selection,
                            deadline,
                            timeout: self.timeout,
                            span: None,
                        },
                    };
                    if !retry {
                        break answered;
                    }
                    tries.retry(up, index, Ok(answered));
                }
                Err(error) => {
                    if !tries.failed(up, &selection, &error, resendable) {
                        return Err(self.fail(error));
                    }
                    tries.retry(up, index, Err(error));
                }
            }
        };
        let Answered {
            head,
            written,
            body,
            lease,
        } = answered;
        if head.status == StatusCode::SWITCHING_PROTOCOLS {
            // Nobody asked to switch: that cannot be relayed.
            let addr = lease.selection.target().addr.to_string();
            return Err(self.fail(GatewayError::UpstreamFailed {
                addr,
                source: "upstream switched protocols unasked".into(),
            }));
        }
        // `out` holds the answering attempt's fields: an attempt after it would have
        // overwritten them, and none came after it.
        push_field(out, b"via", headers::via(head.version).as_bytes());
        let addr = lease.selection.target().addr;
        let body = match super::body::wrap(RawBody::H1(body), lease) {
            Ok(body) => body,
            Err(later) => later.await,
        }
        .map_err(|source| {
            self.fail(GatewayError::UpstreamFailed {
                addr: addr.to_string(),
                source,
            })
        })?;
        Ok(Answer {
            status: head.status,
            head,
            has_server: written.has_server,
            has_date: written.has_date,
            declared_trailers: written.declared_trailers,
            body,
        })
    }

    /// One attempt on `pool`'s target: a connection, the head sent, the response head read
    /// into `out`, all within the upstream's `timeout` (whose rest goes on with the body).
    async fn attempt_text(
        &self,
        pool: &Arc<Pool>,
        fwd: &Forwarding,
        replaced: Replaced,
        out: &mut Vec<u8>,
    ) -> Result<(BareResponseHead, Written, super::h1::ResponseBody, Deadline), GatewayError> {
        let up = &self.upstream;
        let timeout = self.timeout.unwrap_or_default();
        let mut deadline = super::deadline::start(self.timeout);
        let host = fwd.host_for(pool.endpoint.host.as_bytes());
        // A pooled connection the peer closed while idle did not take the request; try again
        // on another (a fresh one, once the idle ones run out).
        loop {
            let (conn, reused) = match until(&mut deadline, pool.checkout(&up.connector)).await {
                Some(Ok(Checkout::H1 { conn, reused })) => (conn, reused),
                Some(Ok(Checkout::H2(_))) => {
                    return Err(GatewayError::UpstreamFailed {
                        addr: pool.endpoint.addr.to_string(),
                        source: "an HTTP/2 connection for the HTTP/1.1 fast path".into(),
                    });
                }
                Some(Err(e)) => return Err(connect_error(pool, e)),
                None => return Err(GatewayError::UpstreamTimeout(timeout)),
            };
            let write_head = |w: &mut Vec<u8>| fwd.write_head(w, host);
            let read = |status: StatusCode, fields: &[httparse::Header<'_>]| {
                client_fields(status, fields, replaced, out)
            };
            let exchange = conn.exchange_text(write_head, fwd.head, pool, reused, read);
            match until(&mut deadline, exchange).await {
                Some(Ok((head, written, body))) => return Ok((head, written, body, deadline)),
                None => return Err(GatewayError::UpstreamTimeout(timeout)),
                Some(Err(failure)) if failure.stale => continue,
                Some(Err(failure)) => {
                    return Err(GatewayError::UpstreamFailed {
                        addr: pool.endpoint.addr.to_string(),
                        source: failure.error.into(),
                    });
                }
            }
        }
    }
}

/// An attempt's response, kept while another target is tried.
struct Answered {
    head: BareResponseHead,
    written: Written,
    body: super::h1::ResponseBody,
    lease: Lease,
}

/// Room for the rewritten request: its request line, the client's fields, and the fields
/// [`forward_fields`] adds ([`fields_room`]), and a preserved `Host`. Short by any of them, the
/// text would grow once more on every request: a reallocation and a copy.
fn text_room(req: &TextRequest<'_>, client: &ClientText) -> usize {
    req.target.len() + fields_room(req.fields, req.host, client)
}

/// Room for what [`forward_fields`] writes of `fields`: the fields themselves and those it
/// adds, in which the host appears up to three times (`Forwarded`, `X-Forwarded-Host`, a
/// preserved `Host` after them) and the client's address twice.
fn fields_room(fields: &[httparse::Header<'_>], host: Option<&[u8]>, client: &ClientText) -> usize {
    let host = host.map_or(0, <[u8]>::len);
    let fields: usize = fields
        .iter()
        .map(|f| f.name.len() + f.value.len() + 4)
        .sum();
    fields + 3 * host + client.ip.len() + client.element.len() + 160
}

/// [`forward_fields`] for a request whose fields are a header map (the general path's), into
/// a buffer of their own: the map's names and values are lent to the rule as the fast path's
/// raw fields are.
pub(super) fn forward_map(map: &HeaderMap, hop: &Hop<'_>, client: &ClientText) -> Bytes {
    let fields: smallvec::SmallVec<[httparse::Header<'_>; 24]> = map
        .iter()
        .map(|(name, value)| httparse::Header {
            name: name.as_str(),
            value: value.as_bytes(),
        })
        .collect();
    let mut out = Vec::with_capacity(fields_room(&fields, hop.host, client));
    forward_fields(&mut out, &fields, hop, client);
    Bytes::from(out)
}

/// What [`forward_fields`] needs to know of a request's hop beside its fields.
pub(super) struct Hop<'a> {
    /// The authority the client addressed (its `Host`, or an HTTP/2 request's `:authority`).
    pub(super) host: Option<&'a [u8]>,
    /// The request switches protocols: its `Upgrade` goes on, with `Connection: upgrade`.
    pub(super) upgrading: bool,
    /// The `Via` value for the client's hop (`1.1 gateway`, `2 gateway`, ...).
    pub(super) via: &'a [u8],
}

/// Writes the fields of a request as its upstream is to get them, for both paths (the fast
/// path's raw fields and the general path's header map, lent as a slice of the same kind):
/// hop-by-hop fields and those `Connection` names dropped (`TE: trailers` kept, `Upgrade` and
/// `Connection: upgrade` when switching protocols); `Host`, the framing fields and `Expect`
/// dropped (each attempt writes its `Host` and the framing of the body it sends, and the gateway
/// answers `100 Continue` itself); then `X-Forwarded-For` and `Forwarded` with the client
/// appended to the values the request brought, `X-Forwarded-Proto` and `X-Forwarded-Host` set
/// (the gateway is the edge: a client must not be able to claim `https`), and `Via`.
pub(super) fn forward_fields(
    out: &mut Vec<u8>,
    fields: &[httparse::Header<'_>],
    hop: &Hop<'_>,
    client: &ClientText,
) {
    let mut end_to_end = EndToEnd::of(fields);
    let (mut xff, mut forwarded) = (false, false);
    for f in fields {
        let name = f.name.as_bytes();
        let is = |known: &[u8]| name.eq_ignore_ascii_case(known);
        if hop.upgrading && name.len() == 7 && is(b"upgrade") {
            push_field(out, name, f.value);
            continue;
        }
        if !goes_on(end_to_end.judge(f), out) {
            continue;
        }
        match name.len() {
            4 if is(b"host") => continue,
            6 if is(b"expect") => continue,
            14 if is(b"content-length") => continue,
            15 if is(b"x-forwarded-for") => {
                xff = true;
                continue;
            }
            9 if is(b"forwarded") => {
                forwarded = true;
                continue;
            }
            17 if is(b"x-forwarded-proto") => continue,
            16 if is(b"x-forwarded-host") => continue,
            _ => {}
        }
        push_field(out, name, f.value);
    }
    if hop.upgrading {
        out.extend_from_slice(b"connection: upgrade\r\n");
    }
    out.extend_from_slice(b"x-forwarded-for: ");
    if xff {
        append_prior(out, fields, b"x-forwarded-for");
    }
    out.extend_from_slice(client.ip.as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(b"forwarded: ");
    if forwarded {
        append_prior(out, fields, b"forwarded");
    }
    out.extend_from_slice(client.element.as_bytes());
    if let Some(host) = hop.host.and_then(gateway_http1::fields::field_text) {
        out.extend_from_slice(b";host=");
        crate::ip_text::push_quoted_bytes(out, host);
    }
    out.extend_from_slice(b"\r\n");
    push_field(out, b"x-forwarded-proto", client.proto.as_bytes());
    if let Some(host) = hop.host {
        push_field(out, b"x-forwarded-host", host);
    }
    push_field(out, b"via", hop.via);
}

/// Writes the client's status line and the upstream's fields as the client is to see them into
/// `out` (cleared first): hop-by-hop fields and those `Connection` names dropped, `TE:
/// trailers` kept, the framing fields dropped (the fast path writes its own for the body it
/// sends), and the listener's fields the general path sets over the upstream's dropped.
fn client_fields(
    status: StatusCode,
    fields: &[httparse::Header<'_>],
    replaced: Replaced,
    out: &mut Vec<u8>,
) -> Written {
    out.clear();
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
    out.extend_from_slice(b"\r\n");
    let mut end_to_end = EndToEnd::of(fields);
    let mut written = Written::default();
    // Allocated only for a response with a `Trailer` field.
    let mut declared: Vec<u8> = Vec::new();
    for f in fields {
        let name = f.name.as_bytes();
        let is = |known: &[u8]| name.eq_ignore_ascii_case(known);
        if !goes_on(end_to_end.judge(f), out) {
            continue;
        }
        match name.len() {
            14 if is(b"content-length") => continue,
            25 if replaced.hsts && is(b"strict-transport-security") => continue,
            7 if replaced.alt_svc && is(b"alt-svc") => continue,
            6 if is(b"server") => written.has_server = true,
            4 if is(b"date") => written.has_date = true,
            7 if is(b"trailer") => {
                if !declared.is_empty() {
                    declared.push(b',');
                }
                declared.extend_from_slice(f.value);
            }
            _ => {}
        }
        push_field(out, name, f.value);
    }
    if !declared.is_empty() {
        written.declared_trailers = Some(declared.into_boxed_slice());
    }
    written
}

/// Whether a field the hop-by-hop rule judged goes on as it is; `TE: trailers`, which goes on
/// alone in its place, is written here.
fn goes_on(judged: Judged, out: &mut Vec<u8>) -> bool {
    match judged {
        Judged::Forward => true,
        Judged::Drop => false,
        Judged::Trailers => {
            out.extend_from_slice(b"te: trailers\r\n");
            false
        }
    }
}

/// The values of the request's `name` fields that are visible ASCII, each followed by `, `
/// (as the general path lists the values it appends the gateway's to).
fn append_prior(out: &mut Vec<u8>, fields: &[httparse::Header<'_>], name: &[u8]) {
    for f in fields {
        if f.name.as_bytes().eq_ignore_ascii_case(name)
            && gateway_http1::fields::field_text(f.value).is_some()
        {
            out.extend_from_slice(f.value);
            out.extend_from_slice(b", ");
        }
    }
}

#[cfg(test)]
#[path = "text_tests.rs"]
mod tests;
