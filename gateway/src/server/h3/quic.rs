//! h3's QUIC traits over quinn, for the server side. It follows h3-quinn (the reference
//! adapter) with two differences the gateway needs:
//!
//! * finishing a send stream waits until the peer has acknowledged all of its data (quinn's
//!   `stopped()`), so a request task ends when its response is delivered and a draining
//!   connection can close right after its last request without discarding unsent bytes;
//! * request streams that arrived as 0-RTT early data are noted (quinn knows per stream), so
//!   the connection can answer unsafe methods on them with 425 Too Early.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use h3::error::Code;
use h3::quic::{self, ConnectionErrorIncoming, StreamErrorIncoming, StreamId, WriteBuf};
use quinn::VarInt;
use tokio_util::sync::ReusableBoxFuture;

type Accepted<T> = Pin<Box<dyn Future<Output = Result<T, quinn::ConnectionError>> + Send + Sync>>;
type Bidi = (quinn::SendStream, quinn::RecvStream);

/// Highest 0-RTT request stream id seen, plus one (0: none). Clients open streams in order,
/// so every stream at or below it was opened before the handshake completed.
#[derive(Debug, Default)]
pub(super) struct EarlyStreams(AtomicU64);

impl EarlyStreams {
    fn note(&self, id: quinn::StreamId) {
        self.0.fetch_max(u64::from(id) + 1, Ordering::Relaxed);
    }

    /// Whether request stream `id` arrived as early data.
    pub(super) fn contains(&self, id: StreamId) -> bool {
        id.into_inner() < self.0.load(Ordering::Relaxed)
    }
}

/// A server connection for h3.
pub(super) struct Connection {
    conn: quinn::Connection,
    accepting_bi: Option<Accepted<Bidi>>,
    accepting_uni: Option<Accepted<quinn::RecvStream>>,
    opener: Opener,
    early: Arc<EarlyStreams>,
}

impl Connection {
    pub(super) fn new(conn: quinn::Connection, early: Arc<EarlyStreams>) -> Self {
        Self {
            opener: Opener::new(conn.clone()),
            conn,
            accepting_bi: None,
            accepting_uni: None,
            early,
        }
    }
}

fn poll_accept<T>(
    slot: &mut Option<Accepted<T>>,
    conn: &quinn::Connection,
    start: impl FnOnce(quinn::Connection) -> Accepted<T>,
    cx: &mut Context<'_>,
) -> Poll<Result<T, ConnectionErrorIncoming>> {
    let fut = slot.get_or_insert_with(|| start(conn.clone()));
    let res = ready!(fut.as_mut().poll(cx));
    *slot = None;
    Poll::Ready(res.map_err(connection_error))
}

impl<B: Buf> quic::Connection<B> for Connection {
    type RecvStream = RecvStream;
    type OpenStreams = Opener;

    fn poll_accept_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<RecvStream, ConnectionErrorIncoming>> {
        let start = |c: quinn::Connection| -> Accepted<quinn::RecvStream> {
            Box::pin(async move { c.accept_uni().await })
        };
        let recv = ready!(poll_accept(&mut self.accepting_uni, &self.conn, start, cx))?;
        Poll::Ready(RecvStream::new(recv))
    }

    fn poll_accept_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<BidiStream<B>, ConnectionErrorIncoming>> {
        let start = |c: quinn::Connection| -> Accepted<Bidi> {
            Box::pin(async move { c.accept_bi().await })
        };
        let (send, recv) = ready!(poll_accept(&mut self.accepting_bi, &self.conn, start, cx))?;
        if recv.is_0rtt() {
            self.early.note(recv.id());
        }
        Poll::Ready(BidiStream::new(send, recv))
    }

    fn opener(&self) -> Opener {
        Opener::new(self.conn.clone())
    }
}

