//! The header names a VM's plugin writes, parsed once.
//!
//! A plugin sets the same few header names on every request, and `HeaderName::from_bytes`
//! checks every byte of one and copies a name outside the standard set into a new allocation,
//! which the header map then drops with the request. The VM keeps the names it parsed, by the
//! guest's own spelling, so that writing one again is a comparison and a reference-count
//! increment. The number kept is bounded, so a plugin that writes ever-new names costs no
//! more memory than a few names.

use http::header::HeaderName;

/// Names kept per VM: more than a plugin writes on a request, in practice.
const KEPT: usize = 16;
/// Names longer than this are parsed each time.
const LONGEST_KEPT: usize = 64;

/// The header names parsed so far, with the bytes the guest spelled them in.
#[derive(Default)]
pub(crate) struct HeaderNames {
    kept: Vec<(Box<[u8]>, HeaderName)>,
}

impl HeaderNames {
    /// The header name the guest wrote as `key` (lowercased), or `None` if it is not one.
    pub(crate) fn parse(&mut self, key: &[u8]) -> Option<HeaderName> {
        if let Some((_, name)) = self.kept.iter().find(|(spelled, _)| **spelled == *key) {
            return Some(name.clone());
        }
        let name = HeaderName::from_bytes(key).ok()?;
        if self.kept.len() < KEPT && key.len() <= LONGEST_KEPT {
            self.kept.push((key.into(), name.clone()));
        }
        Some(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_parsed_once_and_lowercased_and_invalid_ones_refused() {
        let mut names = HeaderNames::default();
        let first = names.parse(b"X-Bench").unwrap();
        assert_eq!(first.as_str(), "x-bench");
        assert_eq!(names.parse(b"X-Bench").unwrap(), first);
        assert_eq!(names.parse(b"x-bench").unwrap(), first);
        assert_eq!(names.kept.len(), 2, "each spelling is kept once");
        assert!(names.parse(b"bad name").is_none());
        assert!(names.parse(b"").is_none());
        assert_eq!(
            names.kept.len(),
            2,
            "nothing is kept for what is not a name"
        );
    }

    #[test]
    fn the_names_kept_are_bounded() {
        let mut names = HeaderNames::default();
        for i in 0..1000 {
            let key = format!("x-{i}");
            assert_eq!(names.parse(key.as_bytes()).unwrap().as_str(), key);
        }
        let long = "x".repeat(LONGEST_KEPT + 1);
        let mut fresh = HeaderNames::default();
        assert_eq!(fresh.parse(long.as_bytes()).unwrap().as_str(), long);
        assert_eq!(names.kept.len(), KEPT);
        assert!(fresh.kept.is_empty(), "a long name is not kept");
    }
}
