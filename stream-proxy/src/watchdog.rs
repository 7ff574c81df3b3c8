//! Idle deadlines and the drain stop of one stream's TCP connections: one table per stream,
//! checked by one sweeper task on a coarse tick, instead of a tokio timer and a wait on the
//! drain token in every connection.
//!
//! Why: on a short connection (connect, one exchange, close) the connection's own timer (armed,
//! polled, taken out of the timer wheel), a clock read for every chunk moved and the wait on the
//! drain token came to about 1,400 of its 12,300 user-space instructions. A watched connection
//! costs one insert into the table and one removal, each under an uncontended lock, and stamps
//! its activity from the kernel's coarse clock (no TSC read), much as nginx and HAProxy stamp
//! events with a time cached once per loop turn.
//!
//! Precision: the sweeper ticks every eighth of the shortest idle timeout in its table (between
//! 10 ms and 1 s). A connection is closed for idleness no earlier than `idle_timeout` after its
//! last byte, and at most one tick plus the coarse clock's resolution (one kernel tick, 1–10 ms)
//! later. The drain stop reaches every connection at once.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicU8;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::Duration;

use atomic_waker::AtomicWaker;
use slab::Slab;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::clock::{coarse_ms, deadline_ms};

const MIN_TICK_MS: u64 = 10;
const MAX_TICK_MS: u64 = 1000;
/// Sweeps finding the table empty before the sweeper parks until the next connection: a
/// stream with steady traffic never parks (so no connection pays for waking it), an unused one
/// costs no wake-ups.
const PARK_AFTER: u32 = 8;

const RUNNING: u8 = 0;
const IDLE: u8 = 1;
const STOPPED: u8 = 2;

/// Why the watchdog ended a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing moved for the idle timeout.
    Idle,
    /// The drain timeout passed (shutdown, or the stream was removed by a reload).
    Stopped,
}

/// One stream's table, held by its accept loop. The sweeper ends when the drain stop fires, or
/// once the accept loop and every connection have let go of the table.
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
}

struct Shared {
    table: Mutex<Table>,
    /// Wakes a parked sweeper: a connection arrived, or the accept loop let go.
    wake: Notify,
}

#[derive(Default)]
struct Table {
    entries: Slab<Arc<Entry>>,
    /// The drain stop fired: a connection registered from now on starts stopped.
    stopped: bool,
    /// The sweeper waits for `wake` instead of ticking.
    parked: bool,
}

/// One connection's state, shared by the connection and the sweeper.
#[derive(Debug)]
struct Entry {
    /// Coarse-clock milliseconds of the last byte moved (or of arming).
    last_ms: AtomicU64,
    /// The idle timeout in milliseconds; 0: none (not relaying yet, or `idle_timeout: 0`).
    idle_ms: AtomicU64,
    verdict: AtomicU8,
    waker: AtomicWaker,
}

/// A connection's place in the table; dropping it takes the connection out.
pub(crate) struct Watch {
    shared: Arc<Shared>,
    entry: Arc<Entry>,
    key: usize,
}

