//! The fast path's request and response rewriting, field by field: what the upstream is sent
//! and what the client is answered with, beside the e2e tests that compare both with the
//! general path's.

use std::net::IpAddr;

use gateway_config::RouteAction;

use super::*;

/// The proxy route of a config with one upstream (`upstream_yaml`, indented under its name)
/// and one route to it (`proxy_yaml`: extra keys of `proxy`).
fn route(upstream_yaml: &str, proxy_yaml: &str) -> ProxyRoute {
    let yaml = format!(
        "upstreams:\n  app:\n    targets: [127.0.0.1:9]\n{upstream_yaml}\
         routes:\n  - match: {{ path_prefix: / }}\n    proxy: {{ upstream: app{proxy_yaml} }}\n"
    );
    let config = gateway_config::load_str(&yaml, "t.yaml", std::path::Path::new(".")).unwrap();
    let upstreams = crate::proxy::Upstreams::build(&config).unwrap();
    let RouteAction::Proxy(p) = &config.routes[0].action else {
        panic!("not a proxy route");
    };
    ProxyRoute::new(p, upstreams.get("app").unwrap().clone())
}

const CLIENT: &str = "192.0.2.7";

/// Parses `head` (a request head without its request line's method: `GET` is added) and
/// rewrites it; the upstream head written with `target_host`, or `None` when the fast path
/// hands the request on.
fn rewrite(proxy: &ProxyRoute, head: &str, target_host: &str) -> Option<String> {
    let mut fields = [httparse::EMPTY_HEADER; 32];
    let mut req = httparse::Request::new(&mut fields);
    let text = format!("GET {head}");
    assert!(req.parse(text.as_bytes()).unwrap().is_complete(), "{text}");
    let target = req.path.unwrap();
    let path = target.split('?').next().unwrap();
    let fields = req.headers;
    let one = |name: &str| {
        fields
            .iter()
            .find(|f| f.name.eq_ignore_ascii_case(name))
            .map(|f| f.value)
    };
    let host = one("host");
    let request = TextRequest {
        head: false,
        target,
        path,
        host,
        fields,
    };
    let client_ip: IpAddr = CLIENT.parse().unwrap();
    let client = ClientText::new(client_ip, false);
    let fwd = proxy.rewrite_text(&request, &client, client_ip)?;
    let mut out = Vec::new();
    fwd.write_head(&mut out, fwd.host_for(target_host.as_bytes()));
    Some(String::from_utf8(out).unwrap())
}

#[test]
fn the_rewritten_request_fits_the_room_made_for_it() {
    // The longest additions: prior `X-Forwarded-For` and `Forwarded` appended to, a long host
    // quoted in `Forwarded` and kept as `Host`, an IPv6 client.
    let proxy = route("", ", preserve_host: true");
    let host = format!("{}.example.com", "h".repeat(200));
    let head = format!(
        "GET /a?b=1 HTTP/1.1\r\nHost: {host}\r\nX-Forwarded-For: 10.0.0.1, 10.0.0.2\r\n\
         Forwarded: for=10.0.0.1, for=\"[2001:db8::1]\"\r\nAccept: */*\r\n\r\n"
    );
    let mut fields = [httparse::EMPTY_HEADER; 32];
    let mut req = httparse::Request::new(&mut fields);
    assert!(req.parse(head.as_bytes()).unwrap().is_complete());
    let request = TextRequest {
        head: true,
        target: req.path.unwrap(),
        path: "/a",
        host: Some(host.as_bytes()),
        fields: req.headers,
    };
    let client_ip: IpAddr = "2001:db8:ffff:ffff:ffff:ffff:ffff:fffe".parse().unwrap();
    let client = ClientText::new(client_ip, true);
    let fwd = proxy.rewrite_text(&request, &client, client_ip).unwrap();
    let room = text_room(&request, &client);
    assert!(fwd.text.len() <= room, "{} > {room}", fwd.text.len());
    assert_eq!(fwd.text.capacity(), room, "the text grew");
}

