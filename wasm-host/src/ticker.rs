//! The epoch ticker: the thread that advances the engine's epoch every [`EPOCH_TICK`], which is
//! what stops a guest call at its deadline (`limits.time`). It only has to run while guest code
//! may be running, so it parks once no call has been armed for longer than any deadline it could
//! have to reach, and the next call wakes it. An idle gateway with plugins loaded would otherwise
//! wake up at every tick, and on a server pinned to one core each tick preempts the worker.
//!
//! Every guest call first tells the ticker it runs ([`Ticker::arm`], which also sets the call's
//! deadline, so no call site can do one without the other): one relaxed load on the hot path,
//! a store (and, when parked, a wake-up) only for the first call after the ticker last looked.
//! The ticker parks only after seeing no call for `linger` ticks, and `linger` is longer than
//! the longest deadline a call is given, so a call that started before the ticker stopped
//! counting has reached its deadline (and its deadline callback, which keeps the ticker awake
//! too, has run) before the ticker parks.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::Duration;

use wasmtime::EngineWeak;

/// How often the epoch advances; `limits.time` is rounded up to a multiple of this.
pub const EPOCH_TICK: Duration = Duration::from_millis(2);

/// Ticks the ticker goes on after the longest deadline before parking: room for a guest's
/// thread that the kernel kept from running to reach its deadline callback.
const LINGER_MARGIN: u64 = 500;

/// How long a parked ticker sleeps before it looks whether its engine is gone (so a dropped
/// engine's thread ends). It goes back to sleep without ticking if the engine lives.
const PARKED_CHECK: Duration = Duration::from_secs(30);

/// The ticker's shared state; the thread holds one reference, every plugin of the engine another.
#[derive(Debug)]
pub struct Ticker {
    /// Set by a call armed since the ticker last looked (only the first such call writes it).
    armed: AtomicBool,
    /// Whether the ticker is parked (or about to): a call that sets `armed` then wakes it.
    parked: AtomicBool,
    /// Ticks without an armed call after which the ticker parks.
    linger: AtomicU64,
    /// Epochs advanced so far (tests and diagnostics).
    ticks: AtomicU64,
    /// How long a park lasts at most ([`PARKED_CHECK`]; shorter in tests).
    parked_check: Duration,
    thread: OnceLock<Thread>,
}

impl Ticker {
    /// Starts the ticker thread for `engine`; it ends once the engine is dropped. If the thread
    /// cannot be started, the error is logged and time limits are not enforced.
    pub(crate) fn start(engine: EngineWeak) -> Arc<Self> {
        Self::start_with(engine, LINGER_MARGIN, PARKED_CHECK)
    }

    fn start_with(engine: EngineWeak, linger: u64, parked_check: Duration) -> Arc<Self> {
        let ticker = Arc::new(Self {
            armed: AtomicBool::new(false),
            parked: AtomicBool::new(false),
            linger: AtomicU64::new(linger),
            ticks: AtomicU64::new(0),
            parked_check,
            thread: OnceLock::new(),
        });
        let running = ticker.clone();
        match std::thread::Builder::new()
            .name("wasm-epoch".into())
            .spawn(move || running.run(engine))
        {
            Ok(handle) => {
                let _ = ticker.thread.set(handle.thread().clone());
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot start the wasm epoch ticker; plugin time limits are not enforced");
            }
        }
        ticker
    }

    /// Called before every guest call (and by the deadline callback): the ticker must run.
    #[inline]
    pub(crate) fn keep_awake(&self) {
        if !self.armed.load(Ordering::Relaxed) {
            self.wake();
        }
    }

    /// Sets `store`'s epoch deadline `ticks` from now with the ticker awake. Every guest call
    /// starts through here, so none can start while the ticker sleeps and run on unlimited.
    #[inline]
    pub(crate) fn arm<T>(&self, store: &mut wasmtime::Store<T>, ticks: u64) {
        self.keep_awake();
        store.set_epoch_deadline(ticks);
    }

