//! A body streamed from an object's file: pieces read on Tokio's blocking pool, one at a time,
//! so a large object never sits whole in memory and no worker thread waits on the disk. A whole
//! body is checked against its CRC before its last piece goes out: a file altered on disk
//! ends the answer short of its `Content-Length` (the client sees a failed transfer, never a
//! complete wrong one) and is removed.

use std::io;
use std::os::unix::fs::FileExt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::task::JoinHandle;

use super::Stored;
use super::file::CHUNK;

pub struct FileBody {
    stored: Arc<Stored>,
    /// Offsets in the body: the next byte to read, and the end.
    at: u64,
    end: u64,
    /// The CRC so far, when the whole body is sent.
    crc: Option<flate2::Crc>,
    reading: Option<JoinHandle<io::Result<Bytes>>>,
}

impl FileBody {
    /// Bytes `first..end` of the stored body.
    pub fn new(stored: Arc<Stored>, first: u64, end: u64) -> Self {
        let whole = first == 0 && end == stored.opened.body_len;
        Self {
            stored,
            at: first,
            end,
            crc: whole.then(flate2::Crc::new),
            reading: None,
        }
    }
}

impl HttpBody for FileBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        loop {
            if let Some(reading) = &mut this.reading {
                let read = ready!(Pin::new(reading).poll(cx));
                this.reading = None;
                let chunk = match read {
                    Ok(Ok(c)) => c,
                    Ok(Err(e)) => return Poll::Ready(Some(Err(e))),
                    Err(e) => return Poll::Ready(Some(Err(io::Error::other(e)))),
                };
                this.at += chunk.len() as u64;
                if let Some(crc) = &mut this.crc {
                    crc.update(&chunk);
                    if this.at == this.end && crc.sum() != this.stored.opened.body_crc {
                        this.stored.reject();
                        let e = io::Error::new(io::ErrorKind::InvalidData, "body CRC mismatch");
                        return Poll::Ready(Some(Err(e)));
                    }
                }
                return Poll::Ready(Some(Ok(Frame::data(chunk))));
            }
            if this.at >= this.end {
                return Poll::Ready(None);
            }
            let n = CHUNK.min((this.end - this.at) as usize);
            let offset = this.stored.opened.body_offset + this.at;
            let stored = this.stored.clone();
            this.reading = Some(tokio::task::spawn_blocking(move || {
                let mut buf = vec![0; n];
                stored.opened.file.read_exact_at(&mut buf, offset)?;
                Ok(Bytes::from(buf))
            }));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.reading.is_none() && self.at >= self.end
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.end - self.at)
    }
}
