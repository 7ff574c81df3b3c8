//! A real Kubernetes API server for the Gateway API tests: etcd and kube-apiserver (built by
//! `scripts/kube-env.sh`) started in a network namespace the test creates, with `lo` up and
//! [`NODE_IP`] on it. EndpointSlices refuse loopback addresses, so backends listen on
//! [`NODE_IP`]; everything — the API server, the backends, the gateway, the clients — runs in
//! that namespace, on a thread that entered it. Dropping the environment kills the servers and
//! deletes the namespace, on failure too.
//!
//! Without the binaries the tests skip with a loud message, unless `CI=true`, where that is a
//! failure: CI must have built them.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use gateway_kubernetes::Client;
use serde_json::{Value, json};

use crate::{Running, TestCa};

/// The address on the namespace's `lo` that backends and the gateway listen on.
pub const NODE_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 10));

/// The API server's port, on the namespace's loopback address.
pub const API_PORT: u16 = 6443;
const ETCD_PORT: u16 = 2379;
const TOKEN: &str = "gateway-test-admin-token";

/// Where `scripts/kube-env.sh` puts its output.
pub fn kube_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("GATEWAY_KUBE_DIR") {
        return d.into();
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache")
        });
    cache.join("gateway-test").join("kube")
}

/// Whether the tests can run here; `false` (said loudly) means skip. Panics in CI.
pub fn available() -> bool {
    let dir = kube_dir();
    let missing: Vec<String> = ["bin/etcd", "bin/kube-apiserver", "crds"]
        .iter()
        .filter(|p| !dir.join(p).exists())
        .map(|p| dir.join(p).display().to_string())
        .collect();
    let root = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
    });
    let reason = if !missing.is_empty() {
        format!("missing {} (run scripts/kube-env.sh)", missing.join(", "))
    } else if !root {
        "network namespaces need root".to_owned()
    } else {
        return true;
    };
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("the Kubernetes tests cannot run in CI: {reason}");
    }
    eprintln!("\n*** SKIPPED: Kubernetes Gateway API test: {reason} ***\n");
    false
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A network namespace, deleted on drop.
struct NetNs {
    name: String,
}

impl NetNs {
    fn create() -> Self {
        let name = format!(
            "gwkube-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let ns = Self { name };
        ns.ip(&["netns", "add", &ns.name]);
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        ns.exec(&["ip", "addr", "add", &format!("{NODE_IP}/32"), "dev", "lo"]);
        ns
    }

    fn ip(&self, args: &[&str]) {
        let status = Command::new("ip").args(args).status().expect("run ip");
        assert!(status.success(), "ip {args:?} failed");
    }

    fn exec(&self, args: &[&str]) {
        let mut all = vec!["netns", "exec", &self.name];
        all.extend_from_slice(args);
        self.ip(&all);
    }

    fn command(&self, program: &std::path::Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }

    /// Moves the calling thread into the namespace.
    #[allow(
        unsafe_code,
        reason = "setns(2) has no safe wrapper in the workspace's crates"
    )]
    fn enter(&self) {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open(format!("/run/netns/{}", self.name)).expect("open netns");
        // SAFETY: `file` is an open namespace file for the duration of the call; setns only
        // changes the calling thread's network namespace.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// etcd and kube-apiserver running in their namespace.
pub struct KubeCluster {
    /// An admin client (group `system:masters`).
    pub client: Client,
    /// A kubeconfig for the gateway, in [`KubeCluster::dir`].
    pub kubeconfig: PathBuf,
    // Drop order: servers first, then the namespace, then the files.
    apiserver: Option<Running>,
    _etcd: Running,
    ns: NetNs,
    dir: tempfile::TempDir,
}

impl KubeCluster {
    /// A directory for the test's own files (kept until the cluster is dropped).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Kills the API server (an outage: watches break, connections are refused); etcd keeps
    /// the data.
    pub fn stop_apiserver(&mut self) {
        self.apiserver = None;
    }

    /// Starts the API server again on the same port and data, and waits until it is ready.
    pub async fn start_apiserver(&mut self) {
        self.apiserver = Some(spawn_apiserver(&self.ns, self.dir.path()));
        wait_for(self, "/readyz", Duration::from_secs(60)).await;
    }
}

fn spawn_apiserver(ns: &NetNs, d: &std::path::Path) -> Running {
    let bin = kube_dir().join("bin");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(d.join("apiserver.log"))
        .expect("log file");
    let child = ns
        .command(&bin.join("kube-apiserver"))
        .arg(format!("--etcd-servers=http://127.0.0.1:{ETCD_PORT}"))
        .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"])
        .arg(format!("--secure-port={API_PORT}"))
        .arg(format!(
            "--tls-cert-file={}",
            d.join("apiserver.crt").display()
        ))
        .arg(format!(
            "--tls-private-key-file={}",
            d.join("apiserver.key").display()
        ))
        .arg(format!(
            "--token-auth-file={}",
            d.join("tokens.csv").display()
        ))
        .arg("--authorization-mode=RBAC")
        .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
        .arg(format!(
            "--service-account-key-file={}",
            d.join("sa.pub").display()
        ))
        .arg(format!(
            "--service-account-signing-key-file={}",
            d.join("sa.key").display()
        ))
        .arg("--service-cluster-ip-range=10.96.0.0/16")
        .arg("--endpoint-reconciler-type=none")
        .args(["--enable-priority-and-fairness=false", "--profiling=false"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start kube-apiserver");
    Running(child)
}

/// Runs `test` on a thread inside a fresh namespace holding a started cluster, on a runtime
/// whose threads are all in that namespace. Returns when the test does; panics propagate.
pub fn run<F, Fut>(test: F)
where
    F: FnOnce(KubeCluster) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let ns = NetNs::create();
    let handle = std::thread::spawn(move || {
        ns.enter();
        // Worker threads are created from this thread and inherit its namespace.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let cluster = start(ns).await;
            test(cluster).await;
        });
    });
    if let Err(panic) = handle.join() {
        std::panic::resume_unwind(panic);
    }
}

