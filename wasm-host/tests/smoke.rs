//! Drives the in-tree `add-header` plugin (built by scripts/build-plugins.sh) through the host
//! without a gateway. Skipped, with a note, when the plugin has not been built.

use std::sync::Arc;

use wasm_host::{Action, CompiledPlugin, HostEngine, HttpStream, PluginInfo, Shared, StreamInfo};

fn plugin(name: &str) -> Option<Vec<u8>> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../plugins/target/wasm32-wasip1/release")
        .join(format!("{name}.wasm"));
    match std::fs::read(&path) {
        Ok(b) => Some(b),
        Err(_) => {
            eprintln!(
                "skipping: {} not built (run scripts/build-plugins.sh)",
                path.display()
            );
            None
        }
    }
}

#[test]
fn add_header_both_ways() {
    let Some(bytes) = plugin("add_header") else {
        return;
    };
    let engine = HostEngine::new();
    // The pooling allocator is used where the probe succeeds (it does on x86-64 Linux).
    eprintln!("pooling allocator: {}", engine.pooling());
    let info = PluginInfo {
        name: "add-header".into(),
        config: bytes::Bytes::from_static(br#"{"name":"x-test","value":"yes"}"#),
        ..Default::default()
    };
    let compiled = CompiledPlugin::load(&engine, Shared::new(), info, &bytes).unwrap();
    let mut vm = compiled.instantiate(None).unwrap();
    let mut stream = HttpStream::new(Arc::new(StreamInfo::default()));
    stream.put_request(http::Request::get("/x").body(()).unwrap().into_parts().0);
    let id = vm.create_http(stream).unwrap();
    assert_eq!(vm.on_request_headers(id, true).unwrap(), Action::Continue);
    assert_eq!(vm.http(id).unwrap().request().headers["x-test"], "yes");
    assert_eq!(vm.on_response_headers(id, false).unwrap(), Action::Continue);
    assert_eq!(vm.http(id).unwrap().response.headers["x-test"], "yes");
    vm.finish(id).unwrap();
    assert!(vm.contexts().is_empty());
    // Unchanged bytes come from the compile cache.
    CompiledPlugin::load(&engine, Shared::new(), PluginInfo::default(), &bytes).unwrap();
    assert_eq!(engine.cached_modules(), 1);
}
