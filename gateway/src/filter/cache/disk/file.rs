//! One object file of the disk tier: a fixed prelude (magic with the format's version, the
//! head's and the body's lengths, a CRC-32 of each), the head (status, freshness, keys, header
//! fields), then the body. A file is written under a temporary name and renamed into place, so
//! a reader sees a whole file or none; the lengths and CRCs catch a file cut short by a crash
//! or altered on disk. Its name is a hash of its primary and variant keys, two directory
//! levels down (as nginx's `levels=1:2`), so that no directory grows huge.

use std::fs::File;
use std::io::{self, ErrorKind, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use sha2::{Digest, Sha256};

use super::super::store::{Object, Payload};

/// Where a body being written comes from.
pub enum Source<'a> {
    Bytes(&'a [u8]),
    /// The body of another object's file (a refreshed head over the same body).
    File(&'a Opened),
}

/// The format's version is the magic's last byte: a file of another version is rejected.
pub const MAGIC: &[u8; 8] = b"GWCACHE\x01";
/// Magic, head length (u32), body length (u64), head CRC (u32), body CRC (u32).
pub const PRELUDE: usize = 8 + 4 + 8 + 4 + 4;
/// Bodies are copied and streamed in pieces of this size.
pub const CHUNK: usize = 64 * 1024;
/// A head larger than this is not one the gateway wrote.
const MAX_HEAD: usize = 1 << 20;

/// The name of an object's file: a hash of its primary and variant keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Id([u8; 16]);

impl Id {
    pub fn of(primary: &str, variant: &str) -> Self {
        let mut h = Sha256::new();
        h.update(primary.as_bytes());
        h.update([0]);
        h.update(variant.as_bytes());
        let mut id = [0; 16];
        id.copy_from_slice(&h.finalize()[..16]);
        Self(id)
    }

    fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses a file name.
    pub fn parse(name: &str) -> Option<Self> {
        if name.len() != 32 {
            return None;
        }
        let mut id = [0; 16];
        for (i, b) in id.iter_mut().enumerate() {
            *b = u8::from_str_radix(name.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Self(id))
    }

    /// Its path under `root`: the last hex digit, then the two before it, then the name.
    pub fn path(&self, root: &Path) -> PathBuf {
        let hex = self.hex();
        root.join(&hex[31..]).join(&hex[29..31]).join(hex)
    }
}

/// What the head of a file says.
pub struct Head {
    pub primary: String,
    pub variant: String,
    pub object: Object,
}

/// An object's file opened for reading its body.
#[derive(Debug)]
pub struct Opened {
    pub file: File,
    pub body_offset: u64,
    pub body_len: u64,
    pub body_crc: u32,
}

fn bad(why: &'static str) -> io::Error {
    io::Error::new(ErrorKind::InvalidData, why)
}

fn crc(parts: &[&[u8]]) -> u32 {
    let mut c = flate2::Crc::new();
    parts.iter().for_each(|p| c.update(p));
    c.sum()
}

fn millis(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

fn put_str(b: &mut BytesMut, s: &[u8]) {
    b.put_u32(s.len() as u32);
    b.put_slice(s);
}

/// The head of `object` stored under `primary` and `variant`; its age is carried as the
/// wall-clock time it was stored at, so a restart ages it right.
pub fn encode_head(primary: &str, variant: &str, object: &Object) -> Bytes {
    let mut b = BytesMut::with_capacity(256);
    let stored_at = SystemTime::now() - object.stored.elapsed();
    b.put_u16(object.status.as_u16());
    b.put_u64(millis(
        stored_at.duration_since(UNIX_EPOCH).unwrap_or_default(),
    ));
    for d in [
        object.initial_age,
        object.lifetime,
        object.stale_while_revalidate,
        object.stale_if_error,
    ] {
        b.put_u64(millis(d));
    }
    b.put_u8(object.always_revalidate.into());
    for s in [primary, variant, object.path.as_str()] {
        put_str(&mut b, s.as_bytes());
    }
    b.put_u32(object.vary.len() as u32);
    for v in &object.vary {
        put_str(&mut b, v.as_str().as_bytes());
    }
    b.put_u32(object.headers.len() as u32);
    for (name, value) in &object.headers {
        put_str(&mut b, name.as_str().as_bytes());
        put_str(&mut b, value.as_bytes());
    }
    b.freeze()
}

/// A reader of untrusted head bytes: every read is bounds-checked.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> io::Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(bad("head cut short"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }

    fn u64(&mut self) -> io::Result<u64> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("8")))
    }

    fn u32(&mut self) -> io::Result<u32> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4")))
    }

    fn bytes(&mut self) -> io::Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    fn string(&mut self) -> io::Result<String> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| bad("key not UTF-8"))
    }
}

