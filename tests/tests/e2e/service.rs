//! The gateway as a system service: the systemd unit in `dist/` passes `systemd-analyze
//! verify`, the binary tells a service manager when it is ready, reloading and stopping
//! (`NOTIFY_SOCKET`), its own log is JSON lines or plain text without colour codes in a file,
//! and the shell completions and man page come out of the command line's definition.

use std::io::{Read, Write};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gateway_tests::{binary_config, gateway_binary, temp_dir, write_file};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn installed(command: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {command}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn the_systemd_unit_verifies() {
    if !installed("systemd-analyze") {
        eprintln!("skipped: systemd-analyze is not installed (scripts/setup.sh installs it)");
        return;
    }
    let unit = std::fs::read_to_string(repo_root().join("dist/systemd/gateway.service"))
        .expect("the unit file");
    // The unit names the binary where the operations guide installs it; verify checks that
    // the command exists, so point it at the one just built.
    let local = unit.replace(
        "/usr/local/bin/gateway",
        gateway_binary().to_str().expect("utf-8 path"),
    );
    let dir = temp_dir();
    let path = write_file(dir.path(), "gateway.service", local);
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("run systemd-analyze");
    let said = String::from_utf8_lossy(&out.stderr);
    // Unknown keys and bad values are warnings on stderr with exit status 0.
    assert!(out.status.success() && said.trim().is_empty(), "{said}");
    for line in [
        "Type=notify",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "CapabilityBoundingSet=CAP_NET_BIND_SERVICE",
        "LimitNOFILE=1048576",
    ] {
        assert!(unit.lines().any(|l| l == line), "the unit sets {line}");
    }
}

/// Kills the child if the test fails before it exits.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Running {
    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.0.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    fn wait_exit(&mut self) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(s) = self.0.try_wait().unwrap() {
                return s;
            }
            assert!(start.elapsed() < Duration::from_secs(20), "did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn hello_config(dir: &Path, server: &str) -> (u16, PathBuf) {
    binary_config(dir, |port| {
        format!(
            "server: {{ drain_timeout: 1s{server} }}\nlisteners:\n  - name: a\n    bind: 127.0.0.1:{port}\nroutes:\n  - match: {{ path: /hello }}\n    respond: {{ body: hi }}\n"
        )
    })
}

fn state(socket: &UnixDatagram) -> String {
    let mut buf = [0u8; 512];
    let n = socket.recv(&mut buf).expect("a notification in time");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn has(state: &str, line: &str) -> bool {
    state.lines().any(|l| l == line)
}

#[test]
fn tells_the_service_manager_ready_reloading_and_stopping() {
    let dir = temp_dir();
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).expect("bind the notify socket");
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let (port, cfg) = hello_config(dir.path(), "");
    let mut gw = Running(
        Command::new(gateway_binary())
            .args(["run", "--config"])
            .arg(&cfg)
            .env("NOTIFY_SOCKET", &socket_path)
            .spawn()
            .expect("run gateway"),
    );

    let ready = state(&socket);
    assert!(has(&ready, "READY=1"), "{ready}");
    // Ready means serving: the listener is bound when the notification goes out.
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).expect("bound when ready");
    conn.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    // A reload: RELOADING with the monotonic clock systemd compares, then READY again.
    gw.signal("HUP");
    let reloading = state(&socket);
    assert!(has(&reloading, "RELOADING=1"), "{reloading}");
    let usec = reloading
        .lines()
        .find_map(|l| l.strip_prefix("MONOTONIC_USEC="))
        .and_then(|v| v.parse::<u64>().ok());
    assert!(usec.is_some_and(|u| u > 0), "{reloading}");
    let back = state(&socket);
    assert!(
        has(&back, "READY=1") && has(&back, "STATUS=serving"),
        "{back}"
    );

    // A refused reload ends too (the old configuration serves) and says so.
    std::fs::write(&cfg, "listeners: [").unwrap();
    gw.signal("HUP");
    assert!(has(&state(&socket), "RELOADING=1"));
    let refused = state(&socket);
    assert!(
        has(&refused, "READY=1") && refused.contains("refused"),
        "{refused}"
    );

    gw.signal("TERM");
    let stopping = state(&socket);
    assert!(has(&stopping, "STOPPING=1"), "{stopping}");
    assert!(gw.wait_exit().success());
}

