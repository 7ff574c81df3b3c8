//! The Gateway API controller against a real kube-apiserver (see `gateway_tests::kube`):
//! objects created through the API become routes and streams (TCPRoute, UDPRoute, TLSRoute
//! passed through by server name), status is read back, and weights and endpoints change under
//! a request loop without one request failing.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use gateway_tests::backend::Backend;
use gateway_tests::kube::{self, KubeCluster, NODE_IP};
use gateway_tests::{Running, TestGateway, TestResponse};
use http::Request;
use http_body_util::Full;
use serde_json::{Value, json};

const GW_API: &str = "/apis/gateway.networking.k8s.io/v1";
const NS: &str = "/api/v1/namespaces/default";
const SLICES: &str = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices";

async fn get(addr: SocketAddr, host: &str, path: &str) -> Result<TestResponse, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let mut client = gateway_tests::http1_over(tcp, addr.to_string()).await;
    let req = Request::get(path)
        .header("host", host)
        .body(Full::new(Bytes::new()))
        .unwrap();
    client.send(req).await.map_err(|e| e.to_string())
}

/// Waits (bounded) until `check` holds: the controller applies changes asynchronously.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let last = check().await;
        if last.is_ok() {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("{what}: {}", last.unwrap_err());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn body_is(addr: SocketAddr, host: &str, path: &str, want: &str) -> Result<(), String> {
    let res = get(addr, host, path).await?;
    let text = res.text();
    if res.status() == 200 && text == want {
        Ok(())
    } else {
        Err(format!("{} {text:?}, want {want:?}", res.status()))
    }
}

fn service(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": name},
           "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}})
}

fn slice(service: &str, ports: &[(u16, bool)]) -> Value {
    // One EndpointSlice per port here: every backend listens on the namespace's one address.
    let port = ports.first().map_or(0, |p| p.0);
    let endpoints: Vec<Value> = ports
        .iter()
        .map(|(_, ready)| json!({"addresses": [NODE_IP.to_string()], "conditions": {"ready": ready}}))
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": service, "labels": {"kubernetes.io/service-name": service}},
           "addressType": "IPv4",
           "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
           "endpoints": endpoints})
}

fn condition<'a>(conditions: &'a Value, kind: &str) -> &'a Value {
    conditions
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == kind))
        .unwrap_or(&Value::Null)
}

/// Waits until the route at `path` (of the default namespace, in the Gateway API group) reports
/// `Accepted` for its first parent.
async fn route_accepted(k: &KubeCluster, what: &str, path: &str) {
    eventually(what, || async {
        let r = k.get(&format!("{GW_API}/namespaces/default/{path}")).await;
        let c = condition(&r["status"]["parents"][0]["conditions"], "Accepted");
        (c["status"] == "True").then_some(()).ok_or(format!("{r}"))
    })
    .await;
}

fn free_port() -> u16 {
    std::net::TcpListener::bind(SocketAddr::new(NODE_IP, 0))
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

async fn start_gateway(k: &KubeCluster) -> TestGateway {
    let yaml = format!(
        "server: {{ watch_config: false }}\n\
         kubernetes:\n  kubeconfig: {}\n  controller_name: gateway.dev/controller\n  listen_address: {NODE_IP}\n\
         listeners: [{{ name: file, bind: '127.0.0.1:0' }}]\n\
         routes: [{{ listeners: [file], respond: {{ body: from-file }} }}]\n",
        k.kubeconfig.display()
    );
    TestGateway::start(&yaml).await
}

/// Our GatewayClass `ours` and Gateway `gw` in `default` with one HTTP listener `web`.
async fn create_gateway(k: &KubeCluster, port: u16) {
    create_gateway_with(
        k,
        json!([{"name": "web", "port": port, "protocol": "HTTP"}]),
    )
    .await;
}

/// Our GatewayClass `ours` and Gateway `gw` in `default` with these listeners.
async fn create_gateway_with(k: &KubeCluster, listeners: Value) {
    k.create(
        &format!("{GW_API}/gatewayclasses"),
        json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
        "metadata": {"name": "ours"}, "spec": {"controllerName": "gateway.dev/controller"}}),
    )
    .await;
    k.create(
        &format!("{GW_API}/namespaces/default/gateways"),
        json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "gw"},
        "spec": {"gatewayClassName": "ours", "listeners": listeners}}),
    )
    .await;
}

