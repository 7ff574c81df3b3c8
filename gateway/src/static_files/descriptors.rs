//! The static files' share of the process's descriptors. Two things hold a descriptor beyond a
//! request: a large cached body's memory file ([`super::SealedFile`]) and a large file's open
//! descriptor kept for the HTTP/1.1 fast path ([`super::open_files`]). Descriptors are what
//! connections need, so together they take at most a quarter of the open-files limit; past
//! that, bodies stay on the heap and large files are opened per request, as without them.

use std::io;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Descriptors the static files hold in the process.
static HELD: AtomicUsize = AtomicUsize::new(0);

/// A place in the budget for one held descriptor, given back when dropped.
pub(super) struct Slot<'a>(&'a AtomicUsize);

impl<'a> Slot<'a> {
    /// A place among `held` if fewer than `budget` are taken.
    fn take(held: &'a AtomicUsize, budget: usize) -> io::Result<Self> {
        held.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            (n < budget).then_some(n + 1)
        })
        .map(|_| Slot(held))
        .map_err(|_| io::Error::other("the static files' share of the open-files limit is used"))
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A place for one more held descriptor, if the budget has room.
pub(super) fn slot() -> io::Result<Slot<'static>> {
    Slot::take(&HELD, budget())
}

/// How many descriptors the static files may hold: a quarter of the open-files limit (read
/// once).
fn budget() -> usize {
    static BUDGET: OnceLock<usize> = OnceLock::new();
    *BUDGET.get_or_init(|| {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct it is given and nothing else.
        #[allow(unsafe_code, reason = "getrlimit")]
        let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
        if rc != 0 {
            return 0;
        }
        usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX) / 4
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_descriptors_stay_within_their_share() {
        assert!(budget() > 0, "a quarter of the open-files limit");
        let held = AtomicUsize::new(0);
        let (a, b) = (Slot::take(&held, 2), Slot::take(&held, 2));
        assert!(a.is_ok() && b.is_ok());
        assert!(Slot::take(&held, 2).is_err(), "the budget is spent");
        assert_eq!(held.load(Ordering::Relaxed), 2);
        drop(a);
        assert!(
            Slot::take(&held, 2).is_ok(),
            "room again once one is given back"
        );
        assert_eq!(held.load(Ordering::Relaxed), 1);
    }
}
