//! Response heads and chunked bodies as upstreams send them, including split across reads.

use bytes::BytesMut;
use http::{Method, StatusCode, Version};

use super::*;

fn parse(text: &str, method: &Method) -> io::Result<Option<ResponseHead>> {
    response_head(&mut BytesMut::from(text), method, 0)
}

fn framing_of(text: &str) -> (BodyFraming, bool) {
    let head = parse(text, &Method::GET).unwrap().unwrap();
    (head.framing, head.keep_alive)
}

#[test]
fn a_head_is_parsed_with_its_fields_and_the_body_left_in_the_buffer() {
    let mut buf = BytesMut::from(
        "HTTP/1.1 201 Created\r\nContent-Length: 5\r\nX-A: 1\r\nx-a: 2\r\n\r\nhello",
    );
    let head = response_head(&mut buf, &Method::POST, 0).unwrap().unwrap();
    assert_eq!(head.parts.status, StatusCode::CREATED);
    assert_eq!(head.parts.version, Version::HTTP_11);
    let xa: Vec<_> = head.parts.headers.get_all("x-a").iter().collect();
    assert_eq!(xa, ["1", "2"]);
    assert_eq!(head.framing, BodyFraming::Length(5));
    assert!(head.keep_alive);
    assert_eq!(&buf[..], b"hello");
}

#[test]
fn a_partial_head_asks_for_more_and_an_endless_one_is_refused() {
    assert!(
        parse("HTTP/1.1 200 OK\r\nContent-Le", &Method::GET)
            .unwrap()
            .is_none()
    );
    let endless = format!("HTTP/1.1 200 OK\r\nx: {}", "a".repeat(MAX_HEAD + 1));
    assert!(parse(&endless, &Method::GET).is_err());
    assert!(parse("NOT HTTP AT ALL\r\n\r\n", &Method::GET).is_err());
}

#[test]
fn interim_responses_count_towards_the_head_limit() {
    // An upstream that sends interim responses without end is refused, not buffered.
    let mut endless = "HTTP/1.1 100 Continue\r\n\r\n".repeat(MAX_HEAD / 25 + 1);
    endless.push_str("HTTP/1.1 200 OK\r\n");
    assert!(endless.len() > MAX_HEAD);
    assert!(parse(&endless, &Method::GET).is_err());
    // The same when the final head completes in the same read.
    endless.push_str("Content-Length: 0\r\n\r\n");
    assert!(parse(&endless, &Method::GET).is_err());
}

#[test]
fn a_head_over_the_limit_is_refused_however_it_arrives() {
    let long = format!("HTTP/1.1 200 OK\r\nx: {}\r\n\r\n", "a".repeat(MAX_HEAD));
    // In pieces it was always refused; whole, it was taken.
    assert!(parse(&long[..MAX_HEAD + 1], &Method::GET).is_err());
    assert!(parse(&long, &Method::GET).is_err());
}

#[test]
fn interim_responses_are_skipped() {
    let mut buf = BytesMut::from(
        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    );
    let head = response_head(&mut buf, &Method::GET, 0).unwrap().unwrap();
    assert_eq!(head.parts.status, StatusCode::OK);
    assert!(head.parts.headers.get("link").is_none());
    assert!(buf.is_empty());
}

#[test]
fn a_switch_of_protocols_ends_the_connection_use() {
    // Bytes after a 101 are another protocol: the connection must not return to the pool.
    assert_eq!(
        framing_of(
            "HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: foo\r\n\r\n"
        ),
        (BodyFraming::Empty, false)
    );
}

