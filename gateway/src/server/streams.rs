//! How an HTTP/2 connection runs its streams: the streams a poll of the connection accepts are
//! started right after that poll, inside the connection's own task, and the connection is
//! polled once more to send what they answered. A stream becomes a task of its own only if it
//! has to wait. Every poll but the task's last lets the connection's flushes wait, so that what
//! the streams answered leaves in one write (`super::coalesce`).
//!
//! Why: spawned at once (hyper's usual executor), every stream waited its turn in the run
//! queue behind every other ready task, and its response waited again for the connection's
//! task to encode and send it. With thousands of streams in flight, each of those steps found
//! the stream's memory (its future, its response head) evicted from the cache. Most responses
//! (a cached file, a `respond` route, a refusal) are ready on the first poll; made right after
//! their requests were read, they are encoded while still in the cache, as an event-loop server
//! does. They are started after the poll that accepted them rather than one by one as hyper
//! accepts them, so that the answers to one read of requests still leave in one burst of
//! writes, as they did from spawned tasks.

use std::cell::Cell;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use super::coalesce::{self, Deferring};

/// A stream's future, as hyper hands it over.
type StreamFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

thread_local! {
    /// Whether a [`StreamBatch`] is polling its connection on this thread.
    static COLLECTING: Cell<bool> = const { Cell::new(false) };
    /// The streams accepted during that poll. Kept per thread rather than per connection, so
    /// that its allocation is reused and no connection's task grows by a `Vec`.
    static ACCEPTED: Cell<Vec<StreamFuture>> = const { Cell::new(Vec::new()) };
}

/// The executor hyper hands each HTTP/2 stream to. Inside a poll of a [`StreamBatch`] it keeps
/// the stream for the batch to start; anywhere else it spawns it, as hyper's own executor does.
#[derive(Clone, Copy, Debug, Default)]
pub struct BatchedStreams;

impl<F> hyper::rt::Executor<F> for BatchedStreams
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, fut: F) {
        let fut: StreamFuture = Box::pin(fut);
        if COLLECTING.get() {
            let mut accepted = ACCEPTED.take();
            accepted.push(fut);
            ACCEPTED.set(accepted);
        } else {
            tokio::spawn(fut);
        }
    }
}

/// Most rounds of "poll the connection, start what it accepted" in one poll of the task, so
/// that a client that keeps sending cannot hold the thread.
const MAX_ROUNDS: usize = 4;

/// An HTTP/2 (or not yet known) hyper connection whose streams [`BatchedStreams`] hands back.
pub struct StreamBatch<C> {
    pub conn: Pin<Box<C>>,
}

impl<C> StreamBatch<C> {
    pub fn new(conn: Pin<Box<C>>) -> Self {
        Self { conn }
    }
}

/// Ends the collecting on drop, so that a connection whose poll panics does not leave the
/// thread's later streams collected by nobody.
struct Collecting;

impl Collecting {
    fn start() -> Self {
        COLLECTING.set(true);
        Collecting
    }
}

impl Drop for Collecting {
    fn drop(&mut self) {
        COLLECTING.set(false);
    }
}

