//! The access log's line formats, written by hand into one reused buffer: the writer thread
//! formats every record, so its cost is paid once per request on a core the gateway shares.
//! `format!` and `Display` (a timestamp in pieces, an IPv4 address, an `f64`, JSON strings a
//! character at a time) cost several times the request they describe; here a timestamp's text
//! is made once a second, numbers and addresses are written digit by digit, and strings are
//! copied whole between the bytes that need an escape.

use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{AccessRecord, LogNotes, StreamRecord};
use crate::ip_text::{ip_text, push_decimal, push_padded};

/// Formats records into lines; keeps the text of the last second it saw.
#[derive(Default)]
pub(super) struct Formatter {
    /// The second `rfc3339` and `clf` are for.
    second: Option<u64>,
    /// `YYYY-MM-DDTHH:MM:SS.` (the milliseconds and `Z` follow).
    rfc3339: Vec<u8>,
    /// `DD/Mon/YYYY:HH:MM:SS +0000`.
    clf: Vec<u8>,
}

impl Formatter {
    /// The JSON line of a request.
    pub(super) fn http_json(&mut self, r: &AccessRecord, out: &mut Vec<u8>) {
        push(out, "{\"time\":\"");
        self.push_rfc3339(r.time, out);
        push(out, "\",\"client\":\"");
        push_ip(out, r.client);
        push(out, "\",\"method\":");
        push_json_str(out, r.method.as_str());
        push(out, ",\"target\":");
        push_json_str(out, r.request.target());
        push(out, ",\"protocol\":");
        push_json_str(out, r.protocol);
        push(out, ",\"status\":");
        push_decimal(out, u64::from(r.status));
        push(out, ",\"bytes\":");
        push_decimal(out, r.bytes);
        push(out, ",\"duration_ms\":");
        push_ms(out, r.duration);
        push(out, ",\"route\":");
        push_json_str(out, &r.route);
        if let Some(u) = &r.upstream {
            push(out, ",\"upstream\":");
            push_json_str(out, u);
        }
        push(out, ",\"host\":");
        push_json_str(out, r.request.host());
        push(out, ",\"user_agent\":");
        push_json_str(out, r.request.user_agent());
        push(out, ",\"referer\":");
        push_json_str(out, r.request.referer());
        if let Some(t) = &r.trace_id {
            push(out, ",\"trace_id\":");
            push_json_str(out, t);
        }
        if let Some(n) = &r.notes {
            push_notes(out, n);
        }
        push(out, "}\n");
    }

    /// The combined-format line of a request (Apache's and nginx's `combined`).
    pub(super) fn http_combined(&mut self, r: &AccessRecord, out: &mut Vec<u8>) {
        push_ip(out, r.client);
        push(out, " - ");
        match r.user() {
            Some(u) => push_clf_str_or_dash(out, u),
            None => push(out, "-"),
        }
        push(out, " [");
        self.push_clf(r.time, out);
        push(out, "] \"");
        push(out, r.method.as_str());
        out.push(b' ');
        push_clf_str(out, r.request.target());
        out.push(b' ');
        push(out, r.protocol);
        push(out, "\" ");
        push_decimal(out, u64::from(r.status));
        out.push(b' ');
        push_decimal(out, r.bytes);
        push(out, " \"");
        push_clf_str_or_dash(out, r.request.referer());
        push(out, "\" \"");
        push_clf_str_or_dash(out, r.request.user_agent());
        push(out, "\"\n");
    }