#[test]
fn routes_status_and_live_changes_from_a_real_api_server() {
    if !kube::available() {
        return;
    }
    kube::run(|k| async move {
        let a = Backend::start_on("a", SocketAddr::new(NODE_IP, 0)).await;
        let b = Backend::start_on("b", SocketAddr::new(NODE_IP, 0)).await;
        let c = Backend::start_on("c", SocketAddr::new(NODE_IP, 0)).await;
        let gw = start_gateway(&k).await;
        let port = free_port();
        create_gateway(&k, port).await;
        for (name, backend) in [("svc-a", &a), ("svc-b", &b)] {
            k.create(&format!("{NS}/services"), service(name)).await;
            k.create(SLICES, slice(name, &[(backend.addr().port(), true)]))
                .await;
        }
        k.create(&format!("{GW_API}/namespaces/default/httproutes"), json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "app"},
            "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["app.example"],
                     "rules": [
                {"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                 "filters": [{"type": "RequestHeaderModifier",
                              "requestHeaderModifier": {"set": [{"name": "x-from", "value": "gateway-api"}]}}],
                 "backendRefs": [{"name": "svc-a", "port": 80, "weight": 1},
                                 {"name": "svc-b", "port": 80, "weight": 0}]},
                {"matches": [{"path": {"type": "Exact", "value": "/old"}}],
                 "filters": [{"type": "RequestRedirect",
                              "requestRedirect": {"path": {"type": "ReplaceFullPath", "replaceFullPath": "/new"},
                                                  "statusCode": 301}}]}]}}))
            .await;
        let echo = gateway_tests::backend::WsEcho::start_on(SocketAddr::new(NODE_IP, 0)).await;
        k.create(&format!("{NS}/services"), service("ws")).await;
        k.create(SLICES, slice("ws", &[(echo.addr().port(), true)]))
            .await;
        k.create(
            &format!("{GW_API}/namespaces/default/httproutes"),
            json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "ws"},
            "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["ws.example"],
                     "rules": [{"backendRefs": [{"name": "ws", "port": 80}]}]}}),
        )
        .await;
        k.create(
            &format!("{GW_API}/namespaces/default/httproutes"),
            json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "broken"},
            "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["broken.example"],
                     "rules": [{"backendRefs": [{"name": "missing", "port": 80}]}]}}),
        )
        .await;
        k.create(
            &format!("{GW_API}/namespaces/default/httproutes"),
            json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "half"},
            "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["half.example"],
                     "rules": [{"backendRefs": [{"name": "svc-b", "port": 80, "weight": 1},
                                                {"name": "missing", "port": 80, "weight": 1}]}]}}),
        )
        .await;

        let addr = SocketAddr::new(NODE_IP, port);
        eventually("the route serves", || {
            body_is(addr, "app.example", "/x", "a")
        })
        .await;
        assert_eq!(a.last().expect("a saw it").header("x-from"), "gateway-api");
        let res = get(addr, "app.example", "/old").await.unwrap();
        assert_eq!(
            (res.status(), res.header("location")),
            (301, "http://app.example/new")
        );
        eventually("a route to a missing backend answers 500", || async {
            let r = get(addr, "broken.example", "/").await?;
            (r.status() == 500)
                .then_some(())
                .ok_or(format!("{}", r.status()))
        })
        .await;
        // The unresolved half of a rule's weight answers 500; the resolved half is served.
        eventually("half of a half-resolved rule answers 500", || async {
            let mut seen = (0, 0);
            for _ in 0..20 {
                match get(addr, "half.example", "/").await?.status() {
                    200 => seen.0 += 1,
                    500 => seen.1 += 1,
                    other => return Err(format!("{other}")),
                }
            }
            (seen == (10, 10)).then_some(()).ok_or(format!("{seen:?}"))
        })
        .await;
        // The file's own listener and route serve beside the cluster's.
        let res = get(gw.addr("file"), "anything", "/").await.unwrap();
        assert_eq!(res.text(), "from-file");

        // Status, as the spec asks for it.
        eventually("status is written", || async {
            let class = k.get(&format!("{GW_API}/gatewayclasses/ours")).await;
            let gateway = k
                .get(&format!("{GW_API}/namespaces/default/gateways/gw"))
                .await;
            let app = k
                .get(&format!("{GW_API}/namespaces/default/httproutes/app"))
                .await;
            let broken = k
                .get(&format!("{GW_API}/namespaces/default/httproutes/broken"))
                .await;
            let checks = [
                condition(&class["status"]["conditions"], "Accepted")["status"] == "True",
                condition(&gateway["status"]["conditions"], "Programmed")["status"] == "True",
                gateway["status"]["addresses"][0]["value"] == NODE_IP.to_string(),
                gateway["status"]["listeners"][0]["attachedRoutes"] == 4,
                condition(&gateway["status"]["listeners"][0]["conditions"], "Accepted")["status"]
                    == "True",
                app["status"]["parents"][0]["controllerName"] == "gateway.dev/controller",
                condition(&app["status"]["parents"][0]["conditions"], "Accepted")["status"]
                    == "True",
                condition(&app["status"]["parents"][0]["conditions"], "ResolvedRefs")["status"]
                    == "True",
                condition(
                    &broken["status"]["parents"][0]["conditions"],
                    "ResolvedRefs",
                )["reason"]
                    == "BackendNotFound",
            ];
            match checks.iter().position(|ok| !ok) {
                None => Ok(()),
                Some(i) => Err(format!(
                    "check {i} fails; gateway {gateway}, route {app}, broken {broken}"
                )),
            }
        })
        .await;

        // A WebSocket opened now must outlive the changes below.
        let slot = std::sync::Mutex::new(None);
        eventually("the WebSocket route serves", || async {
            let tcp = tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| e.to_string())?;
            let req = http::Request::get(format!("ws://{addr}/chat"))
                .header("host", "ws.example")
                .header("connection", "upgrade")
                .header("upgrade", "websocket")
                .header("sec-websocket-version", "13")
                .header(
                    "sec-websocket-key",
                    tokio_tungstenite::tungstenite::handshake::client::generate_key(),
                )
                .body(())
                .unwrap();
            let (socket, _) = tokio_tungstenite::client_async(req, tcp)
                .await
                .map_err(|e| e.to_string())?;
            *slot.lock().unwrap() = Some(socket);
            Ok(())
        })
        .await;
        let mut ws = slot.into_inner().unwrap().expect("connected");

        // Weights and endpoints change while requests keep coming: none may fail.
        let stop = Arc::new(AtomicBool::new(false));
        let (served, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
        let looping = tokio::spawn({
            let (stop, served, failed, failures) = (
                stop.clone(),
                served.clone(),
                failed.clone(),
                failures.clone(),
            );
            async move {
                while !stop.load(Ordering::Relaxed) {
                    match get(addr, "app.example", "/loop").await {
                        Ok(r) if r.status() == 200 => served.fetch_add(1, Ordering::Relaxed),
                        other => {
                            failures
                                .lock()
                                .unwrap()
                                .push(format!("{:?}", other.map(|r| (r.status(), r.text()))));
                            failed.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            }
        });
        k.patch(
            &format!("{GW_API}/namespaces/default/httproutes/app"),
            json!({"spec": {"rules": [
            {"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
             "backendRefs": [{"name": "svc-a", "port": 80, "weight": 0},
                             {"name": "svc-b", "port": 80, "weight": 1}]}]}}),
        )
        .await;
        eventually("the weights moved to b", || {
            body_is(addr, "app.example", "/w", "b")
        })
        .await;
        // b's endpoint replaced by c's in one EndpointSlice update.
        k.patch(
            &format!("{SLICES}/svc-b"),
            json!({
            "ports": [{"name": "http", "port": c.addr().port(), "protocol": "TCP"}]}),
        )
        .await;
        eventually("the endpoints moved to c", || {
            body_is(addr, "app.example", "/e", "c")
        })
        .await;
        stop.store(true, Ordering::Relaxed);
        looping.await.unwrap();
        let failures = failures.lock().unwrap().clone();
        assert_eq!(
            failed.load(Ordering::Relaxed),
            0,
            "requests failed across the changes: {failures:?}"
        );
        let served = served.load(Ordering::Relaxed);
        eprintln!("{served} requests served across the weight and endpoint changes");
        assert!(served > 10, "the loop ran");

        // The WebSocket opened before the changes still carries messages.
        {
            use futures_util::{SinkExt, StreamExt};
            use tokio_tungstenite::tungstenite::Message;
            ws.send(Message::text("still here"))
                .await
                .expect("the WebSocket was cut");
            let back = ws.next().await.expect("open").expect("message");
            assert_eq!(back.into_text().unwrap().as_str(), "still here");
        }

        // An endpoint that is not ready is left out: nothing is left to serve.
        k.patch(
            &format!("{SLICES}/svc-b"),
            slice("svc-b", &[(c.addr().port(), false)]),
        )
        .await;
        eventually("no ready endpoint", || async {
            let r = get(addr, "app.example", "/n").await?;
            (r.status() >= 500)
                .then_some(())
                .ok_or(format!("{}", r.status()))
        })
        .await;
        gw.shutdown().await;
    });
}

#[test]
fn https_filters_references_and_an_api_server_outage() {
    if !kube::available() {
        return;
    }
    kube::run(|mut k| async move {
        let a = Backend::start_on("a", SocketAddr::new(NODE_IP, 0)).await;
        let shadow = Backend::start_on("shadow", SocketAddr::new(NODE_IP, 0)).await;
        let gw = start_gateway(&k).await;
        let (http_port, https_port) = (free_port(), free_port());
        let ca = gateway_tests::TestCa::new();
        let (cert, key) = ca.issue(&["secure.example"], gateway_tests::KeyKind::Ecdsa);
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        k.create(
            &format!("{NS}/secrets"),
            json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": "secure-cert"},
            "data": {"tls.crt": b64(&cert), "tls.key": b64(&key)}}),
        )
        .await;
        k.create(
            &format!("{GW_API}/gatewayclasses"),
            json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
            "metadata": {"name": "ours"}, "spec": {"controllerName": "gateway.dev/controller"}}),
        )
        .await;
        k.create(&format!("{GW_API}/namespaces/default/gateways"), json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "gw"},
            "spec": {"gatewayClassName": "ours", "listeners": [
                {"name": "web", "port": http_port, "protocol": "HTTP",
                 "allowedRoutes": {"namespaces": {"from": "All"}}},
                {"name": "secure", "port": https_port, "protocol": "HTTPS", "hostname": "secure.example",
                 "tls": {"certificateRefs": [{"name": "secure-cert"}]}}]}}))
            .await;
        k.create(
            "/api/v1/namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace",
                                              "metadata": {"name": "other"}}),
        )
        .await;
        for (ns, name, backend) in [
            ("default", "svc-a", &a),
            ("default", "shadow", &shadow),
            ("other", "far", &a),
        ] {
            let base = format!("/api/v1/namespaces/{ns}");
            k.create(&format!("{base}/services"), service(name)).await;
            k.create(
                &format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"),
                slice(name, &[(backend.addr().port(), true)]),
            )
            .await;
        }
        k.create(&format!("{GW_API}/namespaces/default/httproutes"), json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "filters"},
            "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["app.example", "secure.example"],
                     "rules": [
                {"matches": [{"path": {"type": "PathPrefix", "value": "/v1"},
                              "headers": [{"name": "x-canary", "value": "yes"}]}],
                 "filters": [
                    {"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/v2"}}},
                    {"type": "ResponseHeaderModifier", "responseHeaderModifier": {"add": [{"name": "x-served-by", "value": "gw"}]}},
                    {"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "shadow", "port": 80}}}],
                 "backendRefs": [{"name": "svc-a", "port": 80}],
                 "timeouts": {"request": "5s"}},
                {"matches": [{"path": {"type": "PathPrefix", "value": "/q"},
                              "queryParams": [{"name": "v", "value": "2"}]}],
                 "backendRefs": [{"name": "svc-a", "port": 80}]}]}}))
            .await;
        // A route in `other` to a Service there, and one from `other` to `default` without a grant.
        k.create(&format!("{GW_API}/namespaces/other/httproutes"), json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "cross"},
            "spec": {"parentRefs": [{"name": "gw", "namespace": "default", "sectionName": "web"}],
                     "hostnames": ["cross.example"],
                     "rules": [{"backendRefs": [{"name": "svc-a", "namespace": "default", "port": 80}]}]}}))
            .await;
        let http = SocketAddr::new(NODE_IP, http_port);

        eventually("the header match and rewrite serve", || async {
            let req = Request::get("/v1/items")
                .header("host", "app.example")
                .header("x-canary", "yes")
                .body(Full::new(Bytes::new()))
                .unwrap();
            let tcp = tokio::net::TcpStream::connect(http)
                .await
                .map_err(|e| e.to_string())?;
            let res = gateway_tests::http1_over(tcp, http.to_string())
                .await
                .send(req)
                .await
                .map_err(|e| e.to_string())?;
            let seen = a
                .last()
                .map(|s| s.uri.path().to_owned())
                .unwrap_or_default();
            if res.status() == 200 && res.header("x-served-by") == "gw" && seen == "/v2/items" {
                Ok(())
            } else {
                let gateway = k
                    .get(&format!("{GW_API}/namespaces/default/gateways/gw"))
                    .await;
                let route = k
                    .get(&format!("{GW_API}/namespaces/default/httproutes/filters"))
                    .await;
                Err(format!(
                    "{} {:?} seen {seen}; gateway {}; route {}",
                    res.status(),
                    res.text(),
                    gateway["status"],
                    route["status"]
                ))
            }
        })
        .await;
        eventually("the mirror got a copy", || async {
            (shadow.requests() > 0)
                .then_some(())
                .ok_or("no copy".to_owned())
        })
        .await;
        // A query parameter match: only with the parameter as written.
        assert_eq!(
            get(http, "app.example", "/q?x=1&v=2")
                .await
                .unwrap()
                .status(),
            200
        );
        assert_eq!(
            get(http, "app.example", "/q?v=3").await.unwrap().status(),
            404
        );
        // Without the header, nothing matches on this host.
        assert_eq!(
            get(http, "app.example", "/v1/items")
                .await
                .unwrap()
                .status(),
            404
        );

        // HTTPS with the Secret's certificate.
        let (mut client, _) = gateway_tests::https(
            SocketAddr::new(NODE_IP, https_port),
            "secure.example",
            &ca,
            &[b"http/1.1"],
        )
        .await;
        let req = Request::get("/v1/x")
            .header("x-canary", "yes")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let res = client.send(req).await.unwrap();
        assert_eq!(res.status(), 200, "{}", res.text());

        // The cross-namespace reference is refused until a ReferenceGrant allows it.
        let cross = format!("{GW_API}/namespaces/other/httproutes/cross");
        eventually("RefNotPermitted", || async {
            let r = k.get(&cross).await;
            let c = condition(&r["status"]["parents"][0]["conditions"], "ResolvedRefs");
            (c["reason"] == "RefNotPermitted")
                .then_some(())
                .ok_or(format!("{r}"))
        })
        .await;
        assert_eq!(get(http, "cross.example", "/").await.unwrap().status(), 500);
        k.create("/apis/gateway.networking.k8s.io/v1beta1/namespaces/default/referencegrants", json!({
            "apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
            "metadata": {"name": "from-other"},
            "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "other"}],
                     "to": [{"group": "", "kind": "Service"}]}}))
            .await;
        eventually("the grant resolves the reference", || {
            body_is(http, "cross.example", "/", "a")
        })
        .await;

        // The API server goes away: the gateway keeps serving what it has, then catches up.
        k.stop_apiserver();
        tokio::time::sleep(Duration::from_millis(500)).await;
        body_is(http, "cross.example", "/", "a")
            .await
            .expect("serving through the outage");
        k.start_apiserver().await;
        k.patch(
            &format!("{GW_API}/namespaces/other/httproutes/cross"),
            json!({"spec": {"hostnames": ["moved.example"]}}),
        )
        .await;
        eventually("the change made after the outage applies", || {
            body_is(http, "moved.example", "/", "a")
        })
        .await;

        // A Gateway whose port cannot be bound (backend `a` holds it): its listener is left
        // out and says why; every other Gateway and change still applies.
        let clash = format!("{GW_API}/namespaces/default/gateways/clash");
        k.create(
            &format!("{GW_API}/namespaces/default/gateways"),
            json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "clash"},
            "spec": {"gatewayClassName": "ours",
                     "listeners": [{"name": "web", "port": a.addr().port(), "protocol": "HTTP"}]}}),
        )
        .await;
        eventually("the clashing Gateway is not programmed", || async {
            let g = k.get(&clash).await;
            let c = condition(&g["status"]["listeners"][0]["conditions"], "Programmed");
            (c["status"] == "False"
                && condition(&g["status"]["conditions"], "Programmed")["status"] == "False")
                .then_some(())
                .ok_or(format!("{}", g["status"]))
        })
        .await;
        let gateway = k
            .get(&format!("{GW_API}/namespaces/default/gateways/gw"))
            .await;
        assert_eq!(
            condition(&gateway["status"]["conditions"], "Programmed")["status"],
            "True"
        );
        k.patch(
            &format!("{GW_API}/namespaces/other/httproutes/cross"),
            json!({"spec": {"hostnames": ["again.example"]}}),
        )
        .await;
        eventually("changes still apply beside the clash", || {
            body_is(http, "again.example", "/", "a")
        })
        .await;
        k.delete(&clash).await;
        gw.shutdown().await;
    });
}