#[test]
fn framing_follows_rfc_9112() {
    assert_eq!(
        framing_of("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
        (BodyFraming::Empty, true)
    );
    assert_eq!(
        framing_of("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
        (BodyFraming::Chunked, true)
    );
    // Chunked not last: the body runs to the close.
    assert_eq!(
        framing_of("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n"),
        (BodyFraming::Close, false)
    );
    // Both: Transfer-Encoding wins and the connection is not trusted again.
    assert_eq!(
        framing_of("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"),
        (BodyFraming::Chunked, false)
    );
    assert_eq!(
        framing_of("HTTP/1.1 200 OK\r\n\r\n"),
        (BodyFraming::Close, false)
    );
    assert_eq!(
        framing_of("HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\n"),
        (BodyFraming::Length(7), false)
    );
    assert_eq!(
        framing_of("HTTP/1.0 200 OK\r\nContent-Length: 7\r\n\r\n"),
        (BodyFraming::Length(7), false)
    );
    assert_eq!(
        framing_of("HTTP/1.0 200 OK\r\nContent-Length: 7\r\nConnection: Keep-Alive\r\n\r\n"),
        (BodyFraming::Length(7), true)
    );
    // Repeated equal lengths are one length.
    assert_eq!(
        framing_of("HTTP/1.1 200 OK\r\nContent-Length: 4, 4\r\nContent-Length: 4\r\n\r\n"),
        (BodyFraming::Length(4), true)
    );
    for no_body in [
        "HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n",
        "HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
    ] {
        assert_eq!(framing_of(no_body).0, BodyFraming::Empty);
    }
    let head = parse(
        "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n",
        &Method::HEAD,
    )
    .unwrap()
    .unwrap();
    assert_eq!(head.framing, BodyFraming::Empty);
}

#[test]
fn a_bodiless_status_that_declares_a_body_loses_its_connection() {
    // (head, method, kept, counted): a 1xx or 204 with `Transfer-Encoding` or a non-zero
    // `Content-Length` breaks RFC 9112 §6.1-6.2; a `HEAD`'s or a 304's describe the `GET`.
    let cases = [
        (
            "HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n",
            Method::GET,
            false,
            true,
        ),
        (
            "HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n",
            Method::GET,
            false,
            true,
        ),
        (
            "HTTP/1.1 204 No Content\r\nContent-Length: x\r\n\r\n",
            Method::GET,
            false,
            true,
        ),
        (
            "HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n",
            Method::HEAD,
            false,
            true,
        ),
        // Already closing: nothing is discarded.
        (
            "HTTP/1.1 204 No Content\r\nContent-Length: 9\r\nConnection: close\r\n\r\n",
            Method::GET,
            false,
            false,
        ),
        (
            "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
            Method::GET,
            true,
            false,
        ),
        ("HTTP/1.1 204 No Content\r\n\r\n", Method::GET, true, false),
        (
            "HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
            Method::GET,
            true,
            false,
        ),
        (
            "HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
            Method::GET,
            true,
            false,
        ),
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n",
            Method::HEAD,
            true,
            false,
        ),
        (
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            Method::HEAD,
            true,
            false,
        ),
        // An interim response that declares a body taints the connection.
        (
            "HTTP/1.1 103 Early Hints\r\nContent-Length: 2\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
            Method::GET,
            false,
            true,
        ),
        (
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
            Method::GET,
            true,
            false,
        ),
    ];
    for (text, method, kept, counted) in cases {
        let head = parse(text, &method).unwrap().unwrap();
        assert_eq!(head.framing, BodyFraming::Empty, "{text:?}");
        assert_eq!(
            (head.keep_alive, head.bodiless_framed),
            (kept, counted),
            "{method} {text:?}"
        );
        let mut buf = BytesMut::from(text);
        let (head, ()) = response_head_text(&mut buf, &method, |_, _| ())
            .unwrap()
            .unwrap();
        assert_eq!(
            (head.keep_alive, head.bodiless_framed),
            (kept, counted),
            "text: {method} {text:?}"
        );
        assert!(buf.is_empty());
    }
}

#[test]
fn bad_lengths_fail_the_response() {
    for bad in ["5, 6", "-1", "+5", "0x10", "", "99999999999999999999"] {
        let text = format!("HTTP/1.1 200 OK\r\nContent-Length: {bad}\r\n\r\n");
        assert!(parse(&text, &Method::GET).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn a_transfer_coding_overrides_even_a_bad_length() {
    // The length is not used, so it cannot fail the response; the connection is not reused.
    for length in ["5, 6", "x"] {
        let text = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {length}\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
        assert_eq!(
            framing_of(&text),
            (BodyFraming::Chunked, false),
            "{length:?}"
        );
    }
}

#[test]
fn values_hold_only_the_bytes_a_field_value_may_hold() {
    // The values are made without a second check, so the parser's must match `HeaderValue`'s.
    let head_with = |value: &[u8]| {
        let mut wire = b"HTTP/1.1 204 No Content\r\nX-V: ".to_vec();
        wire.extend_from_slice(value);
        wire.extend_from_slice(b"\r\n\r\n");
        response_head(&mut BytesMut::from(&wire[..]), &Method::GET, 0)
    };
    for byte in 0..=u8::MAX {
        let value = [b'a', byte, b'z'];
        let parsed = head_with(&value);
        match HeaderValue::from_bytes(&value) {
            Ok(valid) => {
                let head = parsed.unwrap().unwrap();
                assert_eq!(head.parts.headers["x-v"], valid, "byte {byte:#x}");
            }
            // CR and LF end the line early; anything else must fail the head.
            Err(_) if byte == b'\r' || byte == b'\n' => {}
            Err(_) => assert!(parsed.is_err(), "byte {byte:#x} accepted"),
        }
    }
    // An obsolete line fold would put CR LF inside a value: refused.
    assert!(head_with(b"a\r\n folded").is_err());
}

/// Feeds `wire` to a chunked decoder `split` bytes at a time; returns the data and trailers.
fn decode_chunked(wire: &[u8], split: usize) -> io::Result<(Vec<u8>, Option<HeaderMap>)> {
    let mut state = Chunked::Size;
    let mut buf = BytesMut::new();
    let mut data = Vec::new();
    let mut trailers = None;
    let mut fed = 0;
    loop {
        match state.step(&mut buf)? {
            Step::Frame(f) => match f.into_data() {
                Ok(d) => data.extend_from_slice(&d),
                Err(f) => trailers = f.into_trailers().ok(),
            },
            Step::End => return Ok((data, trailers)),
            Step::NeedMore if fed == wire.len() => {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "truncated"));
            }
            Step::NeedMore => {
                let end = (fed + split).min(wire.len());
                buf.extend_from_slice(&wire[fed..end]);
                fed = end;
            }
        }
    }
}

#[test]
fn chunked_bodies_decode_whatever_the_read_boundaries() {
    let wire = b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\ngrpc-status: 0\r\nx-t: a\r\n\r\n";
    for split in [1, 2, 3, 7, 64] {
        let (data, trailers) = decode_chunked(wire, split).unwrap();
        assert_eq!(data, b"hello, world", "split {split}");
        let trailers = trailers.expect("trailers");
        assert_eq!(trailers["grpc-status"], "0");
        assert_eq!(trailers["x-t"], "a");
    }
    // Fields no trailer may carry are dropped as the section is read.
    let wire =
        b"1\r\nx\r\n0\r\nContent-Length: 9\r\nx-t: a\r\nHost: evil\r\nConnection: close\r\n\r\n";
    let (_, trailers) = decode_chunked(wire, 5).unwrap();
    let names: Vec<_> = trailers.expect("trailers").keys().cloned().collect();
    assert_eq!(names, ["x-t"]);
    let (data, trailers) = decode_chunked(b"A\r\n0123456789\r\n0\r\n\r\n", 4).unwrap();
    assert_eq!(data, b"0123456789");
    assert!(trailers.is_none());
}

#[test]
fn malformed_chunked_bodies_fail() {
    for bad in [
        &b"g\r\nhello\r\n0\r\n\r\n"[..],
        b"5\r\nhelloXX0\r\n\r\n",
        b"12345678901234567\r\n",
        b"5 junk\r\nhello\r\n0\r\n\r\n",
        b"\r\n",
    ] {
        assert!(
            decode_chunked(bad, 64).is_err(),
            "{:?} accepted",
            String::from_utf8_lossy(bad)
        );
    }
    assert!(decode_chunked(&[b'1'; MAX_CHUNK_LINE + 10], 8192).is_err());
}

#[test]
fn a_long_chunk_size_line_is_refused_however_it_arrives() {
    let mut wire = b"1;".to_vec();
    wire.extend_from_slice(&[b'e'; MAX_CHUNK_LINE]);
    wire.extend_from_slice(b"\r\nx\r\n0\r\n\r\n");
    for split in [1, 7, 4096, wire.len()] {
        assert!(decode_chunked(&wire, split).is_err(), "split {split}");
    }
    // A line of exactly the limit passes, even with its CR and LF in different reads.
    let mut wire = b"1;".to_vec();
    wire.extend_from_slice(&[b'e'; MAX_CHUNK_LINE - 2]);
    wire.extend_from_slice(b"\r\nx\r\n0\r\n\r\n");
    for split in [MAX_CHUNK_LINE + 1, wire.len()] {
        assert_eq!(
            decode_chunked(&wire, split).unwrap().0,
            b"x",
            "split {split}"
        );
    }
}

#[test]
fn a_trailer_section_over_the_limit_is_refused_however_it_arrives() {
    let wire = format!("0\r\nx: {}\r\n\r\n", "a".repeat(MAX_HEAD));
    for split in [4096, wire.len()] {
        assert!(
            decode_chunked(wire.as_bytes(), split).is_err(),
            "split {split}"
        );
    }
}

#[test]
fn a_fault_after_a_frame_is_reported_after_that_frame() {
    // The fault is in the same read as the good chunk before it: the chunk's data comes out
    // first, then the error.
    let mut state = Chunked::Size;
    let mut buf = BytesMut::from(&b"5\r\nhello\r\nZZ\r\n"[..]);
    match state.next(&mut buf).unwrap() {
        Step::Frame(frame) => assert_eq!(frame.into_data().unwrap(), "hello"),
        other => panic!("{other:?}"),
    }
    assert!(state.next(&mut buf).is_err());
    // A good end in the same read is noticed with the last frame.
    let mut state = Chunked::Size;
    let mut buf = BytesMut::from(&b"5\r\nhello\r\n0\r\n\r\n"[..]);
    assert!(matches!(state.next(&mut buf).unwrap(), Step::Frame(_)));
    assert_eq!(state, Chunked::Done);
}

#[test]
fn settle_sees_a_buffered_end_without_a_frame() {
    let mut state = Chunked::Size;
    let mut buf = BytesMut::from(&b"3\r\nabc\r\n0\r\n\r\n"[..]);
    assert!(matches!(state.step(&mut buf).unwrap(), Step::Frame(_)));
    state.settle(&mut buf).unwrap();
    assert_eq!(state, Chunked::Done);
    assert!(buf.is_empty());
    // A further data chunk is left for `step`.
    let mut state = Chunked::Size;
    let mut buf = BytesMut::from(&b"1\r\na\r\n1\r\nb\r\n0\r\n\r\n"[..]);
    assert!(matches!(state.step(&mut buf).unwrap(), Step::Frame(_)));
    state.settle(&mut buf).unwrap();
    assert_eq!(state, Chunked::Size);
    assert_eq!(&buf[..], b"1\r\nb\r\n0\r\n\r\n");
}
