//! Returning free memory to the kernel around a burst of connections: as it begins, and once
//! it has closed.
//!
//! Every open connection holds buffers (hyper's read and write buffers, TLS state). When they
//! close, jemalloc keeps the freed pages for its decay time and decays them only while it keeps
//! allocating, so a gateway that goes quiet after a burst holds them for good. A shorter decay time
//! would fix that but makes every request pay for purging. Instead the gateway counts its open
//! connections (HTTP, and the L4 proxy's through its hooks) and, once three quarters of a burst of
//! at least `server.release_memory_after_burst` (1,024 by default) have closed, returns the free
//! pages once, [`SETTLE`] later, on a blocking thread.
//!
//! The same purge also runs as a burst begins, when half a burst is open. hyper gives each
//! connection an 8 KiB read buffer and an 8 KiB write buffer and an idle connection touches one
//! page of each. On fresh pages only the touched ones become resident; on pages that earlier
//! traffic freed and the allocator kept, the untouched half is resident too, so a burst that
//! follows other traffic peaks higher than one on fresh pages, by as much as that traffic's
//! memory had not yet decayed. Traffic that never has half a burst open triggers neither; the
//! figures are in docs/performance-log.md, "Then: memory after a burst" and "Then: a release
//! as a burst begins".

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

/// How long the purge waits once most of a burst has closed, so that the rest of the burst
/// (a load generator closes its connections over a few hundred milliseconds) is freed by then.
const SETTLE: Duration = Duration::from_secs(1);

static CONNECTIONS: ConnectionCount = ConnectionCount::new(
    gateway_config::model::ServerSettings::DEFAULT_RELEASE_MEMORY_AFTER_BURST,
    SETTLE,
    super::release_freed,
);

/// Sets how many open connections make a burst (`server.release_memory_after_burst`); 0 turns
/// the release off. Process-wide, like the allocator it releases to.
pub fn set_burst_size(connections: usize) {
    CONNECTIONS.burst.store(connections, Relaxed);
}

/// Counts a client connection (HTTP over TCP or QUIC) as open until the returned guard is
/// dropped.
pub fn connection_opened() -> OpenConnection {
    CONNECTIONS.opened()
}

/// The L4 stream proxy's hooks: its TCP connections and UDP sessions count toward the burst
/// as the HTTP listeners' connections do.
pub fn stream_hooks() -> stream_proxy::ConnectionHooks {
    stream_proxy::ConnectionHooks {
        opened: || CONNECTIONS.count_open(),
        closed: || CONNECTIONS.closed(),
    }
}

/// Appends the Prometheus series of the releases around bursts.
pub fn render_prometheus(out: &mut String) {
    use std::fmt::Write as _;
    for (name, help, count) in [
        (
            "gateway_memory_burst_releases_total",
            "Times the gateway returned free memory to the kernel after a burst of connections closed.",
            &CONNECTIONS.releases,
        ),
        (
            "gateway_memory_burst_start_releases_total",
            "Times the gateway returned free memory to the kernel as a burst of connections began, so that the burst's buffers start on fresh pages.",
            &CONNECTIONS.start_releases,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
            count.load(Relaxed)
        );
    }
}

/// Open connections, their high-water mark since the last release, and the release itself.
struct ConnectionCount {
    open: AtomicUsize,
    peak: AtomicUsize,
    release_pending: AtomicBool,
    releases: AtomicU64,
    start_releases: AtomicU64,
    /// Whether the next time half a burst is open counts as a burst beginning.
    start_armed: AtomicBool,
    /// The fewest open connections that make a burst; 0: never release.
    burst: AtomicUsize,
    settle: Duration,
    release: fn(),
}

/// One open connection of a [`ConnectionCount`]; dropping it counts the connection closed.
pub struct OpenConnection(&'static ConnectionCount);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.closed();
    }
}

impl ConnectionCount {
    const fn new(burst: usize, settle: Duration, release: fn()) -> Self {
        Self {
            open: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            release_pending: AtomicBool::new(false),
            releases: AtomicU64::new(0),
            start_releases: AtomicU64::new(0),
            start_armed: AtomicBool::new(true),
            burst: AtomicUsize::new(burst),
            settle,
            release,
        }
    }

    fn opened(&'static self) -> OpenConnection {
        self.count_open();
        OpenConnection(self)
    }

    fn count_open(&'static self) {
        let open = self.open.fetch_add(1, Relaxed) + 1;
        // A load and a store rather than `fetch_max`, whose compare-and-swap loop every accept
        // would pay: two accepts racing can lose a maximum, which only makes the burst look
        // one connection smaller.
        if open > self.peak.load(Relaxed) {
            self.peak.store(open, Relaxed);
        }
        // Every count passes each value once, so a burst begins exactly when one accept
        // sees half a burst open (armed again once fewer than a quarter are).
        let burst = self.burst.load(Relaxed);
        if burst > 0 && open == burst.div_ceil(2) && self.start_armed.swap(false, Relaxed) {
            self.release_now();
        }
    }

    /// Returns the free pages at once, on a blocking thread, before the burst's connections
    /// take them.
    fn release_now(&'static self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let release = self.release;
        runtime.spawn_blocking(move || {
            release();
            self.start_releases.fetch_add(1, Relaxed);
        });
    }

