//! Callouts: `proxy_http_call` records the request (owned by the root context, with a token
//! unique in the VM) for the embedder to send through its upstream pools; the response comes
//! back as `proxy_on_http_call_response(root, token, ...)`. gRPC calls and foreign functions
//! are not offered: they answer with statuses the SDKs handle (InternalFailure, NotFound).

use std::time::Duration;

use bytes::Bytes;
use wasmtime::Linker;

use super::memory::{Cx, parse_map, read, write_u32};
use super::{BAD_ARGUMENT, INTERNAL_FAILURE, NOT_FOUND, OK};
use crate::state::{HostState, HttpCallOut};

/// Calls in flight per VM beyond which new ones are refused (a guest looping on calls).
const MAX_PENDING: usize = 1024;

fn pairs(raw: &[u8]) -> Option<Vec<(String, Bytes)>> {
    Some(
        parse_map(raw)?
            .into_iter()
            .map(|(k, v)| {
                (
                    String::from_utf8_lossy(k).to_ascii_lowercase(),
                    Bytes::copy_from_slice(v),
                )
            })
            .collect(),
    )
}

pub(crate) fn link(l: &mut Linker<HostState>) -> wasmtime::Result<()> {
    l.func_wrap(
        "env",
        "proxy_http_call",
        |mut c: Cx<'_>,
         up: u32,
         ul: u32,
         hp: u32,
         hl: u32,
         bp: u32,
         bl: u32,
         tp: u32,
         tl: u32,
         timeout_ms: u32,
         ret: u32|
         -> wasmtime::Result<u32> {
            const W: &str = "proxy_http_call";
            let upstream = read(&mut c, up, ul, W)?;
            let headers = read(&mut c, hp, hl, W)?;
            let body = read(&mut c, bp, bl, W)?;
            let trailers = read(&mut c, tp, tl, W)?;
            let (Some(headers), Some(trailers)) = (pairs(&headers), pairs(&trailers)) else {
                return Ok(BAD_ARGUMENT);
            };
            let has = |k: &str| headers.iter().any(|(n, _)| n == k);
            if !(has(":method") && has(":path")) || upstream.is_empty() {
                return Ok(BAD_ARGUMENT);
            }
            let s = c.data_mut();
            if s.effects.calls.len() >= MAX_PENDING {
                return Ok(INTERNAL_FAILURE);
            }
            let token = s.next_token;
            s.next_token = s.next_token.wrapping_add(1).max(1);
            s.effects.calls.push(HttpCallOut {
                token,
                upstream: String::from_utf8_lossy(&upstream).into_owned(),
                headers,
                body: Bytes::from(body),
                trailers,
                timeout: Duration::from_millis(u64::from(timeout_ms.max(1))),
            });
            write_u32(&mut c, ret, token, W)?;
            Ok(OK)
        },
    )?;
    // gRPC callouts: not offered. InternalFailure and NotFound are statuses the Rust SDK maps
    // to errors instead of panicking.
    l.func_wrap(
        "env",
        "proxy_grpc_call",
        |_: Cx<'_>,
         _: u32,
         _: u32,
         _: u32,
         _: u32,
         _: u32,
         _: u32,
         _: u32,
         _: u32,
         _: u32,
         _: u32,
         _: u32,
         _: u32|
         -> u32 { INTERNAL_FAILURE },
    )?;
    l.func_wrap(
        "env",
        "proxy_grpc_stream",
        |_: Cx<'_>,
         _: u32,
         _: u32,
         _: u32,
         _: u32,
         _: u32,
         _: u32,
         _: u32,
         _: u32,
         _: u32|
         -> u32 { INTERNAL_FAILURE },
    )?;
    l.func_wrap(
        "env",
        "proxy_grpc_send",
        |_: Cx<'_>, _: u32, _: u32, _: u32, _: u32| -> u32 { NOT_FOUND },
    )?;
    l.func_wrap("env", "proxy_grpc_cancel", |_: Cx<'_>, _: u32| -> u32 {
        NOT_FOUND
    })?;
    l.func_wrap("env", "proxy_grpc_close", |_: Cx<'_>, _: u32| -> u32 {
        NOT_FOUND
    })?;
    l.func_wrap(
        "env",
        "proxy_call_foreign_function",
        |_: Cx<'_>, _: u32, _: u32, _: u32, _: u32, _: u32, _: u32| -> u32 { NOT_FOUND },
    )?;
    Ok(())
}