/// Decodes a head written by [`encode_head`]; the object's body is left empty.
pub fn decode_head(head: &[u8]) -> io::Result<Head> {
    let mut c = Cursor(head);
    let status = u16::from_be_bytes(c.take(2)?.try_into().expect("2"));
    let status = StatusCode::from_u16(status).map_err(|_| bad("bad status"))?;
    let stored_at = UNIX_EPOCH + Duration::from_millis(c.u64()?);
    let mut d = [Duration::ZERO; 4];
    for x in &mut d {
        *x = Duration::from_millis(c.u64()?);
    }
    let always_revalidate = c.take(1)?[0] != 0;
    let (primary, variant, path) = (c.string()?, c.string()?, c.string()?);
    let n = c.u32()? as usize;
    let mut vary = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        vary.push(HeaderName::from_bytes(c.bytes()?).map_err(|_| bad("bad vary name"))?);
    }
    let n = c.u32()? as usize;
    let mut headers = HeaderMap::with_capacity(n.min(256));
    for _ in 0..n {
        let name = HeaderName::from_bytes(c.bytes()?).map_err(|_| bad("bad header name"))?;
        let value = HeaderValue::from_bytes(c.bytes()?).map_err(|_| bad("bad header value"))?;
        headers.append(name, value);
    }
    if !c.0.is_empty() {
        return Err(bad("bytes after the head"));
    }
    // The time it spent on disk (a clock set back counts as none) adds to its age.
    let on_disk = SystemTime::now()
        .duration_since(stored_at)
        .unwrap_or_default();
    let object = Object {
        status,
        headers,
        body: Payload::Memory(Bytes::new()),
        path,
        stored: tokio::time::Instant::now(),
        initial_age: d[0] + on_disk,
        lifetime: d[1],
        always_revalidate,
        stale_while_revalidate: d[2],
        stale_if_error: d[3],
        vary,
    };
    Ok(Head {
        primary,
        variant,
        object,
    })
}

/// A file being written, under a temporary name beside its final one until
/// [`Partial::finish`] renames it into place. Dropped unfinished, it leaves nothing at either
/// name: the index no longer counts a version it replaces.
pub struct Partial {
    file: File,
    tmp: PathBuf,
    path: PathBuf,
    head_len: u32,
    head_crc: u32,
    crc: flate2::Crc,
    len: u64,
    done: bool,
}

impl Partial {
    /// Starts the file of `id` with `head`; `tag` tells apart the temporary names of writes of
    /// one object at once.
    pub fn begin(root: &Path, id: Id, tag: &str, head: &[u8]) -> io::Result<Self> {
        let path = id.path(root);
        std::fs::create_dir_all(path.parent().expect("two levels under the root"))?;
        let tmp = path.with_file_name(format!("{}.{tag}.tmp", id.hex()));
        let file = File::create(&tmp)?;
        let mut p = Self {
            file,
            tmp,
            path,
            head_len: head.len() as u32,
            head_crc: crc(&[head]),
            crc: flate2::Crc::new(),
            len: 0,
            done: false,
        };
        p.file.write_all(&[0; PRELUDE])?;
        p.file.write_all(head)?;
        Ok(p)
    }

    /// Appends a piece of the body.
    pub fn push(&mut self, piece: &[u8]) -> io::Result<()> {
        self.file.write_all(piece)?;
        self.crc.update(piece);
        self.len += piece.len() as u64;
        Ok(())
    }

