//! HTTP/1 request framing checks that run ahead of hyper's parser (request-smuggling defence).
//!
//! Smuggling lives in the gaps between how two HTTP/1 parsers frame the same bytes. hyper
//! rejects conflicting or non-numeric `Content-Length` values, obs-fold, and a
//! `Transfer-Encoding` whose last coding is not `chunked`, but it accepts shapes that other
//! servers frame differently: `Content-Length` together with `Transfer-Encoding` (hyper reads the
//! body as chunked and drops the length), a repeated `Content-Length` line with the same value,
//! codings before `chunked` (`gzip, chunked`), a repeated `Transfer-Encoding`, and lines ended by
//! a bare LF; and it hands a chunked request on before its first chunk-size line has been read.
//! The checks here cover those and the ones hyper refuses (so every refusal is counted by
//! reason). [`Framing`] follows the framing of
//! every request on an HTTP/1 connection (heads, fixed-length and chunked bodies) over the raw
//! bytes and reports where such a request starts, so the server's IO wrapper can keep it
//! from the parser. It is a pure state machine over `&[u8]`: bytes may arrive split anywhere.
//!
//! A chunked request head is judged together with its first chunk-size line (unless the client
//! waits for `100 Continue`), so a malformed first chunk rejects the request before anything is
//! routed or forwarded. A malformed later chunk ends the body early; the parser reports it.

/// The HTTP/2 connection preface; on a port serving both, it means the connection is HTTP/2.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Chunk sizes of more than 16 hex digits overflow 64 bits.
const MAX_SIZE_DIGITS: u8 = 16;

/// Longest first chunk-size line (size, extensions and CRLF) held back with its head. It has a
/// bound of its own: counted against the head's, a long one would turn checking off for a head
/// the parser accepts.
const MAX_FIRST_CHUNK_LINE: usize = 4096;

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// A line of the head ends in LF without CR.
    BareLf,
    /// A header line continues the previous one (obs-fold).
    ObsFold,
    /// Both `Content-Length` and `Transfer-Encoding`.
    LengthWithChunked,
    /// `Content-Length` more than once.
    DuplicateLength,
    /// `Content-Length` that is not a plain decimal number.
    InvalidLength,
    /// `Transfer-Encoding` other than exactly one `chunked`.
    InvalidTransferEncoding,
    /// A chunk-size line, chunk terminator or trailer that is not well formed.
    InvalidChunk,
}

impl Violation {
    /// Every violation, for registering counters up front.
    pub const ALL: [Self; 7] = [
        Self::BareLf,
        Self::ObsFold,
        Self::LengthWithChunked,
        Self::DuplicateLength,
        Self::InvalidLength,
        Self::InvalidTransferEncoding,
        Self::InvalidChunk,
    ];

    /// The `reason` label of `gateway_http_rejected_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::BareLf => "bare_lf",
            Self::ObsFold => "obs_fold",
            Self::LengthWithChunked => "content_length_with_transfer_encoding",
            Self::DuplicateLength => "duplicate_content_length",
            Self::InvalidLength => "invalid_content_length",
            Self::InvalidTransferEncoding => "invalid_transfer_encoding",
            Self::InvalidChunk => "invalid_chunk",
        }
    }
}

/// What to do with the bytes just scanned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// Everything may go to the parser.
    Pass,
    /// The first `n` bytes may go; the rest start a request head that is not complete yet. The
    /// next call must pass those held bytes again, followed by whatever arrived since.
    Hold(usize),
    /// The first `n` bytes may go; the request starting at `n` is refused.
    Reject(usize, Violation),
    /// The first `n` bytes may go; the byte at `n`, inside a body, is not valid there.
    Cut(usize, Violation),
    /// The first `n` bytes may go; the request starting at `n` has bytes in its target that
    /// the URI parser refuses and other servers take ([`escape_target`]). The next call must
    /// pass those bytes again, escaped, followed by whatever arrived since.
    Escape(usize),
    /// The first `n` bytes may go and the stream ends there: they end with the first
    /// `max_head` bytes of a head longer than that. The parser, whose buffer has the same
    /// limit, answers them with `431`; it never gets the whole head, so it cannot take one the
    /// checks did not.
    Truncate(usize),
}

