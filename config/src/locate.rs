//! Maps key paths (`routes[0].proxy.upstream`) to line:column in the YAML source. serde gives
//! positions only for errors it finds itself; checks that run after deserializing (dangling
//! references, duplicate binds) look their position up here.
//!
//! The index is a tree: one node per key and per sequence item, found from its parent by key
//! or index. Building it costs each node its own key once, and a lookup walks the path once,
//! so both are linear in the size of the file however deeply it nests (a map of whole path
//! strings would copy every ancestor's path into each descendant's).

use std::collections::HashMap;

use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::Marker;

use crate::nesting::{self, MAX_NESTING_DEPTH};

/// The document root's node.
const ROOT: usize = 0;

/// Line/column of every key path in one YAML document.
#[derive(Debug, Clone)]
pub struct SourceMap {
    nodes: Vec<Node>,
    /// Children by key, for keys a path can name unambiguously (no `.` or `[` in them).
    keys: HashMap<(usize, Box<str>), usize>,
}

#[derive(Debug, Clone)]
struct Node {
    /// 1-based (line, column): a scalar value's own, otherwise its key's or item's.
    at: (usize, usize),
    /// Sequence items in order.
    items: Vec<usize>,
    /// Children whose key holds `.` or `[` (host names, dotted names), matched by prefix.
    dotted: Vec<(Box<str>, usize)>,
}

impl Node {
    fn new(at: (usize, usize)) -> Self {
        Self {
            at,
            items: Vec::new(),
            dotted: Vec::new(),
        }
    }
}

impl Default for SourceMap {
    fn default() -> Self {
        Self {
            nodes: vec![Node::new((1, 1))],
            keys: HashMap::new(),
        }
    }
}

impl SourceMap {
    /// Indexes the first document of `source`. A document that does not parse, or nests
    /// deeper than [`MAX_NESTING_DEPTH`], yields an empty map (the loader reports those
    /// errors itself).
    pub fn build(source: &str) -> Self {
        if nesting::measure(source, MAX_NESTING_DEPTH).is_err() {
            return Self::default();
        }
        let mut indexer = Indexer {
            map: Self::default(),
            frames: Vec::new(),
        };
        let mut parser = Parser::new_from_str(source);
        loop {
            match parser.next_token() {
                Ok((Event::DocumentEnd | Event::StreamEnd, _)) => return indexer.map,
                Ok((event, mark)) => indexer.on_event(event, mark),
                Err(_) => return Self::default(),
            }
        }
    }

    /// The 1-based (line, column) of `path`, or of its nearest ancestor that is known.
    pub fn find(&self, path: &str) -> (usize, usize) {
        let mut node = ROOT;
        let mut rest = path;
        while !rest.is_empty() {
            let child = if let Some(index) = rest.strip_prefix('[') {
                let Some((digits, after)) = index.split_once(']') else {
                    break;
                };
                rest = after;
                digits
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| self.nodes[node].items.get(i).copied())
            } else {
                let name = if node == ROOT {
                    rest
                } else {
                    match rest.strip_prefix('.') {
                        Some(name) => name,
                        None => break,
                    }
                };
                match self.child_by_key(node, name) {
                    Some((child, after)) => {
                        rest = after;
                        Some(child)
                    }
                    None => None,
                }
            };
            match child {
                Some(child) => node = child,
                None => break,
            }
        }
        self.nodes[node].at
    }

    /// The child of `node` whose key starts `path`, and the rest of `path` after that key.
    fn child_by_key<'p>(&self, node: usize, path: &'p str) -> Option<(usize, &'p str)> {
        let end = path.find(['.', '[']).unwrap_or(path.len());
        if let Some(&child) = self.keys.get(&(node, Box::from(&path[..end]))) {
            return Some((child, &path[end..]));
        }
        self.nodes[node]
            .dotted
            .iter()
            .filter(|(key, _)| {
                path.strip_prefix(&**key)
                    .is_some_and(|after| after.is_empty() || after.starts_with(['.', '[']))
            })
            .max_by_key(|(key, _)| key.len())
            .map(|(key, child)| (*child, &path[key.len()..]))
    }

    /// Bytes of key text the index holds.
    #[cfg(test)]
    fn key_bytes(&self) -> usize {
        let linked: usize = self.keys.keys().map(|(_, k)| k.len()).sum();
        let dotted: usize = self
            .nodes
            .iter()
            .flat_map(|n| &n.dotted)
            .map(|(k, _)| k.len())
            .sum();
        linked + dotted
    }

    fn add(&mut self, mark: Marker) -> usize {
        self.nodes.push(Node::new(position(mark)));
        self.nodes.len() - 1
    }
}

fn position(mark: Marker) -> (usize, usize) {
    (mark.line(), mark.col() + 1)
}

enum Frame {
    /// A mapping; `value` is the node of the key whose value comes next, if one does.
    Map {
        node: usize,
        value: Option<usize>,
    },
    Seq {
        node: usize,
    },
}

