//! Regression tests for host calls found by the `host_calls` fuzz target (see
//! `wasm_host::fuzzing`): a hostile guest must not make the host do work or allocate memory
//! out of proportion to its own memory cap.

use std::sync::Arc;

use wasm_host::{CompiledPlugin, HostEngine, HttpStream, PluginInfo, Shared, StreamInfo};

/// `fd_write` with 1024 iovecs that all point at the same 64 KiB: 64 MiB of "output" from a
/// 128 KiB guest. Copied into one buffer, that output would let a guest under a 64 MiB memory
/// cap make the host allocate 64 GiB in a single call, so a call takes at most a bounded amount
/// and reports a short write, as WASI allows; the guest traps if more was claimed.
const FD_WRITE_AMPLIFIER: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "proxy_on_memory_allocate") (param i32) (result i32) (i32.const 100000))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (local $i i32)
    (loop $fill
      (i32.store (i32.mul (local.get $i) (i32.const 8)) (i32.const 16384))
      (i32.store offset=4 (i32.mul (local.get $i) (i32.const 8)) (i32.const 65536))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $fill (i32.lt_u (local.get $i) (i32.const 1024))))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1024) (i32.const 90000)))
    (if (i32.gt_u (i32.load (i32.const 90000)) (i32.const 65536)) (then unreachable))
    (i32.const 0))
)"#;

#[test]
fn fd_write_copies_a_bounded_amount_per_call() {
    let engine = HostEngine::new();
    let info = PluginInfo {
        name: "amplifier".into(),
        ..Default::default()
    };
    let compiled = CompiledPlugin::load(
        &engine,
        Shared::new(),
        info,
        &wat::parse_str(FD_WRITE_AMPLIFIER).unwrap(),
    )
    .unwrap();
    let mut vm = compiled.instantiate(None).unwrap();
    let id = vm
        .create_http(HttpStream::new(Arc::new(StreamInfo::default())))
        .unwrap();
    let started = std::time::Instant::now();
    let result = vm.on_request_headers(id, true);
    assert!(result.is_ok(), "{result:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
}

/// A guest whose request-header callback never returns.
const RUNAWAY: &str = r#"(module
  (memory (export "memory") 1)
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "proxy_on_memory_allocate") (param i32) (result i32) (i32.const 1024))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (loop $forever (br $forever))
    (i32.const 0))
)"#;

/// The epoch ticker parks when no guest has run for a while; the first call after that must
/// wake it, or a runaway call would never reach its deadline.
#[test]
fn a_runaway_call_after_an_idle_spell_still_stops_at_its_limit() {
    let engine = HostEngine::new();
    let info = PluginInfo {
        name: "runaway".into(),
        limits: wasm_host::Limits {
            time: std::time::Duration::from_millis(20),
            ..Default::default()
        },
        ..Default::default()
    };
    let compiled = CompiledPlugin::load(
        &engine,
        Shared::new(),
        info,
        &wat::parse_str(RUNAWAY).unwrap(),
    )
    .unwrap();
    let mut vm = compiled.instantiate(None).unwrap();
    let id = vm
        .create_http(HttpStream::new(Arc::new(StreamInfo::default())))
        .unwrap();

    // Idle for longer than the longest deadline (start-up's, 5 s) and the ticker's margin.
    let ticker = engine.ticker().clone();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !ticker.is_parked() {
        assert!(std::time::Instant::now() < until, "the ticker never parked");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let parked_at = ticker.ticks();
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(ticker.ticks(), parked_at, "a parked ticker does not tick");

    let (done, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(vm.on_request_headers(id, true));
    });
    let result = result
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the runaway call was stopped");
    assert!(
        matches!(result, Err(wasm_host::PluginError::Timeout(_))),
        "{result:?}"
    );
}
