//! Deadlines and the drain stop of many connections: one table per stream (and per HTTP
//! listener, in the gateway), checked by one sweeper task on a coarse tick, instead of a tokio
//! timer and a wait on the drain token in every connection. What a deadline is belongs to the
//! table's user ([`Deadlines`]): a stream's connection has one idle timeout, an HTTP
//! connection also a header-read and a write-stall timeout.
//!
//! Why: on a short connection (connect, one exchange, close) the connection's own timer (armed,
//! polled, taken out of the timer wheel), a clock read for every chunk moved and the wait on the
//! drain token are a tenth of its user-space work. A watched connection
//! costs one insert into the table and one removal, each under an uncontended lock, and stamps
//! its activity from the kernel's coarse clock (no TSC read), much as nginx and HAProxy stamp
//! events with a time cached once per loop turn.
//!
//! Precision: the sweeper ticks every eighth of the shortest timeout in its table (between
//! 10 ms and 1 s). A deadline passes no earlier than its timeout after the stamp it counts
//! from, and is reported at most one tick plus the coarse clock's resolution (one kernel tick,
//! 1–10 ms) later. The drain stop reaches every connection at once.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicU8;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use atomic_waker::AtomicWaker;
use slab::Slab;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::clock::{coarse_ms, deadline_ms};

const MIN_TICK_MS: u64 = 10;
const MAX_TICK_MS: u64 = 1000;
/// Sweeps finding the table empty before the sweeper parks until the next connection: a
/// table with steady traffic never parks (so no connection pays for waking it), an unused one
/// costs no wake-ups.
const PARK_AFTER: u32 = 8;

/// `Entry::signal` values: nothing to tell, the drain stop, or `EXPIRED + code`.
const NONE: u8 = 0;
const STOP: u8 = 1;
const EXPIRED: u8 = 2;

/// A watched connection's deadlines, read by the sweeper on every tick.
pub trait Deadlines: Send + Sync + 'static {
    /// The deadline that has passed as of `now` (a [`deadline_ms`] reading), as a code the
    /// connection will get back in [`Signal::Expired`]; `None` while none has. Asked again on
    /// every tick until the connection takes the signal, and after.
    fn expired(&self, now: u64) -> Option<u8>;

    /// The shortest timeout, in milliseconds, this connection can expire by (`u64::MAX`: none
    /// yet). The table ticks every eighth of the shortest one it holds.
    fn shortest_ms(&self) -> u64;
}

/// What the table tells a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// The drain stop fired (shutdown, or a reload removed the stream or listener).
    Stop,
    /// One of the connection's deadlines passed: the code its [`Deadlines::expired`] gave.
    Expired(u8),
}

/// A table of connections and its sweeper, held by an accept loop. The sweeper ends once every
/// handle on the table and every connection have let go.
pub struct Watchdog<D> {
    shared: Arc<Shared<D>>,
}

struct Shared<D> {
    table: Mutex<Table<D>>,
    /// Wakes a parked sweeper: a connection arrived, or a handle on the table let go.
    wake: Notify,
}

struct Table<D> {
    entries: Slab<Arc<Entry<D>>>,
    /// The drain stop fired: a connection registered from now on starts with it.
    stopped: bool,
    /// The sweeper waits for `wake` instead of ticking.
    parked: bool,
}

/// One connection's state, shared by the connection and the sweeper.
#[derive(Debug)]
struct Entry<D> {
    deadlines: D,
    /// What to tell the connection, until it takes it.
    signal: AtomicU8,
    waker: AtomicWaker,
}

/// A connection's place in the table; dropping it takes the connection out.
pub struct Watch<D> {
    shared: Arc<Shared<D>>,
    entry: Arc<Entry<D>>,
    key: usize,
}

impl<D> Shared<D> {
    fn lock(&self) -> MutexGuard<'_, Table<D>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<D: Deadlines> Watchdog<D> {
    /// A table and its sweeper task; `stop` is the drain stop every connection is told of.
    /// Needs a Tokio runtime.
    pub fn start(stop: CancellationToken) -> Self {
        let shared = Arc::new(Shared {
            table: Mutex::new(Table {
                entries: Slab::new(),
                stopped: false,
                parked: false,
            }),
            wake: Notify::new(),
        });
        tokio::spawn(sweep(shared.clone(), stop));
        Self { shared }
    }