impl<B: Buf> quic::OpenStreams<B> for Connection {
    type BidiStream = BidiStream<B>;
    type SendStream = SendStream<B>;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<BidiStream<B>, StreamErrorIncoming>> {
        self.opener.poll_open_bidi(cx)
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<SendStream<B>, StreamErrorIncoming>> {
        self.opener.poll_open_send(cx)
    }

    fn close(&mut self, code: Code, reason: &[u8]) {
        quic::OpenStreams::<B>::close(&mut self.opener, code, reason);
    }
}

/// Opens the server's own streams (h3's control and QPACK streams).
pub(super) struct Opener {
    conn: quinn::Connection,
    opening_bi: Option<Accepted<Bidi>>,
    opening_uni: Option<Accepted<quinn::SendStream>>,
}

impl Opener {
    fn new(conn: quinn::Connection) -> Self {
        Self {
            conn,
            opening_bi: None,
            opening_uni: None,
        }
    }
}

fn stream_error(e: ConnectionErrorIncoming) -> StreamErrorIncoming {
    StreamErrorIncoming::ConnectionErrorIncoming {
        connection_error: e,
    }
}

impl<B: Buf> quic::OpenStreams<B> for Opener {
    type BidiStream = BidiStream<B>;
    type SendStream = SendStream<B>;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<BidiStream<B>, StreamErrorIncoming>> {
        let start =
            |c: quinn::Connection| -> Accepted<Bidi> { Box::pin(async move { c.open_bi().await }) };
        let (send, recv) = ready!(poll_accept(&mut self.opening_bi, &self.conn, start, cx))
            .map_err(stream_error)?;
        Poll::Ready(BidiStream::new(send, recv).map_err(stream_error))
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<SendStream<B>, StreamErrorIncoming>> {
        let start = |c: quinn::Connection| -> Accepted<quinn::SendStream> {
            Box::pin(async move { c.open_uni().await })
        };
        let send = ready!(poll_accept(&mut self.opening_uni, &self.conn, start, cx))
            .map_err(stream_error)?;
        Poll::Ready(SendStream::new(send).map_err(stream_error))
    }

    fn close(&mut self, code: Code, reason: &[u8]) {
        let code = VarInt::from_u64(code.value()).unwrap_or(VarInt::MAX);
        self.conn.close(code, reason);
    }
}

/// A request stream, both directions.
pub(super) struct BidiStream<B: Buf> {
    send: SendStream<B>,
    recv: RecvStream,
}

impl<B: Buf> BidiStream<B> {
    fn new(
        send: quinn::SendStream,
        recv: quinn::RecvStream,
    ) -> Result<Self, ConnectionErrorIncoming> {
        Ok(Self {
            send: SendStream::new(send)?,
            recv: RecvStream::new(recv)?,
        })
    }
}

impl<B: Buf> quic::BidiStream<B> for BidiStream<B> {
    type SendStream = SendStream<B>;
    type RecvStream = RecvStream;

    fn split(self) -> (SendStream<B>, RecvStream) {
        (self.send, self.recv)
    }
}

impl<B: Buf> quic::RecvStream for BidiStream<B> {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        self.recv.poll_data(cx)
    }

    fn stop_sending(&mut self, error_code: u64) {
        self.recv.stop_sending(error_code);
    }

    fn recv_id(&self) -> StreamId {
        self.recv.recv_id()
    }
}

impl<B: Buf> quic::SendStream<B> for BidiStream<B> {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.send.poll_ready(cx)
    }

    fn send_data<T: Into<WriteBuf<B>>>(&mut self, data: T) -> Result<(), StreamErrorIncoming> {
        self.send.send_data(data)
    }

    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.send.poll_finish(cx)
    }

    fn reset(&mut self, reset_code: u64) {
        self.send.reset(reset_code);
    }

    fn send_id(&self) -> StreamId {
        self.send.send_id()
    }
}

type ReadChunk = (
    quinn::RecvStream,
    Result<Option<quinn::Chunk>, quinn::ReadError>,
);

/// The receiving half of a stream.
pub(super) struct RecvStream {
    stream: Option<quinn::RecvStream>,
    id: StreamId,
    reading: ReusableBoxFuture<'static, ReadChunk>,
}

impl RecvStream {
    fn new(stream: quinn::RecvStream) -> Result<Self, ConnectionErrorIncoming> {
        Ok(Self {
            id: to_h3_id(stream.id())?,
            stream: Some(stream),
            // Replaced before its first poll; allocated once, reused for every read.
            reading: ReusableBoxFuture::new(std::future::pending()),
        })
    }
}

impl quic::RecvStream for RecvStream {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        if let Some(mut stream) = self.stream.take() {
            self.reading.set(async move {
                let chunk = stream.read_chunk(usize::MAX, true).await;
                (stream, chunk)
            });
        }
        let (stream, chunk) = ready!(self.reading.poll(cx));
        self.stream = Some(stream);
        Poll::Ready(chunk.map(|c| c.map(|c| c.bytes)).map_err(read_error))
    }

    fn stop_sending(&mut self, error_code: u64) {
        if let Some(s) = self.stream.as_mut() {
            let _ = s.stop(VarInt::from_u64(error_code).unwrap_or(VarInt::MAX));
        }
    }

    fn recv_id(&self) -> StreamId {
        self.id
    }
}

type Stopped =
    Pin<Box<dyn Future<Output = Result<Option<VarInt>, quinn::StoppedError>> + Send + Sync>>;

/// The sending half of a stream.
pub(super) struct SendStream<B: Buf> {
    stream: quinn::SendStream,
    id: StreamId,
    writing: Option<WriteBuf<B>>,
    finish: Finish,
}