/// The objects of a manifest in `deploy/kubernetes/`.
fn manifest(file: &str) -> Vec<Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/kubernetes")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.split("\n---\n")
        .map(|doc| serde_yaml::from_str(doc).expect("manifest YAML"))
        .collect()
}

/// Where an object of `kind` is created.
fn collection(object: &Value) -> String {
    let ns = object["metadata"]["namespace"].as_str().unwrap_or_default();
    match object["kind"].as_str().unwrap_or_default() {
        "Namespace" => "/api/v1/namespaces".into(),
        "ServiceAccount" => format!("/api/v1/namespaces/{ns}/serviceaccounts"),
        "ConfigMap" => format!("/api/v1/namespaces/{ns}/configmaps"),
        "ClusterRole" => "/apis/rbac.authorization.k8s.io/v1/clusterroles".into(),
        "ClusterRoleBinding" => "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings".into(),
        "GatewayClass" => format!("{GW_API}/gatewayclasses"),
        other => panic!("no collection for {other}"),
    }
}

#[test]
fn the_deploy_rbac_is_enough_for_the_controller() {
    if !kube::available() {
        return;
    }
    kube::run(|k| async move {
        for file in [
            "namespace.yaml",
            "rbac.yaml",
            "config.yaml",
            "gatewayclass.yaml",
        ] {
            for object in manifest(file) {
                k.create(&collection(&object), object).await;
            }
        }
        // The ConfigMap's file is a config the gateway reads.
        let config_map = &manifest("config.yaml")[0];
        gateway_config::parse(
            config_map["data"]["gateway.yaml"].as_str().unwrap(),
            "config.yaml",
        )
        .expect("the deploy config parses");
        // A token of the deploy's service account, and a kubeconfig with it.
        let token = k
            .create(
                "/api/v1/namespaces/gateway-system/serviceaccounts/gateway/token",
                json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}),
            )
            .await["status"]["token"]
            .as_str()
            .expect("token")
            .to_owned();
        let kubeconfig = k.dir().join("service-account.yaml");
        let admin = std::fs::read_to_string(&k.kubeconfig).unwrap();
        let token_line = admin.lines().find(|l| l.starts_with("users:")).unwrap();
        std::fs::write(
            &kubeconfig,
            admin.replace(
                token_line,
                &format!("users: [{{name: admin, user: {{token: '{token}'}}}}]"),
            ),
        )
        .unwrap();

        let a = Backend::start_on("a", SocketAddr::new(NODE_IP, 0)).await;
        let port = free_port();
        let yaml = format!(
            "server: {{ watch_config: false }}\n\
             kubernetes: {{ kubeconfig: {}, listen_address: {NODE_IP} }}\n",
            kubeconfig.display()
        );
        let gw = TestGateway::start(&yaml).await;
        k.create(
            &format!("{GW_API}/namespaces/default/gateways"),
            json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "gw"},
            "spec": {"gatewayClassName": "gateway",
                     "listeners": [{"name": "web", "port": port, "protocol": "HTTP"}]}}),
        )
        .await;
        k.create(&format!("{NS}/services"), service("svc-a")).await;
        k.create(SLICES, slice("svc-a", &[(a.addr().port(), true)]))
            .await;
        k.create(
            &format!("{GW_API}/namespaces/default/httproutes"),
            json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "app"},
            "spec": {"parentRefs": [{"name": "gw"}],
                     "rules": [{"backendRefs": [{"name": "svc-a", "port": 80}]}]}}),
        )
        .await;
        let addr = SocketAddr::new(NODE_IP, port);
        eventually("served with the deploy's permissions", || {
            body_is(addr, "any", "/", "a")
        })
        .await;
        route_accepted(
            &k,
            "status written with the deploy's permissions",
            "httproutes/app",
        )
        .await;
        gw.shutdown().await;

        // The same service account as a pod sees it: no kubeconfig, the token, CA and
        // namespace files at the service-account path (a tmpfs of the gateway process's own
        // mount namespace) and `KUBERNETES_SERVICE_HOST`/`_PORT`. The gateway binary takes the
        // Gateway over and serves its route again.
        let sa = k.dir().join("pod-service-account");
        std::fs::create_dir_all(&sa).unwrap();
        std::fs::write(sa.join("token"), &token).unwrap();
        std::fs::copy(k.dir().join("ca.crt"), sa.join("ca.crt")).unwrap();
        std::fs::write(sa.join("namespace"), "gateway-system").unwrap();
        let config = k.dir().join("in-cluster.yaml");
        std::fs::write(
            &config,
            format!(
                "server: {{ watch_config: false }}\nkubernetes: {{ listen_address: {NODE_IP} }}\n"
            ),
        )
        .unwrap();
        let script = "mount -t tmpfs tmpfs /run \
            && mkdir -p /run/secrets/kubernetes.io/serviceaccount \
            && cp \"$SA\"/* /run/secrets/kubernetes.io/serviceaccount/ \
            && exec \"$GATEWAY\" run --config \"$CONFIG\"";
        let child = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", script])
            .env("SA", &sa)
            .env("GATEWAY", gateway_tests::gateway_binary())
            .env("CONFIG", &config)
            .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            .env("KUBERNETES_SERVICE_PORT", kube::API_PORT.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(k.dir().join("in-cluster.log")).unwrap())
            .spawn()
            .expect("start the gateway binary");
        let _pod = Running(child);
        let log = k.dir().join("in-cluster.log");
        eventually("served with in-cluster credentials", || async {
            body_is(addr, "any", "/", "a").await.map_err(|e| {
                format!(
                    "{e}; log: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                )
            })
        })
        .await;
    });
}

