//! The ids a connection's log lines carry. The proxy knows no tracing: a filter (the gateway's
//! observer, when traces are on) names the ids of the connection's span after `on_connect`
//! ([`crate::StreamFilter::log_ids`]), the connection's work runs in a task-local scope holding
//! them, and the gateway's log format reads them back ([`current`]) when it writes a line. The
//! lookup is the writer's, per line; the connection pays only the scope, and only when a filter
//! named ids.

use std::future::Future;

use tokio_util::either::Either;

/// The trace and span a connection's log lines name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogIds {
    /// The trace.
    pub trace_id: [u8; 16],
    /// The span.
    pub span_id: [u8; 8],
}

tokio::task_local! {
    static CURRENT: LogIds;
}

/// The ids of the connection or session the current task is serving, if a filter named any.
pub fn current() -> Option<LogIds> {
    CURRENT.try_with(|ids| *ids).ok()
}

/// `fut` in the scope of `ids`, when there are any; otherwise `fut` itself (public for the
/// tests of whoever reads [`current`]).
pub fn scope<F: Future>(ids: Option<LogIds>, fut: F) -> impl Future<Output = F::Output> {
    match ids {
        Some(ids) => Either::Left(CURRENT.scope(ids, fut)),
        None => Either::Right(fut),
    }
}

/// `f` in the scope of `ids`, when there are any.
pub fn sync_scope<R>(ids: Option<LogIds>, f: impl FnOnce() -> R) -> R {
    match ids {
        Some(ids) => CURRENT.sync_scope(ids, f),
        None => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDS: LogIds = LogIds {
        trace_id: [7; 16],
        span_id: [9; 8],
    };

    #[tokio::test]
    async fn the_ids_are_there_inside_the_scope_only() {
        assert_eq!(current(), None);
        let inside = scope(Some(IDS), async {
            tokio::task::yield_now().await;
            current()
        })
        .await;
        assert_eq!(inside, Some(IDS));
        assert_eq!(scope(None, async { current() }).await, None);
        assert_eq!(sync_scope(Some(IDS), current), Some(IDS));
        assert_eq!(current(), None);
    }
}