async fn start(ns: NetNs) -> KubeCluster {
    let bin = kube_dir().join("bin");
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let ca = TestCa::new();
    let (cert, key) = ca.issue(
        &["127.0.0.1", &NODE_IP.to_string(), "localhost"],
        crate::KeyKind::Ecdsa,
    );
    std::fs::write(d.join("apiserver.crt"), &cert).unwrap();
    std::fs::write(d.join("apiserver.key"), &key).unwrap();
    std::fs::write(d.join("ca.crt"), &ca.pem).unwrap();
    let sa = rcgen::KeyPair::generate().expect("service-account key");
    std::fs::write(d.join("sa.key"), sa.serialize_pem()).unwrap();
    std::fs::write(d.join("sa.pub"), sa.public_key_pem()).unwrap();
    std::fs::write(
        d.join("tokens.csv"),
        format!("{TOKEN},admin,admin,\"system:masters\"\n"),
    )
    .unwrap();
    let log = |name: &str| std::fs::File::create(d.join(name)).expect("log file");
    let etcd = ns
        .command(&bin.join("etcd"))
        .arg(format!("--data-dir={}", d.join("etcd").display()))
        .arg(format!("--listen-client-urls=http://127.0.0.1:{ETCD_PORT}"))
        .arg(format!(
            "--advertise-client-urls=http://127.0.0.1:{ETCD_PORT}"
        ))
        .arg("--listen-peer-urls=http://127.0.0.1:2380")
        .stdout(Stdio::null())
        .stderr(log("etcd.log"))
        .spawn()
        .expect("start etcd");
    let etcd = Running(etcd);
    let apiserver = spawn_apiserver(&ns, d);
    let kubeconfig = d.join("kubeconfig.yaml");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: test\n\
             clusters: [{{name: test, cluster: {{server: 'https://127.0.0.1:{API_PORT}', certificate-authority: ca.crt}}}}]\n\
             users: [{{name: admin, user: {{token: {TOKEN}}}}}]\n\
             contexts: [{{name: test, context: {{cluster: test, user: admin}}}}]\n"
        ),
    )
    .unwrap();
    let client = Client::new(Some(&kubeconfig)).expect("client");
    let cluster = KubeCluster {
        client,
        kubeconfig,
        apiserver: Some(apiserver),
        _etcd: etcd,
        ns,
        dir,
    };
    wait_for(&cluster, "/readyz", Duration::from_secs(60)).await;
    wait_for(
        &cluster,
        "/api/v1/namespaces/default",
        Duration::from_secs(30),
    )
    .await;
    apply_crds(&cluster).await;
    cluster
}

/// Waits until GET `path` succeeds (the API server's own readiness is a state, not an event).
async fn wait_for(cluster: &KubeCluster, path: &str, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let ok = match path {
            "/readyz" => cluster.client.get_text(path).await.is_ok(),
            _ => cluster.client.get(path).await.is_ok(),
        };
        if ok {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            let log =
                std::fs::read_to_string(cluster.dir().join("apiserver.log")).unwrap_or_default();
            let tail: String = log.lines().rev().take(30).collect::<Vec<_>>().join("\n");
            panic!(
                "{path} not ready after {limit:?}; apiserver log (last lines, newest first):\n{tail}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates the Gateway API CRDs and waits until they serve.
async fn apply_crds(cluster: &KubeCluster) {
    let dir = kube_dir().join("crds");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("crds dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let crd: Value = serde_yaml::from_str(&text).expect("crd yaml");
        cluster
            .client
            .post(
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                &crd,
            )
            .await
            .unwrap_or_else(|e| panic!("create {}: {e}", f.display()));
    }
    for path in [
        "/apis/gateway.networking.k8s.io/v1/gatewayclasses",
        "/apis/gateway.networking.k8s.io/v1/gateways",
        "/apis/gateway.networking.k8s.io/v1/httproutes",
        "/apis/gateway.networking.k8s.io/v1/grpcroutes",
        "/apis/gateway.networking.k8s.io/v1alpha2/tcproutes",
        "/apis/gateway.networking.k8s.io/v1beta1/referencegrants",
    ] {
        wait_for(cluster, path, Duration::from_secs(30)).await;
    }
}

impl KubeCluster {
    /// Creates an object (`path` is its collection).
    pub async fn create(&self, path: &str, object: Value) -> Value {
        self.client
            .post(path, &object)
            .await
            .unwrap_or_else(|e| panic!("create in {path}: {e}"))
    }

    /// Merge-patches an object's spec (or any top-level fields).
    pub async fn patch(&self, path: &str, patch: Value) -> Value {
        self.client
            .json(http::Method::PATCH, path, &patch)
            .await
            .unwrap_or_else(|e| panic!("patch {path}: {e}"))
    }

    /// GETs an object.
    pub async fn get(&self, path: &str) -> Value {
        self.client
            .get(path)
            .await
            .unwrap_or_else(|e| panic!("get {path}: {e}"))
    }

    /// Deletes an object.
    pub async fn delete(&self, path: &str) {
        self.client
            .json(http::Method::DELETE, path, &json!({}))
            .await
            .unwrap_or_else(|e| panic!("delete {path}: {e}"));
    }
}