    fn closed(&'static self) {
        let open = self.open.fetch_sub(1, Relaxed) - 1;
        let peak = self.peak.load(Relaxed);
        let burst = self.burst.load(Relaxed);
        if open == burst / 4 {
            self.start_armed.store(true, Relaxed);
        }
        if burst > 0
            && peak >= burst
            && open <= peak / 4
            && !self.release_pending.load(Relaxed)
            && !self.release_pending.swap(true, Relaxed)
        {
            self.schedule_release();
        }
    }

    fn schedule_release(&'static self) {
        // Cleared however this ends: a listener's own runtime shut down by a reload drops the
        // task, maybe before its first poll, and a flag left set would stop every later release.
        let pending = Pending(self);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // Closed outside a runtime: nothing to wait on; the next burst starts from here.
            self.peak.store(self.open.load(Relaxed), Relaxed);
            return;
        };
        runtime.spawn(async move {
            let _pending = pending;
            tokio::time::sleep(self.settle).await;
            // The next burst is measured from what is open now.
            self.peak.store(self.open.load(Relaxed), Relaxed);
            let release = self.release;
            if tokio::task::spawn_blocking(release).await.is_ok() {
                self.releases.fetch_add(1, Relaxed);
            }
        });
    }
}

/// A scheduled release; dropping it lets the next burst schedule one.
struct Pending(&'static ConnectionCount);

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.release_pending.store(false, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static RELEASED: AtomicU64 = AtomicU64::new(0);

    fn count_release() {
        RELEASED.fetch_add(1, Relaxed);
    }

    static COUNT: ConnectionCount =
        ConnectionCount::new(8, Duration::from_millis(20), count_release);

    async fn settled() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    #[tokio::test]
    async fn memory_is_released_once_after_most_of_a_burst_closes_and_not_for_small_ones() {
        // A burst of 10: closing 7 leaves 3, not yet a quarter of the peak.
        let mut open: Vec<_> = (0..10).map(|_| COUNT.opened()).collect();
        open.truncate(3);
        settled().await;
        assert_eq!(
            COUNT.releases.load(Relaxed),
            0,
            "released while a third was still open"
        );

        // The eighth close leaves 2 of 10: one release, however many close after it.
        open.truncate(2);
        open.clear();
        settled().await;
        assert_eq!(COUNT.releases.load(Relaxed), 1);

        // Traffic below the burst size never releases.
        for _ in 0..3 {
            let few: Vec<_> = (0..7).map(|_| COUNT.opened()).collect();
            drop(few);
        }
        settled().await;
        assert_eq!(
            COUNT.releases.load(Relaxed),
            1,
            "released after fewer than 8 connections"
        );

        // The next burst is counted from what was open at the release: it releases again.
        let burst: Vec<_> = (0..9).map(|_| COUNT.opened()).collect();
        drop(burst);
        settled().await;
        assert_eq!(COUNT.releases.load(Relaxed), 2);

        // A release whose runtime shuts down before it runs does not stop later ones.
        let burst: Vec<_> = (0..9).map(|_| COUNT.opened()).collect();
        std::thread::spawn(move || {
            let short_lived = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("runtime");
            short_lived.block_on(async move { drop(burst) });
        })
        .join()
        .expect("thread");
        assert!(!COUNT.release_pending.load(Relaxed), "left pending");
        let burst: Vec<_> = (0..9).map(|_| COUNT.opened()).collect();
        drop(burst);
        settled().await;
        assert_eq!(COUNT.releases.load(Relaxed), 3);

        // Each of the seven climbs past half a burst above (the three of 7 connections too)
        // released as it began.
        assert_eq!(COUNT.start_releases.load(Relaxed), 7);
        assert_eq!(RELEASED.load(Relaxed), 3 + 7);

        // 0 turns the release off, as a burst begins and after it.
        COUNT.burst.store(0, Relaxed);
        let burst: Vec<_> = (0..20).map(|_| COUNT.opened()).collect();
        drop(burst);
        settled().await;
        assert_eq!(
            RELEASED.load(Relaxed),
            3 + 7,
            "released with the release turned off"
        );
    }

    fn no_release() {}

    static STARTS: ConnectionCount = ConnectionCount::new(8, Duration::from_millis(20), no_release);

    #[tokio::test]
    async fn memory_is_released_once_as_a_burst_begins_and_again_after_it_has_ended() {
        // Three open: not yet half of a burst of 8.
        let mut open: Vec<_> = (0..3).map(|_| STARTS.opened()).collect();
        settled().await;
        assert_eq!(STARTS.start_releases.load(Relaxed), 0);

        // The fourth makes half: one release, however many more open.
        open.extend((0..7).map(|_| STARTS.opened()));
        settled().await;
        assert_eq!(STARTS.start_releases.load(Relaxed), 1);

        // Down to 3 and up again: still the same burst.
        open.truncate(3);
        open.extend((0..5).map(|_| STARTS.opened()));
        settled().await;
        assert_eq!(
            STARTS.start_releases.load(Relaxed),
            1,
            "the burst had not ended"
        );

        // Down to a quarter ends it: the next climb past half is a new burst.
        open.truncate(2);
        open.extend((0..4).map(|_| STARTS.opened()));
        settled().await;
        assert_eq!(STARTS.start_releases.load(Relaxed), 2);
    }
}
