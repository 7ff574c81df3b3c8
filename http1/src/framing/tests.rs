//! Verdicts of the framing checks, and that they do not depend on how bytes are split.

use super::*;

/// Feeds `pieces` the way the IO wrapper does (held bytes first again) and returns the bytes
/// released to the parser (up to where the stream ends, for an oversized head) and the refusal,
/// if any.
fn run(framing: &mut Framing, pieces: &[&[u8]]) -> (Vec<u8>, Option<Violation>) {
    let mut out = Vec::new();
    let mut held: Vec<u8> = Vec::new();
    for piece in pieces {
        held.extend_from_slice(piece);
        loop {
            match framing.scan(&held) {
                Scan::Pass => out.append(&mut held),
                Scan::Hold(n) => {
                    out.extend(held.drain(..n));
                }
                Scan::Reject(n, v) | Scan::Cut(n, v) => {
                    out.extend_from_slice(&held[..n]);
                    return (out, Some(v));
                }
                Scan::Escape(n) => {
                    out.extend(held.drain(..n));
                    held = escape_target(&held);
                    continue;
                }
                Scan::Truncate(n) => {
                    out.extend_from_slice(&held[..n]);
                    return (out, None);
                }
            }
            break;
        }
    }
    (out, None)
}

fn verdict(input: &[u8]) -> (Vec<u8>, Option<Violation>) {
    run(&mut Framing::http1(64 * 1024, true), &[input])
}

#[test]
fn plain_requests_pass_whole() {
    let input: &[u8] = b"GET / HTTP/1.1\r\nHost: a\r\n\r\nPOST /u HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloPOST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\nX-T: 1\r\n\r\nGET /last HTTP/1.1\r\n\r\n";
    assert_eq!(verdict(input), (input.to_vec(), None));
}