#[test]
fn the_forwarding_fields_are_appended_to_and_set() {
    let proxy = route("", "");
    let head = rewrite(
        &proxy,
        "/a?b=1 HTTP/1.1\r\nHost: api.example.com\r\nX-Forwarded-For: 10.0.0.1\r\n\
         X-Forwarded-Proto: https\r\nX-Forwarded-Host: evil\r\nForwarded: for=10.0.0.1\r\n\
         Accept: */*\r\n\r\n",
        "127.0.0.1:9",
    )
    .unwrap();
    assert_eq!(
        head,
        "GET /a?b=1 HTTP/1.1\r\nhost: api.example.com\r\nAccept: */*\r\n\
         x-forwarded-for: 10.0.0.1, 192.0.2.7\r\n\
         forwarded: for=10.0.0.1, for=192.0.2.7;proto=http;host=\"api.example.com\"\r\n\
         x-forwarded-proto: http\r\nx-forwarded-host: api.example.com\r\nvia: 1.1 gateway\r\n\r\n"
    );
}

#[test]
fn hop_by_hop_fields_stay_but_te_trailers_goes_on() {
    let proxy = route("", "");
    let head = rewrite(
        &proxy,
        "/ HTTP/1.1\r\nHost: h\r\nConnection: close\r\nKeep-Alive: timeout=5\r\n\
         Proxy-Connection: keep-alive\r\nTE: trailers, deflate\r\nTE: gzip\r\nClose: x\r\n\
         Upgrade: h2c\r\nX-Kept: 1\r\n\r\n",
        "t",
    )
    .unwrap();
    let fields: Vec<&str> = head.lines().skip(2).take_while(|l| !l.is_empty()).collect();
    assert_eq!(
        fields[0], "te: trailers",
        "the first TE names trailers: {head}"
    );
    assert!(
        fields.contains(&"X-Kept: 1"),
        "names keep their case: {head}"
    );
    for gone in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "upgrade",
        "close",
        "te: gzip",
    ] {
        assert!(
            !fields
                .iter()
                .any(|f| f.to_ascii_lowercase().starts_with(gone)),
            "{gone} was forwarded: {head}"
        );
    }
}

#[test]
fn a_te_without_trailers_first_is_not_forwarded() {
    let proxy = route("", "");
    let head = rewrite(
        &proxy,
        "/ HTTP/1.1\r\nHost: h\r\nTE: gzip\r\nTE: trailers\r\n\r\n",
        "t",
    )
    .unwrap();
    assert!(!head.contains("te:"), "{head}");
}

#[test]
fn the_target_host_is_sent_unless_the_client_host_is_preserved() {
    let kept = route("", "");
    let replaced = route("", ", preserve_host: false");
    let request = "/ HTTP/1.1\r\nHost: api.example.com:8080\r\n\r\n";
    let kept = rewrite(&kept, request, "127.0.0.1:9").unwrap();
    let replaced = rewrite(&replaced, request, "127.0.0.1:9").unwrap();
    assert!(
        kept.starts_with("GET / HTTP/1.1\r\nhost: api.example.com:8080\r\n"),
        "{kept}"
    );
    assert!(
        replaced.starts_with("GET / HTTP/1.1\r\nhost: 127.0.0.1:9\r\n"),
        "{replaced}"
    );
    // The client's host is what `X-Forwarded-Host` and `Forwarded` name either way.
    assert!(replaced.contains("x-forwarded-host: api.example.com:8080\r\n"));
    assert!(replaced.contains(";host=\"api.example.com:8080\"\r\n"));
}

#[test]
fn a_request_without_host_gets_the_target_s() {
    let proxy = route("", "");
    let head = rewrite(&proxy, "/ HTTP/1.1\r\n\r\n", "127.0.0.1:9").unwrap();
    assert!(
        head.starts_with("GET / HTTP/1.1\r\nhost: 127.0.0.1:9\r\n"),
        "{head}"
    );
    assert!(!head.contains("x-forwarded-host"), "{head}");
    assert!(
        head.contains("forwarded: for=192.0.2.7;proto=http\r\n"),
        "{head}"
    );
}