/// Bytes of a request target that hyper's URI parser refuses (in the path, the query or both)
/// but that nginx and other servers take as they are: they are percent-encoded before the
/// parser sees them, unless the listener keeps to RFC 3986 (`strict_uri`).
const ESCAPED_IN_TARGET: [u8; 4] = [b'"', b'<', b'>', b'`'];

/// The request target of a request line: between its first and last space.
fn target_of(line: &[u8]) -> &[u8] {
    let first = line.iter().position(|&b| b == b' ');
    let last = line.iter().rposition(|&b| b == b' ');
    match (first, last) {
        (Some(first), Some(last)) if first < last => &line[first + 1..last],
        _ => &[],
    }
}

fn needs_escape(target: &[u8]) -> bool {
    target.iter().any(|b| ESCAPED_IN_TARGET.contains(b))
}

/// `head` (a request head from its first byte, as [`Scan::Escape`] left it) with the bytes of
/// its target in [`ESCAPED_IN_TARGET`] percent-encoded; the rest is copied as it is.
pub fn escape_target(head: &[u8]) -> Vec<u8> {
    // Empty lines may come before the request line (RFC 9112 §2.2).
    let start = head
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(head.len());
    let end = find_byte(&head[start..], b'\n').map_or(head.len(), |i| start + i);
    let line = &head[start..end];
    let target = target_of(line);
    let mut out = Vec::with_capacity(head.len() + 2 * target.len());
    if target.is_empty() {
        out.extend_from_slice(head);
        return out;
    }
    // `target` is a subslice of `line`: its offset is where it starts.
    let at = start + (target.as_ptr() as usize - line.as_ptr() as usize);
    out.extend_from_slice(&head[..at]);
    for &b in target {
        if ESCAPED_IN_TARGET.contains(&b) {
            crate::escape::push_escaped(&mut out, b);
        } else {
            out.push(b);
        }
    }
    out.extend_from_slice(&head[at + target.len()..]);
    out
}

/// The framing state of one HTTP/1 connection's request stream.
#[derive(Debug)]
pub struct Framing {
    state: State,
    /// Longest head held back; the parser gets this much of a longer one, and answers 431.
    max_head: usize,
    /// The connection speaks HTTP/2 (chosen by ALPN, or its preface came first).
    http2: bool,
    /// Percent-encode the bytes of [`ESCAPED_IN_TARGET`] in request targets; `false` leaves
    /// them to the parser, which refuses them (`strict_uri`).
    escape_targets: bool,
    /// A request asked to switch protocols (`Upgrade`, `CONNECT`). Its bytes and what follows
    /// are checked as HTTP/1 until the service says the switch really happened
    /// ([`Framing::switched`]): a request whose upgrade was answered with anything else leaves
    /// the connection HTTP/1, and checked.
    switch_asked: bool,
}

#[derive(Debug)]
enum State {
    /// A cleartext port serving both protocols: an HTTP/2 preface may come first.
    Preface,
    /// Reading a request head.
    Head(HeadScan),
    /// Body bytes left of a fixed-length body.
    Body(u64),
    /// Inside a chunked body.
    Chunked(Chunk),
    /// Not checking (HTTP/2, after a switch of protocols, after an oversized head or a refusal).
    Off,
}

/// Progress through one request head; positions are relative to the head's first byte.
#[derive(Debug, Default)]
struct HeadScan {
    /// Bytes checked so far (a line start, or inside the first chunk-size line).
    pos: usize,
    /// The request line has been seen.
    started: bool,
    length: Option<u64>,
    chunked: bool,
    /// `Upgrade` or `CONNECT`: what follows may not be HTTP.
    upgrade: bool,
    expect_continue: bool,
    /// After the head of a chunked request: its first chunk-size line, being checked.
    first_chunk: Option<Chunk>,
    /// Where that line starts (the head's length).
    first_chunk_at: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Hex digits of a chunk size.
    Size {
        value: u64,
        digits: u8,
    },
    /// After the size: whitespace and extensions up to CR.
    Ext {
        value: u64,
    },
    /// CR seen at the end of a size line.
    SizeLf {
        value: u64,
    },
    /// Data bytes left of the current chunk.
    Data(u64),
    DataCr,
    DataLf,
    /// At the start of a trailer line or of the final empty line.
    TrailerStart,
    TrailerLine,
    /// CR seen; `last` when it ended the empty line that ends the message.
    TrailerLf {
        last: bool,
    },
}