    /// The JSON line of an L4 connection or UDP session.
    pub(super) fn stream_json(&mut self, r: &StreamRecord, out: &mut Vec<u8>) {
        push(out, "{\"time\":\"");
        self.push_rfc3339(r.time, out);
        push(out, "\",\"stream\":");
        push_json_str(out, &r.stream);
        push(out, ",\"protocol\":");
        push_json_str(out, r.protocol);
        push(out, ",\"client\":");
        push_json_str(out, &r.client.to_string());
        if let Some(t) = r.target {
            push(out, ",\"target\":");
            push_json_str(out, &t.to_string());
        }
        if let Some(sni) = &r.sni {
            push(out, ",\"sni\":");
            push_json_str(out, sni);
        }
        push(out, ",\"bytes_in\":");
        push_decimal(out, r.bytes_in);
        push(out, ",\"bytes_out\":");
        push_decimal(out, r.bytes_out);
        push(out, ",\"duration_ms\":");
        push_ms(out, r.duration);
        if let Some(e) = &r.error {
            push(out, ",\"error\":");
            push_json_str(out, e);
        }
        push(out, "}\n");
    }

    /// nginx's `stream` "basic" layout: client, time, protocol, status (200 when both sides
    /// closed cleanly, 500 otherwise; the JSON format carries the error), bytes sent to the
    /// client, bytes received from it, seconds; then the stream and the target.
    pub(super) fn stream_basic(&mut self, r: &StreamRecord, out: &mut Vec<u8>) {
        push_ip(out, r.client.ip());
        push(out, " [");
        self.push_clf(r.time, out);
        push(out, "] ");
        push(out, r.protocol);
        push(out, if r.error.is_none() { " 200 " } else { " 500 " });
        push_decimal(out, r.bytes_out);
        out.push(b' ');
        push_decimal(out, r.bytes_in);
        out.push(b' ');
        let ms = millis(r.duration);
        push_decimal(out, ms / 1000);
        out.push(b'.');
        push_padded(out, ms % 1000, 3);
        out.push(b' ');
        push(out, &r.stream);
        out.push(b' ');
        match r.target {
            Some(t) => push(out, &t.to_string()),
            None => out.push(b'-'),
        }
        out.push(b'\n');
    }

    /// Makes the second's texts when `t` is in another second than the last record's.
    fn at(&mut self, t: SystemTime) -> Duration {
        let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
        let secs = since.as_secs();
        if self.second != Some(secs) {
            let c = Civil::of(secs);
            self.rfc3339.clear();
            push_padded(&mut self.rfc3339, c.year, 4);
            self.rfc3339.push(b'-');
            push_padded(&mut self.rfc3339, c.month, 2);
            self.rfc3339.push(b'-');
            push_padded(&mut self.rfc3339, c.day, 2);
            self.rfc3339.push(b'T');
            c.push_clock(&mut self.rfc3339);
            self.rfc3339.push(b'.');
            const MONTHS: [&str; 12] = [
                "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
            ];
            self.clf.clear();
            push_padded(&mut self.clf, c.day, 2);
            self.clf.push(b'/');
            push(&mut self.clf, MONTHS[(c.month - 1) as usize]);
            self.clf.push(b'/');
            push_padded(&mut self.clf, c.year, 4);
            self.clf.push(b':');
            c.push_clock(&mut self.clf);
            push(&mut self.clf, " +0000");
            self.second = Some(secs);
        }
        since
    }

    /// `YYYY-MM-DDTHH:MM:SS.mmmZ`.
    fn push_rfc3339(&mut self, t: SystemTime, out: &mut Vec<u8>) {
        let since = self.at(t);
        out.extend_from_slice(&self.rfc3339);
        push_padded(out, u64::from(since.subsec_millis()), 3);
        out.push(b'Z');
    }

    /// `DD/Mon/YYYY:HH:MM:SS +0000`.
    fn push_clf(&mut self, t: SystemTime, out: &mut Vec<u8>) {
        self.at(t);
        out.extend_from_slice(&self.clf);
    }
}

/// A UTC calendar date and time of day (civil-from-days, Howard Hinnant's algorithm).
struct Civil {
    year: u64,
    month: u64,
    day: u64,
    seconds_of_day: u64,
}

impl Civil {
    fn of(secs: u64) -> Self {
        let days = (secs / 86_400) as i64;
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u64;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u64;
        let year = (yoe + era * 400 + i64::from(month <= 2)).max(0) as u64;
        Self {
            year,
            month,
            day,
            seconds_of_day: secs % 86_400,
        }
    }

