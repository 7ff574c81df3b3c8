//! Moving bytes both ways between a client and an upstream connection until both directions
//! have ended. Each direction is independent (half-close): when one side stops sending (FIN),
//! the other side's write half is shut down and the opposite direction keeps flowing. An error
//! on either side ends both.
//!
//! Two relays: [`buffered`] (read then write through a per-thread scratch buffer, no buffer
//! held while idle; a direction carrying bulk data switches to [`splice`] on Linux: socket →
//! pipe → socket inside the kernel, no userspace copy) and [`filtered`] (every chunk passed
//! through the stream's filter hooks, one buffer per direction). Filters with data hooks need
//! `filtered`. Measured on loopback (see `examples/relay_throughput.rs` and
//! docs/guide-tcp-udp.md).

pub mod buffered;
pub mod filtered;
#[cfg(target_os = "linux")]
pub mod splice;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::time::Instant;

use crate::stats::StreamStats;
use crate::watchdog::Stamp;

/// Which way bytes flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client to upstream.
    In,
    /// Upstream to client.
    Out,
}

/// One connection's byte counts and last activity, shared by both directions and the idle
/// deadline; every update also feeds the stream's counters.
#[derive(Debug)]
pub struct Progress {
    start: Instant,
    activity: Activity,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    stats: Arc<StreamStats>,
}

/// Where the last activity is kept.
#[derive(Debug)]
enum Activity {
    /// Milliseconds after `start` of the last byte moved, read by [`Progress::idle`] (UDP
    /// sessions).
    Own(AtomicU64),
    /// In the connection's watchdog entry, which the stream's sweeper reads (TCP).
    Watched(Stamp),
}

impl Progress {
    /// Starts counting now; [`Progress::idle`] waits for the idle timeout.
    pub fn new(stats: Arc<StreamStats>) -> Self {
        Self::with(stats, Activity::Own(AtomicU64::new(0)))
    }

    /// Starts counting now; activity is stamped for the stream's watchdog.
    pub(crate) fn watched(stats: Arc<StreamStats>, stamp: Stamp) -> Self {
        Self::with(stats, Activity::Watched(stamp))
    }

    fn with(stats: Arc<StreamStats>, activity: Activity) -> Self {
        Self {
            start: Instant::now(),
            activity,
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            stats,
        }
    }

    /// `n` bytes moved in direction `dir`.
    pub fn add(&self, dir: Direction, n: usize) {
        let n = n as u64;
        let (mine, stream) = match dir {
            Direction::In => (&self.bytes_in, &self.stats.bytes_in),
            Direction::Out => (&self.bytes_out, &self.stats.bytes_out),
        };
        mine.fetch_add(n, Relaxed);
        stream.fetch_add(n, Relaxed);
        self.touch();
    }

    /// Marks activity now (also for bytes not counted, such as a PROXY header).
    pub fn touch(&self) {
        match &self.activity {
            Activity::Own(last) => {
                let now = self.start.elapsed().as_millis() as u64;
                // Load first: both directions touch on every chunk.
                if last.load(Relaxed) != now {
                    last.store(now, Relaxed);
                }
            }
            Activity::Watched(stamp) => stamp.touch(),
        }
    }

    /// Bytes client → upstream so far.
    pub fn bytes_in(&self) -> u64 {
        self.bytes_in.load(Relaxed)
    }

    /// Bytes upstream → client so far.
    pub fn bytes_out(&self) -> u64 {
        self.bytes_out.load(Relaxed)
    }

    /// Time since the connection started.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Time since the last byte moved (or since the start).
    pub fn quiet_for(&self) -> Duration {
        match &self.activity {
            Activity::Own(last) => self
                .start
                .elapsed()
                .saturating_sub(Duration::from_millis(last.load(Relaxed))),
            Activity::Watched(stamp) => stamp.quiet_for(),
        }
    }

    /// Resolves once nothing has moved for `timeout`; never when `timeout` is zero. (A watched
    /// connection leaves this to its watchdog.)
    pub async fn idle(&self, timeout: Duration) {
        if timeout.is_zero() {
            return std::future::pending().await;
        }
        loop {
            let quiet = self.quiet_for();
            if quiet >= timeout {
                return;
            }
            tokio::time::sleep(timeout - quiet).await;
        }
    }
}

/// Size of the buffered relay's per-thread scratch buffer and of each direction's buffer in
/// the filtered relay. A read that fills it marks a bulk transfer.
pub const BUFFER_SIZE: usize = 64 * 1024;