    #[cold]
    fn wake(&self) {
        // With `run`'s store of `parked` then load of `armed`, one side sees the other's write:
        // either the ticker does not park, or this call sees it parked and unparks it (an
        // unpark before the park makes the park return at once).
        self.armed.store(true, Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst)
            && let Some(thread) = self.thread.get()
        {
            thread.unpark();
        }
    }

    /// Makes the ticker go on for at least `deadline` ticks (plus a margin) after the last call:
    /// called with the longest deadline a plugin's calls are given, when it is loaded.
    pub(crate) fn linger_at_least(&self, deadline: u64) {
        self.linger
            .fetch_max(deadline.saturating_add(LINGER_MARGIN), Ordering::Relaxed);
    }

    /// Epochs advanced so far.
    pub fn ticks(&self) -> u64 {
        self.ticks.load(Ordering::Relaxed)
    }

    /// Whether the ticker is parked (no guest call for a while).
    pub fn is_parked(&self) -> bool {
        self.parked.load(Ordering::SeqCst)
    }

    fn run(&self, weak: EngineWeak) {
        let mut idle = 0u64;
        while let Some(engine) = weak.upgrade() {
            engine.increment_epoch();
            drop(engine);
            self.ticks.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(EPOCH_TICK);
            if self.armed.swap(false, Ordering::SeqCst) {
                idle = 0;
                continue;
            }
            idle += 1;
            if idle <= self.linger.load(Ordering::Relaxed) {
                continue;
            }
            // Parked until a call arms the ticker (a spurious or timed-out wake-up only checks
            // that the engine is still there).
            self.parked.store(true, Ordering::SeqCst);
            while !self.armed.load(Ordering::SeqCst) {
                if weak.upgrade().is_none() {
                    return;
                }
                std::thread::park_timeout(self.parked_check);
            }
            self.parked.store(false, Ordering::SeqCst);
            idle = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(
                std::time::Instant::now() < until,
                "timed out waiting: {what}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn an_idle_ticker_parks_and_a_call_wakes_it() {
        let engine = wasmtime::Engine::default();
        let ticker = Ticker::start_with(engine.weak(), 5, Duration::from_millis(10));
        wait_for("the ticker to park", || ticker.is_parked());
        let parked_at = ticker.ticks();
        std::thread::sleep(EPOCH_TICK * 20);
        assert_eq!(ticker.ticks(), parked_at, "a parked ticker does not tick");

        ticker.keep_awake();
        wait_for("the ticker to tick again", || {
            ticker.ticks() > parked_at + 2
        });
        // Kept awake by calls, it does not park...
        for _ in 0..20 {
            ticker.keep_awake();
            assert!(!ticker.is_parked());
            std::thread::sleep(EPOCH_TICK);
        }
        // ...and parks again once they stop.
        wait_for("the ticker to park again", || ticker.is_parked());
    }

    #[test]
    fn a_parked_ticker_stays_parked_until_a_call_and_ends_with_its_engine() {
        let engine = wasmtime::Engine::default();
        let ticker = Ticker::start_with(engine.weak(), 5, Duration::from_millis(10));
        wait_for("the ticker to park", || ticker.is_parked());
        let parked_at = ticker.ticks();
        // Ten park time-outs: each only looks whether the engine is still there.
        std::thread::sleep(Duration::from_millis(100));
        assert!(ticker.is_parked());
        assert_eq!(ticker.ticks(), parked_at, "a timed-out park does not tick");

        drop(engine);
        // The thread's own reference goes when it ends.
        wait_for("the ticker's thread to end", || {
            Arc::strong_count(&ticker) == 1
        });
    }

    #[test]
    fn a_longer_deadline_makes_the_ticker_linger() {
        let engine = wasmtime::Engine::default();
        let ticker = Ticker::start_with(engine.weak(), 5, Duration::from_millis(10));
        ticker.linger_at_least(100);
        assert_eq!(ticker.linger.load(Ordering::Relaxed), 100 + LINGER_MARGIN);
        ticker.linger_at_least(10);
        assert_eq!(ticker.linger.load(Ordering::Relaxed), 100 + LINGER_MARGIN);
    }
}
