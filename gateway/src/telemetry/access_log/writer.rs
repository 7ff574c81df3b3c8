//! The access log's writer thread: every round it takes what is queued, formats it and writes it
//! with one flush; it sleeps between rounds, so a busy gateway wakes it once per
//! [`super::WAKE_AT`] records rather than once per request.

use std::fs::OpenOptions;
use std::io::{BufWriter, Write};
use std::sync::Arc;

use gateway_config::model::AccessLogFormat;

use super::format::Formatter;
use super::{Entry, FLUSH_EVERY, Queue, Sink, WAKE_AT, lock};

/// Opens where the lines go.
pub(super) fn open(sink: &Sink) -> std::io::Result<Box<dyn Write + Send>> {
    Ok(match sink {
        Sink::Stdout => Box::new(std::io::stdout()),
        Sink::Stderr => Box::new(std::io::stderr()),
        Sink::File(p) => Box::new(OpenOptions::new().create(true).append(true).open(p)?),
    })
}

/// Writes rounds until the gateway closes the log or no handle is left (a reload replaced
/// it), then writes what is left and returns.
pub(super) fn run(
    queue: &Arc<Queue>,
    sink: Sink,
    out: Box<dyn Write + Send>,
    format: AccessLogFormat,
) {
    let mut out = BufWriter::with_capacity(64 * 1024, out);
    let mut line = Vec::with_capacity(512);
    let mut formatter = Formatter::default();
    // Swapped with the queue's each round, so both keep their capacity.
    let mut batch = Vec::new();
    loop {
        // The writer's own reference is the last when every handle is gone.
        let orphaned = || Arc::strong_count(queue) == 1;
        let (reopen, last) = {
            let waiting = lock(&queue.waiting);
            let (mut waiting, _) = queue
                .wake
                .wait_timeout_while(waiting, FLUSH_EVERY, |w| {
                    w.entries.len() < WAKE_AT && !w.reopen && !w.closed && !orphaned()
                })
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            std::mem::swap(&mut waiting.entries, &mut batch);
            let last = waiting.closed || orphaned();
            (std::mem::take(&mut waiting.reopen), last)
        };
        for entry in batch.drain(..) {
            line.clear();
            let f = &mut formatter;
            match (format, entry) {
                (AccessLogFormat::Json, Entry::Http(r)) => f.http_json(&r, &mut line),
                (AccessLogFormat::Combined, Entry::Http(r)) => f.http_combined(&r, &mut line),
                (AccessLogFormat::Json, Entry::Stream(r)) => f.stream_json(&r, &mut line),
                (AccessLogFormat::Combined, Entry::Stream(r)) => f.stream_basic(&r, &mut line),
            }
            let _ = out.write_all(&line);
        }
        let _ = out.flush();
        if reopen {
            match open(&sink) {
                Ok(w) => out = BufWriter::with_capacity(64 * 1024, w),
                Err(e) => tracing::error!(error = %e, "cannot reopen the access log"),
            }
        }
        if last {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant, SystemTime};

    use gateway_config::model::{AccessLogConfig, AccessLogFormat};

    use super::super::{AccessLog, AccessRecord, RequestText};
    use crate::telemetry::Registry;

    fn record(i: usize) -> AccessRecord {
        AccessRecord {
            time: SystemTime::now(),
            client: "127.0.0.1".parse().unwrap(),
            method: http::Method::GET,
            request: RequestText::new(&format!("/{i}"), "h", b"", b""),
            protocol: "HTTP/1.1",
            status: 200,
            bytes: 0,
            duration: Duration::ZERO,
            route: "r".into(),
            upstream: None,
            trace_id: None,
            notes: None,
        }
    }

    fn start(dir: &tempfile::TempDir) -> (AccessLog, std::path::PathBuf) {
        let path = dir.path().join("access.log");
        let cfg = AccessLogConfig {
            path: path.to_string_lossy().into_owned(),
            format: AccessLogFormat::Combined,
        };
        (AccessLog::start(&cfg, &Registry::new()).unwrap(), path)
    }

    fn targets(path: &std::path::Path) -> Vec<String> {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        text.lines()
            .map(|l| l.split(' ').nth(6).unwrap_or_default().to_owned())
            .collect()
    }

    #[tokio::test]
    async fn a_quiet_log_is_written_within_a_round_and_a_closed_one_entirely_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let (log, path) = start(&dir);
        log.log(record(0));
        // No wake-up for one record: the round writes it.
        let begun = Instant::now();
        while targets(&path).is_empty() {
            assert!(begun.elapsed() < Duration::from_secs(5), "not written");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // More than wake the writer early, and fewer than are dropped.
        let n = 10_000;
        for i in 1..n {
            log.log(record(i));
        }
        log.close(Duration::from_secs(5)).await;
        let expected: Vec<String> = (0..n).map(|i| format!("/{i}")).collect();
        assert_eq!(targets(&path), expected);
    }

    #[tokio::test]
    async fn the_writer_ends_with_its_last_handle_after_writing_what_was_queued() {
        let dir = tempfile::tempdir().unwrap();
        let (log, path) = start(&dir);
        let thread = super::super::lock(&log.queue.thread).take().unwrap();
        log.log(record(7));
        drop(log);
        // Bounded, so that a writer that never ends fails the test instead of hanging it.
        let joined = tokio::task::spawn_blocking(move || thread.join().unwrap());
        tokio::time::timeout(Duration::from_secs(10), joined)
            .await
            .expect("the writer ended")
            .unwrap();
        assert_eq!(targets(&path), ["/7"]);
    }

    #[tokio::test]
    async fn a_reopen_moves_later_lines_to_a_new_file_at_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let (log, path) = start(&dir);
        log.log(record(1));
        let rotated = dir.path().join("access.log.1");
        let begun = Instant::now();
        while targets(&path).is_empty() {
            assert!(begun.elapsed() < Duration::from_secs(5), "not written");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // What logrotate does: move the file, then signal.
        std::fs::rename(&path, &rotated).unwrap();
        log.reopen();
        while !path.exists() {
            assert!(begun.elapsed() < Duration::from_secs(5), "not reopened");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        log.log(record(2));
        log.close(Duration::from_secs(5)).await;
        assert_eq!(targets(&rotated), ["/1"]);
        assert_eq!(targets(&path), ["/2"]);
    }
}
