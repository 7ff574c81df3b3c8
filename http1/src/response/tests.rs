//! The head hyper's HTTP/1.1 server would write, rule by rule.

use http::HeaderValue;

use super::*;

/// 1994-11-06 08:49:37 UTC.
const NOW: u64 = 784_111_777;
const DATE_LINE: &str = "date: Sun, 06 Nov 1994 08:49:37 GMT\r\n";

fn fields(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(*name, HeaderValue::from_static(value));
    }
    map
}

fn write(
    status: u16,
    pairs: &[(&'static str, &'static str)],
    body: BodyLength,
    to: Answering,
) -> (String, Written) {
    let mut out = Vec::new();
    let status = StatusCode::from_u16(status).unwrap();
    let written = push_head(&mut out, status, &fields(pairs), body, to, NOW);
    (String::from_utf8(out).unwrap(), written)
}

const GET: Answering = Answering {
    head_only: false,
    close: false,
};
const HEAD: Answering = Answering {
    head_only: true,
    close: false,
};

#[test]
fn a_known_length_is_written_after_the_other_fields_and_date_last() {
    let (text, w) = write(200, &[("x-a", "1")], BodyLength::Known(5), GET);
    assert_eq!(
        text,
        format!("HTTP/1.1 200 OK\r\nx-a: 1\r\ncontent-length: 5\r\n{DATE_LINE}\r\n")
    );
    assert_eq!(
        w,
        Written {
            framing: Framing::Length(5),
            closes: false,
            trailers: None
        }
    );
}

#[test]
fn head_with_an_empty_body_has_no_length_and_with_a_known_one_has_it() {
    let (text, w) = write(200, &[], BodyLength::Empty, HEAD);
    assert_eq!(text, format!("HTTP/1.1 200 OK\r\n{DATE_LINE}\r\n"));
    assert_eq!(w.framing, Framing::Empty);
    let (text, w) = write(200, &[], BodyLength::Known(7), HEAD);
    assert_eq!(
        text,
        format!("HTTP/1.1 200 OK\r\ncontent-length: 7\r\n{DATE_LINE}\r\n")
    );
    assert_eq!(w.framing, Framing::Empty);
    // A declared length beside an empty body is kept for `HEAD`, dropped otherwise.
    let (text, w) = write(200, &[("content-length", "9")], BodyLength::Empty, HEAD);
    assert!(text.contains("content-length: 9\r\n"), "{text}");
    assert_eq!(w.framing, Framing::Empty);
    let (text, w) = write(200, &[("content-length", "9")], BodyLength::Empty, GET);
    assert!(text.contains("content-length: 0\r\n"), "{text}");
    assert!(!text.contains("content-length: 9"), "{text}");
    assert_eq!(w.framing, Framing::Empty);
}

#[test]
fn an_empty_body_says_length_zero() {
    let (text, w) = write(200, &[], BodyLength::Empty, GET);
    assert_eq!(
        text,
        format!("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n{DATE_LINE}\r\n")
    );
    assert_eq!(w.framing, Framing::Empty);
    let (text, _) = write(200, &[], BodyLength::Known(0), GET);
    assert!(text.contains("content-length: 0\r\n"), "{text}");
}

#[test]
fn statuses_without_a_body_carry_neither_body_nor_length() {
    for status in [100, 103, 204, 304] {
        for body in [BodyLength::Empty, BodyLength::Known(5), BodyLength::Unknown] {
            let (text, w) = write(status, &[("trailer", "x-sum")], body, GET);
            assert!(
                !text.contains("content-length"),
                "{status} {body:?}: {text}"
            );
            assert!(
                !text.contains("transfer-encoding"),
                "{status} {body:?}: {text}"
            );
            assert!(!text.contains("trailer"), "{status} {body:?}: {text}");
            assert_eq!(w.framing, Framing::Empty, "{status} {body:?}");
            assert_eq!(w.trailers, None);
        }
    }
    // A 304's declared length describes the representation and goes on.
    let (text, _) = write(304, &[("content-length", "42")], BodyLength::Unknown, GET);
    assert!(text.contains("content-length: 42\r\n"), "{text}");
}