#[test]
fn grpc_routes_reach_h2c_backends() {
    use gateway_tests::backend::grpc::{self, Channel, EchoReply, EchoRequest, GrpcBackend, UNARY};
    if !kube::available() {
        return;
    }
    kube::run(|k| async move {
        let echo = GrpcBackend::start_on("echo", SocketAddr::new(NODE_IP, 0)).await;
        let gw = start_gateway(&k).await;
        let port = free_port();
        create_gateway(&k, port).await;
        k.create(&format!("{NS}/services"), service("echo")).await;
        k.create(SLICES, slice("echo", &[(echo.addr().port(), true)]))
            .await;
        k.create(&format!("{GW_API}/namespaces/default/grpcroutes"), json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GRPCRoute",
            "metadata": {"name": "echo"},
            "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["grpc.example"],
                     "rules": [{"matches": [{"method": {"service": "test.Echo", "method": "Unary"}}],
                                "backendRefs": [{"name": "echo", "port": 80}]}]}}))
            .await;
        let addr = SocketAddr::new(NODE_IP, port);
        eventually("the GRPCRoute serves", || async {
            // The listener is bound once the config applies: until then, refused.
            let tcp = tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| e.to_string())?;
            let channel = Channel::handshake(tcp).await;
            let mut client = channel.client("http://grpc.example");
            client.ready().await.map_err(|e| e.to_string())?;
            let reply: EchoReply = client
                .unary(
                    tonic::Request::new(EchoRequest {
                        message: "hi".into(),
                        count: 0,
                    }),
                    http::uri::PathAndQuery::from_static(UNARY),
                    grpc::codec(),
                )
                .await
                .map_err(|e| e.to_string())?
                .into_inner();
            (reply.backend == "echo")
                .then_some(())
                .ok_or(format!("{reply:?}"))
        })
        .await;
        route_accepted(&k, "GRPCRoute status", "grpcroutes/echo").await;
        gw.shutdown().await;
    });
}

