//! Hostile host calls, for the fuzz target in `wasm-host/fuzz/` and the unit test that replays
//! its seed corpus: a guest generated from the linker itself imports every host function and
//! runs a script of calls with arguments chosen by the fuzzer (pointers, lengths, ids, enums).
//! The host must answer each with a status or a clean trap that fails the VM; it must never
//! panic, and it must never hand the guest more than its memory cap. Compiled for tests and with
//! the `fuzzing` feature only.
//!
//! The script is the plugin configuration. `proxy_on_configure` copies it in through
//! `proxy_get_buffer_bytes` and runs it; every other callback runs it again, so header, body,
//! property and stream calls meet a live HTTP or TCP context. A script is a sequence of records:
//! one byte picks the host function (modulo their number), then its arguments follow as
//! little-endian `i32`/`i64` values.

use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use wasmtime::{Extern, Store, ValType};

use crate::engine::HostEngine;
use crate::plugin::CompiledPlugin;
use crate::shared::Shared;
use crate::state::{HostState, HttpCallResponse, HttpStream, Limits, PluginInfo, StreamInfo};
use crate::vm::Peer;

/// Every callback the guest exports: name, parameter count, whether it returns `i32`.
const CALLBACKS: &[(&str, usize, bool)] = &[
    ("proxy_on_context_create", 2, false),
    ("proxy_on_request_headers", 3, true),
    ("proxy_on_request_body", 3, true),
    ("proxy_on_request_trailers", 2, true),
    ("proxy_on_response_headers", 3, true),
    ("proxy_on_response_body", 3, true),
    ("proxy_on_response_trailers", 2, true),
    ("proxy_on_http_call_response", 5, false),
    ("proxy_on_tick", 1, false),
    ("proxy_on_queue_ready", 2, false),
    ("proxy_on_new_connection", 1, true),
    ("proxy_on_downstream_data", 3, true),
    ("proxy_on_upstream_data", 3, true),
    ("proxy_on_downstream_connection_close", 2, false),
    ("proxy_on_upstream_connection_close", 2, false),
    ("proxy_on_log", 1, false),
    ("proxy_on_delete", 1, false),
];

/// The largest linear memory a fuzzed VM may have: small, so the fuzzer's pointers often land
/// inside it, and so a host call that copies "all of memory" many times shows up as memory use.
const MEMORY_CAP: u64 = 1 << 20;

struct Fuzzer {
    engine: Arc<HostEngine>,
    shared: Arc<Shared>,
    module: String,
    /// `module` in the binary format the engine loads.
    wasm: Vec<u8>,
}

fn fuzzer() -> &'static Fuzzer {
    static FUZZER: OnceLock<Fuzzer> = OnceLock::new();
    FUZZER.get_or_init(|| {
        let engine = HostEngine::new();
        let shared = Shared::new();
        let module = guest_module(&engine, &shared);
        let wasm = wat::parse_str(&module).expect("the generated guest is valid text");
        Fuzzer {
            engine,
            shared,
            module,
            wasm,
        }
    })
}

/// The imported host functions as (module, name, parameter types, result count), in the
/// linker's order.
fn host_functions(
    engine: &HostEngine,
    shared: &Arc<Shared>,
) -> Vec<(String, String, Vec<ValType>, usize)> {
    let linker = crate::abi::linker(engine.engine()).expect("linker");
    let info = Arc::new(PluginInfo::default());
    let mut store = Store::new(
        engine.engine(),
        HostState::new(info, shared.clone(), engine.ticker().clone()),
    );
    let defs: Vec<_> = linker
        .iter(&mut store)
        .map(|(m, n, e)| (m.to_owned(), n.to_owned(), e))
        .collect();
    let mut out = Vec::new();
    for (module, name, def) in defs {
        if let Extern::Func(f) = def {
            let ty = f.ty(&store);
            out.push((module, name, ty.params().collect(), ty.results().len()));
        }
    }
    out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    out
}

fn wat_type(t: &ValType) -> &'static str {
    match t {
        ValType::I64 => "i64",
        ValType::F32 => "f32",
        ValType::F64 => "f64",
        _ => "i32",
    }
}