#[test]
fn notifies_an_abstract_socket() {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("gateway-test-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let socket = UnixDatagram::bind_addr(&addr).expect("bind an abstract socket");
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let dir = temp_dir();
    let (_, cfg) = hello_config(dir.path(), "");
    let mut gw = Running(
        Command::new(gateway_binary())
            .args(["run", "--config"])
            .arg(&cfg)
            .env("NOTIFY_SOCKET", format!("@{name}"))
            .spawn()
            .expect("run gateway"),
    );
    assert!(has(&state(&socket), "READY=1"));
    gw.signal("TERM");
    assert!(has(&state(&socket), "STOPPING=1"));
    assert!(gw.wait_exit().success());
}

/// Runs the gateway with `server` settings added, until it serves, then stops it and returns
/// what it wrote on stderr (a pipe, as under a service manager or with `2>file`).
fn own_log(server: &str) -> String {
    let dir = temp_dir();
    let (port, cfg) = hello_config(dir.path(), server);
    let mut gw = Running(
        Command::new(gateway_binary())
            .args(["run", "--config"])
            .arg(&cfg)
            .env_remove("RUST_LOG")
            .stderr(Stdio::piped())
            .spawn()
            .expect("run gateway"),
    );
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(start.elapsed() < Duration::from_secs(20), "never served");
        std::thread::sleep(Duration::from_millis(20));
    }
    gw.signal("TERM");
    assert!(gw.wait_exit().success());
    let mut log = String::new();
    gw.0.stderr
        .take()
        .expect("piped")
        .read_to_string(&mut log)
        .unwrap();
    log
}

#[test]
fn the_own_log_is_json_lines_or_plain_text() {
    let json = own_log(", log_format: json");
    let lines: Vec<&str> = json.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.len() >= 2, "the shutdown is logged: {json}");
    for line in &lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        for key in ["timestamp", "level", "target", "fields"] {
            assert!(v.get(key).is_some(), "`{key}` in {line}");
        }
    }
    assert!(lines.iter().any(|l| l.contains("shutting down")), "{json}");

    let text = own_log("");
    assert!(text.contains("shutting down"), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "no colour codes when stderr is not a terminal: {text:?}"
    );
}

fn printed(args: &[&str]) -> String {
    let out = Command::new(gateway_binary())
        .args(args)
        .output()
        .expect("run gateway");
    assert!(out.status.success(), "{args:?}");
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn completions_and_the_man_page_come_from_the_command_line() {
    let bash = printed(&["completions", "bash"]);
    for word in ["run", "validate", "completions", "--config"] {
        assert!(bash.contains(word), "bash completes {word}");
    }
    let dir = temp_dir();
    let script = write_file(dir.path(), "gateway.bash", &bash);
    let syntax = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .status()
        .unwrap();
    assert!(syntax.success(), "the bash script parses");
    assert!(printed(&["completions", "zsh"]).starts_with("#compdef gateway"));
    assert!(printed(&["completions", "fish"]).contains("complete -c gateway"));

    let man = printed(&["manpage"]);
    assert!(man.contains(".TH gateway 1"), "{man}");
    for word in ["validate", "completions", "manpage"] {
        assert!(man.contains(word), "the man page lists {word}");
    }
    // The pages it refers to, one per subcommand.
    let pages = temp_dir();
    printed(&["manpage", "--dir", pages.path().to_str().unwrap()]);
    for page in ["gateway.1", "gateway-run.1", "gateway-validate.1"] {
        let text = std::fs::read_to_string(pages.path().join(page)).expect(page);
        assert!(text.contains(".TH gateway"), "{page}");
    }
    let run = std::fs::read_to_string(pages.path().join("gateway-run.1")).unwrap();
    assert!(run.contains("config"), "{run}");
}

#[test]
fn schema_prints_the_committed_schema() {
    let printed: serde_json::Value =
        serde_json::from_str(&printed(&["schema"])).expect("JSON on stdout");
    let committed: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("schema/gateway.schema.json")).unwrap(),
    )
    .unwrap();
    assert!(
        printed == committed,
        "`gateway schema` and schema/gateway.schema.json differ"
    );
    assert_eq!(
        printed["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
}
