//! Context and stream control: `proxy_done`, `proxy_set_effective_context`,
//! `proxy_continue_stream`, `proxy_close_stream`, `proxy_send_local_response`,
//! `proxy_get_status`, and the ABI 0.1.0 names (`proxy_continue_request`, ...). Continue, close
//! and local replies are recorded as effects and applied by the embedder after the guest call
//! returns, never from inside it.

use bytes::Bytes;
use wasmtime::Linker;

use super::memory::{Cx, copy_out, parse_map, read, write_u32};
use super::{BAD_ARGUMENT, OK};
use crate::state::{Effect, HostState, LocalResponse, StreamType};

pub(crate) fn link(l: &mut Linker<HostState>) -> wasmtime::Result<()> {
    l.func_wrap("env", "proxy_done", |mut c: Cx<'_>| -> u32 {
        let s = c.data_mut();
        let ctx = s.effective;
        s.effects.done.push(ctx);
        OK
    })?;
    l.func_wrap(
        "env",
        "proxy_set_effective_context",
        |mut c: Cx<'_>, ctx: u32| -> u32 {
            let s = c.data_mut();
            // A context already deleted (a late HTTP call response) is refused, which the SDKs
            // accept and use to drop the callback.
            if ctx == s.root_id || s.streams.contains_key(&ctx) {
                s.effective = ctx;
                OK
            } else {
                BAD_ARGUMENT
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_continue_stream",
        |mut c: Cx<'_>, t: u32| -> u32 {
            push_stream_effect(c.data_mut(), t, false);
            OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_close_stream",
        |mut c: Cx<'_>, t: u32| -> u32 {
            push_stream_effect(c.data_mut(), t, true);
            OK
        },
    )?;
    // ABI 0.1.0 spellings, for older AssemblyScript and C++ guests.
    l.func_wrap("env", "proxy_continue_request", |mut c: Cx<'_>| -> u32 {
        push_stream_effect(c.data_mut(), 0, false);
        OK
    })?;
    l.func_wrap("env", "proxy_continue_response", |mut c: Cx<'_>| -> u32 {
        push_stream_effect(c.data_mut(), 1, false);
        OK
    })?;
    l.func_wrap("env", "proxy_clear_route_cache", |_: Cx<'_>| -> u32 { OK })?;
    l.func_wrap(
        "env",
        "proxy_send_local_response",
        |mut c: Cx<'_>,
         code: u32,
         dp: u32,
         dl: u32,
         bp: u32,
         bl: u32,
         hp: u32,
         hl: u32,
         _grpc: i32|
         -> wasmtime::Result<u32> {
            const W: &str = "proxy_send_local_response";
            let details = read(&mut c, dp, dl, W)?;
            let body = read(&mut c, bp, bl, W)?;
            let raw = read(&mut c, hp, hl, W)?;
            let Some(pairs) = parse_map(&raw) else {
                return Ok(BAD_ARGUMENT);
            };
            let headers = pairs
                .into_iter()
                .map(|(k, v)| {
                    (
                        String::from_utf8_lossy(k).to_ascii_lowercase(),
                        Bytes::copy_from_slice(v),
                    )
                })
                .collect();
            let s = c.data_mut();
            let ctx = s.effective;
            let status = if (100..=999).contains(&code) {
                code as u16
            } else {
                500
            };
            s.effects.actions.push(Effect::LocalResponse(
                ctx,
                LocalResponse {
                    status,
                    details: String::from_utf8_lossy(&details).into_owned(),
                    body: Bytes::from(body),
                    headers,
                },
            ));
            Ok(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_status",
        |mut c: Cx<'_>, rc: u32, rp: u32, rl: u32| -> wasmtime::Result<u32> {
            let (code, msg) = c.data().status.clone();
            write_u32(&mut c, rc, code, "proxy_get_status")?;
            copy_out(&mut c, &msg, rp, rl, "proxy_get_status")?;
            Ok(OK)
        },
    )?;
    Ok(())
}

fn push_stream_effect(s: &mut HostState, t: u32, close: bool) {
    let Some(t) = StreamType::from_abi(t) else {
        return;
    };
    let ctx = s.effective;
    s.effects.actions.push(if close {
        Effect::Close(ctx, t)
    } else {
        Effect::Continue(ctx, t)
    });
}
