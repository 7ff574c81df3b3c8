//! A real ACME CA for tests: Pebble and its challenge test server (as DNS, answering every name
//! with 127.0.0.1) on loopback ports picked per test. Pebble validates challenges against the
//! gateway's own listeners (its `httpPort`/`tlsPort` are the gateway's), serves its directory
//! over HTTPS with a certificate from a per-test CA, and hands out its issuing root on the
//! management API. The binaries come from `go install` (see `scripts/setup.sh`); without them
//! [`Pebble::start`] says why and returns `None`, and the test skips.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::TestCa;
use crate::ports::reserved_port;

/// Pebble and its DNS, stopped on drop.
pub struct Pebble {
    children: Vec<Child>,
    /// The ACME directory URL.
    pub directory: String,
    /// PEM file of the CA that signed Pebble's HTTPS certificate (`acme.directory_ca`).
    pub directory_ca: PathBuf,
    /// The management API address (roots).
    management: SocketAddr,
    ca: TestCa,
}

/// Where `go install` puts a binary: `$PEBBLE_BIN`, `$GOBIN`, `$GOPATH/bin`, `~/go/bin`, `PATH`.
fn find(binary: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for var in ["PEBBLE_BIN", "GOBIN"] {
        if let Some(d) = std::env::var_os(var) {
            dirs.push(d.into());
        }
    }
    if let Some(p) = std::env::var_os("GOPATH") {
        dirs.extend(std::env::split_paths(&p).map(|d| d.join("bin")));
    }
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(Path::new(&home).join("go/bin"));
    }
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    dirs.into_iter()
        .map(|d| d.join(binary))
        .find(|p| p.is_file())
}

impl Pebble {
    /// Starts Pebble validating on the gateway ports `http_port` (HTTP-01) and `tls_port`
    /// (TLS-ALPN-01), with files in `dir`. `None` (after printing why) when not installed.
    pub async fn start(dir: &Path, http_port: u16, tls_port: u16) -> Option<Self> {
        let (Some(pebble), Some(challtestsrv)) = (find("pebble"), find("pebble-challtestsrv"))
        else {
            eprintln!(
                "skipping: pebble and pebble-challtestsrv are not installed (they need Go; \
                 scripts/setup.sh installs them with `go install`)"
            );
            return None;
        };
        // Its ports are picked free and released before Pebble binds them, so a test running
        // alongside can take one first; Pebble then exits. Start again on fresh ports.
        for attempt in 1..=3 {
            match Self::spawn(dir, &pebble, &challtestsrv, http_port, tls_port).await {
                Ok(me) => return Some(me),
                Err(port) => eprintln!(
                    "pebble attempt {attempt}: port {port} did not open (taken by another test?): {}",
                    std::fs::read_to_string(dir.join("pebble.err")).unwrap_or_default()
                ),
            }
        }
        panic!("pebble did not start in three attempts");
    }

    /// One start on freshly picked ports; `Err(port)` names a port that did not open.
    async fn spawn(
        dir: &Path,
        pebble: &Path,
        challtestsrv: &Path,
        http_port: u16,
        tls_port: u16,
    ) -> Result<Self, u16> {
        let ca = TestCa::new();
        let (cert, key) = ca.write(
            dir,
            "pebble-https",
            &["localhost", "127.0.0.1"],
            crate::KeyKind::Ecdsa,
        );
        let directory_ca = dir.join("pebble-https-ca.pem");
        std::fs::write(&directory_ca, &ca.pem).expect("write CA");

        let dns = reserved_port();
        let challtest_mgmt = reserved_port();
        let listen = reserved_port();
        let management = reserved_port();
        let config = serde_json::json!({
            "pebble": {
                "listenAddress": format!("127.0.0.1:{listen}"),
                "managementListenAddress": format!("127.0.0.1:{management}"),
                "certificate": cert,
                "privateKey": key,
                "httpPort": http_port,
                "tlsPort": tls_port,
                "ocspResponderURL": "",
                "externalAccountBindingRequired": false,
                "retryAfter": { "authz": 1, "order": 1 },
                "profiles": { "default": { "description": "test", "validityPeriod": 7_776_000 } }
            }
        });
        let config_path = dir.join("pebble.json");
        std::fs::write(&config_path, config.to_string()).expect("write pebble config");

        let log = |name: &str| {
            std::fs::File::create(dir.join(name))
                .map(Stdio::from)
                .unwrap_or_else(|_| Stdio::null())
        };
        let children = vec![
            Command::new(challtestsrv)
                .args(["-defaultIPv4", "127.0.0.1", "-defaultIPv6", ""])
                .args(["-dns01", &format!("127.0.0.1:{dns}")])
                .args(["-http01", "", "-https01", "", "-tlsalpn01", "", "-doh", ""])
                .args(["-management", &format!("127.0.0.1:{challtest_mgmt}")])
                .stdout(log("challtestsrv.log"))
                .stderr(log("challtestsrv.err"))
                .spawn()
                .expect("start pebble-challtestsrv"),
            Command::new(pebble)
                .arg("-config")
                .arg(&config_path)
                .args(["-dnsserver", &format!("127.0.0.1:{dns}")])
                .env("PEBBLE_VA_NOSLEEP", "1")
                .env("PEBBLE_WFE_NONCEREJECT", "0")
                .stdout(log("pebble.log"))
                .stderr(log("pebble.err"))
                .spawn()
                .expect("start pebble"),
        ];
        let me = Self {
            children,
            directory: format!("https://127.0.0.1:{listen}/dir"),
            directory_ca,
            management: SocketAddr::from(([127, 0, 0, 1], management)),
            ca,
        };
        for port in [listen, management, challtest_mgmt] {
            if !port_opens(port).await {
                // Dropping `me` stops both processes.
                return Err(port);
            }
        }
        Ok(me)
    }

    /// The root that issued certificates chain to (PEM), from the management API.
    pub async fn issuing_root(&self) -> String {
        let config = self.ca.client_config(&[b"http/1.1"]);
        let tls = crate::tls_connect(self.management, "127.0.0.1", config)
            .await
            .expect("connect to pebble management");
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .expect("HTTP/1.1 handshake");
        tokio::spawn(conn);
        let req = http::Request::get("/roots/0")
            .header(
                http::header::HOST,
                format!("127.0.0.1:{}", self.management.port()),
            )
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .expect("request");
        let res = sender.send_request(req).await.expect("pebble /roots/0");
        assert_eq!(res.status(), 200, "pebble /roots/0");
        let body = http_body_util::BodyExt::collect(res.into_body())
            .await
            .expect("root body")
            .to_bytes();
        String::from_utf8(body.to_vec()).expect("PEM")
    }
}

/// Whether `port` accepts connections within 10 s.
async fn port_opens(port: u16) -> bool {
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

impl Drop for Pebble {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
