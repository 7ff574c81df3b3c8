//! The disk tier's index, in memory: each file's keys, request path and size, by primary key
//! (with the `Vary` names its variants are chosen by) and in use order. Entries found by the
//! start-up scan are ordered by their files' modification times, before every entry used or
//! written since: an approximate LRU, as nginx's after a restart.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use http::{HeaderMap, HeaderName};
use smallvec::SmallVec;

use super::super::store::{Object, variant};
use super::file::Id;

/// Ticks of entries used or written while running start here, above any modification time in
/// seconds a scan gives.
const LIVE_TICKS: u64 = 1 << 40;

struct Entry {
    /// Shared with the key of its [`Primary`].
    primary: Arc<str>,
    variant: Box<str>,
    /// The request path (for purges).
    path: Box<str>,
    size: u64,
    tick: u64,
}

struct Primary {
    vary: Vec<HeaderName>,
    /// Most keys have one variant.
    ids: SmallVec<[Id; 1]>,
}

pub(super) struct Index {
    entries: HashMap<Id, Entry>,
    primaries: HashMap<Arc<str>, Primary>,
    lru: BTreeSet<(u64, Id)>,
    tick: u64,
    bytes: u64,
}

impl Default for Index {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
            primaries: HashMap::new(),
            lru: BTreeSet::new(),
            tick: LIVE_TICKS,
            bytes: 0,
        }
    }
}

impl Index {
    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn contains(&self, id: Id) -> bool {
        self.entries.contains_key(&id)
    }

    /// The file of the object for a request under `primary`, counted as used.
    pub(super) fn lookup(&mut self, primary: &str, req: &HeaderMap) -> Option<Id> {
        let p = self.primaries.get(primary)?;
        let id = Id::of(primary, &variant(&p.vary, req));
        let e = self.entries.get_mut(&id)?;
        self.lru.remove(&(e.tick, id));
        self.tick += 1;
        e.tick = self.tick;
        self.lru.insert((e.tick, id));
        Some(id)
    }

    /// Adds the file `id` of `object` (`tick`: its place in use order when found by a scan,
    /// else now). The files made unreachable by a change of the key's `Vary` names, to remove.
    pub(super) fn insert(
        &mut self,
        id: Id,
        primary: String,
        variant: String,
        object: &Object,
        size: u64,
        tick: Option<u64>,
    ) -> Vec<Id> {
        self.remove(id);
        let tick = tick.unwrap_or_else(|| {
            self.tick += 1;
            self.tick
        });
        let primary: Arc<str> = match self.primaries.get_key_value(primary.as_str()) {
            Some((k, _)) => k.clone(),
            None => primary.into(),
        };
        let p = self
            .primaries
            .entry(primary.clone())
            .or_insert_with(|| Primary {
                vary: object.vary.clone(),
                ids: SmallVec::new(),
            });
        let mut unreachable = SmallVec::new();
        if p.vary != object.vary {
            p.vary = object.vary.clone();
            unreachable = std::mem::take(&mut p.ids);
        }
        p.ids.push(id);
        for old in &unreachable {
            if let Some(e) = self.entries.remove(old) {
                self.lru.remove(&(e.tick, *old));
                self.bytes -= e.size;
            }
        }
        self.entries.insert(
            id,
            Entry {
                primary,
                variant: variant.into(),
                path: object.path.as_str().into(),
                size,
                tick,
            },
        );
        self.lru.insert((tick, id));
        self.bytes += size;
        unreachable.into_vec()
    }

    pub(super) fn remove(&mut self, id: Id) -> bool {
        let Some(e) = self.entries.remove(&id) else {
            return false;
        };
        self.lru.remove(&(e.tick, id));
        self.bytes -= e.size;
        if let Some(p) = self.primaries.get_mut(&e.primary) {
            p.ids.retain(|i| *i != id);
            if p.ids.is_empty() {
                self.primaries.remove(&e.primary);
            }
        }
        true
    }