#[test]
fn a_declared_length_frames_a_body_of_unknown_length() {
    let (text, w) = write(200, &[("content-length", "12")], BodyLength::Unknown, GET);
    assert_eq!(
        text,
        format!("HTTP/1.1 200 OK\r\ncontent-length: 12\r\n{DATE_LINE}\r\n")
    );
    assert_eq!(w.framing, Framing::Length(12));
    // The body's own length wins, and the field as given is written.
    let (_, w) = write(200, &[("content-length", "12")], BodyLength::Known(3), GET);
    assert_eq!(w.framing, Framing::Length(3));
    // A length that is not a number leaves the body of unknown length chunked.
    let (text, w) = write(200, &[("content-length", "x")], BodyLength::Unknown, GET);
    assert!(!text.contains("content-length"), "{text}");
    assert!(text.contains("transfer-encoding: chunked\r\n"), "{text}");
    assert_eq!(w.framing, Framing::Chunked);
}

#[test]
fn an_unknown_length_goes_chunked_and_a_coding_list_ends_in_chunked() {
    let (text, w) = write(200, &[], BodyLength::Unknown, GET);
    assert_eq!(
        text,
        format!("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n{DATE_LINE}\r\n")
    );
    assert_eq!(w.framing, Framing::Chunked);
    let (text, w) = write(
        200,
        &[("transfer-encoding", "gzip")],
        BodyLength::Unknown,
        GET,
    );
    assert!(
        text.contains("transfer-encoding: gzip, chunked\r\n"),
        "{text}"
    );
    assert_eq!(w.framing, Framing::Chunked);
    // `HEAD`: no body, so no coding is added.
    let (text, w) = write(200, &[], BodyLength::Unknown, HEAD);
    assert!(!text.contains("transfer-encoding"), "{text}");
    assert_eq!(w.framing, Framing::Empty);
}

#[test]
fn connection_values_are_joined_and_close_is_seen() {
    let (text, w) = write(
        200,
        &[("connection", "x-hop"), ("connection", "Close")],
        BodyLength::Empty,
        GET,
    );
    assert!(text.contains("connection: x-hop, Close\r\n"), "{text}");
    assert!(!text.contains("connection: close\r\n"), "{text}");
    assert!(w.closes);
    let (text, w) = write(200, &[("connection", "keep-alive")], BodyLength::Empty, GET);
    assert!(text.contains("connection: keep-alive\r\n"), "{text}");
    assert!(!w.closes);
    // The client's `close` adds hyper's own line, once.
    let close = Answering {
        head_only: false,
        close: true,
    };
    let (text, w) = write(200, &[], BodyLength::Empty, close);
    assert!(
        text.ends_with(&format!("connection: close\r\n{DATE_LINE}\r\n")),
        "{text}"
    );
    assert!(w.closes);
    let (text, _) = write(200, &[("connection", "close")], BodyLength::Empty, close);
    assert_eq!(text.matches("connection").count(), 1, "{text}");
}

#[test]
fn trailer_values_are_joined_and_declared_where_a_body_follows() {
    let (text, w) = write(
        200,
        &[("trailer", "x-sum"), ("trailer", "grpc-status")],
        BodyLength::Unknown,
        GET,
    );
    assert!(text.contains("trailer: x-sum, grpc-status\r\n"), "{text}");
    assert_eq!(w.trailers.as_deref(), Some(&b"x-sum, grpc-status"[..]));
    let (text, w) = write(200, &[("trailer", "x-sum")], BodyLength::Unknown, HEAD);
    assert!(!text.contains("trailer"), "{text}");
    assert_eq!(w.trailers, None);
}

#[test]
fn date_is_added_only_when_the_response_has_none() {
    let (text, _) = write(
        200,
        &[("date", "Mon, 01 Jan 2001 00:00:00 GMT")],
        BodyLength::Empty,
        GET,
    );
    assert_eq!(text.matches("date: ").count(), 1, "{text}");
    assert!(
        text.contains("date: Mon, 01 Jan 2001 00:00:00 GMT\r\n"),
        "{text}"
    );
    let (text, _) = write(200, &[], BodyLength::Empty, GET);
    assert!(text.contains(DATE_LINE), "{text}");
}

#[test]
fn a_status_without_a_reason_phrase_is_written_as_hyper_writes_it() {
    let (text, _) = write(599, &[], BodyLength::Empty, GET);
    assert!(text.starts_with("HTTP/1.1 599 <none>\r\n"), "{text}");
}
