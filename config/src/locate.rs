//! Maps key paths (`routes[0].proxy.upstream`) to line:column in the YAML source. serde gives
//! positions only for errors it finds itself; checks that run after deserializing (dangling
//! references, duplicate binds) look their position up here.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// Line/column of every key path in one YAML document.
#[derive(Debug, Default, Clone)]
pub struct SourceMap {
    positions: HashMap<String, (usize, usize)>,
}

impl SourceMap {
    /// Indexes `source`. A document that does not parse yields an empty map (serde reports
    /// the syntax error itself).
    pub fn build(source: &str) -> Self {
        let mut indexer = Indexer::default();
        let mut parser = Parser::new_from_str(source);
        if parser.load(&mut indexer, false).is_err() {
            return Self::default();
        }
        Self {
            positions: indexer.positions,
        }
    }

    /// The 1-based (line, column) of `path`, or of its nearest ancestor that is known.
    pub fn find(&self, path: &str) -> (usize, usize) {
        let mut candidate = path;
        loop {
            if let Some(pos) = self.positions.get(candidate) {
                return *pos;
            }
            match candidate.rfind(['.', '[']) {
                Some(cut) => candidate = &candidate[..cut],
                None => return (1, 1),
            }
        }
    }
}

enum Frame {
    Map { path: String, key: Option<String> },
    Seq { path: String, next: usize },
}

#[derive(Default)]
struct Indexer {
    frames: Vec<Frame>,
    positions: HashMap<String, (usize, usize)>,
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

impl Indexer {
    fn record(&mut self, path: &str, mark: Marker) {
        self.positions
            .insert(path.to_owned(), (mark.line(), mark.col() + 1));
    }

    /// Returns the path of the value starting here, or `None` if the event is a mapping key.
    fn value_path(&mut self, key_text: Option<&str>, mark: Marker) -> Option<String> {
        match self.frames.last_mut() {
            None => Some(String::new()),
            Some(Frame::Seq { path, next }) => {
                let p = format!("{path}[{next}]");
                *next += 1;
                self.record(&p, mark);
                Some(p)
            }
            Some(Frame::Map { path, key }) => match key.take() {
                Some(k) => Some(join(path, &k)),
                None => {
                    let k = key_text.unwrap_or_default().to_owned();
                    let p = join(path, &k);
                    *key = Some(k);
                    self.record(&p, mark);
                    None
                }
            },
        }
    }
}

impl MarkedEventReceiver for Indexer {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        match ev {
            Event::Scalar(text, ..) => {
                if let Some(p) = self.value_path(Some(&text), mark) {
                    self.record(&p, mark);
                }
            }
            Event::Alias(_) => {
                if let Some(p) = self.value_path(None, mark) {
                    self.record(&p, mark);
                }
            }
            Event::MappingStart(..) => {
                if let Some(path) = self.value_path(None, mark) {
                    self.frames.push(Frame::Map { path, key: None });
                } else {
                    // A complex key: index its contents under an empty name.
                    self.frames.push(Frame::Map {
                        path: String::new(),
                        key: None,
                    });
                }
            }
            Event::SequenceStart(..) => {
                let path = self.value_path(None, mark).unwrap_or_default();
                self.frames.push(Frame::Seq { path, next: 0 });
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
    }
}
