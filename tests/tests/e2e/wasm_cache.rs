//! The on-disk cache of compiled plugins (`server.wasm_cache`) across real restarts of the
//! gateway binary: the first start compiles and writes the file, the next loads it, and a
//! file altered on disk is detected, removed, counted in the log and replaced, while the
//! gateway serves as before. The start-up times are printed (docs/plugins.md quotes them).

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gateway_tests::{Running, binary_config, gateway_binary, temp_dir};

use crate::wasm::{install, plugin};

/// Starts the binary on `cfg` and waits until `/hello` answers through the plugin; the time
/// from spawn to that answer.
fn start(cfg: &Path, port: u16, log: &Path) -> (Running, Duration) {
    let began = Instant::now();
    let child = Command::new(gateway_binary())
        .args(["run", "--config"])
        .arg(cfg)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let running = Running(child);
    while began.elapsed() < Duration::from_secs(120) {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            s.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            assert!(out.starts_with("HTTP/1.1 200"), "{out}");
            assert!(
                out.to_ascii_lowercase().contains("x-go-plugin: cached"),
                "{out}"
            );
            return (running, began.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("the gateway did not answer within 120 s");
}

/// The body of `GET path` on `port`.
fn get(port: u16, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    // The admin API answers only its own address as `Host`.
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

fn cache_files(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default()
}

#[test]
fn a_restart_loads_the_compiled_module_from_disk_and_a_bad_file_is_replaced() {
    if !plugin("go_headers").exists() {
        eprintln!("skipped: the Go plugin is not built (Go not installed)");
        return;
    }
    let dir = temp_dir();
    install(dir.path(), "go_headers", "big.wasm");
    let admin = gateway_tests::ports::reserved_port();
    let (port, cfg) = binary_config(dir.path(), |port| {
        format!(
            r#"
server: {{ wasm_cache: {{ path: cache, max_size: 64MiB }}, worker_threads: 1 }}
admin: {{ bind: 127.0.0.1:{admin} }}
listeners:
  - name: a
    bind: 127.0.0.1:{port}
plugins:
  big: {{ wasm: big.wasm, config: {{ value: cached }} }}
routes:
  - match: {{ path: /hello }}
    filters: [ {{ plugin: big }} ]
    respond: {{ body: hi }}
"#
        )
    });
    let cache = dir.path().join("cache");
    let log = dir.path().join("stderr.log");

    let (first, cold) = start(&cfg, port, &log);
    drop(first);
    let files = cache_files(&cache);
    assert_eq!(files.len(), 1, "one compiled module written: {files:?}");
    let file = files[0].clone();
    assert_eq!(file.extension().unwrap(), "cwasm");

    let (second, warm) = start(&cfg, port, &log);
    let metrics = get(admin, "/metrics");
    let vm_memory = metrics
        .lines()
        .find(|l| l.starts_with("gateway_plugin_memory_bytes{plugin=\"big\"}"))
        .unwrap_or_else(|| panic!("{metrics}"))
        .to_owned();
    assert!(
        metrics.contains("gateway_plugin_cache_total{result=\"hit\"} 1"),
        "{metrics}"
    );
    let status = std::fs::read_to_string(format!("/proc/{}/status", second.0.id())).unwrap();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS"))
        .unwrap_or("")
        .to_owned();
    drop(second);
    eprintln!(
        "start-up with a 3.4 MB module: {cold:?} compiling, {warm:?} from the cache; one VM: {vm_memory}; process {rss}"
    );
    assert!(
        warm < cold,
        "the cached start ({warm:?}) is faster than compiling ({cold:?})"
    );

    // One byte changed on disk: detected before wasmtime sees it, removed, compiled again.
    let mut bytes = std::fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    std::fs::write(&file, &bytes).unwrap();
    let (third, _) = start(&cfg, port, &log);
    drop(third);
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("plugin cache file rejected"), "{said}");
    let rewritten = std::fs::read(&file).expect("written again");
    assert_ne!(rewritten, bytes, "the altered file was replaced");

    // A foreign file under the name: the same.
    std::fs::write(&file, b"GWWASM01 but nothing else that fits").unwrap();
    let (fourth, _) = start(&cfg, port, &log);
    drop(fourth);
    assert!(
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("plugin cache file rejected")
    );
}
