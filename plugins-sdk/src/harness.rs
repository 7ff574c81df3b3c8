//! A native test harness for plugins (feature `harness`): loads a built `.wasm` into the
//! gateway's own proxy-wasm host (crate `gateway-wasm-host`, the very code the gateway runs)
//! and drives it with `http` requests and responses, so plugin authors unit-test without a
//! gateway. HTTP calls the plugin makes are handed to the test, which answers them.
//!
//! ```ignore
//! use gateway_plugin_sdk::harness::{Decision, Harness};
//!
//! let mut h = Harness::load("target/wasm32-wasip1/release/api_key.wasm", r#"{"keys":["k1"]}"#)?;
//! let req = http::Request::get("/").header("x-api-key", "k1").body(Vec::new())?;
//! let (ctx, decision) = h.send(req)?;
//! assert!(matches!(decision, Decision::Forward(_)));
//! let res = h.respond(ctx, http::Response::new(b"ok".to_vec()))?;
//! assert_eq!(res.status(), 200);
//! ```

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use wasm_host::state::{copy_head, empty_response};
use wasm_host::{
    Action, CompiledPlugin, Effect, HostEngine, HttpCallOut, HttpCallResponse, HttpStream, Limits,
    PluginError, PluginInfo, Shared, StreamInfo, Vm,
};

pub use wasm_host::PluginError as Error;

/// What the plugin decided about a request.
#[derive(Debug)]
pub enum Decision {
    /// The request goes on to the upstream, as the plugin left it.
    Forward(http::Request<Vec<u8>>),
    /// The plugin answered itself.
    Reply(http::Response<Vec<u8>>),
    /// The plugin paused (usually waiting on an HTTP call: see [`Harness::calls`]).
    Paused,
}

/// A plugin loaded in a VM.
pub struct Harness {
    vm: Vm,
    calls: Vec<HttpCallOut>,
    actions: Vec<Effect>,
}

impl Harness {
    /// Loads, starts and configures the plugin at `path` with JSON `config`.
    pub fn load(path: impl AsRef<Path>, config: &str) -> Result<Self, PluginError> {
        Self::load_with(path, config, Limits::default())
    }