    /// Writes the prelude and renames the file into place: its size.
    pub fn finish(mut self) -> io::Result<u64> {
        let mut prelude = BytesMut::with_capacity(PRELUDE);
        prelude.put_slice(MAGIC);
        prelude.put_u32(self.head_len);
        prelude.put_u64(self.len);
        prelude.put_u32(self.head_crc);
        prelude.put_u32(self.crc.sum());
        self.file.write_all_at(&prelude, 0)?;
        std::fs::rename(&self.tmp, &self.path)?;
        self.done = true;
        Ok((PRELUDE as u64) + u64::from(self.head_len) + self.len)
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.tmp);
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Writes an object's file whole ([`Partial`]): its size.
pub fn write(root: &Path, id: Id, tag: &str, head: &[u8], body: Source<'_>) -> io::Result<u64> {
    let mut p = Partial::begin(root, id, tag, head)?;
    match body {
        Source::Bytes(b) => p.push(b)?,
        Source::File(src) => {
            let mut buf = vec![0; CHUNK];
            let mut at = 0;
            while at < src.body_len {
                let n = CHUNK.min((src.body_len - at) as usize);
                src.file
                    .read_exact_at(&mut buf[..n], src.body_offset + at)?;
                p.push(&buf[..n])?;
                at += n as u64;
            }
            if p.crc.sum() != src.body_crc {
                return Err(bad("body CRC mismatch"));
            }
        }
    }
    p.finish()
}

/// A file's prelude, read.
struct Prelude {
    head_len: usize,
    body_len: u64,
    head_crc: u32,
    body_crc: u32,
}

impl Prelude {
    /// Reads the prelude of a file of `len` bytes: of this version, and its lengths adding up.
    fn check(prelude: &[u8; PRELUDE], len: u64) -> io::Result<Self> {
        if &prelude[..8] != MAGIC {
            return Err(bad("not a cache file of this version"));
        }
        let word = |at: usize| u32::from_be_bytes(prelude[at..at + 4].try_into().expect("4"));
        let head_len = word(8) as usize;
        let body_len = u64::from_be_bytes(prelude[12..20].try_into().expect("8"));
        if head_len > MAX_HEAD {
            return Err(bad("head too large"));
        }
        if ((PRELUDE + head_len) as u64).checked_add(body_len) != Some(len) {
            return Err(bad("length differs from the prelude's"));
        }
        Ok(Self {
            head_len,
            body_len,
            head_crc: word(20),
            body_crc: word(24),
        })
    }
}

/// Untrusted bytes as a whole cache file (its prelude and head) and as a head alone: neither
/// may panic. The `cache_file` fuzz target; the CRC is not required, so that altered heads
/// get decoded.
#[cfg(any(test, feature = "fuzzing"))]
pub fn check_untrusted(data: &[u8]) {
    let _ = decode_head(data);
    if let Some(prelude) = data.first_chunk::<PRELUDE>()
        && let Ok(p) = Prelude::check(prelude, data.len() as u64)
    {
        let _ = decode_head(&data[PRELUDE..PRELUDE + p.head_len]);
    }
}

/// Opens `path` and checks its prelude and head: an `InvalidData` error for a file of another
/// version, altered or cut short.
pub fn open(path: &Path) -> io::Result<(Head, Opened)> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut prelude = [0; PRELUDE];
    file.read_exact(&mut prelude).map_err(|e| match e.kind() {
        ErrorKind::UnexpectedEof => bad("shorter than a prelude"),
        _ => e,
    })?;
    let Prelude {
        head_len,
        body_len,
        head_crc,
        body_crc,
    } = Prelude::check(&prelude, len)?;
    let body_offset = (PRELUDE + head_len) as u64;
    let mut head = vec![0; head_len];
    file.read_exact(&mut head)?;
    if crc(&[&head]) != head_crc {
        return Err(bad("head CRC mismatch"));
    }
    let head = decode_head(&head)?;
    let opened = Opened {
        file,
        body_offset,
        body_len,
        body_crc,
    };
    Ok((head, opened))
}

