//! Plugins' `scope: global` shared data and queues in Redis ([`wasm_host::shared::GlobalStore`]).
//!
//! Host calls are synchronous (a guest cannot await), so these calls use blocking connections
//! from a small pool, each bounded by `cluster.timeout` for connect, read and write; while the
//! cluster link is down they return `None` at once and the host uses the process's store.
//!
//! A pooled connection may have been closed by Redis while it sat idle (a restart, its idle
//! `timeout`): connections opened before the link last reconnected are dropped instead of
//! reused, and a call whose pooled connection turns out closed empties the pool and runs once
//! more on a fresh connection before it gives up and marks the link down.
//!
//! A value is a hash `{prefix}:shared:KEY` with fields `v` (the bytes) and `c` (the CAS token);
//! a conditional write is one Lua script comparing the token, so compare-and-swap holds across
//! instances. A queue is a list `{prefix}:queue:VM/NAME`; an enqueue pushes and publishes the
//! queue's name on `{prefix}:queue` in one pipeline, and every instance's subscriber tells the
//! queue's local owner (`proxy_on_queue_ready`).

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use wasm_host::shared::{GlobalStore, SetError};

use super::link::{self, Link};

/// Idle blocking connections kept (more are opened under contention and closed after use).
const POOL: usize = 8;

/// Compare-and-swap on the `{v, c}` hash: a missing key is always written (as in the process's
/// store); tokens run 1..=u32::MAX and wrap to 1, so 0 always means "unconditional".
const SET_SCRIPT: &str = r"
local cas = tonumber(ARGV[2])
local cur = tonumber(redis.call('HGET', KEYS[1], 'c') or '0')
if cas ~= 0 and cur ~= 0 and cas ~= cur then return 0 end
local nxt = cur + 1
if nxt > 4294967295 then nxt = 1 end
redis.call('HSET', KEYS[1], 'v', ARGV[1], 'c', nxt)
return 1
";

/// The store one gateway's global plugins share.
pub(crate) struct RedisSharedData {
    link: Arc<Link>,
    prefix: String,
    /// Idle connections, each with the link's epoch when it was opened.
    pool: Mutex<Vec<(u64, redis::Connection)>>,
    set: redis::Script,
}

impl RedisSharedData {
    pub(crate) fn new(link: Arc<Link>, prefix: &str) -> Self {
        Self {
            link,
            prefix: prefix.to_owned(),
            pool: Mutex::new(Vec::new()),
            set: redis::Script::new(SET_SCRIPT),
        }
    }

    fn key(&self, what: &str, name: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.prefix.len() + what.len() + name.len() + 2);
        k.extend_from_slice(self.prefix.as_bytes());
        k.push(b':');
        k.extend_from_slice(what.as_bytes());
        k.push(b':');
        k.extend_from_slice(name);
        k
    }

    /// Runs `f` on a pooled blocking connection; `None` when the link is down or `f` failed.
    /// `f` runs a second time, on a fresh connection, when the pooled one was found closed.
    fn with<T>(&self, f: impl Fn(&mut redis::Connection) -> redis::RedisResult<T>) -> Option<T> {
        if !self.link.is_up() {
            return None;
        }
        // Read before opening: a connection opened now is tagged no newer than the server it
        // reaches.
        let epoch = self.link.epoch();
        let (mut conn, pooled) = match self.checkout(epoch) {
            Some(c) => (c, true),
            None => (self.open_or_fail()?, false),
        };
        let mut result = f(&mut conn);
        if pooled && matches!(&result, Err(e) if link::closed(e)) {
            // Closed while idle: the connections kept alongside it most likely were too.
            self.pool.lock().unwrap_or_else(|p| p.into_inner()).clear();
            conn = self.open_or_fail()?;
            self.link.retried();
            result = f(&mut conn);
        }
        match result {
            Ok(v) => {
                let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
                if pool.len() < POOL {
                    pool.push((epoch, conn));
                }
                Some(v)
            }
            Err(e) => {
                // The connection may hold a half-read reply: never reuse it.
                self.link.failed(&e);
                None
            }
        }
    }

    /// An idle connection opened under `epoch`; older ones are dropped, since the link has
    /// reconnected after they were opened and the server they reach may be gone.
    fn checkout(&self, epoch: u64) -> Option<redis::Connection> {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        pool.retain(|(opened, _)| *opened == epoch);
        pool.pop().map(|(_, c)| c)
    }

    /// A new connection, or `None` with the link marked down.
    fn open_or_fail(&self) -> Option<redis::Connection> {
        match self.open() {
            Ok(c) => Some(c),
            Err(e) => {
                self.link.failed(&e);
                None
            }
        }
    }

    fn open(&self) -> redis::RedisResult<redis::Connection> {
        let t = self.link.timeout;
        let conn = self.link.client.get_connection_with_timeout(t)?;
        conn.set_read_timeout(Some(t))?;
        conn.set_write_timeout(Some(t))?;
        Ok(conn)
    }
}

impl GlobalStore for RedisSharedData {
    fn get(&self, key: &[u8]) -> Option<Option<(Bytes, u32)>> {
        let k = self.key("shared", key);
        let (v, c): (Option<Vec<u8>>, Option<u32>) =
            self.with(|conn| redis::cmd("HMGET").arg(&k).arg("v").arg("c").query(conn))?;
        Some(v.map(|v| (Bytes::from(v), c.unwrap_or(1))))
    }

    fn set(&self, key: &[u8], value: Bytes, cas: u32) -> Option<Result<(), SetError>> {
        let k = self.key("shared", key);
        let written: i64 =
            self.with(|conn| self.set.key(&k).arg(&value[..]).arg(cas).invoke(conn))?;
        Some(if written == 1 {
            Ok(())
        } else {
            Err(SetError::CasMismatch)
        })
    }

    fn enqueue(&self, queue: &str, value: Bytes) -> Option<()> {
        let k = self.key("queue", queue.as_bytes());
        let channel = format!("{}:queue", self.prefix);
        self.with(|conn| {
            redis::pipe()
                .rpush(&k, &value[..])
                .ignore()
                .publish(&channel, queue)
                .ignore()
                .query::<()>(conn)
        })
    }

    fn dequeue(&self, queue: &str) -> Option<Option<Bytes>> {
        let k = self.key("queue", queue.as_bytes());
        let item: Option<Vec<u8>> = self.with(|conn| redis::cmd("LPOP").arg(&k).query(conn))?;
        Some(item.map(Bytes::from))
    }
}
