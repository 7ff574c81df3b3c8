//! The gateway's own log lines (`server.log_format`, not the access log): tracing-subscriber's
//! text or JSON lines, plus `trace_id` and `span_id` (lowercase hex, as in `traceparent`) of
//! the request span when a line is written while a traced request is being served, or of the
//! connection's span for an L4 connection or UDP session.
//!
//! Where the ids come from: the request path already runs a traced request's filters and
//! terminal inside the task-local trace scope (`trace::scope`, `trace::with_current`), which
//! plugin calls need anyway. The formatter reads that task-local when it writes a line, so the
//! cost is paid per log line, which is rare, and never per request: a request records nothing
//! for its log lines, and without `telemetry.traces` there is no scope at all. Recording the ids
//! on a per-request `tracing` span instead would cost a span per request whenever the span's
//! level is on, and nothing would be gained, since the scope exists already. A traced stream
//! connection has its span's ids made when it is accepted instead of when it ends (the same
//! work, earlier) and runs in the stream proxy's own task-local scope of them
//! (`stream_proxy::log_ids`), which the formatter reads when no request's is there.
//!
//! A line without ids is written exactly as tracing-subscriber writes it; a line with ids is
//! formatted into a buffer of its own first, so the ids can be put before its end (inside the
//! JSON object, or at the end of the text line, after the event's fields).

use std::fmt;