    /// Puts a new connection in the table.
    pub fn register(&self, deadlines: D) -> Watch<D> {
        let entry = Arc::new(Entry {
            deadlines,
            signal: AtomicU8::new(NONE),
            waker: AtomicWaker::new(),
        });
        let mut table = self.shared.lock();
        if table.stopped {
            entry.signal.store(STOP, Relaxed);
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

impl<D> Drop for Watchdog<D> {
    fn drop(&mut self) {
        // A parked sweeper checks whether anyone still holds the table.
        self.shared.wake.notify_one();
    }
}

impl<D> Watch<D> {
    /// The deadlines this connection registered with.
    pub fn deadlines(&self) -> &D {
        &self.entry.deadlines
    }

    /// `work`'s output, or the next signal the table has for the connection, whichever comes
    /// first. A signal is handed over once: a connection that goes on (an HTTP connection
    /// closing gracefully) calls this again with the same work. `work` is borrowed pinned, so
    /// the connection's future is not moved into another.
    pub async fn until<F: Future>(&self, mut work: Pin<&mut F>) -> Result<F::Output, Signal> {
        std::future::poll_fn(|cx| self.poll_until(work.as_mut(), cx)).await
    }

    /// [`Watch::until`] as a poll function, for callers whose futures are generic enough that
    /// an `async fn` borrowing them trips the compiler's `Send` inference.
    pub fn poll_until<F: Future>(
        &self,
        work: Pin<&mut F>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<F::Output, Signal>> {
        if let Poll::Ready(out) = work.poll(cx) {
            return Poll::Ready(Ok(out));
        }
        // Registered before the signal is read: a signal given after this read wakes us.
        self.entry.waker.register(cx.waker());
        // Load first: the swap would write the entry's line on every poll.
        if self.entry.signal.load(Acquire) == NONE {
            return Poll::Pending;
        }
        match self.entry.signal.swap(NONE, AcqRel) {
            NONE => Poll::Pending,
            STOP => Poll::Ready(Err(Signal::Stop)),
            s => Poll::Ready(Err(Signal::Expired(s - EXPIRED))),
        }
    }
}

impl<D> Drop for Watch<D> {
    fn drop(&mut self) {
        self.shared.lock().entries.try_remove(self.key);
    }
}

/// The sweeper: ticks while the table has connections, parks when it has had none for a while.
/// After the drain stop it goes on checking the deadlines of the connections still closing (an
/// HTTP connection finishing its requests can still stall on a client that reads nothing).
async fn sweep<D: Deadlines>(shared: Arc<Shared<D>>, stop: CancellationToken) {
    // The first sweep comes soon and sets the tick from the connections it finds.
    let mut tick_ms = MIN_TICK_MS;
    let mut parked = false;
    let mut stopped = false;
    let mut empty_sweeps = 0;
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled(), if !stopped => {
                stop_all(&shared);
                stopped = true;
            }
            () = shared.wake.notified(), if parked => {}
            () = tokio::time::sleep(Duration::from_millis(tick_ms)), if !parked => {}
        }
        // Only this task holds the table: no handle on it and no connection is left.
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
        tick_ms = expire(&table, deadline_ms());
    }
}

/// Signals every connection with a deadline passed as of `now` (a [`deadline_ms`] reading)
/// and nothing else pending; returns the next tick.
fn expire<D: Deadlines>(table: &Table<D>, now: u64) -> u64 {
    let mut shortest = u64::MAX;
    for (_, e) in table.entries.iter() {
        shortest = shortest.min(e.deadlines.shortest_ms());
        if e.signal.load(Relaxed) != NONE {
            continue;
        }
        if let Some(code) = e.deadlines.expired(now) {
            let code = code.saturating_add(EXPIRED);
            if e.signal
                .compare_exchange(NONE, code, AcqRel, Relaxed)
                .is_ok()
            {
                e.waker.wake();
            }
        }
    }
    (shortest / 8).clamp(MIN_TICK_MS, MAX_TICK_MS)
}

fn stop_all<D>(shared: &Shared<D>) {
    let mut table = shared.lock();
    table.stopped = true;
    for (_, e) in table.entries.iter() {
        e.signal.store(STOP, Release);
        e.waker.wake();
    }
}

/// A stream connection's one deadline: no byte moved for `idle_timeout`.
#[derive(Debug)]
pub(crate) struct Idle {
    /// Coarse-clock milliseconds of the last byte moved (or of arming).
    last_ms: AtomicU64,
    /// The idle timeout in milliseconds; 0: none (not relaying yet, or `idle_timeout: 0`).
    idle_ms: AtomicU64,
}

impl Idle {
    /// Unarmed: no deadline until [`Watch::arm_idle`].
    pub(crate) fn unarmed() -> Self {
        Self {
            last_ms: AtomicU64::new(coarse_ms()),
            idle_ms: AtomicU64::new(0),
        }
    }
}

impl Deadlines for Idle {
    fn expired(&self, now: u64) -> Option<u8> {
        let idle = self.idle_ms.load(Relaxed);
        (idle != 0 && now.saturating_sub(self.last_ms.load(Relaxed)) >= idle).then_some(0)
    }

    fn shortest_ms(&self) -> u64 {
        match self.idle_ms.load(Relaxed) {
            0 => u64::MAX,
            ms => ms,
        }
    }
}

/// Where a watched stream connection stamps its activity (the relay's
/// [`crate::relay::Progress`]).
#[derive(Debug)]
pub(crate) struct Stamp(Arc<Entry<Idle>>);

impl Watch<Idle> {
    /// Starts the idle deadline (zero: none), counting from now.
    pub(crate) fn arm_idle(&self, timeout: Duration) {
        let ms = match timeout.as_millis() {
            0 if timeout.is_zero() => 0,
            0 => 1,
            ms => u64::try_from(ms).unwrap_or(u64::MAX / 2),
        };
        let idle = &self.entry.deadlines;
        idle.last_ms.store(coarse_ms(), Relaxed);
        idle.idle_ms.store(ms, Relaxed);
    }

    /// A handle the relay stamps activity through.
    pub(crate) fn stamp(&self) -> Stamp {
        Stamp(self.entry.clone())
    }
}

impl Stamp {
    /// Something moved now.
    pub(crate) fn touch(&self) {
        let now = coarse_ms();
        let last = &self.0.deadlines.last_ms;
        // Load first: both directions touch on every chunk, mostly within one clock tick.
        if last.load(Relaxed) != now {
            last.store(now, Relaxed);
        }
    }

    /// Time since the last stamp, to the coarse clock's resolution.
    pub(crate) fn quiet_for(&self) -> Duration {
        Duration::from_millis(coarse_ms().saturating_sub(self.0.deadlines.last_ms.load(Relaxed)))
    }
}

#[cfg(test)]
mod tests;
