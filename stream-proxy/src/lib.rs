//! L4 streams (TCP and UDP passthrough) and the upstream target selection shared with the HTTP
//! reverse proxy. Filled in by the stream-proxy work; the HTTP core only needs it to build.

pub mod upstream;