#[test]
fn tcp_routes_become_streams() {
    use gateway_tests::backend::l4::TcpBackend;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if !kube::available() {
        return;
    }
    kube::run(|k| async move {
        let backend = TcpBackend::tag_on("tcp-a", SocketAddr::new(NODE_IP, 0)).await;
        let gw = start_gateway(&k).await;
        let port = free_port();
        create_gateway_with(&k, json!([{"name": "db", "port": port, "protocol": "TCP"}])).await;
        k.create(&format!("{NS}/services"), service("db")).await;
        k.create(SLICES, slice("db", &[(backend.addr().port(), true)]))
            .await;
        k.create(
            "/apis/gateway.networking.k8s.io/v1alpha2/namespaces/default/tcproutes",
            json!({
            "apiVersion": "gateway.networking.k8s.io/v1alpha2", "kind": "TCPRoute",
            "metadata": {"name": "db"},
            "spec": {"parentRefs": [{"name": "gw", "sectionName": "db"}],
                     "rules": [{"backendRefs": [{"name": "db", "port": 80}]}]}}),
        )
        .await;
        let addr = SocketAddr::new(NODE_IP, port);
        eventually("the TCPRoute carries bytes", || async {
            let mut tcp = tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| e.to_string())?;
            let mut tag = [0u8; 6];
            tcp.read_exact(&mut tag).await.map_err(|e| e.to_string())?;
            tcp.write_all(b"ping").await.map_err(|e| e.to_string())?;
            let mut echo = [0u8; 4];
            tcp.read_exact(&mut echo).await.map_err(|e| e.to_string())?;
            (&tag == b"tcp-a\n" && &echo == b"ping")
                .then_some(())
                .ok_or(format!("{tag:?} {echo:?}"))
        })
        .await;
        // A connection open while the route's endpoints change is not cut: new connections go
        // to the new endpoint, the open one keeps its backend.
        let mut held = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut tag = [0u8; 6];
        held.read_exact(&mut tag).await.unwrap();
        assert_eq!(&tag, b"tcp-a\n");
        let moved = TcpBackend::tag_on("tcp-b", SocketAddr::new(NODE_IP, 0)).await;
        k.patch(
            &format!("{SLICES}/db"),
            json!({"ports": [{"name": "http", "port": moved.addr().port(), "protocol": "TCP"}]}),
        )
        .await;
        eventually("new connections reach the new endpoint", || async {
            let mut tcp = tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| e.to_string())?;
            let mut tag = [0u8; 6];
            tcp.read_exact(&mut tag).await.map_err(|e| e.to_string())?;
            (&tag == b"tcp-b\n").then_some(()).ok_or(format!("{tag:?}"))
        })
        .await;
        held.write_all(b"still here").await.unwrap();
        let mut echo = [0u8; 10];
        held.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, b"still here");
        eventually("TCPRoute status", || async {
            let r = k
                .get("/apis/gateway.networking.k8s.io/v1alpha2/namespaces/default/tcproutes/db")
                .await;
            let g = k
                .get(&format!("{GW_API}/namespaces/default/gateways/gw"))
                .await;
            let ok = condition(&r["status"]["parents"][0]["conditions"], "Accepted")["status"]
                == "True"
                && g["status"]["listeners"][0]["supportedKinds"][0]["kind"] == "TCPRoute"
                && g["status"]["listeners"][0]["attachedRoutes"] == 1;
            ok.then_some(()).ok_or(format!("{r} {g}"))
        })
        .await;
        gw.shutdown().await;
    });
}