/// One step of a chunked body.
enum ChunkStep {
    /// Everything consumed; the body goes on.
    More,
    /// The whole body ended after `n` bytes.
    Done(usize),
    /// The byte at this offset is not valid here.
    Bad(usize),
}

enum HeadStep {
    Incomplete,
    /// The request line is whole and its target needs escaping first.
    Escape,
    Oversize,
    Bad(Violation),
    /// The head (and any first chunk-size line) is fine and `len` bytes long.
    Done {
        len: usize,
        next: State,
    },
}

impl Framing {
    /// A connection known to speak HTTP/1 (`sniff_h2` when an HTTP/2 preface may come first).
    pub fn http1(max_head: usize, sniff_h2: bool) -> Self {
        let state = if sniff_h2 {
            State::Preface
        } else {
            State::Head(HeadScan::default())
        };
        Self {
            state,
            max_head,
            http2: false,
            escape_targets: true,
            switch_asked: false,
        }
    }

    /// A connection that is not checked (HTTP/2 chosen by ALPN).
    pub fn off() -> Self {
        Self {
            state: State::Off,
            max_head: 0,
            http2: true,
            escape_targets: false,
            switch_asked: false,
        }
    }

    /// Leaves request targets as they are (`strict_uri`): bytes outside RFC 3986 reach the
    /// parser, which refuses most of them, and the service the rest.
    pub fn strict_targets(mut self, strict: bool) -> Self {
        self.escape_targets = !strict;
        self
    }

    /// Whether checking has stopped for good.
    pub fn is_off(&self) -> bool {
        matches!(self.state, State::Off)
    }

    /// Whether a request asked to switch protocols and checking goes on until it is known
    /// whether the switch happened.
    pub fn switch_asked(&self) -> bool {
        self.switch_asked && !self.is_off()
    }

    /// The connection switched protocols (a `101` went out): what follows is not HTTP/1.
    pub fn switched(&mut self) {
        self.state = State::Off;
    }

    /// Whether the connection speaks HTTP/2.
    pub fn is_http2(&self) -> bool {
        self.http2
    }

    /// Scans bytes in arrival order. After [`Scan::Hold`], the next call starts with the held
    /// bytes; after [`Scan::Reject`], [`Scan::Cut`] or [`Scan::Truncate`] checking stops.
    pub fn scan(&mut self, data: &[u8]) -> Scan {
        let mut at = 0;
        loop {
            match &mut self.state {
                State::Off => return Scan::Pass,
                State::Preface => {
                    let n = data.len().min(PREFACE.len());
                    if data[..n] != PREFACE[..n] {
                        self.state = State::Head(HeadScan::default());
                    } else if n < PREFACE.len() {
                        return Scan::Hold(0);
                    } else {
                        self.state = State::Off;
                        self.http2 = true;
                        return Scan::Pass;
                    }
                }
                State::Head(head) => {
                    match head.scan(&data[at..], self.max_head, self.escape_targets) {
                        HeadStep::Escape => {
                            self.state = State::Head(HeadScan::default());
                            return Scan::Escape(at);
                        }
                        HeadStep::Incomplete if at == data.len() => return Scan::Pass,
                        HeadStep::Incomplete => return Scan::Hold(at),
                        HeadStep::Oversize => {
                            self.state = State::Off;
                            return Scan::Truncate(at + self.max_head);
                        }
                        HeadStep::Bad(v) => {
                            self.state = State::Off;
                            return Scan::Reject(at, v);
                        }
                        HeadStep::Done { len, next } => {
                            self.switch_asked |= head.upgrade;
                            at += len;
                            self.state = next;
                        }
                    }
                }
                State::Body(left) => {
                    let n = (*left).min((data.len() - at) as u64);
                    *left -= n;
                    at += n as usize;
                    if *left > 0 {
                        return Scan::Pass;
                    }
                    self.state = State::Head(HeadScan::default());
                }
                State::Chunked(chunk) => match chunk.scan(&data[at..]) {
                    ChunkStep::More => return Scan::Pass,
                    ChunkStep::Done(n) => {
                        at += n;
                        self.state = State::Head(HeadScan::default());
                    }
                    ChunkStep::Bad(i) => {
                        self.state = State::Off;
                        return Scan::Cut(at + i, Violation::InvalidChunk);
                    }
                },
            }
        }
    }
}