    /// `HH:MM:SS`.
    fn push_clock(&self, out: &mut Vec<u8>) {
        let s = self.seconds_of_day;
        push_padded(out, s / 3600, 2);
        out.push(b':');
        push_padded(out, s % 3600 / 60, 2);
        out.push(b':');
        push_padded(out, s % 60, 2);
    }
}

fn push(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
}

/// The JSON members of a request's notes, those it has.
fn push_notes(out: &mut Vec<u8>, n: &LogNotes) {
    push_text_members(out, &[("user", n.user.as_deref()), ("cache", n.cache)]);
    if let Some((filter, reason)) = n.auth {
        push(out, ",\"auth\":\"");
        push(out, filter);
        out.push(b':');
        push(out, reason);
        out.push(b'"');
    }
    push_text_members(
        out,
        &[
            ("cors", n.cors),
            ("redirect", n.redirect.as_deref()),
            ("mirror", n.mirror),
            ("compress", n.compress),
        ],
    );
}

/// `,"NAME":"TEXT"` for each member that has a text, in order.
fn push_text_members(out: &mut Vec<u8>, members: &[(&str, Option<&str>)]) {
    for (name, text) in members {
        if let Some(text) = text {
            push(out, ",\"");
            push(out, name);
            push(out, "\":");
            push_json_str(out, text);
        }
    }
}

/// Milliseconds, rounded to the nearest microsecond, as `M.mmm` (the microseconds are the
/// fraction). An integer's digits: the same text `{:.3}` of the `f64` gives, without it.
fn push_ms(out: &mut Vec<u8>, d: Duration) {
    let micros = (d.as_nanos() + 500) / 1000;
    let micros = u64::try_from(micros).unwrap_or(u64::MAX);
    push_decimal(out, micros / 1000);
    out.push(b'.');
    push_padded(out, micros % 1000, 3);
}

/// Whole milliseconds, rounded to the nearest.
fn millis(d: Duration) -> u64 {
    u64::try_from((d.as_nanos() + 500_000) / 1_000_000).unwrap_or(u64::MAX)
}

fn push_ip(out: &mut Vec<u8>, ip: IpAddr) {
    let mut buf = [0u8; 48];
    out.extend_from_slice(ip_text(ip, &mut buf));
}

/// Bytes a JSON string cannot hold as they are: `"`, `\` and the control characters.
static JSON_ESCAPED: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        t[b] = true;
        b += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

/// `s` as a JSON string, copied whole between the bytes that need an escape.
fn push_json_str(out: &mut Vec<u8>, s: &str) {
    out.reserve(s.len() + 2);
    out.push(b'"');
    let mut rest = s.as_bytes();
    while let Some(i) = rest.iter().position(|&b| JSON_ESCAPED[usize::from(b)]) {
        out.extend_from_slice(&rest[..i]);
        match rest[i] {
            b'"' => push(out, "\\\""),
            b'\\' => push(out, "\\\\"),
            c => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                push(out, "\\u00");
                out.push(HEX[usize::from(c >> 4)]);
                out.push(HEX[usize::from(c & 0xf)]);
            }
        }
        rest = &rest[i + 1..];
    }
    out.extend_from_slice(rest);
    out.push(b'"');
}

/// `s` inside a combined-format quoted field: `"` escaped as `\"`.
fn push_clf_str(out: &mut Vec<u8>, s: &str) {
    let mut rest = s;
    while let Some(i) = memchr::memchr(b'"', rest.as_bytes()) {
        push(out, &rest[..i]);
        push(out, "\\\"");
        rest = &rest[i + 1..];
    }
    push(out, rest);
}

