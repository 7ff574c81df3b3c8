//! Server name → route lookup, built once per config generation. Exact names win over
//! wildcards; among wildcards the longest suffix wins. A wildcard `*.b.example.com` matches any
//! name ending in `.b.example.com` at any depth (`x.b.example.com`, `y.x.b.example.com`) but
//! not `b.example.com` itself, the same rule as the HTTP router's `*.example.com` hosts.

use std::collections::HashMap;

/// A compiled `sni_routes` table mapping names to values (upstream indices).
#[derive(Debug, Clone)]
pub struct SniRoutes<T> {
    exact: HashMap<Box<str>, T>,
    /// `(".b.example.com", value)`, longest suffix first.
    wildcards: Vec<(Box<str>, T)>,
}

impl<T> SniRoutes<T> {
    /// Builds the table from `(pattern, value)` pairs; patterns are compared case-insensitively
    /// and without a trailing dot. The first of two equal patterns wins.
    pub fn new(routes: impl IntoIterator<Item = (String, T)>) -> Self {
        let mut exact = HashMap::new();
        let mut wildcards: Vec<(Box<str>, T)> = Vec::new();
        for (pattern, value) in routes {
            let pattern = pattern.trim_end_matches('.').to_ascii_lowercase();
            match pattern.strip_prefix('*') {
                Some(suffix) => {
                    if !wildcards.iter().any(|(s, _)| **s == *suffix) {
                        wildcards.push((suffix.into(), value));
                    }
                }
                None => {
                    exact.entry(pattern.into_boxed_str()).or_insert(value);
                }
            }
        }
        // Stable: equal lengths keep file order.
        wildcards.sort_by_key(|(s, _)| std::cmp::Reverse(s.len()));
        Self { exact, wildcards }
    }

    /// Whether the table has no routes.
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.wildcards.is_empty()
    }

    /// The value for `name` (already lowercase, as the ClientHello parser returns it).
    pub fn lookup(&self, name: &str) -> Option<&T> {
        if let Some(v) = self.exact.get(name) {
            return Some(v);
        }
        self.wildcards
            .iter()
            .find(|(suffix, _)| name.len() > suffix.len() && name.ends_with(&**suffix))
            .map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> SniRoutes<u32> {
        SniRoutes::new([
            ("a.example.com".to_owned(), 1),
            ("*.b.example.com".to_owned(), 2),
            ("*.x.b.example.com".to_owned(), 3),
            ("Exact.B.Example.com.".to_owned(), 4),
            ("a.example.com".to_owned(), 9),
        ])
    }

    #[test]
    fn exact_beats_wildcard_and_longest_wildcard_wins() {
        let t = table();
        assert_eq!(t.lookup("a.example.com"), Some(&1));
        assert_eq!(t.lookup("exact.b.example.com"), Some(&4));
        assert_eq!(t.lookup("y.b.example.com"), Some(&2));
        assert_eq!(t.lookup("deep.y.b.example.com"), Some(&2));
        assert_eq!(t.lookup("z.x.b.example.com"), Some(&3));
    }

    #[test]
    fn wildcard_needs_a_label_before_the_suffix() {
        let t = table();
        assert_eq!(t.lookup("b.example.com"), None);
        assert_eq!(t.lookup(".b.example.com"), None);
        assert_eq!(t.lookup("xb.example.com"), None);
        assert_eq!(t.lookup("c.example.com"), None);
        assert!(!t.is_empty());
    }
}