impl HeadScan {
    fn scan(&mut self, data: &[u8], max_head: usize, escape_targets: bool) -> HeadStep {
        loop {
            if let Some(chunk) = self.first_chunk {
                return self.first_chunk_line(chunk, data);
            }
            let rest = &data[self.pos.min(data.len())..];
            // A head is oversized when its bytes so far, or its next line, go past the limit:
            // the same verdict whether the line arrives whole or in pieces.
            let Some(nl) = find_byte(rest, b'\n') else {
                return if data.len() > max_head {
                    HeadStep::Oversize
                } else {
                    HeadStep::Incomplete
                };
            };
            if self.pos + nl + 1 > max_head {
                return HeadStep::Oversize;
            }
            let Some(line) = rest[..nl].strip_suffix(b"\r") else {
                return HeadStep::Bad(Violation::BareLf);
            };
            self.pos += nl + 1;
            if !self.started {
                // Empty lines before a request line are ignored (RFC 9112 §2.2).
                if !line.is_empty() {
                    if escape_targets && needs_escape(target_of(line)) {
                        return HeadStep::Escape;
                    }
                    self.started = true;
                    self.upgrade = line.starts_with(b"CONNECT ");
                }
                continue;
            }
            if line.is_empty() {
                match self.end() {
                    Some(step) => return step,
                    // A chunked head: its first chunk-size line is checked next.
                    None => continue,
                }
            }
            if matches!(line[0], b' ' | b'\t') {
                return HeadStep::Bad(Violation::ObsFold);
            }
            if let Err(v) = self.header(line) {
                return HeadStep::Bad(v);
            }
        }
    }

    fn header(&mut self, line: &[u8]) -> Result<(), Violation> {
        // Only four names matter here, and their first letters rule out most lines (`Host`,
        // `Accept`, `User-Agent`, ...) before looking for the colon.
        if !matches!(line[0] | 0x20, b'c' | b't' | b'u' | b'e') {
            return Ok(());
        }
        // A line without a colon is the parser's to refuse.
        let Some(colon) = find_byte(line, b':') else {
            return Ok(());
        };
        let name = &line[..colon];
        // The value is trimmed only for the names that read it (`User-Agent`, `Cookie`,
        // `Connection` and the like start with the same letters).
        let value = || trim_ows(&line[colon + 1..]);
        if name.eq_ignore_ascii_case(b"content-length") {
            if self.length.is_some() {
                return Err(Violation::DuplicateLength);
            }
            self.length = Some(parse_length(value()).ok_or(Violation::InvalidLength)?);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            if self.chunked || !value().eq_ignore_ascii_case(b"chunked") {
                return Err(Violation::InvalidTransferEncoding);
            }
            self.chunked = true;
        } else if name.eq_ignore_ascii_case(b"upgrade") {
            self.upgrade = true;
        } else if name.eq_ignore_ascii_case(b"expect") {
            self.expect_continue = value().eq_ignore_ascii_case(b"100-continue");
        }
        Ok(())
    }

    /// The empty line ending the head was consumed; `None` when the first chunk-size line is
    /// to be checked before deciding.
    fn end(&mut self) -> Option<HeadStep> {
        if self.length.is_some() && self.chunked {
            return Some(HeadStep::Bad(Violation::LengthWithChunked));
        }
        if self.chunked && !self.expect_continue {
            self.first_chunk = Some(Chunk::Size {
                value: 0,
                digits: 0,
            });
            self.first_chunk_at = self.pos;
            return None;
        }
        let next = match (self.chunked, self.length) {
            (true, _) => State::Chunked(Chunk::Size {
                value: 0,
                digits: 0,
            }),
            (false, Some(n)) if n > 0 => State::Body(n),
            _ => State::Head(HeadScan::default()),
        };
        Some(HeadStep::Done {
            len: self.pos,
            next,
        })
    }