#[test]
fn strip_prefix_cuts_whole_segments_and_keeps_the_query() {
    let proxy = route("", ", strip_prefix: /api/");
    let line = |target: &str| {
        let head = rewrite(
            &proxy,
            &format!("{target} HTTP/1.1\r\nHost: h\r\n\r\n"),
            "t",
        );
        head.unwrap().lines().next().unwrap().to_owned()
    };
    assert_eq!(line("/api/users?x=1"), "GET /users?x=1 HTTP/1.1");
    assert_eq!(line("/api"), "GET / HTTP/1.1");
    assert_eq!(line("/api?q"), "GET /?q HTTP/1.1");
    assert_eq!(line("/apix/users"), "GET /apix/users HTTP/1.1");
}

#[test]
fn a_balancer_keyed_on_a_header_or_a_cookie_reads_the_key_from_the_raw_head() {
    for hash_on in ["cookie:session", "header:x-user"] {
        let proxy = route(
            &format!("    balance: consistent_hash\n    hash_on: {hash_on}\n"),
            "",
        );
        let head = "/ HTTP/1.1\r\nHost: h\r\nX-User: 1\r\nCookie: session=1\r\n\r\n";
        let text = rewrite(&proxy, head, "t").expect(hash_on);
        assert!(
            text.contains("\r\nCookie: session=1\r\n"),
            "{hash_on}: {text}"
        );
    }
}

#[test]
fn an_http2_upstream_leaves_the_request_to_the_general_path() {
    let proxy = route("    protocol: h2c\n", "");
    assert!(rewrite(&proxy, "/ HTTP/1.1\r\nHost: h\r\n\r\n", "t").is_none());
}

/// The client's head `client_fields` writes from an upstream's response head.
fn answer(status: u16, fields: &[(&str, &str)], replaced: Replaced) -> (String, Written) {
    let fields: Vec<httparse::Header<'_>> = fields
        .iter()
        .map(|(name, value)| httparse::Header {
            name,
            value: value.as_bytes(),
        })
        .collect();
    let mut out = b"left from an earlier attempt".to_vec();
    let status = StatusCode::from_u16(status).unwrap();
    let written = client_fields(status, &fields, replaced, &mut out);
    (String::from_utf8(out).unwrap(), written)
}

#[test]
fn the_answer_drops_hop_by_hop_connection_named_and_framing_fields() {
    let (head, written) = answer(
        200,
        &[
            ("Connection", "keep-alive, X-Private"),
            ("Keep-Alive", "timeout=5"),
            ("Transfer-Encoding", "chunked"),
            ("Content-Length", "5"),
            ("x-private", "secret"),
            ("Content-Type", "text/plain"),
            ("Set-Cookie", "a=1"),
            ("Set-Cookie", "b=2"),
        ],
        Replaced::default(),
    );
    assert_eq!(
        head,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n"
    );
    assert!(!written.has_server && !written.has_date);
}

#[test]
fn the_answer_notes_server_and_date_and_gives_way_to_the_listener_s_fields() {
    let fields = [
        ("Server", "backend"),
        ("Date", "Fri, 04 Dec 2026 10:00:00 GMT"),
        ("Strict-Transport-Security", "max-age=1"),
        ("Alt-Svc", "h3=\":1\""),
    ];
    let (kept, written) = answer(404, &fields, Replaced::default());
    assert!(kept.starts_with("HTTP/1.1 404 Not Found\r\nServer: backend\r\nDate: "));
    assert!(kept.contains("Strict-Transport-Security: max-age=1\r\n"));
    assert!(kept.contains("Alt-Svc: "));
    assert!(written.has_server && written.has_date);
    let replaced = Replaced {
        hsts: true,
        alt_svc: true,
    };
    let (head, _) = answer(404, &fields, replaced);
    assert!(
        !head.contains("Strict-Transport-Security") && !head.contains("Alt-Svc"),
        "{head}"
    );
}

#[test]
fn a_status_without_a_reason_phrase_is_written_with_a_placeholder() {
    let (head, _) = answer(599, &[], Replaced::default());
    assert_eq!(head, "HTTP/1.1 599 <none>\r\n");
}