/// Where finishing a send stream is.
enum Finish {
    Open,
    /// FIN sent; resolves when the peer has acknowledged everything (or stopped reading).
    Acking(Stopped),
    Done,
}

impl<B: Buf> SendStream<B> {
    fn new(stream: quinn::SendStream) -> Result<Self, ConnectionErrorIncoming> {
        Ok(Self {
            id: to_h3_id(stream.id())?,
            stream,
            writing: None,
            finish: Finish::Open,
        })
    }
}

impl<B: Buf> quic::SendStream<B> for SendStream<B> {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        if let Some(data) = self.writing.as_mut() {
            while data.has_remaining() {
                let n = ready!(Pin::new(&mut self.stream).poll_write(cx, data.chunk()))
                    .map_err(write_error)?;
                data.advance(n);
            }
        }
        self.writing = None;
        Poll::Ready(Ok(()))
    }

    fn send_data<T: Into<WriteBuf<B>>>(&mut self, data: T) -> Result<(), StreamErrorIncoming> {
        if self.writing.is_some() {
            // h3 always waits for poll_ready first; refuse rather than drop data if it did not.
            return Err(StreamErrorIncoming::ConnectionErrorIncoming {
                connection_error: ConnectionErrorIncoming::InternalError(
                    "send_data while a write is pending".into(),
                ),
            });
        }
        self.writing = Some(data.into());
        Ok(())
    }

    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        if let Finish::Open = self.finish {
            // An error means the stream was already finished or reset: nothing left to wait for.
            self.finish = match self.stream.finish() {
                Ok(()) => Finish::Acking(Box::pin(self.stream.stopped())),
                Err(_) => Finish::Done,
            };
        }
        let Finish::Acking(stopped) = &mut self.finish else {
            return Poll::Ready(Ok(()));
        };
        let res = ready!(stopped.as_mut().poll(cx));
        self.finish = Finish::Done;
        match res {
            // All acknowledged, or the peer stopped reading (its choice; nothing is lost to us).
            Ok(_) => Poll::Ready(Ok(())),
            Err(quinn::StoppedError::ConnectionLost(e)) => {
                Poll::Ready(Err(stream_error(connection_error(e))))
            }
            Err(e) => Poll::Ready(Err(StreamErrorIncoming::Unknown(Box::new(e)))),
        }
    }

    fn reset(&mut self, reset_code: u64) {
        let _ = self
            .stream
            .reset(VarInt::from_u64(reset_code).unwrap_or(VarInt::MAX));
    }

    fn send_id(&self) -> StreamId {
        self.id
    }
}

/// Both are 62-bit QUIC stream ids, so quinn's always convert; the error is for form's sake.
fn to_h3_id(id: quinn::StreamId) -> Result<StreamId, ConnectionErrorIncoming> {
    StreamId::try_from(u64::from(id))
        .map_err(|e| ConnectionErrorIncoming::InternalError(e.to_string()))
}

fn connection_error(e: quinn::ConnectionError) -> ConnectionErrorIncoming {
    match e {
        quinn::ConnectionError::ApplicationClosed(close) => {
            ConnectionErrorIncoming::ApplicationClose {
                error_code: close.error_code.into_inner(),
            }
        }
        quinn::ConnectionError::TimedOut => ConnectionErrorIncoming::Timeout,
        other => ConnectionErrorIncoming::Undefined(Arc::new(other)),
    }
}

fn read_error(e: quinn::ReadError) -> StreamErrorIncoming {
    match e {
        quinn::ReadError::Reset(code) => StreamErrorIncoming::StreamTerminated {
            error_code: code.into_inner(),
        },
        quinn::ReadError::ConnectionLost(e) => stream_error(connection_error(e)),
        other => StreamErrorIncoming::Unknown(Box::new(other)),
    }
}

fn write_error(e: quinn::WriteError) -> StreamErrorIncoming {
    match e {
        quinn::WriteError::Stopped(code) => StreamErrorIncoming::StreamTerminated {
            error_code: code.into_inner(),
        },
        quinn::WriteError::ConnectionLost(e) => stream_error(connection_error(e)),
        other => StreamErrorIncoming::Unknown(Box::new(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn early_streams_cover_everything_up_to_the_last_0rtt_one() {
        let early = EarlyStreams::default();
        let id = |n: u64| StreamId::try_from(n).unwrap();
        assert!(!early.contains(id(0)), "nothing noted yet");
        early.note(quinn::StreamId::from(VarInt::from_u32(4)));
        assert!(early.contains(id(0)));
        assert!(early.contains(id(4)));
        assert!(!early.contains(id(8)), "opened after the handshake");
    }
}