#[test]
fn smuggling_shapes_are_refused_at_the_request_start() {
    let ok = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    let cases: &[(&[u8], Violation)] = &[
        (
            b"POST / HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            Violation::LengthWithChunked,
        ),
        (
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n",
            Violation::LengthWithChunked,
        ),
        (
            b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
            Violation::DuplicateLength,
        ),
        (
            b"POST / HTTP/1.1\r\nContent-Length: 5\r\ncontent-length: 6\r\n\r\nhello",
            Violation::DuplicateLength,
        ),
        (
            b"POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\nhello",
            Violation::InvalidLength,
        ),
        (
            b"POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\nhello",
            Violation::InvalidLength,
        ),
        (
            b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
            Violation::InvalidLength,
        ),
        (
            b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
            Violation::InvalidTransferEncoding,
        ),
        (
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            Violation::InvalidTransferEncoding,
        ),
        (
            b"POST / HTTP/1.1\r\nTransfer-Encoding: identity\r\n\r\n",
            Violation::InvalidTransferEncoding,
        ),
        (
            b"POST / HTTP/1.1\r\nTransfer-Encoding: xchunked\r\n\r\n",
            Violation::InvalidTransferEncoding,
        ),
        (b"GET / HTTP/1.1\nHost: a\r\n\r\n", Violation::BareLf),
        (b"GET / HTTP/1.1\r\nHost: a\n\r\n", Violation::BareLf),
        (b"GET / HTTP/1.1\r\nHost: a\r\n\n", Violation::BareLf),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n  folded\r\n\r\n",
            Violation::ObsFold,
        ),
        (
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
            Violation::InvalidChunk,
        ),
        (
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n",
            Violation::InvalidChunk,
        ),
        (
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n",
            Violation::InvalidChunk,
        ),
        (
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\n",
            Violation::InvalidChunk,
        ),
    ];
    for (bad, violation) in cases {
        // After a good request, so the refusal point is checked too.
        let input = [&ok[..], bad].concat();
        let (released, got) = verdict(&input);
        assert_eq!(got, Some(*violation), "{}", String::from_utf8_lossy(bad));
        assert_eq!(released, ok, "{}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn a_bad_later_chunk_is_refused_where_it_is() {
    let input: &[u8] =
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nxyz\r\n";
    let (released, got) = verdict(input);
    assert_eq!(got, Some(Violation::InvalidChunk));
    assert_eq!(released, &input[..input.len() - 5]);
    // Data not followed by CRLF.
    let input: &[u8] = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhello\r\n";
    let (released, got) = verdict(input);
    assert_eq!(got, Some(Violation::InvalidChunk));
    assert!(released.ends_with(b"he"));
}

#[test]
fn expect_continue_releases_a_chunked_head_before_its_body() {
    let head: &[u8] =
        b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n";
    assert_eq!(verdict(head), (head.to_vec(), None));
    // Without it, the head waits for its first chunk-size line.
    let head: &[u8] = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
    assert_eq!(verdict(head), (Vec::new(), None));
    let mut f = Framing::http1(64 * 1024, false);
    assert_eq!(
        run(&mut f, &[head, b"3\r\nab"]).0,
        [head, b"3\r\nab"].concat()
    );
}

#[test]
fn http2_preface_turns_checking_off() {
    let mut f = Framing::http1(64 * 1024, true);
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04\x00\n\n";
    assert!(!f.is_http2());
    assert_eq!(run(&mut f, &[&preface[..10], &preface[10..]]).1, None);
    assert!(f.is_off());
    assert!(f.is_http2(), "the preface says HTTP/2");
    // Without sniffing (an HTTP/1-only connection) the preface is just a bad request line,
    // the parser's to refuse.
    let mut f = Framing::http1(64 * 1024, false);
    assert!(!f.is_off());
    let _ = run(&mut f, &[preface]);
    assert!(!f.is_http2());
    // Checking stopped for another reason (a switch of protocols) is not HTTP/2; ALPN's `h2` is.
    let mut f = Framing::http1(64 * 1024, true);
    let _ = run(
        &mut f,
        &[b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n"],
    );
    f.switched();
    assert!(f.is_off() && !f.is_http2());
    assert!(Framing::off().is_http2());
}

#[test]
fn an_upgrade_request_keeps_checking_on_until_the_switch_happens() {
    let upgrade: &[u8] = b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n";
    let connect: &[u8] = b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n";
    for asking in [upgrade, connect] {
        // Not switched (the answer was not 101): what follows is HTTP/1, and checked.
        let mut f = Framing::http1(64 * 1024, true);
        let smuggled = b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n";
        let (released, got) = run(&mut f, &[asking, smuggled]);
        assert_eq!(released, asking.to_vec());
        assert_eq!(got, Some(Violation::DuplicateLength));

        // Switched: what follows is the new protocol's, passed as it is.
        let mut f = Framing::http1(64 * 1024, true);
        assert_eq!(run(&mut f, &[asking]), (asking.to_vec(), None));
        assert!(f.switch_asked() && !f.is_off());
        f.switched();
        let frame: &[u8] = b"\x81\x05hello\n";
        assert_eq!(run(&mut f, &[frame]), (frame.to_vec(), None));
        assert!(f.is_off());
    }
}

#[test]
fn oversized_heads_go_to_the_parser_cut_at_the_limit() {
    // After a good request, so the cut is placed from the oversized head's start.
    let good: &[u8] = b"GET / HTTP/1.1\r\n\r\n";
    let big = [
        good,
        b"GET / HTTP/1.1\r\nX-Big: ",
        &[b'a'; 100],
        b"\r\n\r\nPOST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    ]
    .concat();
    let mut f = Framing::http1(64, false);
    let (released, got) = run(&mut f, &[&big]);
    assert_eq!((released, got), (big[..good.len() + 64].to_vec(), None));
    assert!(f.is_off());
}

#[test]
fn verdicts_do_not_depend_on_how_bytes_are_split() {
    let inputs: &[&[u8]] = &[
        b"GET / HTTP/1.1\r\nHost: a\r\n\r\nPOST /u HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc\r\nGET / HTTP/1.1\r\n\r\n",
        b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;a=b\r\nabc\r\n0\r\nT: 1\r\n\r\nGET / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\n\r\nPOST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"GET / HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\nHost: a\n\r\n",
        b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nq\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\n\n\n",
        b"PRI * HTTP/1.1\r\nHost: a\r\n\r\n",
    ];
    for input in inputs {
        let whole = verdict(input);
        for split in 1..input.len() {
            let mut f = Framing::http1(64 * 1024, true);
            let parts = run(&mut f, &[&input[..split], &input[split..]]);
            assert_eq!(
                parts,
                whole,
                "split at {split}: {}",
                String::from_utf8_lossy(input)
            );
        }
        let mut f = Framing::http1(64 * 1024, true);
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(run(&mut f, &bytes), whole, "byte by byte");
    }
}

#[test]
fn the_word_at_a_time_search_finds_the_first_match_wherever_it_is() {
    // Every length up to three words, the needle at every place (alone, twice, and next to
    // bytes that differ from it by one bit, or by the borrow a subtraction carries).
    for len in 0..=24 {
        for needle in [b'\n', b':', 0x00, 0x80, 0xff] {
            let none = vec![needle ^ 1; len];
            assert_eq!(find_byte(&none, needle), None, "len {len}");
            for first in 0..len {
                for second in first..len {
                    let mut hay = none.clone();
                    for (i, b) in hay.iter_mut().enumerate() {
                        *b = if i % 2 == 0 {
                            needle ^ 1
                        } else {
                            needle.wrapping_add(1)
                        };
                    }
                    hay[first] = needle;
                    hay[second] = needle;
                    assert_eq!(
                        find_byte(&hay, needle),
                        Some(first),
                        "len {len}, needle {needle:#x}, at {first} and {second}"
                    );
                }
            }
        }
    }
}

#[test]
fn targets_are_escaped_once_and_only_in_the_request_line() {
    let input: &[u8] =
        b"GET /a\"b?<q> HTTP/1.1\r\nX-Quote: \"<>`\"\r\n\r\nPOST / HTTP/1.1\r\nContent-Length: 3\r\n\r\n<\">";
    let want: &[u8] =
        b"GET /a%22b?%3Cq%3E HTTP/1.1\r\nX-Quote: \"<>`\"\r\n\r\nPOST / HTTP/1.1\r\nContent-Length: 3\r\n\r\n<\">";
    for split in 1..input.len() {
        let mut f = Framing::http1(64 * 1024, true);
        assert_eq!(
            run(&mut f, &[&input[..split], &input[split..]]),
            (want.to_vec(), None),
            "split at {split}"
        );
    }
    // A strict listener leaves them to the parser.
    let mut f = Framing::http1(64 * 1024, true).strict_targets(true);
    assert_eq!(run(&mut f, &[input]), (input.to_vec(), None));
}

/// Feeds `input` whole, split everywhere, and byte by byte; asserts the same outcome and off
/// state every way, and returns it.
fn split_everywhere(max_head: usize, input: &[u8]) -> ((Vec<u8>, Option<Violation>), bool) {
    let mut f = Framing::http1(max_head, false);
    let whole = (run(&mut f, &[input]), f.is_off());
    for split in 1..input.len() {
        let mut f = Framing::http1(max_head, false);
        let parts = run(&mut f, &[&input[..split], &input[split..]]);
        assert_eq!((parts, f.is_off()), whole, "split at {split}");
    }
    let mut f = Framing::http1(max_head, false);
    let bytes: Vec<&[u8]> = input.chunks(1).collect();
    assert_eq!((run(&mut f, &bytes), f.is_off()), whole, "byte by byte");
    whole
}

#[test]
fn a_head_ending_past_the_limit_is_oversized_however_it_arrives() {
    // Every line but the final empty one fits the 56-byte limit; the empty line ends past it.
    let head = [
        b"GET / HTTP/1.1\r\nX: ".as_slice(),
        &[b'a'; 35],
        b"\r\n\r\n",
    ]
    .concat();
    assert_eq!(head.len(), 58);
    let (verdict, off) = split_everywhere(56, &head);
    assert_eq!(verdict, (head[..56].to_vec(), None), "cut at the limit");
    assert!(off, "an oversized head ends checking");
    // Two bytes shorter, it ends at the limit: it fits, and checking goes on.
    let (verdict, off) = split_everywhere(56, &[&head[..19], &head[21..]].concat());
    assert_eq!(verdict.1, None);
    assert!(!off);
}

#[test]
fn a_long_first_chunk_line_is_refused_however_it_arrives() {
    // The head is far within its limit; the first chunk-size line (extensions) is not within
    // its own. Counted against the head's, it turned checking off when it came in pieces.
    let head: &[u8] = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
    let input = [
        head,
        b"5;",
        &[b'e'; MAX_FIRST_CHUNK_LINE],
        b"\r\nhello\r\n0\r\n\r\n",
    ]
    .concat();
    let (verdict, off) = split_everywhere(1024, &input);
    assert_eq!(verdict, (Vec::new(), Some(Violation::InvalidChunk)));
    assert!(off);
    // Up to the limit (CRLF included) it passes.
    let fits = [
        head,
        b"5;",
        &[b'e'; MAX_FIRST_CHUNK_LINE - 4],
        b"\r\nhello\r\n0\r\n\r\n",
    ]
    .concat();
    let mut f = Framing::http1(1024, false);
    assert_eq!(run(&mut f, &[&fits]), (fits.clone(), None));
}