impl<C: Future> Future for StreamBatch<C> {
    type Output = C::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        // Whether the next poll of the connection may leave its flush owed (see
        // `super::coalesce`): never on the last round, nor right after a round that owed one.
        let mut defer = true;
        for round in 0..MAX_ROUNDS {
            let deferring = defer && round + 1 < MAX_ROUNDS;
            let res = {
                let _collecting = Collecting::start();
                let _deferring = deferring.then(Deferring::start);
                self.conn.as_mut().poll(cx)
            };
            let flush_owed = deferring && coalesce::owed();
            let mut accepted = ACCEPTED.take();
            if accepted.is_empty() {
                ACCEPTED.set(accepted);
                if flush_owed && res.is_pending() {
                    // Polled once more, only to send what this poll gathered.
                    defer = false;
                    continue;
                }
                return res;
            }
            // Started outside the collecting: a stream hands nothing to the executor, but if
            // one did, it would be spawned rather than lost.
            for stream in accepted.drain(..) {
                start(stream);
            }
            ACCEPTED.set(accepted);
            if res.is_ready() {
                return res;
            }
            defer = true;
        }
        // Streams were started in the last round: their answers go out on the next poll.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// Polls a stream once and spawns it if it is not finished.
fn start(mut stream: StreamFuture) {
    // The no-op waker: whatever the first poll waits on registers a waker nobody needs, since
    // the task spawned next polls the stream again with its own waker and sees any event that
    // came in between. A panic stays the stream's, as it would in a task of its own, instead
    // of ending the connection's task.
    let first = catch_unwind(AssertUnwindSafe(|| {
        stream
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending()
    }));
    if matches!(first, Ok(true)) {
        tokio::spawn(stream);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    use hyper::rt::Executor;

    use super::*;

    /// A stand-in for hyper's connection: each poll calls `on_poll` with the poll's number.
    struct Conn<F> {
        polls: usize,
        on_poll: F,
    }

    impl<F: FnMut(usize) -> Poll<()> + Unpin> Future for Conn<F> {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            self.polls += 1;
            let n = self.polls;
            (self.on_poll)(n)
        }
    }

    fn batch<F: FnMut(usize) -> Poll<()> + Unpin>(on_poll: F) -> StreamBatch<Conn<F>> {
        StreamBatch::new(Box::pin(Conn { polls: 0, on_poll }))
    }

    /// A stream that counts itself finished.
    fn counted(done: &Arc<AtomicUsize>) -> impl Future<Output = ()> + Send + 'static {
        let done = done.clone();
        async move {
            done.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[derive(Default)]
    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn poll_once<C: Future<Output = ()>>(b: &mut StreamBatch<C>, waker: &Arc<CountingWaker>) {
        let waker = Waker::from(waker.clone());
        let _ = Pin::new(b).poll(&mut Context::from_waker(&waker));
    }

    #[tokio::test]
    async fn streams_start_after_the_poll_that_accepted_them_and_their_answers_go_out_on_another() {
        let done = Arc::new(AtomicUsize::new(0));
        let seen = done.clone();
        let mut b = batch(move |n| {
            if n == 1 {
                for _ in 0..3 {
                    BatchedStreams.execute(counted(&seen));
                }
                // Kept for after this poll: none has run yet.
                assert_eq!(seen.load(Ordering::SeqCst), 0);
            }
            Poll::Pending
        });
        let waker = Arc::new(CountingWaker::default());
        poll_once(&mut b, &waker);
        assert_eq!(
            done.load(Ordering::SeqCst),
            3,
            "finished on their first poll"
        );
        assert_eq!(b.conn.polls, 2, "polled again to send the answers");
        assert_eq!(waker.0.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn answers_started_together_leave_in_one_write_on_one_more_poll() {
        use std::sync::Mutex;

        use crate::server::coalesce::WriteGather;
        use crate::server::coalesce::test_writer::Recorder;

        let answers = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
        let written = Arc::new(Mutex::new(Recorder::default()));
        let (queued, socket) = (answers.clone(), written.clone());
        let mut gather = WriteGather::default();
        let mut b = batch(move |n| {
            if n == 1 {
                for i in 0..3 {
                    let queued = queued.clone();
                    BatchedStreams.execute(async move {
                        queued
                            .lock()
                            .unwrap()
                            .push(format!("answer {i};").into_bytes());
                    });
                }
            }
            // As h2 does: each answer a write and a flush of its own, and a flush to end.
            let mut socket = socket.lock().unwrap();
            let mut cx = Context::from_waker(Waker::noop());
            for answer in queued.lock().unwrap().drain(..) {
                assert!(
                    gather
                        .poll_write(true, Pin::new(&mut *socket), &mut cx, &answer)
                        .is_ready()
                );
                assert!(
                    gather
                        .poll_flush(Pin::new(&mut *socket), &mut cx)
                        .is_ready()
                );
            }
            assert!(
                gather
                    .poll_flush(Pin::new(&mut *socket), &mut cx)
                    .is_ready()
            );
            Poll::Pending
        });
        poll_once(&mut b, &Arc::default());
        assert_eq!(
            written.lock().unwrap().writes,
            vec![b"answer 0;answer 1;answer 2;".to_vec()]
        );
        assert_eq!(b.conn.polls, 3, "accept, answer (gathered), send");
    }

    #[tokio::test]
    async fn a_stream_that_waits_becomes_a_task_and_misses_no_wake_up() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let mut stream = Some(Box::pin(async move {
            rx.await.unwrap();
            done_tx.send(()).unwrap();
        }));
        let mut b = batch(move |_| {
            if let Some(s) = stream.take() {
                BatchedStreams.execute(s);
            }
            Poll::Pending
        });
        poll_once(&mut b, &Arc::default());
        // The first poll registered only the no-op waker; the task's own poll must see this.
        tx.send(()).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), done_rx)
            .await
            .expect("the waiting stream finished")
            .unwrap();
    }

    #[tokio::test]
    async fn outside_a_batch_a_stream_is_spawned() {
        let done = Arc::new(AtomicUsize::new(0));
        BatchedStreams.execute(counted(&done));
        assert_eq!(done.load(Ordering::SeqCst), 0);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(done.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_connection_that_keeps_accepting_gives_way_after_a_few_rounds() {
        let done = Arc::new(AtomicUsize::new(0));
        let seen = done.clone();
        let mut b = batch(move |_| {
            BatchedStreams.execute(counted(&seen));
            Poll::Pending
        });
        let waker = Arc::new(CountingWaker::default());
        poll_once(&mut b, &waker);
        assert_eq!(b.conn.polls, MAX_ROUNDS);
        assert_eq!(done.load(Ordering::SeqCst), MAX_ROUNDS);
        // Woken to send the last round's answers.
        assert_eq!(waker.0.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_stream_that_panics_ends_alone() {
        let done = Arc::new(AtomicUsize::new(0));
        let seen = done.clone();
        let mut b = batch(move |n| {
            if n == 1 {
                BatchedStreams.execute(async { panic!("a stream's own panic") });
                BatchedStreams.execute(counted(&seen));
            }
            Poll::Ready(())
        });
        poll_once(&mut b, &Arc::default());
        assert_eq!(done.load(Ordering::SeqCst), 1);
        assert_eq!(b.conn.polls, 1, "a finished connection is not polled again");
    }
}