/// Where a watched connection stamps its activity (the relay's [`crate::relay::Progress`]).
#[derive(Debug)]
pub(crate) struct Stamp(Arc<Entry>);

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Watchdog {
    /// A table for one stream and its sweeper task; `hard` is the stream's drain stop. Needs a
    /// Tokio runtime.
    pub(crate) fn start(hard: CancellationToken) -> Self {
        let shared = Arc::new(Shared {
            table: Mutex::new(Table::default()),
            wake: Notify::new(),
        });
        tokio::spawn(sweep(shared.clone(), hard));
        Self { shared }
    }

    /// Puts a new connection in the table, with no idle deadline until [`Watch::arm_idle`].
    pub(crate) fn register(&self) -> Watch {
        let entry = Arc::new(Entry {
            last_ms: AtomicU64::new(coarse_ms()),
            idle_ms: AtomicU64::new(0),
            verdict: AtomicU8::new(RUNNING),
            waker: AtomicWaker::new(),
        });
        let mut table = self.shared.lock();
        if table.stopped {
            entry.verdict.store(STOPPED, Relaxed);
        }
        let key = table.entries.insert(entry.clone());
        let unpark = std::mem::take(&mut table.parked);
        drop(table);
        if unpark {
            self.shared.wake.notify_one();
        }
        Watch {
            shared: self.shared.clone(),
            entry,
            key,
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // A parked sweeper checks whether anyone still holds the table.
        self.shared.wake.notify_one();
    }
}

impl Watch {
    /// Starts the idle deadline (zero: none), counting from now.
    pub(crate) fn arm_idle(&self, timeout: Duration) {
        let ms = match timeout.as_millis() {
            0 if timeout.is_zero() => 0,
            0 => 1,
            ms => u64::try_from(ms).unwrap_or(u64::MAX / 2),
        };
        self.entry.last_ms.store(coarse_ms(), Relaxed);
        self.entry.idle_ms.store(ms, Relaxed);
    }

    /// A handle the relay stamps activity through.
    pub(crate) fn stamp(&self) -> Stamp {
        Stamp(self.entry.clone())
    }

    /// `work`'s output, or why the watchdog ended the connection first. `work` is borrowed
    /// pinned, so the connection's future is not moved into another.
    pub(crate) async fn until<F: Future>(
        &self,
        mut work: Pin<&mut F>,
    ) -> Result<F::Output, Verdict> {
        std::future::poll_fn(|cx| {
            if let Poll::Ready(out) = work.as_mut().poll(cx) {
                return Poll::Ready(Ok(out));
            }
            // Registered before the verdict is read: a verdict given after this read wakes us.
            self.entry.waker.register(cx.waker());
            match self.entry.verdict.load(Acquire) {
                RUNNING => Poll::Pending,
                IDLE => Poll::Ready(Err(Verdict::Idle)),
                _ => Poll::Ready(Err(Verdict::Stopped)),
            }
        })
        .await
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.shared.lock().entries.try_remove(self.key);
    }
}

impl Stamp {
    /// Something moved now.
    pub(crate) fn touch(&self) {
        let now = coarse_ms();
        // Load first: both directions touch on every chunk, mostly within one clock tick.
        if self.0.last_ms.load(Relaxed) != now {
            self.0.last_ms.store(now, Relaxed);
        }
    }

    /// Time since the last stamp, to the coarse clock's resolution.
    pub(crate) fn quiet_for(&self) -> Duration {
        Duration::from_millis(coarse_ms().saturating_sub(self.0.last_ms.load(Relaxed)))
    }
}

/// The sweeper: ticks while the table has connections, parks when it has had none for a while.
async fn sweep(shared: Arc<Shared>, hard: CancellationToken) {
    let mut tick_ms = MAX_TICK_MS;
    let mut parked = false;
    let mut empty_sweeps = 0;
    loop {
        tokio::select! {
            biased;
            () = hard.cancelled() => {
                stop_all(&shared);
                return;
            }
            () = shared.wake.notified(), if parked => {}
            () = tokio::time::sleep(Duration::from_millis(tick_ms)), if !parked => {}
        }
        // Only this task holds the table: the accept loop has ended and no connection is left.
        if Arc::strong_count(&shared) == 1 {
            return;
        }
        let mut table = shared.lock();
        if table.entries.is_empty() {
            empty_sweeps += 1;
            if empty_sweeps >= PARK_AFTER {
                table.parked = true;
            }
            parked = table.parked;
            continue;
        }
        empty_sweeps = 0;
        parked = false;
        tick_ms = expire_idle(&table, deadline_ms());
    }
}

/// Ends every connection quiet for its idle timeout as of `now` (a [`deadline_ms`] reading);
/// returns the next tick.
fn expire_idle(table: &Table, now: u64) -> u64 {
    let mut shortest = u64::MAX;
    for (_, e) in table.entries.iter() {
        let idle = e.idle_ms.load(Relaxed);
        if idle == 0 {
            continue;
        }
        shortest = shortest.min(idle);
        if e.verdict.load(Relaxed) == RUNNING && now.saturating_sub(e.last_ms.load(Relaxed)) >= idle
        {
            e.verdict.store(IDLE, Release);
            e.waker.wake();
        }
    }
    (shortest / 8).clamp(MIN_TICK_MS, MAX_TICK_MS)
}

fn stop_all(shared: &Shared) {
    let mut table = shared.lock();
    table.stopped = true;
    for (_, e) in table.entries.iter() {
        e.verdict.store(STOPPED, Release);
        e.waker.wake();
    }
}

#[cfg(test)]
mod tests;
