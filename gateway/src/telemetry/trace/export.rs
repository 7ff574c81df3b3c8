//! The batch exporter: one background task per tracer. Requests `try_send` finished spans into
//! a bounded queue and never wait; the task sends them in batches of up to [`MAX_BATCH`] spans,
//! woken when a batch is full or after [`FLUSH_INTERVAL`] (never per span). While an export is in flight the queue
//! absorbs new spans; once it is full, new spans are dropped and counted. A failed or timed-out
//! export drops its batch (counted too): a collector that is down or slow costs spans, never
//! latency or unbounded memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use opentelemetry_proto::tonic::resource::v1::Resource;
use tokio::sync::Notify;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TryRecvError;
use tokio_util::sync::CancellationToken;

use super::convert::Batch;
use super::span::SpanData;
use crate::telemetry::metrics::Counter;
use crate::telemetry::otlp::Transport;

/// Spans per export request.
pub(crate) const MAX_BATCH: usize = 512;
/// Longest a span waits for its batch.
pub(crate) const FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// Spans waiting for the exporter; beyond this they are dropped.
pub(crate) const QUEUE: usize = 8 * MAX_BATCH;
/// One export, connection included (OTLP exporters default to 10 s).
pub(crate) const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The exporter's counters.
#[derive(Clone)]
pub(crate) struct Counters {
    /// Spans the collector accepted.
    pub(crate) exported: Counter,
    /// Spans lost (queue full, export failed, shutdown).
    pub(crate) dropped: Counter,
    /// Export requests that failed.
    pub(crate) failures: Counter,
}

/// What the tracer and its exporter share besides the queue: the exporter is woken once a
/// batch is full (or by its timer), never per span, so queueing a span stays a lock-free push
/// with no task wake-up.
#[derive(Default)]
pub(crate) struct Signal {
    /// Spans queued and not yet taken by the exporter.
    pending: AtomicUsize,
    /// Notified when `pending` reaches a batch.
    full: Notify,
}

impl Signal {
    /// Counts one queued span; wakes the exporter when a batch is ready.
    pub(crate) fn queued(&self) {
        if self.pending.fetch_add(1, Ordering::Relaxed) + 1 == MAX_BATCH {
            self.full.notify_one();
        }
    }

    /// Takes back a span that could not be queued.
    pub(crate) fn unqueued(&self) {
        self.pending.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The task's state.
pub(crate) struct Exporter {
    rx: mpsc::Receiver<SpanData>,
    transport: Transport,
    /// The export request, rewritten for each batch.
    message: Batch,
    counters: Counters,
    signal: Arc<Signal>,
    endpoint: String,
    /// Whether the last export failed (so a dead collector is logged once, not per batch).
    failing: bool,
}

impl Exporter {
    /// The exporter for one tracer.
    pub(crate) fn new(
        rx: mpsc::Receiver<SpanData>,
        transport: Transport,
        resource: Resource,
        counters: Counters,
        signal: Arc<Signal>,
        endpoint: String,
    ) -> Self {
        Self {
            rx,
            transport,
            message: Batch::new(resource),
            counters,
            signal,
            endpoint,
            failing: false,
        }
    }

    /// Exports until every sender is gone (a reload replaced the tracer and the last request
    /// using it ended) or `stop` fires (shutdown); then sends what is queued, and returns.
    pub(crate) async fn run(mut self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(FLUSH_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let stopping = tokio::select! {
                biased;
                () = stop.cancelled() => true,
                () = self.signal.full.notified() => false,
                _ = tick.tick() => false,
            };
            // Keep going while whole batches are waiting (a busy gateway fills one before the
            // previous export returns).
            loop {
                if !self.drain().await {
                    return;
                }
                if stopping || self.signal.pending.load(Ordering::Relaxed) < MAX_BATCH {
                    break;
                }
            }
            if stopping {
                return;
            }
        }
    }

    /// Exports up to a queue's worth of spans in batches; `false` once every sender is gone
    /// and nothing is left.
    async fn drain(&mut self) -> bool {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        let mut open = true;
        for _ in 0..QUEUE {
            match self.rx.try_recv() {
                Ok(span) => batch.push(span),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
            if batch.len() == MAX_BATCH {
                self.flush(&mut batch).await;
            }
        }
        if !batch.is_empty() {
            self.flush(&mut batch).await;
        }
        open
    }

    async fn flush(&mut self, batch: &mut Vec<SpanData>) {
        let n = batch.len() as u64;
        self.signal
            .pending
            .fetch_sub(batch.len(), Ordering::Relaxed);
        let message = self.message.fill(batch);
        batch.clear();
        let sent = tokio::time::timeout(EXPORT_TIMEOUT, self.transport.export(message)).await;
        let error = match sent {
            Ok(Ok(())) => {
                self.counters.exported.add(n);
                if self.failing {
                    self.failing = false;
                    tracing::info!(endpoint = %self.endpoint, "trace export recovered");
                }
                return;
            }
            Ok(Err(e)) => e,
            Err(_) => {
                self.transport.reset();
                format!("timed out after {EXPORT_TIMEOUT:?}")
            }
        };
        self.counters.dropped.add(n);
        self.counters.failures.inc();
        if self.failing {
            tracing::debug!(endpoint = %self.endpoint, %error, spans = n, "trace export failed");
        } else {
            self.failing = true;
            tracing::warn!(endpoint = %self.endpoint, %error, spans = n, "trace export failed; spans are dropped until the collector answers");
        }
    }
}