    /// Removes every variant under `primary`: their files and variant keys.
    pub(super) fn remove_primary(&mut self, primary: &str) -> Vec<(Id, String)> {
        let Some(p) = self.primaries.remove(primary) else {
            return Vec::new();
        };
        let mut gone = Vec::with_capacity(p.ids.len());
        for id in p.ids {
            if let Some(e) = self.entries.remove(&id) {
                self.lru.remove(&(e.tick, id));
                self.bytes -= e.size;
                gone.push((id, e.variant.into()));
            }
        }
        gone
    }

    /// Removes the entries whose request path `matches`: their files and keys.
    pub(super) fn remove_matching(
        &mut self,
        matches: impl Fn(&str) -> bool,
    ) -> Vec<(Id, String, String)> {
        let ids: Vec<Id> = self
            .entries
            .iter()
            .filter(|(_, e)| matches(&e.path))
            .map(|(id, _)| *id)
            .collect();
        let mut gone = Vec::with_capacity(ids.len());
        for id in ids {
            let (primary, variant) = {
                let e = &self.entries[&id];
                (e.primary.to_string(), e.variant.to_string())
            };
            self.remove(id);
            gone.push((id, primary, variant));
        }
        gone
    }

    /// Removes the least recently used entries until `capacity` holds: their files.
    pub(super) fn evict(&mut self, capacity: u64) -> Vec<Id> {
        let mut gone = Vec::new();
        while self.bytes > capacity {
            let Some(&(_, id)) = self.lru.first() else {
                break;
            };
            self.remove(id);
            gone.push(id);
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn object(path: &str, vary: &[&'static str]) -> Object {
        Object {
            vary: vary.iter().map(|v| HeaderName::from_static(v)).collect(),
            ..Object::sample(path, Bytes::new())
        }
    }

    fn add(ix: &mut Index, primary: &str, tick: Option<u64>) -> Id {
        let id = Id::of(primary, "");
        ix.insert(
            id,
            primary.into(),
            String::new(),
            &object(primary, &[]),
            100,
            tick,
        );
        id
    }

    #[test]
    fn scanned_entries_go_first_oldest_first_then_least_recently_used() {
        let mut ix = Index::default();
        let h = HeaderMap::new();
        let new = add(&mut ix, "/new", Some(2_000));
        let old = add(&mut ix, "/old", Some(1_000));
        let live = add(&mut ix, "/live", None);
        let used = add(&mut ix, "/used", None);
        assert_eq!(ix.lookup("/live", &h), Some(live));
        assert_eq!(ix.bytes(), 400);
        assert_eq!(ix.evict(300), [old]);
        assert_eq!(ix.evict(100), [new, used]);
        assert!(ix.contains(live) && ix.len() == 1);
        assert_eq!(ix.evict(0), [live]);
        assert!(ix.primaries.is_empty() && ix.lru.is_empty() && ix.bytes() == 0);
    }

    #[test]
    fn variants_purges_and_a_vary_change() {
        let mut ix = Index::default();
        let mut en = HeaderMap::new();
        en.insert("accept-language", "en".parse().unwrap());
        let v = variant(&[HeaderName::from_static("accept-language")], &en);
        let o = object("/a", &["accept-language"]);
        let id = Id::of("k", &v);
        ix.insert(id, "k".into(), v.clone(), &o, 10, None);
        assert_eq!(ix.lookup("k", &en), Some(id));
        assert_eq!(ix.lookup("k", &HeaderMap::new()), None);
        let plain = Id::of("k", "");
        let dropped = ix.insert(
            plain,
            "k".into(),
            String::new(),
            &object("/a", &[]),
            10,
            None,
        );
        assert_eq!(dropped, [id], "the old variants are unreachable");
        assert_eq!((ix.len(), ix.bytes()), (1, 10));
        add(&mut ix, "/b", None);
        let gone = ix.remove_matching(|p| p == "/a");
        assert_eq!(gone, [(plain, "k".to_owned(), String::new())]);
        assert_eq!(ix.remove_primary("/b").len(), 1);
        assert_eq!((ix.len(), ix.bytes()), (0, 0));
    }
}