use gateway_config::model::LogFormat;
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{self, FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::{FmtContext, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

use super::trace::context::{SpanContext, format_traceparent};

/// The log's subscriber: `filter`'s lines in `shape`, written to `writer`, with colour codes
/// when `ansi` (text only).
pub fn subscriber<W>(
    shape: LogFormat,
    filter: EnvFilter,
    writer: W,
    ansi: bool,
) -> Box<dyn Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match shape {
        LogFormat::Text => Box::new(
            builder
                .with_ansi(ansi)
                // Set on the event format too: it formats into a buffer of its own when a line
                // has ids, and that buffer's writer knows nothing of the terminal.
                .event_format(WithSpanIds::text(format().with_ansi(ansi)))
                .finish(),
        ),
        LogFormat::Json => Box::new(
            builder
                .with_ansi(false)
                .fmt_fields(format::JsonFields::new())
                .event_format(WithSpanIds::json(
                    format().json().with_current_span(true).with_span_list(true),
                ))
                .finish(),
        ),
    }
}

fn format() -> format::Format {
    tracing_subscriber::fmt::format()
}

/// An event format that adds the current request span's ids to `F`'s lines.
#[derive(Debug, Clone)]
pub struct WithSpanIds<F> {
    inner: F,
    json: bool,
}

impl<F> WithSpanIds<F> {
    /// Around a text format: ` trace_id=… span_id=…` at the end of the line.
    pub fn text(inner: F) -> Self {
        Self { inner, json: false }
    }

    /// Around a JSON format: `"trace_id"` and `"span_id"` as top-level members.
    pub fn json(inner: F) -> Self {
        Self { inner, json: true }
    }

    /// `line` (as `F` wrote it) with `span`'s ids, written to `out`.
    fn splice(&self, line: &str, span: &SpanContext, out: &mut Writer<'_>) -> fmt::Result {
        // The `traceparent` text holds both ids in lowercase hex: no allocation, and the same
        // spelling as the header.
        let text = format_traceparent(span);
        let text = std::str::from_utf8(&text).map_err(|_| fmt::Error)?;
        let (trace_id, span_id) = (&text[3..35], &text[36..52]);
        let end = if self.json { "}\n" } else { "\n" };
        // The formats end every line so; should one ever not, the line goes out unchanged
        // rather than broken.
        let Some(body) = line.strip_suffix(end) else {
            return out.write_str(line);
        };
        out.write_str(body)?;
        if self.json {
            write!(out, r#","trace_id":"{trace_id}","span_id":"{span_id}""#)?;
        } else {
            write!(out, " trace_id={trace_id} span_id={span_id}")?;
        }
        out.write_str(end)
    }
}

impl<S, N, F> FormatEvent<S, N> for WithSpanIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let Some((trace_id, span_id)) = super::trace::current_log_ids() else {
            return self.inner.format_event(ctx, writer, event);
        };
        let span = SpanContext {
            trace_id,
            span_id,
            sampled: false,
        };
        let mut line = String::with_capacity(256);
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        self.splice(&line, &span, &mut writer)
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use gateway_config::model::{TelemetryConfig, TracesConfig};

    use super::*;
    use crate::telemetry::Registry;
    use crate::telemetry::trace::{self, Tracer, context::hex};

    /// Everything the subscriber writes.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Captured {
        type Writer = Captured;

        fn make_writer(&'w self) -> Captured {
            self.clone()
        }
    }

    impl Captured {
        fn lines(&self) -> Vec<String> {
            let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
            text.lines().map(str::to_owned).collect()
        }
    }

    /// A tracer (its exporter never gets a span here) and a request's context from it.
    fn traced() -> (Arc<Tracer>, trace::TraceCx) {
        let config = TelemetryConfig {
            traces: Some(TracesConfig {
                otlp_endpoint: "http://127.0.0.1:9".into(),
                sample_ratio: Some(1.0),
                headers: Default::default(),
            }),
            ..Default::default()
        };
        let tracer = Tracer::start(&config, &Registry::new())
            .expect("tracer")
            .expect("traces on");
        let cx = tracer.root();
        (tracer, cx)
    }

    /// Logs one line outside any request, one inside `cx`, one inside a span inside `cx`.
    fn log_lines(shape: LogFormat, cx: &trace::TraceCx) -> Vec<String> {
        let out = Captured::default();
        let sub = subscriber(shape, EnvFilter::new("info"), out.clone(), false);
        tracing::subscriber::with_default(sub, || {
            tracing::warn!(n = 1, "outside");
            trace::with_current(Some(cx), || {
                tracing::warn!(n = 2, "inside");
                let span = tracing::info_span!("conn", peer = "p");
                span.in_scope(|| tracing::warn!(n = 3, "inside a span"));
            });
        });
        out.lines()
    }

    #[tokio::test]
    async fn json_lines_in_a_request_carry_its_ids_at_the_top_level() {
        let (tracer, cx) = traced();
        let lines = log_lines(LogFormat::Json, &cx);
        assert_eq!(lines.len(), 3, "{lines:?}");
        let parsed: Vec<serde_json::Value> = lines
            .iter()
            .map(|l| serde_json::from_str(l).expect("a JSON object per line"))
            .collect();
        let (trace_id, span_id) = (hex(&cx.span.trace_id), hex(&cx.span.span_id));

        let outside = &parsed[0];
        assert_eq!(outside["fields"]["message"], "outside");
        assert!(outside.get("trace_id").is_none(), "{outside}");
        assert!(outside.get("span_id").is_none(), "{outside}");

        for (line, message) in parsed[1..].iter().zip(["inside", "inside a span"]) {
            assert_eq!(line["fields"]["message"], message, "{line}");
            assert_eq!(line["trace_id"], trace_id.as_str(), "{line}");
            assert_eq!(line["span_id"], span_id.as_str(), "{line}");
            assert_eq!(line["level"], "WARN", "{line}");
            assert!(line["timestamp"].is_string(), "{line}");
            assert!(line["target"].is_string(), "{line}");
        }
        // The enclosing `tracing` spans are still there.
        assert_eq!(parsed[2]["span"]["name"], "conn", "{}", parsed[2]);
        assert_eq!(parsed[2]["spans"][0]["peer"], "p", "{}", parsed[2]);
        tracer.shutdown(std::time::Duration::from_millis(10)).await;
    }

    #[tokio::test]
    async fn text_lines_in_a_request_end_with_its_ids() {
        let (tracer, cx) = traced();
        let lines = log_lines(LogFormat::Text, &cx);
        assert_eq!(lines.len(), 3, "{lines:?}");
        let ids = format!(
            " trace_id={} span_id={}",
            hex(&cx.span.trace_id),
            hex(&cx.span.span_id)
        );
        assert!(lines[0].ends_with("outside n=1"), "{}", lines[0]);
        assert!(!lines[0].contains("trace_id"), "{}", lines[0]);
        assert!(
            lines[1].ends_with(&format!("inside n=2{ids}")),
            "{}",
            lines[1]
        );
        assert!(lines[2].contains("conn{peer=\"p\"}:"), "{}", lines[2]);
        assert!(
            lines[2].ends_with(&format!("inside a span n=3{ids}")),
            "{}",
            lines[2]
        );
        tracer.shutdown(std::time::Duration::from_millis(10)).await;
    }

    /// A stream connection's ids are used where no request's are; a request's come first.
    #[tokio::test]
    async fn lines_of_a_stream_connection_carry_its_ids() {
        let (tracer, cx) = traced();
        let ids = stream_proxy::log_ids::LogIds {
            trace_id: [0xab; 16],
            span_id: [0xcd; 8],
        };
        let out = Captured::default();
        let sub = subscriber(LogFormat::Json, EnvFilter::new("info"), out.clone(), false);
        tracing::subscriber::with_default(sub, || {
            stream_proxy::log_ids::sync_scope(Some(ids), || {
                tracing::warn!("stream");
                trace::with_current(Some(&cx), || tracing::warn!("request"));
            });
        });
        let lines: Vec<serde_json::Value> = out
            .lines()
            .iter()
            .map(|l| serde_json::from_str(l).expect("JSON"))
            .collect();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(lines[0]["trace_id"], "ab".repeat(16));
        assert_eq!(lines[0]["span_id"], "cd".repeat(8));
        assert_eq!(lines[1]["trace_id"], hex(&cx.span.trace_id));
        assert_eq!(lines[1]["span_id"], hex(&cx.span.span_id));
        tracer.shutdown(std::time::Duration::from_millis(10)).await;
    }

    /// A line the inner format did not end as expected goes out as it is.
    #[test]
    fn an_unexpected_line_end_leaves_the_line_unchanged() {
        let span = SpanContext {
            trace_id: [1; 16],
            span_id: [2; 8],
            sampled: true,
        };
        let mut out = String::new();
        let ids = WithSpanIds::json(());
        ids.splice("{\"a\":1}", &span, &mut Writer::new(&mut out))
            .unwrap();
        assert_eq!(out, "{\"a\":1}");
        out.clear();
        ids.splice("{\"a\":1}\n", &span, &mut Writer::new(&mut out))
            .unwrap();
        assert_eq!(
            out,
            "{\"a\":1,\"trace_id\":\"01010101010101010101010101010101\",\"span_id\":\"0202020202020202\"}\n"
        );
    }
}
