//! The watchdog on a real clock: idle deadlines never early and not much late, activity
//! postponing them, the drain stop, a parked sweeper waking for a new connection, and the
//! sweeper ending once nobody holds the table; a user's own deadlines, their signal handed over
//! once and asked again.

use std::future::{Future, pending};
use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::{Deadlines, Idle, Signal, Watchdog};

#[tokio::test]
async fn an_idle_connection_ends_after_its_timeout_never_before() {
    let dog = Watchdog::<Idle>::start(CancellationToken::new());
    let watch = dog.register(Idle::unarmed());
    watch.arm_idle(Duration::from_millis(120));
    let started = Instant::now();
    let quiet = pin!(pending::<()>());
    assert_eq!(watch.until(quiet).await, Err(Signal::Expired(0)));
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(120), "ended early: {took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
}

#[tokio::test]
async fn activity_postpones_the_idle_deadline() {
    let dog = Watchdog::<Idle>::start(CancellationToken::new());
    let watch = dog.register(Idle::unarmed());
    watch.arm_idle(Duration::from_millis(150));
    let stamp = watch.stamp();
    let started = Instant::now();
    let busy = pin!(async {
        for _ in 0..10 {
            stamp.touch();
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    });
    // 400 ms of traffic with a 150 ms idle timeout: the work finishes first.
    assert_eq!(watch.until(busy).await, Ok(()));
    assert!(started.elapsed() >= Duration::from_millis(400));
    // Then silence ends it.
    let quiet = pin!(pending::<()>());
    assert_eq!(watch.until(quiet).await, Err(Signal::Expired(0)));
}

#[tokio::test]
async fn no_idle_deadline_until_armed_or_when_zero() {
    let dog = Watchdog::<Idle>::start(CancellationToken::new());
    let unarmed = dog.register(Idle::unarmed());
    let zero = dog.register(Idle::unarmed());
    zero.arm_idle(Duration::ZERO);
    // A short deadline elsewhere in the table makes the sweeper tick every 10 ms meanwhile.
    let short = dog.register(Idle::unarmed());
    short.arm_idle(Duration::from_millis(20));
    let a = pin!(tokio::time::sleep(Duration::from_millis(300)));
    assert_eq!(unarmed.until(a).await, Ok(()));
    let b = pin!(tokio::time::sleep(Duration::from_millis(300)));
    assert_eq!(zero.until(b).await, Ok(()));
    assert_eq!(
        short.until(pin!(pending::<()>())).await,
        Err(Signal::Expired(0))
    );
}

#[tokio::test]
async fn the_drain_stop_ends_every_connection_and_the_next_ones() {
    let hard = CancellationToken::new();
    let dog = Watchdog::<Idle>::start(hard.clone());
    let (a, b) = (dog.register(Idle::unarmed()), dog.register(Idle::unarmed()));
    a.arm_idle(Duration::from_secs(3600));
    let stop = hard.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        stop.cancel();
    });
    let started = Instant::now();
    let (qa, qb) = (pin!(pending::<()>()), pin!(pending::<()>()));
    let (ra, rb) = tokio::join!(a.until(qa), b.until(qb));
    assert_eq!((ra, rb), (Err(Signal::Stop), Err(Signal::Stop)));
    assert!(started.elapsed() < Duration::from_secs(2));
    // Give the sweeper its turn, then: a connection registered after the stop starts stopped.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let late = dog.register(Idle::unarmed());
    assert_eq!(late.until(pin!(pending::<()>())).await, Err(Signal::Stop));
}

#[tokio::test]
async fn a_parked_sweeper_wakes_for_the_next_connection() {
    let dog = Watchdog::<Idle>::start(CancellationToken::new());
    // A short deadline sets a 10 ms tick; once the table is empty for eight sweeps, it parks.
    let first = dog.register(Idle::unarmed());
    first.arm_idle(Duration::from_millis(30));
    assert_eq!(
        first.until(pin!(pending::<()>())).await,
        Err(Signal::Expired(0))
    );
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(3);
    while !dog.shared.lock().parked {
        assert!(Instant::now() < deadline, "the sweeper never parked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let next = dog.register(Idle::unarmed());
    assert!(!dog.shared.lock().parked);
    next.arm_idle(Duration::from_millis(30));
    let started = Instant::now();
    assert_eq!(
        next.until(pin!(pending::<()>())).await,
        Err(Signal::Expired(0))
    );
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn the_sweeper_ends_once_nobody_holds_the_table() {
    let dog = Watchdog::<Idle>::start(CancellationToken::new());
    let watch = dog.register(Idle::unarmed());
    let table = Arc::downgrade(&dog.shared);
    drop(dog);
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A connection still open keeps it.
    assert!(table.upgrade().is_some());
    drop(watch);
    let deadline = Instant::now() + Duration::from_secs(5);
    while table.upgrade().is_some() {
        assert!(
            Instant::now() < deadline,
            "the sweeper still holds the table"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Deadlines of a test's own: expired with `code` once `armed`.
struct Flag {
    armed: std::sync::atomic::AtomicBool,
    code: u8,
}

impl Deadlines for Flag {
    fn expired(&self, _now: u64) -> Option<u8> {
        self.armed
            .load(std::sync::atomic::Ordering::Relaxed)
            .then_some(self.code)
    }

    fn shortest_ms(&self) -> u64 {
        80
    }
}

#[tokio::test]
async fn a_signal_is_handed_over_once_and_the_deadlines_are_asked_again() {
    let dog = Watchdog::start(CancellationToken::new());
    let watch = dog.register(Flag {
        armed: false.into(),
        code: 7,
    });
    // Not expired: the work finishes.
    let work = pin!(tokio::time::sleep(Duration::from_millis(100)));
    assert_eq!(watch.until(work).await, Ok(()));
    watch
        .deadlines()
        .armed
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let mut quiet = pin!(pending::<()>());
    assert_eq!(watch.until(quiet.as_mut()).await, Err(Signal::Expired(7)));
    // Taken: a connection that goes on (closing gracefully) is not told again on its next
    // poll (the test's runtime has one thread, so the sweeper cannot run in between), but on
    // a later tick.
    let mut again = pin!(watch.until(quiet.as_mut()));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(again.as_mut().poll(&mut cx).is_pending());
    assert_eq!(again.await, Err(Signal::Expired(7)));
    // Disarmed, the same work runs on undisturbed.
    watch
        .deadlines()
        .armed
        .store(false, std::sync::atomic::Ordering::Relaxed);
    let work = pin!(tokio::time::sleep(Duration::from_millis(100)));
    assert_eq!(watch.until(work).await, Ok(()));
}