#[test]
fn tls_routes_pass_through_by_server_name_and_udp_routes_carry_datagrams() {
    use gateway_tests::TestCa;
    use gateway_tests::backend::l4::{TlsTag, UdpEcho};
    use tokio::io::AsyncReadExt;
    if !kube::available() {
        return;
    }
    kube::run(|k| async move {
        let ca = TestCa::new();
        let on_node = SocketAddr::new(NODE_IP, 0);
        let a = TlsTag::start_on(&ca, &["a.example.com"], "a", on_node).await;
        let b = TlsTag::start_on(&ca, &["x.b.example.com"], "b", on_node).await;
        let any = TlsTag::start_on(&ca, &["other.example.com"], "any", on_node).await;
        let echo = UdpEcho::start_on(on_node).await;
        let gw = start_gateway(&k).await;
        let (tls_port, udp_port) = (free_port(), free_port());
        create_gateway_with(
            &k,
            json!([
                {"name": "tls", "port": tls_port, "protocol": "TLS", "tls": {"mode": "Passthrough"}},
                {"name": "dns", "port": udp_port, "protocol": "UDP"}]),
        )
        .await;
        for (name, port) in [
            ("svc-a", a.addr().port()),
            ("svc-b", b.addr().port()),
            ("svc-any", any.addr().port()),
            ("dns", echo.addr().port()),
        ] {
            k.create(&format!("{NS}/services"), service(name)).await;
            k.create(SLICES, slice(name, &[(port, true)])).await;
        }
        let tls_routes = "/apis/gateway.networking.k8s.io/v1alpha2/namespaces/default/tlsroutes";
        for (name, hostnames, service) in [
            ("a", json!(["a.example.com"]), "svc-a"),
            ("b", json!(["*.b.example.com"]), "svc-b"),
            ("any", json!([]), "svc-any"),
        ] {
            k.create(
                tls_routes,
                json!({
                "apiVersion": "gateway.networking.k8s.io/v1alpha2", "kind": "TLSRoute",
                "metadata": {"name": name},
                "spec": {"parentRefs": [{"name": "gw", "sectionName": "tls"}],
                         "hostnames": hostnames,
                         "rules": [{"backendRefs": [{"name": service, "port": 80}]}]}}),
            )
            .await;
        }
        k.create(
            "/apis/gateway.networking.k8s.io/v1alpha2/namespaces/default/udproutes",
            json!({
            "apiVersion": "gateway.networking.k8s.io/v1alpha2", "kind": "UDPRoute",
            "metadata": {"name": "dns"},
            "spec": {"parentRefs": [{"name": "gw", "sectionName": "dns"}],
                     "rules": [{"backendRefs": [{"name": "dns", "port": 80}]}]}}),
        )
        .await;
        // End-to-end TLS with each backend's own certificate: the gateway only read the name.
        let tls_addr = SocketAddr::new(NODE_IP, tls_port);
        for (name, want) in [
            ("a.example.com", "a\n"),
            ("x.b.example.com", "b\n"),
            ("other.example.com", "any\n"),
        ] {
            let config = ca.client_config(&[]);
            eventually(&format!("TLSRoute for {name}"), || {
                let config = config.clone();
                async move {
                    let mut tls = gateway_tests::tls_connect(tls_addr, name, config)
                        .await
                        .map_err(|e| e.to_string())?;
                    let mut got = String::new();
                    tls.read_to_string(&mut got)
                        .await
                        .map_err(|e| e.to_string())?;
                    (got == want).then_some(()).ok_or(format!("{got:?}"))
                }
            })
            .await;
        }
        let udp_addr = SocketAddr::new(NODE_IP, udp_port);
        eventually("the UDPRoute carries datagrams", || async {
            let socket = tokio::net::UdpSocket::bind(SocketAddr::new(NODE_IP, 0))
                .await
                .map_err(|e| e.to_string())?;
            socket
                .send_to(b"query", udp_addr)
                .await
                .map_err(|e| e.to_string())?;
            let mut buf = [0u8; 16];
            let n = tokio::time::timeout(Duration::from_millis(500), socket.recv(&mut buf))
                .await
                .map_err(|_| "no answer".to_owned())?
                .map_err(|e| e.to_string())?;
            (&buf[..n] == b"query")
                .then_some(())
                .ok_or(format!("{:?}", &buf[..n]))
        })
        .await;
        eventually("TLSRoute and UDPRoute status", || async {
            let g = k
                .get(&format!("{GW_API}/namespaces/default/gateways/gw"))
                .await;
            let mut ok = g["status"]["listeners"][0]["supportedKinds"][0]["kind"] == "TLSRoute"
                && g["status"]["listeners"][0]["attachedRoutes"] == 3
                && g["status"]["listeners"][1]["attachedRoutes"] == 1;
            for route in [
                "tlsroutes/a",
                "tlsroutes/b",
                "tlsroutes/any",
                "udproutes/dns",
            ] {
                let r = k
                    .get(&format!(
                        "/apis/gateway.networking.k8s.io/v1alpha2/namespaces/default/{route}"
                    ))
                    .await;
                ok &= condition(&r["status"]["parents"][0]["conditions"], "Accepted")["status"]
                    == "True";
            }
            ok.then_some(()).ok_or(format!("{g}"))
        })
        .await;
        gw.shutdown().await;
    });
}

