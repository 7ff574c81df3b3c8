//! A coarse monotonic clock for activity stamps and idle deadlines, shared by the stream proxy's
//! watchdog and the HTTP connections' watchdog in the gateway.
//!
//! Why: a connection stamps every read and write with the time, and `Instant::now()` reads the
//! TSC and converts it, then the stamp subtracts an epoch: work repeated on every chunk moved.
//! `CLOCK_MONOTONIC_COARSE` is the time of the kernel's last timer tick, read from the vDSO with a
//! few loads. Its resolution (one kernel tick, 1–10 ms) is far below any idle or header timeout;
//! deadlines are measured against [`deadline_ms`], which takes it off, so that none fires early.

/// `CLOCK_MONOTONIC_COARSE` in milliseconds: the time of the kernel's last timer tick, read
/// from the vDSO without a TSC read. Were the read to fail, its zeroes would make no idle
/// deadline fire: a missed timeout, never an early one.
#[cfg(target_os = "linux")]
pub fn coarse_ms() -> u64 {
    let ts = read_clock(libc::CLOCK_MONOTONIC_COARSE);
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Whole seconds since the Unix epoch from `CLOCK_REALTIME_COARSE`: the wall clock at the kernel's
/// last timer tick, for a `Date` field that shows whole seconds anyway. It reads the vDSO without a
/// TSC read and needs no subtraction from an epoch, which `SystemTime::now()` and `duration_since`
/// would cost every response on the fast path. Were the read to fail, its zeroes name 1970, which
/// the caller treats as "ask the precise clock".
#[cfg(target_os = "linux")]
pub fn coarse_unix_secs() -> u64 {
    u64::try_from(read_clock(libc::CLOCK_REALTIME_COARSE).tv_sec).unwrap_or(0)
}

/// One of the kernel's clocks, zeroes if it cannot be read.
#[cfg(target_os = "linux")]
#[allow(
    unsafe_code,
    reason = "clock_gettime(2) through libc: a plain read of the vDSO clock into a local"
)]
fn read_clock(clock: libc::clockid_t) -> libc::timespec {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; both coarse clocks exist on every Linux since
    // 2.6.32, and a failed call leaves `ts` as it was.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts
}

/// Elsewhere, whole seconds of the system clock since the Unix epoch.
#[cfg(not(target_os = "linux"))]
pub fn coarse_unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The coarse clock's resolution in milliseconds, rounded up (asked of the kernel once).
#[cfg(target_os = "linux")]
#[allow(
    unsafe_code,
    reason = "clock_getres(2) through libc: a plain read into a local"
)]
fn coarse_resolution_ms() -> u64 {
    static RESOLUTION: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *RESOLUTION.get_or_init(|| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: as in `coarse_ms`.
        let ok = unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut ts) } == 0;
        if !ok {
            return 10;
        }
        (ts.tv_sec as u64 * 1000 + (ts.tv_nsec as u64).div_ceil(1_000_000)).max(1)
    })
}

/// Elsewhere, milliseconds of the monotonic clock since the first call.
#[cfg(not(target_os = "linux"))]
pub fn coarse_ms() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

#[cfg(not(target_os = "linux"))]
fn coarse_resolution_ms() -> u64 {
    1
}

/// The time to measure deadlines against: a stamp from [`coarse_ms`] may be up to one
/// resolution behind the event it marks, so subtracting the resolution from now never makes a
/// wait look longer than it was. No deadline fires early; each may fire that much late.
pub fn deadline_ms() -> u64 {
    coarse_ms().saturating_sub(coarse_resolution_ms())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{SystemTime, UNIX_EPOCH};

    #[test]
    fn the_coarse_wall_clock_shows_the_current_second() {
        let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let coarse = coarse_unix_secs();
        let after = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        // At most one kernel tick behind the precise clock: the same second, or the one before
        // when a second turned over within the tick.
        assert!(
            coarse + 1 >= before.as_secs() && coarse <= after.as_secs(),
            "coarse {coarse}, precise {before:?}..{after:?}"
        );
    }
}
