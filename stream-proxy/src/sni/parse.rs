//! A TLS ClientHello reader that finds the `server_name` extension (RFC 6066) without decrypting
//! anything: a pure function over the bytes peeked so far, so it can be fuzzed and tested with
//! any split of the input.
//!
//! The ClientHello may span several TLS records (large key shares, many extensions) and each
//! record may arrive in several TCP segments, so the handshake message is reassembled from the
//! fragments of consecutive handshake records before it is parsed. Anything that is not a
//! well-formed ClientHello is `NotTls`: the caller treats a malformed hello like any other
//! non-TLS stream (fallback or close), and never panics on it.

/// What the bytes peeked so far say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientHello {
    /// A prefix of what may be a ClientHello: read more.
    Incomplete,
    /// Not a TLS ClientHello, or a malformed one.
    NotTls,
    /// A complete ClientHello without a usable host name.
    NoSni,
    /// The requested server name, lowercase, without a trailing dot.
    Sni(String),
}

const RECORD_HEADER: usize = 5;
const CONTENT_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: u16 = 0;
const NAME_TYPE_HOST: u8 = 0;
/// RFC 8446 §5.1: a record's plaintext is at most 2^14 bytes.
const MAX_RECORD: usize = 1 << 14;

/// Parses the start of a client's byte stream.
pub fn parse_client_hello(buf: &[u8]) -> ClientHello {
    match reassemble(buf) {
        Err(verdict) => verdict,
        Ok(message) => match parse_message(&message) {
            Some(Some(name)) => ClientHello::Sni(name),
            Some(None) => ClientHello::NoSni,
            None => ClientHello::NotTls,
        },
    }
}

/// The whole ClientHello handshake message (header and body) from consecutive handshake
/// records, or the verdict when it is not (yet) available.
fn reassemble(buf: &[u8]) -> Result<Vec<u8>, ClientHello> {
    let mut message = Vec::new();
    let mut pos = 0;
    loop {
        let Some(header) = buf.get(pos..pos + RECORD_HEADER) else {
            // Reject early on what we have: a wrong first byte needs no more data.
            return Err(check_partial_header(&buf[pos.min(buf.len())..]));
        };
        if header[0] != CONTENT_HANDSHAKE || header[1] != 3 {
            return Err(ClientHello::NotTls);
        }
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if len == 0 || len > MAX_RECORD {
            return Err(ClientHello::NotTls);
        }
        let body_start = pos + RECORD_HEADER;
        let available = &buf[body_start..buf.len().min(body_start + len)];
        message.extend_from_slice(available);
        if message.len() >= 4 {
            if message[0] != HANDSHAKE_CLIENT_HELLO {
                return Err(ClientHello::NotTls);
            }
            let want = 4 + u24(&message[1..4]);
            if message.len() >= want {
                message.truncate(want);
                return Ok(message);
            }
        }
        if available.len() < len {
            return Err(ClientHello::Incomplete);
        }
        pos = body_start + len;
    }
}

fn check_partial_header(part: &[u8]) -> ClientHello {
    match part {
        [t, ..] if *t != CONTENT_HANDSHAKE => ClientHello::NotTls,
        [_, major, ..] if *major != 3 => ClientHello::NotTls,
        _ => ClientHello::Incomplete,
    }
}

fn u24(b: &[u8]) -> usize {
    (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2])
}

/// `None`: malformed. `Some(None)`: well formed, no host name.
fn parse_message(message: &[u8]) -> Option<Option<String>> {
    let mut r = Reader(message.get(4..)?);
    r.take(2)?; // legacy_version
    r.take(32)?; // random
    let session_id = r.u8()?;
    if session_id > 32 {
        return None;
    }
    r.take(usize::from(session_id))?;
    let suites = r.u16()?;
    if suites == 0 || suites % 2 != 0 {
        return None;
    }
    r.take(usize::from(suites))?;
    let compression = r.u8()?;
    if compression == 0 {
        return None;
    }
    r.take(usize::from(compression))?;
    if r.0.is_empty() {
        // SSL 3.0-style hello without extensions.
        return Some(None);
    }
    let ext_len = usize::from(r.u16()?);
    let mut exts = Reader(r.take(ext_len)?);
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let len = usize::from(exts.u16()?);
        let data = exts.take(len)?;
        if kind == EXT_SERVER_NAME {
            return server_name(data).map(|name| name.and_then(host_name));
        }
    }
    Some(None)
}

/// The first host name in a `server_name` extension body.
fn server_name(data: &[u8]) -> Option<Option<&[u8]>> {
    let mut r = Reader(data);
    let list_len = usize::from(r.u16()?);
    let mut list = Reader(r.take(list_len)?);
    while !list.0.is_empty() {
        let kind = list.u8()?;
        let len = usize::from(list.u16()?);
        let name = list.take(len)?;
        if kind == NAME_TYPE_HOST {
            return Some(Some(name));
        }
    }
    Some(None)
}

/// A DNS host name as routing compares it; anything else (IP literals are not allowed in SNI,
/// control bytes, over-long names) counts as "no SNI".
fn host_name(raw: &[u8]) -> Option<String> {
    let raw = raw.strip_suffix(b".").unwrap_or(raw);
    let valid = !raw.is_empty()
        && raw.len() <= 253
        && raw
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    valid.then(|| String::from_utf8_lossy(raw).to_ascii_lowercase())
}

/// A bounds-checked cursor: every read is `None` past the end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
}

#[cfg(test)]
#[path = "parse_tests.rs"]
pub(crate) mod tests;