/// [`push_clf_str`], or `-` for an empty field.
fn push_clf_str_or_dash(out: &mut Vec<u8>, s: &str) {
    if s.is_empty() {
        out.push(b'-');
    } else {
        push_clf_str(out, s);
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::Arc;

    use super::*;
    use crate::telemetry::RequestText;

    fn at(millis: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(millis)
    }

    /// What `write` appends to an empty line.
    fn text(write: impl FnOnce(&mut Vec<u8>)) -> String {
        let mut out = Vec::new();
        write(&mut out);
        String::from_utf8(out).expect("UTF-8")
    }

    fn record() -> AccessRecord {
        AccessRecord {
            time: at(1_700_000_000_123),
            client: "10.0.200.7".parse().unwrap(),
            method: http::Method::GET,
            request: RequestText::new(
                "/a?b=\"c\"",
                "example.com",
                "agent\\1\t\u{1}é".as_bytes(),
                b"",
            ),
            protocol: "HTTP/1.1",
            status: 200,
            bytes: 1024,
            duration: Duration::from_nanos(1_234_567),
            route: Arc::from("files"),
            upstream: None,
            trace_id: Some("0af7651916cd43dd8448eb211c80319c".into()),
            notes: None,
        }
    }

    #[test]
    fn request_texts_share_one_string_and_read_invalid_utf8_lossily() {
        let t = RequestText::new("/p?q", "h", b"ua\xff", b"http://r/");
        assert_eq!(
            (t.target(), t.host(), t.user_agent(), t.referer()),
            ("/p?q", "h", "ua\u{fffd}", "http://r/")
        );
        let empty = RequestText::new("/", "", b"", b"");
        assert_eq!(
            (empty.host(), empty.user_agent(), empty.referer()),
            ("", "", "")
        );
    }

    #[test]
    fn timestamps_of_known_instants_and_a_second_change() {
        let mut f = Formatter::default();
        let out = text(|out| {
            f.push_rfc3339(at(1_700_000_000_123), out);
            f.push_rfc3339(at(1_700_000_000_999), out);
            f.push_rfc3339(at(1_700_000_001_007), out);
            f.push_clf(at(1_700_000_001_007), out);
            f.push_rfc3339(at(951_782_400_000), out);
        });
        assert_eq!(
            out,
            "2023-11-14T22:13:20.123Z2023-11-14T22:13:20.999Z2023-11-14T22:13:21.007Z\
             14/Nov/2023:22:13:21 +00002000-02-29T00:00:00.000Z"
        );
    }

    #[test]
    fn numbers_with_and_without_padding() {
        let numbers = text(|out| {
            for (n, width) in [(0, 1), (7, 3), (1234, 2), (u64::MAX, 1), (5, 4)] {
                push_padded(out, n, width);
                out.push(b',');
            }
        });
        assert_eq!(numbers, "0,007,1234,18446744073709551615,0005,");
        let ms = text(|out| {
            for nanos in [0, 499, 500, 1_234_567, 12_345_678_999] {
                push_ms(out, Duration::from_nanos(nanos));
                out.push(b',');
            }
        });
        assert_eq!(ms, "0.000,0.000,0.001,1.235,12345.679,");
    }

    #[test]
    fn json_lines_parse_back_to_the_record() {
        let out = text(|out| Formatter::default().http_json(&record(), out));
        assert!(out.ends_with("}\n"), "{out}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
        assert_eq!(v["time"], "2023-11-14T22:13:20.123Z");
        assert_eq!(v["client"], "10.0.200.7");
        assert_eq!(v["method"], "GET");
        assert_eq!(v["target"], "/a?b=\"c\"");
        assert_eq!(v["protocol"], "HTTP/1.1");
        assert_eq!(v["status"], 200);
        assert_eq!(v["bytes"], 1024);
        assert_eq!(v["duration_ms"], 1.235);
        assert_eq!(v["route"], "files");
        assert_eq!(v["host"], "example.com");
        assert_eq!(v["user_agent"], "agent\\1\t\u{1}é");
        assert_eq!(v["referer"], "");
        assert_eq!(v["trace_id"], "0af7651916cd43dd8448eb211c80319c");
        assert!(
            out.contains(r#""user_agent":"agent\\1\u0009\u0001é""#),
            "{out}"
        );
    }

    #[test]
    fn combined_lines_escape_quotes_and_mark_empty_fields() {
        let out = text(|out| Formatter::default().http_combined(&record(), out));
        assert_eq!(
            out,
            "10.0.200.7 - - [14/Nov/2023:22:13:20 +0000] \"GET /a?b=\\\"c\\\" HTTP/1.1\" 200 1024 \
             \"-\" \"agent\\1\t\u{1}é\"\n"
        );
    }

    #[test]
    fn the_authenticated_user_in_both_formats() {
        let mut r = record();
        r.notes = Some(Box::new(LogNotes {
            user: Some(Arc::from("alice")),
            cache: Some("hit"),
            ..LogNotes::default()
        }));
        let json = text(|out| Formatter::default().http_json(&r, out));
        let v: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
        assert_eq!(v["user"], "alice");
        assert_eq!(v["cache"], "hit");
        let line = text(|out| Formatter::default().http_combined(&r, out));
        assert!(
            line.starts_with("10.0.200.7 - alice [14/Nov/2023"),
            "{line}"
        );
        assert!(!text(|out| Formatter::default().http_json(&record(), out)).contains("\"user\""));
    }

    #[test]
    fn notes_are_members_of_their_own_only_when_there_are_any() {
        let mut r = record();
        r.notes = Some(Box::new(LogNotes {
            auth: Some(("jwt", "expired")),
            cors: Some("denied"),
            redirect: Some(Box::from("https://a.example/\"x\"")),
            mirror: Some("copied"),
            compress: Some("gzip"),
            ..LogNotes::default()
        }));
        let json = text(|out| Formatter::default().http_json(&r, out));
        let v: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
        assert_eq!(v["auth"], "jwt:expired");
        assert_eq!(v["cors"], "denied");
        assert_eq!(v["redirect"], "https://a.example/\"x\"");
        assert_eq!(v["mirror"], "copied");
        assert_eq!(v["compress"], "gzip");
        r.notes = Some(Box::new(LogNotes {
            cors: Some("preflight"),
            ..LogNotes::default()
        }));
        let json = text(|out| Formatter::default().http_json(&r, out));
        let v: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
        assert_eq!(v["cors"], "preflight");
        for absent in ["user", "cache", "auth", "redirect", "mirror", "compress"] {
            assert!(v.get(absent).is_none(), "{absent} in {json}");
        }
    }

    #[test]
    fn stream_lines() {
        let client: SocketAddr = "[2001:db8::1]:5353".parse().unwrap();
        let mut r = StreamRecord {
            time: at(1_700_000_000_123),
            stream: Arc::from("dns"),
            protocol: "UDP",
            client,
            target: Some("127.0.0.1:53".parse().unwrap()),
            sni: Some("a.example".into()),
            bytes_in: 40,
            bytes_out: 120,
            duration: Duration::from_millis(2_500),
            error: None,
        };
        let mut f = Formatter::default();
        assert_eq!(
            text(|out| f.stream_basic(&r, out)),
            "2001:db8::1 [14/Nov/2023:22:13:20 +0000] UDP 200 120 40 2.500 dns 127.0.0.1:53\n"
        );
        r.error = Some("reset \"by peer\"".into());
        r.target = None;
        let json = text(|out| f.stream_json(&r, out));
        let v: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
        assert_eq!(v["time"], "2023-11-14T22:13:20.123Z");
        assert_eq!(v["client"], "[2001:db8::1]:5353");
        assert_eq!(v["sni"], "a.example");
        assert_eq!((&v["bytes_in"], &v["bytes_out"]), (&40.into(), &120.into()));
        assert_eq!(v["duration_ms"], 2500.0);
        assert_eq!(v["error"], "reset \"by peer\"");
        assert!(v.get("target").is_none());
        let basic = text(|out| f.stream_basic(&r, out));
        assert!(
            basic.starts_with("2001:db8::1 [") && basic.ends_with(" 500 120 40 2.500 dns -\n"),
            "{basic}"
        );
    }
}