/// The guest, in the text format.
fn guest_module(engine: &HostEngine, shared: &Arc<Shared>) -> String {
    let funcs = host_functions(engine, shared);
    let mut w = String::from("(module\n");
    for (i, (module, name, params, results)) in funcs.iter().enumerate() {
        let params: Vec<_> = params.iter().map(wat_type).collect();
        let _ = write!(w, "  (import \"{module}\" \"{name}\" (func $h{i}");
        if !params.is_empty() {
            let _ = write!(w, " (param {})", params.join(" "));
        }
        if *results == 1 {
            w.push_str(" (result i32)");
        }
        w.push_str("))\n");
    }
    let get_buffer = funcs
        .iter()
        .position(|f| f.0 == "env" && f.1 == "proxy_get_buffer_bytes")
        .expect("proxy_get_buffer_bytes is linked");
    // Page 0 holds the scratch words at 0..8; the bump heap starts at page 1 and grows memory.
    w.push_str(
        r#"  (memory (export "memory") 2)
  (global $heap (mut i32) (i32.const 65536))
  (global $script (mut i32) (i32.const 0))
  (global $script_len (mut i32) (i32.const 0))
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "proxy_on_memory_allocate") (param $n i32) (result i32)
    (local $p i32) (local $end i64) (local $pages i32)
    (local.set $p (global.get $heap))
    (local.set $end (i64.add (i64.extend_i32_u (local.get $p)) (i64.extend_i32_u (local.get $n))))
    (if (i64.gt_u (local.get $end) (i64.const 0xffffffff)) (then (return (i32.const 0))))
    (if (i64.gt_u (local.get $end) (i64.shl (i64.extend_i32_u (memory.size)) (i64.const 16)))
      (then
        (local.set $pages (i32.wrap_i64 (i64.shr_u
          (i64.add (i64.sub (local.get $end) (i64.shl (i64.extend_i32_u (memory.size)) (i64.const 16))) (i64.const 65535))
          (i64.const 16))))
        (if (i32.eq (memory.grow (local.get $pages)) (i32.const -1)) (then (return (i32.const 0))))))
    (global.set $heap (i32.wrap_i64 (local.get $end)))
    (local.get $p))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_done") (param i32) (result i32) (call $run) (i32.const 1))
"#,
    );
    let _ = write!(
        w,
        r#"  (func (export "proxy_on_configure") (param $root i32) (param $size i32) (result i32)
    (drop (call $h{get_buffer} (i32.const 7) (i32.const 0) (local.get $size) (i32.const 0) (i32.const 4)))
    (global.set $script (i32.load (i32.const 0)))
    (global.set $script_len (i32.load (i32.const 4)))
    (call $run)
    (i32.const 1))
"#
    );
    for (name, params, result) in CALLBACKS {
        let _ = write!(w, "  (func (export \"{name}\")");
        if *params > 0 {
            let _ = write!(w, " (param{})", " i32".repeat(*params));
        }
        if *result {
            w.push_str(" (result i32) (call $run) (i32.const 0))\n");
        } else {
            w.push_str(" (call $run))\n");
        }
    }
    // The interpreter: a loop over records, dispatching with br_table.
    w.push_str(
        "  (func $run (local $p i32) (local $end i32) (local $op i32)\n    (local.set $p (global.get $script))\n    (local.set $end (i32.add (global.get $script) (global.get $script_len)))\n    (block $done (loop $next\n      (br_if $done (i32.ge_u (local.get $p) (local.get $end)))\n",
    );
    let _ = writeln!(
        w,
        "      (local.set $op (i32.rem_u (i32.load8_u (local.get $p)) (i32.const {})))",
        funcs.len()
    );
    w.push_str("      (local.set $p (i32.add (local.get $p) (i32.const 1)))\n");
    for i in (0..funcs.len()).rev() {
        let _ = writeln!(w, "      (block $c{i}");
    }
    let labels: Vec<_> = (0..funcs.len()).map(|i| format!("$c{i}")).collect();
    let _ = writeln!(w, "      (br_table {} (local.get $op))", labels.join(" "));
    for (i, (_, _, params, results)) in funcs.iter().enumerate() {
        let _ = write!(w, "      ) ;; case {i}\n      (call $h{i}");
        let mut offset = 0;
        for t in params {
            let (load, size) = match t {
                ValType::I64 => ("i64.load", 8),
                ValType::F32 => ("f32.load", 4),
                ValType::F64 => ("f64.load", 8),
                _ => ("i32.load", 4),
            };
            let _ = write!(w, " ({load} offset={offset} (local.get $p))");
            offset += size;
        }
        w.push(')');
        if *results == 1 {
            w.push_str(" (drop)");
        }
        let _ = writeln!(
            w,
            "\n      (local.set $p (i32.add (local.get $p) (i32.const {offset})))\n      (br $next)"
        );
    }
    w.push_str("    ))\n  )\n)\n");
    w
}

