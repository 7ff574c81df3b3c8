//! The gateway's one HTTP/1.1 codec, shared by its server side (the listeners, the fast path)
//! and its upstream client (the proxy): the request-stream framing and smuggling checks,
//! response heads written by the server and read by the client, request heads written by the
//! client, the chunked coding both ways, the field-line writer, the trailer rules and the
//! `Date` cache.
//!
//! It does no IO: everything here is a function or a state machine over bytes and `http`
//! types, so each rule lives once and is tested, and fuzzed, without a socket. Where a rule
//! needs to know a body, the caller says what it knows of it ([`BodyLength`]).

#![deny(missing_docs)]

pub mod date;
pub mod decode;
pub mod escape;
pub mod fields;
pub mod framing;
/// The fuzz targets' entry points (`http1/fuzz/`).
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod hop_by_hop;
pub mod request;
pub mod response;
pub mod trailers;

/// How a body the gateway writes is delimited (one it reads may also end with the connection:
/// [`decode::BodyFraming`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body bytes follow the head.
    Empty,
    /// Exactly this many bytes follow.
    Length(u64),
    /// The chunked transfer coding, trailers allowed.
    Chunked,
}

/// What a body to be written says of its length, as hyper's encoders read it: the caller
/// reads it off its body type (`is_end_stream`, then an exact `size_hint`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLength {
    /// The body has ended already.
    Empty,
    /// Exactly this many bytes.
    Known(u64),
    /// Not known before the body ends.
    Unknown,
}
