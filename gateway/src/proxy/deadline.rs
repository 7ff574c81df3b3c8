//! An upstream attempt's deadline (the upstream's `timeout`), with its timer taken from a stock
//! kept on the gateway's worker threads.
//!
//! Why: a new `Sleep` for every proxied request costs an allocation, its registration in the
//! runtime's timer wheel under the wheel's lock when first polled, and its removal under the
//! lock when dropped, a noticeable share of a proxied request on the HTTP/1.1 fast path. A
//! timer given back when its exchange completes is reset for the next attempt on the same
//! thread: a deadline later than the one it is registered for only moves its expiry (one
//! atomic update; the wheel finds the later time when it reaches the old slot), and it is never
//! freed. That spares each request the allocation and two acquisitions of the wheel's lock,
//! less the cost of letting go of the last task's waker (below); the figures are in
//! docs/performance-log.md, "The upstream timer kept for the next attempt".
//!
//! A `Sleep` belongs to the runtime that made it and is driven by that runtime's timer, so the
//! stock is kept only where a thread has asked for it ([`keep_stock_on_this_thread`]): the
//! threads of the runtime `gateway run` builds, which lives as long as the process. A thread
//! that never asked (tests' runtimes, a short-lived runtime) makes a new timer every time, so
//! no timer of one runtime is ever reset on another.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Waker};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// An attempt's timer; `None` when the upstream has no timeout.
pub(crate) type Deadline = Option<Pin<Box<Sleep>>>;

/// Timers kept at most per thread: more than an instant's attempts in flight on one worker
/// rarely finish at once, and each kept timer is a couple of hundred bytes.
const STOCK_LIMIT: usize = 256;

thread_local! {
    /// `None` on a thread that did not ask for a stock.
    static STOCK: RefCell<Option<Vec<Pin<Box<Sleep>>>>> = const { RefCell::new(None) };
}

/// Keeps a stock of timers on this thread from now on. Call it only on a thread whose
/// runtime outlives every proxied request on it (the runtime's own worker threads).
pub fn keep_stock_on_this_thread() {
    STOCK.with(|stock| {
        stock.borrow_mut().get_or_insert_with(Vec::new);
    });
}

/// Drops this thread's stock and keeps none from now on (before its runtime goes).
pub fn drop_stock_on_this_thread() {
    let timers = STOCK.with(|stock| stock.borrow_mut().take());
    drop(timers);
}

/// The deadline of an attempt starting now, `timeout` from now.
pub(crate) fn start(timeout: Option<Duration>) -> Deadline {
    let timeout = timeout?;
    let at = Instant::now() + timeout;
    let kept = STOCK.with(|stock| stock.borrow_mut().as_mut().and_then(Vec::pop));
    Some(match kept {
        Some(mut timer) => {
            timer.as_mut().reset(at);
            timer
        }
        None => Box::pin(tokio::time::sleep_until(at)),
    })
}

/// Gives an attempt's timer back once its exchange is over, for the next attempt on this
/// thread (dropped where no stock is kept, or the stock is full).
pub(crate) fn give_back(deadline: Deadline) {
    let Some(mut timer) = deadline else {
        return;
    };
    let refused = STOCK.with(|stock| match stock.borrow_mut().as_mut() {
        Some(timers) if timers.len() < STOCK_LIMIT => {
            forget_waker(timer.as_mut());
            timers.push(timer);
            None
        }
        _ => Some(timer),
    });
    drop(refused);
}

/// Swaps the waker a timer holds for one that wakes nothing. The waker of the task that last
/// polled it holds that task's memory; a kept timer whose deadline is far off would otherwise
/// keep the task of a connection that has since closed until it fired (`timeout`, 30 s by
/// default). Polled without the task's budget, so the poll always registers.
fn forget_waker(timer: Pin<&mut Sleep>) {
    let mut unconstrained = tokio::task::unconstrained(timer);
    let mut cx = Context::from_waker(Waker::noop());
    let _ = Pin::new(&mut unconstrained).poll(&mut cx);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(deadline: &Deadline) -> *const Sleep {
        let timer = deadline.as_ref().expect("a timer");
        &**timer as *const Sleep
    }

    #[tokio::test]
    async fn a_timer_given_back_is_reset_for_the_next_attempt_and_fires_at_its_deadline() {
        keep_stock_on_this_thread();
        let first = start(Some(Duration::from_secs(60)));
        let kept = address(&first);
        give_back(first);

        // The next attempt gets the same timer, due at its own deadline, not the first one's
        // (the bounds are wide: only a timer still due at the first deadline misses them).
        let second = start(Some(Duration::from_millis(50)));
        assert_eq!(address(&second), kept);
        let began = Instant::now();
        let mut second = second.expect("a timer");
        second.as_mut().await;
        let waited = began.elapsed();
        assert!(
            waited >= Duration::from_millis(50) && waited < Duration::from_secs(30),
            "{waited:?}"
        );

        // A timer that fired is reset too: it waits again, for its new time.
        give_back(Some(second));
        let third = start(Some(Duration::from_millis(80)));
        assert_eq!(address(&third), kept);
        let began = Instant::now();
        third.expect("a timer").await;
        let waited = began.elapsed();
        assert!(
            waited >= Duration::from_millis(80) && waited < Duration::from_secs(30),
            "{waited:?}"
        );
        drop_stock_on_this_thread();
    }

    #[tokio::test]
    async fn without_a_stock_nothing_is_kept() {
        drop_stock_on_this_thread();
        let first = start(Some(Duration::from_secs(1)));
        let second = start(Some(Duration::from_secs(1)));
        assert_ne!(address(&first), address(&second));
        give_back(first);
        assert!(STOCK.with(|stock| stock.borrow().is_none()));
        assert!(start(None).is_none());
    }

    /// A waker that counts nothing but the references to it.
    struct Counted;

    impl std::task::Wake for Counted {
        fn wake(self: std::sync::Arc<Self>) {}
    }

    #[tokio::test]
    async fn a_timer_given_back_lets_go_of_the_task_that_waited_on_it() {
        keep_stock_on_this_thread();
        let task = std::sync::Arc::new(Counted);
        let waker = Waker::from(task.clone());
        let mut deadline = start(Some(Duration::from_secs(60)));
        let timer = deadline.as_mut().expect("a timer").as_mut();
        assert!(timer.poll(&mut Context::from_waker(&waker)).is_pending());
        drop(waker);
        assert_eq!(
            std::sync::Arc::strong_count(&task),
            2,
            "the timer holds the waker"
        );
        give_back(deadline);
        assert_eq!(
            std::sync::Arc::strong_count(&task),
            1,
            "the kept timer let it go"
        );
        drop_stock_on_this_thread();
    }

    #[tokio::test]
    async fn the_stock_keeps_at_most_its_limit() {
        keep_stock_on_this_thread();
        let timers: Vec<_> = (0..STOCK_LIMIT + 10)
            .map(|_| start(Some(Duration::from_secs(1))))
            .collect();
        for timer in timers {
            give_back(timer);
        }
        let kept = STOCK.with(|stock| stock.borrow().as_ref().map_or(0, Vec::len));
        assert_eq!(kept, STOCK_LIMIT);
        drop_stock_on_this_thread();
    }
}