struct Indexer {
    map: SourceMap,
    frames: Vec<Frame>,
}

impl Indexer {
    /// The node of a value starting at `mark`, or `None` when the event is a mapping key.
    /// `key` is the key's text when it is a scalar.
    fn value(&mut self, key: Option<&str>, mark: Marker) -> Option<usize> {
        match self.frames.last_mut() {
            None => Some(ROOT),
            Some(&mut Frame::Seq { node }) => {
                let item = self.map.add(mark);
                self.map.nodes[node].items.push(item);
                Some(item)
            }
            Some(Frame::Map { value, .. }) if value.is_some() => value.take(),
            Some(&mut Frame::Map { node, .. }) => {
                let child = self.map.add(mark);
                match key {
                    Some(k) if k.contains(['.', '[']) => {
                        self.map.nodes[node].dotted.push((Box::from(k), child));
                    }
                    Some(k) => {
                        self.map.keys.insert((node, Box::from(k)), child);
                    }
                    // A key that is a collection or an alias names nothing a path can reach:
                    // its node stays unlinked, and so does its value's.
                    None => {}
                }
                if let Some(Frame::Map { value, .. }) = self.frames.last_mut() {
                    *value = Some(child);
                }
                None
            }
        }
    }

    /// A collection starts at `mark`: its contents are indexed under the value's node, or
    /// under an unlinked node when the collection is a key.
    fn open(&mut self, mark: Marker) -> usize {
        match self.value(None, mark) {
            Some(node) => node,
            None => self.map.add(mark),
        }
    }

    fn on_event(&mut self, event: Event, mark: Marker) {
        match event {
            Event::Scalar(text, ..) => {
                if let Some(node) = self.value(Some(&text), mark) {
                    self.map.nodes[node].at = position(mark);
                }
            }
            Event::Alias(_) => {
                if let Some(node) = self.value(None, mark) {
                    self.map.nodes[node].at = position(mark);
                }
            }
            Event::MappingStart(..) => {
                let node = self.open(mark);
                self.frames.push(Frame::Map { node, value: None });
            }
            Event::SequenceStart(..) => {
                let node = self.open(mark);
                self.frames.push(Frame::Seq { node });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.frames.pop();
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_nested_keys_and_sequence_items() {
        let src = "listeners:\n  - name: web\n    bind: 1.2.3.4:80\nroutes:\n  - match: { path: /x }\n    proxy:\n      upstream: nope\n";
        let map = SourceMap::build(src);
        assert_eq!(map.find("listeners[0].bind"), (3, 11));
        assert_eq!(map.find("routes[0].proxy.upstream"), (7, 17));
        assert_eq!(map.find("routes[0].match.path"), (5, 20));
        // Unknown paths fall back to the nearest known ancestor.
        assert_eq!(map.find("routes[0].proxy.nothing"), (6, 5));
        assert_eq!(map.find("routes[7].proxy"), (4, 1));
        assert_eq!(map.find("nothing.at.all"), (1, 1));
    }

    #[test]
    fn finds_keys_holding_dots_and_brackets() {
        let src = "streams:\n  - sni_routes:\n      api.example.com: a\n      example: b\n      x[1]: c\n";
        let map = SourceMap::build(src);
        assert_eq!(map.find("streams[0].sni_routes.api.example.com"), (3, 24));
        assert_eq!(map.find("streams[0].sni_routes.example"), (4, 16));
        assert_eq!(map.find("streams[0].sni_routes.x[1]"), (5, 13));
        assert_eq!(map.find("streams[0].sni_routes.api.other.com"), (2, 5));
    }

    #[test]
    fn complex_keys_are_not_reachable_by_path() {
        let src = "? { a: 1 }\n: { b: 2 }\nc: 3\n";
        let map = SourceMap::build(src);
        assert_eq!(map.find("a"), (1, 1));
        assert_eq!(map.find("b"), (1, 1));
        assert_eq!(map.find("c"), (3, 4));
    }

    #[test]
    fn each_key_is_held_once_however_long_its_ancestors() {
        // Indexed by whole path strings, this file would hold 2,000 copies of the 1 KB key (a
        // simple key's longest).
        let long = "k".repeat(1_000);
        let mut src = format!("{long}:\n");
        for i in 0..2_000 {
            src += &format!("  c{i}:\n  - [{i}]\n");
        }
        let map = SourceMap::build(&src);
        assert!(map.key_bytes() <= src.len(), "{} bytes", map.key_bytes());
        assert_eq!(map.find(&format!("{long}.c1999[0]")), (4_001, 5));
        assert_eq!(map.find(&format!("{long}.c1999[0][0]")), (4_001, 6));
    }

    #[test]
    fn too_deep_or_broken_documents_give_an_empty_map() {
        let deep = format!("a:\n  b: {}\n", "[".repeat(10_000));
        assert_eq!(SourceMap::build(&deep).find("a.b"), (1, 1));
        assert_eq!(SourceMap::build("a: [\n").find("a"), (1, 1));
    }
}
