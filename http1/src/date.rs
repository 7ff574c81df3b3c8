//! The `Date` field line of responses the gateway writes itself (the server's fast path, the
//! responses it encodes for the service): one formatted line per thread, rendered again only
//! when the second changes, as hyper does for its own responses. The caller says which second
//! it is: the gateway reads it from the coarse wall clock (the kernel's last tick), which costs
//! a few loads where the precise clock costs a TSC read and a subtraction.

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

/// Appends the `Date` field line (with its CRLF) of `second`, whole seconds since the Unix
/// epoch, to `out`. A `second` of 0 is a clock that could not be read: the system clock is
/// asked instead.
pub fn push_field(out: &mut Vec<u8>, mut second: u64) {
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
        // 0: the caller's clock failed, and the system clock gives the second.
        push_field(&mut out, 0);
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
        push_field(&mut again, 0);
        assert_eq!(again.len(), LINE_LEN);
    }

    #[test]
    fn the_line_shows_the_second_it_is_given() {
        let mut out = Vec::new();
        push_field(&mut out, 784_111_777);
        push_field(&mut out, 784_111_778);
        assert_eq!(
            out,
            b"date: Sun, 06 Nov 1994 08:49:37 GMT\r\ndate: Sun, 06 Nov 1994 08:49:38 GMT\r\n"
        );
    }
}