/// Runs one script through a fresh VM and every callback; see the module docs.
pub fn host_calls(script: &[u8]) {
    let f = fuzzer();
    let info = PluginInfo {
        name: Arc::from("fuzz"),
        config: Bytes::copy_from_slice(script),
        vm_config: Bytes::from_static(b"vm"),
        limits: Limits {
            memory: MEMORY_CAP,
            time: Duration::from_millis(200),
        },
        ..PluginInfo::default()
    };
    let plugin = CompiledPlugin::load(&f.engine, f.shared.clone(), info, &f.wasm)
        .expect("the generated guest compiles and links");
    // A script that faults during start-up is a start error, which is an answer too.
    let Ok(mut vm) = plugin.instantiate(None) else {
        return;
    };
    let stream_info = Arc::new(StreamInfo {
        source: Some(([192, 0, 2, 1], 40000).into()),
        destination: Some(([127, 0, 0, 1], 8080).into()),
        route_name: Arc::from("r"),
        listener: Arc::from("l"),
        ..StreamInfo::default()
    });
    let mut http = || -> Option<()> {
        let mut stream = HttpStream::new(stream_info.clone());
        stream
            .request_mut()
            .headers
            .insert("x-fuzz", http::HeaderValue::from_static("1"));
        stream.request_body.extend_from_slice(b"request body");
        let id = vm.create_http(stream).ok()?;
        vm.on_request_headers(id, false).ok()?;
        vm.on_request_body(id, true).ok()?;
        vm.on_request_trailers(id).ok()?;
        if let Some(h) = vm.http(id) {
            h.response.status = http::StatusCode::OK;
            h.response_body.extend_from_slice(b"response body");
        }
        vm.on_response_headers(id, false).ok()?;
        vm.on_response_body(id, true).ok()?;
        vm.on_response_trailers(id).ok()?;
        vm.finish(id).ok()?;
        let response = HttpCallResponse {
            headers: vec![(":status".to_owned(), Bytes::from_static(b"200"))],
            body: Bytes::from_static(b"call body"),
            trailers: Vec::new(),
        };
        vm.on_http_call_response(1, response, (0, "")).ok()?;
        vm.on_tick().ok()?;
        vm.on_queue_ready(1).ok()?;
        let id = vm.create_net(stream_info.clone()).ok()?;
        vm.on_new_connection(id).ok()?;
        if let Some(n) = vm.net(id) {
            n.downstream.extend_from_slice(b"down");
            n.upstream.extend_from_slice(b"up");
        }
        vm.on_downstream_data(id, false).ok()?;
        vm.on_upstream_data(id, true).ok()?;
        vm.on_connection_close(id, true, Peer::Remote).ok()?;
        vm.on_connection_close(id, false, Peer::Local).ok()?;
        vm.finish(id).ok()?;
        Some(())
    };
    if http().is_none() {
        assert!(vm.failed().is_some(), "a failed call marks the VM failed");
    }
    let _ = vm.take_effects();
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    #[test]
    fn host_calls_corpus_replays() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/host_calls");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("entry").path())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no seed inputs in {}", dir.display());
        for file in files {
            super::host_calls(&std::fs::read(&file).expect("read"));
        }
    }

    #[test]
    fn the_guest_imports_every_host_function() {
        let f = super::fuzzer();
        let imports = f.module.matches("(import ").count();
        assert!(imports >= 39, "only {imports} host functions imported");
    }
}