    /// Checks the first chunk-size line right after a chunked head, so a malformed one refuses
    /// the whole request.
    fn first_chunk_line(&mut self, mut chunk: Chunk, data: &[u8]) -> HeadStep {
        let mut i = self.pos;
        while i < data.len() {
            match chunk.step(data[i]) {
                Err(()) => return HeadStep::Bad(Violation::InvalidChunk),
                Ok(next) => chunk = next,
            }
            i += 1;
            if matches!(chunk, Chunk::Data(_) | Chunk::TrailerStart) {
                return HeadStep::Done {
                    len: i,
                    next: State::Chunked(chunk),
                };
            }
            if i - self.first_chunk_at >= MAX_FIRST_CHUNK_LINE {
                return HeadStep::Bad(Violation::InvalidChunk);
            }
        }
        self.pos = i;
        self.first_chunk = Some(chunk);
        HeadStep::Incomplete
    }
}

impl Chunk {
    fn scan(&mut self, data: &[u8]) -> ChunkStep {
        let mut i = 0;
        while i < data.len() {
            if let Chunk::Data(left) = self {
                let n = (*left).min((data.len() - i) as u64);
                *left -= n;
                i += n as usize;
                if *left == 0 {
                    *self = Chunk::DataCr;
                }
                continue;
            }
            let last = matches!(self, Chunk::TrailerLf { last: true });
            match self.step(data[i]) {
                Err(()) => return ChunkStep::Bad(i),
                Ok(next) => *self = next,
            }
            i += 1;
            if last {
                return ChunkStep::Done(i);
            }
        }
        ChunkStep::More
    }

    /// One byte outside chunk data (data is skipped in bulk by [`Chunk::scan`]).
    fn step(self, b: u8) -> Result<Chunk, ()> {
        Ok(match self {
            Chunk::Size { value, digits } => match b {
                b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' if digits < MAX_SIZE_DIGITS => {
                    let d = (b as char).to_digit(16).unwrap_or(0) as u64;
                    Chunk::Size {
                        value: (value << 4) | d,
                        digits: digits + 1,
                    }
                }
                b';' | b' ' | b'\t' if digits > 0 => Chunk::Ext { value },
                b'\r' if digits > 0 => Chunk::SizeLf { value },
                _ => return Err(()),
            },
            Chunk::Ext { value } => match b {
                b'\r' => Chunk::SizeLf { value },
                b'\t' => self,
                0..=0x1f | 0x7f => return Err(()),
                _ => self,
            },
            Chunk::SizeLf { value } => match b {
                b'\n' if value == 0 => Chunk::TrailerStart,
                b'\n' => Chunk::Data(value),
                _ => return Err(()),
            },
            Chunk::Data(_) => self,
            Chunk::DataCr => match b {
                b'\r' => Chunk::DataLf,
                _ => return Err(()),
            },
            Chunk::DataLf => match b {
                b'\n' => Chunk::Size {
                    value: 0,
                    digits: 0,
                },
                _ => return Err(()),
            },
            Chunk::TrailerStart => match b {
                b'\r' => Chunk::TrailerLf { last: true },
                b'\n' | b' ' | b'\t' => return Err(()),
                _ => Chunk::TrailerLine,
            },
            Chunk::TrailerLine => match b {
                b'\r' => Chunk::TrailerLf { last: false },
                b'\n' => return Err(()),
                _ => self,
            },
            Chunk::TrailerLf { .. } => match b {
                b'\n' => Chunk::TrailerStart,
                _ => return Err(()),
            },
        })
    }
}

/// Where `needle` first occurs in `hay`, eight bytes at a time. A head's lines are a few dozen
/// bytes, too short for a vectorised search to pay for its call and set-up.
#[inline]
fn find_byte(hay: &[u8], needle: u8) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let pattern = ONES * u64::from(needle);
    let mut at = 0;
    while let Some(word) = hay[at..].first_chunk::<8>() {
        // Bytes equal to the needle become zero; the lowest byte flagged here is always a
        // zero byte (a false flag can only sit above a true one), and little-endian order
        // makes the lowest byte the first in memory.
        let x = u64::from_le_bytes(*word) ^ pattern;
        let zeros = x.wrapping_sub(ONES) & !x & HIGHS;
        if zeros != 0 {
            return Some(at + (zeros.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    hay[at..].iter().position(|&b| b == needle).map(|i| at + i)
}

fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// `1*DIGIT`, nothing else (no sign, no list, no spaces inside), and no overflow.
fn parse_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    v.iter().try_fold(0u64, |n, d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

#[cfg(test)]
mod tests;
