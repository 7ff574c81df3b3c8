//! The batch exporter: one background task per tracer. Requests `try_send` finished spans into
//! a bounded queue and never wait; the task sends them in batches of up to [`MAX_BATCH`] spans,
//! or whatever has gathered after [`FLUSH_INTERVAL`]. While an export is in flight the queue
//! absorbs new spans; once it is full, new spans are dropped and counted. A failed or timed-out
//! export drops its batch (counted too): a collector that is down or slow costs spans, never
//! latency or unbounded memory.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::proto::{self, Resource};
use super::span::SpanData;
use super::transport::Transport;
use crate::telemetry::metrics::Counter;

/// Spans per export request.
pub(crate) const MAX_BATCH: usize = 512;
/// Longest a span waits for its batch.
pub(crate) const FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// Spans waiting for the exporter; beyond this they are dropped.
pub(crate) const QUEUE: usize = 4 * MAX_BATCH;
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

/// The task's state.
pub(crate) struct Exporter {
    rx: mpsc::Receiver<SpanData>,
    transport: Transport,
    resource: Resource,
    counters: Counters,
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
        endpoint: String,
    ) -> Self {
        Self {
            rx,
            transport,
            resource,
            counters,
            endpoint,
            failing: false,
        }
    }

    /// Exports until every sender is gone (a reload replaced the tracer and the last request
    /// using it ended) or `stop` fires (shutdown); then sends what is queued, and returns.
    pub(crate) async fn run(mut self, stop: CancellationToken) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        let mut tick = tokio::time::interval(FLUSH_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Never zero: a full batch is flushed before the next turn.
            let room = MAX_BATCH - batch.len();
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                n = self.rx.recv_many(&mut batch, room) => {
                    if n == 0 {
                        break;
                    }
                    if batch.len() >= MAX_BATCH {
                        self.flush(&mut batch).await;
                    }
                }
                _ = tick.tick() => {
                    if !batch.is_empty() {
                        self.flush(&mut batch).await;
                    }
                }
            }
        }
        self.rx.close();
        while let Some(span) = self.rx.recv().await {
            batch.push(span);
            if batch.len() >= MAX_BATCH {
                self.flush(&mut batch).await;
            }
        }
        if !batch.is_empty() {
            self.flush(&mut batch).await;
        }
    }

    async fn flush(&mut self, batch: &mut Vec<SpanData>) {
        let n = batch.len() as u64;
        let message = proto::request(&self.resource, batch);
        batch.clear();
        let sent = tokio::time::timeout(EXPORT_TIMEOUT, self.transport.export(&message)).await;
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