    /// [`Harness::load`] with explicit limits.
    pub fn load_with(
        path: impl AsRef<Path>,
        config: &str,
        limits: Limits,
    ) -> Result<Self, PluginError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| PluginError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let info = PluginInfo {
            name: Arc::from(
                path.file_stem()
                    .and_then(|s| s.to_str())
                    .unwrap_or("plugin"),
            ),
            config: Bytes::copy_from_slice(config.as_bytes()),
            limits,
            ..Default::default()
        };
        let compiled = CompiledPlugin::load(&HostEngine::new(), Shared::new(), info, &bytes)?;
        let mut vm = compiled.instantiate(None)?;
        let effects = vm.take_effects();
        Ok(Self {
            vm,
            calls: effects.calls,
            actions: effects.actions,
        })
    }

    fn collect(&mut self) {
        let e = self.vm.take_effects();
        self.calls.extend(e.calls);
        self.actions.extend(e.actions);
    }

    /// What the guest asked for `ctx` (continue or a local reply), if anything.
    fn take_action(&mut self, ctx: u32) -> Option<Effect> {
        let i = self.actions.iter().position(|a| match a {
            Effect::Continue(c, _) | Effect::Close(c, _) | Effect::LocalResponse(c, _) => *c == ctx,
        })?;
        Some(self.actions.remove(i))
    }

    /// Runs the request phases (headers, then the body if any) and returns the context id
    /// and the decision.
    pub fn send(&mut self, req: http::Request<Vec<u8>>) -> Result<(u32, Decision), PluginError> {
        let (parts, body) = req.into_parts();
        let mut stream = HttpStream::new(Arc::new(StreamInfo {
            source: Some(([127, 0, 0, 1], 40000).into()),
            destination: Some(([127, 0, 0, 1], 8080).into()),
            route_name: Arc::from("test"),
            listener: Arc::from("test"),
            ..Default::default()
        }));
        stream.put_request(parts);
        let ctx = self.vm.create_http(stream)?;
        let action = self.vm.on_request_headers(ctx, body.is_empty())?;
        self.collect();
        if let Some(d) = self.decide(ctx, action)? {
            return Ok((ctx, d));
        }
        if !body.is_empty() {
            if let Some(h) = self.vm.http(ctx) {
                h.request_body = Bytes::copy_from_slice(&body).into();
            }
            let action = self.vm.on_request_body(ctx, true)?;
            self.collect();
            if let Some(d) = self.decide(ctx, action)? {
                return Ok((ctx, d));
            }
        }
        Ok((ctx, Decision::Forward(self.forwarded(ctx))))
    }

    fn decide(&mut self, ctx: u32, action: Action) -> Result<Option<Decision>, PluginError> {
        match self.take_action(ctx) {
            Some(Effect::LocalResponse(_, r)) => {
                let mut res = http::Response::new(r.body.to_vec());
                *res.status_mut() = http::StatusCode::from_u16(r.status)
                    .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
                for (k, v) in r.headers {
                    if let (Ok(k), Ok(v)) = (
                        http::HeaderName::from_bytes(k.as_bytes()),
                        http::HeaderValue::from_bytes(&v),
                    ) {
                        res.headers_mut().append(k, v);
                    }
                }
                Ok(Some(Decision::Reply(res)))
            }
            Some(Effect::Close(..)) => Ok(Some(Decision::Reply(
                http::Response::builder()
                    .status(403)
                    .body(Vec::new())
                    .unwrap_or_default(),
            ))),
            Some(Effect::Continue(..)) => Ok(None),
            None if action == Action::Pause => Ok(Some(Decision::Paused)),
            None => Ok(None),
        }
    }

    fn forwarded(&mut self, ctx: u32) -> http::Request<Vec<u8>> {
        let Some(h) = self.vm.http(ctx) else {
            return http::Request::new(Vec::new());
        };
        // The VM keeps its head for the later phases, as the gateway keeps one for them.
        let parts = copy_head(h.request());
        let body = h
            .request_body
            .take()
            .map(|b| b.to_vec())
            .unwrap_or_default();
        http::Request::from_parts(parts, body)
    }

    /// HTTP calls the plugin has made and the test has not answered yet.
    pub fn calls(&mut self) -> Vec<HttpCallOut> {
        std::mem::take(&mut self.calls)
    }

    /// Answers HTTP call `token` (status 0: the call failed) and returns the decision about
    /// the paused request `ctx`.
    pub fn answer(
        &mut self,
        ctx: u32,
        token: u32,
        status: u16,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Decision, PluginError> {
        let mut response = HttpCallResponse::default();
        if status != 0 {
            response
                .headers
                .push((":status".into(), Bytes::from(status.to_string())));
            for (k, v) in headers {
                response
                    .headers
                    .push((k.to_ascii_lowercase(), Bytes::copy_from_slice(v.as_bytes())));
            }
            response.body = Bytes::copy_from_slice(body);
        }
        let code = if status == 0 { (14, "reset") } else { (0, "") };
        self.vm.on_http_call_response(token, response, code)?;
        self.collect();
        Ok(match self.decide(ctx, Action::Pause)? {
            Some(d) => d,
            None => Decision::Forward(self.forwarded(ctx)),
        })
    }

    /// Runs the response phases for request `ctx` and ends it (`on_done`, `on_log`,
    /// `on_delete`); returns the response as the client would get it.
    pub fn respond(
        &mut self,
        ctx: u32,
        res: http::Response<Vec<u8>>,
    ) -> Result<http::Response<Vec<u8>>, PluginError> {
        let (parts, body) = res.into_parts();
        if let Some(h) = self.vm.http(ctx) {
            h.response = parts;
        }
        self.vm.on_response_headers(ctx, body.is_empty())?;
        self.collect();
        if let Some(Decision::Reply(r)) = self.decide(ctx, Action::Continue)? {
            self.vm.finish(ctx)?;
            return Ok(r);
        }
        let mut body = body;
        if let Some(h) = self.vm.http(ctx) {
            h.response_body = Bytes::copy_from_slice(&body).into();
        }
        if !body.is_empty() {
            self.vm.on_response_body(ctx, true)?;
            self.collect();
        }
        let parts = match self.vm.http(ctx) {
            Some(h) => {
                body = h
                    .response_body
                    .take()
                    .map(|b| b.to_vec())
                    .unwrap_or_default();
                std::mem::replace(&mut h.response, empty_response())
            }
            None => empty_response(),
        };
        self.vm.finish(ctx)?;
        self.collect();
        Ok(http::Response::from_parts(parts, body))
    }

    /// Calls `proxy_on_tick` once.
    pub fn tick(&mut self) -> Result<(), PluginError> {
        self.vm.on_tick()?;
        self.collect();
        Ok(())
    }

    /// A shared-data value (as the plugin stored it).
    pub fn shared_data(&self, key: &str) -> Option<Vec<u8>> {
        self.vm
            .plugin()
            .shared()
            .get(key.as_bytes())
            .map(|(v, _)| v.to_vec())
    }
}