#[test]
fn a_listener_selector_admits_routes_as_namespace_labels_change() {
    if !kube::available() {
        return;
    }
    kube::run(|k| async move {
        let backend = Backend::start_on("team", SocketAddr::new(NODE_IP, 0)).await;
        let gw = start_gateway(&k).await;
        let port = free_port();
        k.create(
            "/api/v1/namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}}),
        )
        .await;
        create_gateway_with(
            &k,
            json!([
                {"name": "web", "port": port, "protocol": "HTTP",
                 "allowedRoutes": {"namespaces": {"from": "Selector",
                     "selector": {"matchLabels": {"gateway-access": "granted"}}}}}]),
        )
        .await;
        let team = "/api/v1/namespaces/team";
        k.create(&format!("{team}/services"), service("app")).await;
        k.create(
            "/apis/discovery.k8s.io/v1/namespaces/team/endpointslices",
            slice("app", &[(backend.addr().port(), true)]),
        )
        .await;
        k.create(
            &format!("{GW_API}/namespaces/team/httproutes"),
            json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "app"},
            "spec": {"parentRefs": [{"name": "gw", "namespace": "default"}],
                     "hostnames": ["team.example"],
                     "rules": [{"backendRefs": [{"name": "app", "port": 80}]}]}}),
        )
        .await;
        let route = format!("{GW_API}/namespaces/team/httproutes/app");
        let accepted_reason = |r: &Value| {
            condition(&r["status"]["parents"][0]["conditions"], "Accepted")["reason"].clone()
        };
        eventually("a namespace without the label is not admitted", || async {
            let r = k.get(&route).await;
            (accepted_reason(&r) == "NotAllowedByListeners")
                .then_some(())
                .ok_or(format!("{r}"))
        })
        .await;
        let addr = SocketAddr::new(NODE_IP, port);
        assert_eq!(get(addr, "team.example", "/").await.unwrap().status(), 404);
        // Labelling the namespace admits its route: the controller watches Namespaces.
        k.patch(
            team,
            json!({"metadata": {"labels": {"gateway-access": "granted"}}}),
        )
        .await;
        eventually("the labelled namespace's route serves", || {
            body_is(addr, "team.example", "/", "team")
        })
        .await;
        eventually("and is accepted", || async {
            let r = k.get(&route).await;
            (accepted_reason(&r) == "Accepted")
                .then_some(())
                .ok_or(format!("{r}"))
        })
        .await;
        gw.shutdown().await;
    });
}
