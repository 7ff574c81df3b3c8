//! The `Date` header line of responses written without hyper (the HTTP/1.1 fast path): one
//! formatted line per thread, rendered again only when the second changes, as hyper does for
//! its own responses. The second is read from the coarse wall clock (the kernel's last tick),
//! which costs a few loads where the precise clock costs a TSC read and a subtraction.

use std::cell::RefCell;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `date: Sun, 06 Nov 1994 08:49:37 GMT\r\n`
const LINE_LEN: usize = 6 + 29 + 2;

struct Cached {
    line: [u8; LINE_LEN],
    /// The whole second the line shows (seconds since the epoch).
    second: u64,
}

thread_local! {
    static CACHED: RefCell<Cached> = const {
        RefCell::new(Cached {
            line: [0; LINE_LEN],
            second: u64::MAX,
        })
    };
}

/// Appends the current `Date` header line (with its CRLF) to `out`.
pub(super) fn push_line(out: &mut Vec<u8>) {
    // The coarse clock lags the precise one by at most a kernel tick (1–10 ms): a `Date` that
    // turns over that much late, well inside the second it shows.
    let mut second = stream_proxy::clock::coarse_unix_secs();
    if second == 0 {
        second = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
    }
    CACHED.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.second != second {
            let text = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(second));
            let line = &mut cached.line;
            line[..6].copy_from_slice(b"date: ");
            // An HTTP-date is always 29 bytes; were it ever not, the line keeps its old text
            // rather than a torn one.
            if text.len() == 29 {
                line[6..35].copy_from_slice(text.as_bytes());
                line[35..].copy_from_slice(b"\r\n");
                cached.second = second;
            }
        }
        out.extend_from_slice(&cached.line);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_is_a_parseable_http_date_of_now() {
        let mut out = Vec::new();
        push_line(&mut out);
        let text = std::str::from_utf8(&out).unwrap();
        let value = text
            .strip_prefix("date: ")
            .and_then(|t| t.strip_suffix("\r\n"))
            .unwrap();
        let when = httpdate::parse_http_date(value).unwrap();
        let age = SystemTime::now().duration_since(when).unwrap();
        assert!(age.as_secs() <= 2, "{text:?}");
        // A second call in the same second appends the same line.
        let mut again = Vec::new();
        push_line(&mut again);
        assert_eq!(again.len(), LINE_LEN);
    }
}