/// Reads a whole body, checking its CRC.
pub fn read_body(o: &Opened) -> io::Result<Bytes> {
    let mut body = vec![0; o.body_len as usize];
    o.file.read_exact_at(&mut body, o.body_offset)?;
    if crc(&[&body]) != o.body_crc {
        return Err(bad("body CRC mismatch"));
    }
    Ok(body.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(body: &'static [u8]) -> Object {
        let mut headers = HeaderMap::new();
        headers.insert("etag", HeaderValue::from_static("\"x\""));
        headers.append("x-two", HeaderValue::from_static("a"));
        headers.append("x-two", HeaderValue::from_static("b"));
        Object {
            status: StatusCode::OK,
            headers,
            body: Payload::Memory(Bytes::from_static(body)),
            path: "/p".into(),
            stored: tokio::time::Instant::now(),
            initial_age: Duration::from_secs(3),
            lifetime: Duration::from_secs(60),
            always_revalidate: false,
            stale_while_revalidate: Duration::from_secs(5),
            stale_if_error: Duration::ZERO,
            vary: vec![HeaderName::from_static("accept-language")],
        }
    }

    #[test]
    fn a_written_file_reads_back_and_an_altered_one_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let id = Id::of("GET\nh\n/p\n\n", "accept-language:en\n");
        assert_eq!(Id::parse(&id.hex()), Some(id));
        let obj = object(b"hello body");
        let head = encode_head("GET\nh\n/p\n\n", "accept-language:en\n", &obj);
        let size = write(dir.path(), id, "t", &head, Source::Bytes(b"hello body")).unwrap();
        let path = id.path(dir.path());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
        let (head, opened) = open(&path).unwrap();
        assert_eq!(head.variant, "accept-language:en\n");
        assert_eq!(head.object.headers.get_all("x-two").iter().count(), 2);
        assert_eq!(head.object.vary, obj.vary);
        assert!(head.object.initial_age >= Duration::from_secs(3));
        assert_eq!(&read_body(&opened).unwrap()[..], b"hello body");

        let bytes = std::fs::read(&path).unwrap();
        let kind = |b: &[u8]| {
            std::fs::write(&path, b).unwrap();
            open(&path).err().map(|e| e.kind())
        };
        assert_eq!(
            kind(&bytes[..bytes.len() - 1]),
            Some(ErrorKind::InvalidData)
        );
        assert_eq!(kind(&bytes[..10]), Some(ErrorKind::InvalidData));
        let mut flipped = bytes.clone();
        flipped[PRELUDE + 3] ^= 1;
        assert_eq!(kind(&flipped), Some(ErrorKind::InvalidData));
        let mut version = bytes.clone();
        version[7] = 2;
        assert_eq!(kind(&version), Some(ErrorKind::InvalidData));
        let mut body = bytes.clone();
        *body.last_mut().unwrap() ^= 1;
        std::fs::write(&path, &body).unwrap();
        let (_, opened) = open(&path).unwrap();
        assert_eq!(
            read_body(&opened).unwrap_err().kind(),
            ErrorKind::InvalidData
        );
    }

    #[test]
    fn a_refreshed_head_is_written_over_the_body_of_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (Id::of("a", ""), Id::of("b", ""));
        let obj = object(b"shared body");
        let body = Source::Bytes(b"shared body");
        write(dir.path(), a, "t", &encode_head("a", "", &obj), body).unwrap();
        let (_, src) = open(&a.path(dir.path())).unwrap();
        write(
            dir.path(),
            b,
            "t",
            &encode_head("b", "", &obj),
            Source::File(&src),
        )
        .unwrap();
        let (head, opened) = open(&b.path(dir.path())).unwrap();
        assert_eq!(head.primary, "b");
        assert_eq!(&read_body(&opened).unwrap()[..], b"shared body");
    }

    #[test]
    fn hostile_heads_do_not_panic() {
        let obj = object(b"");
        let head = encode_head("k", "v", &obj);
        for cut in 0..head.len() {
            assert!(decode_head(&head[..cut]).is_err());
        }
        let mut huge = head.to_vec();
        huge[2 + 8 * 5 + 1..2 + 8 * 5 + 5].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode_head(&huge).is_err());
    }
}
