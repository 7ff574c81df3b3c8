//! Process-wide state every plugin VM sees: the shared key-value store with compare-and-swap
//! (how per-worker VMs of a rate limiter agree on counts), shared queues, and the metrics
//! registry. One [`Shared`] per process; VMs hold an `Arc` to it.
//!
//! A plugin may instead keep its shared data and queues in a [`GlobalStore`] that other
//! processes see too (the gateway's `shared_data: { scope: global }`, backed by Redis). When
//! that store cannot be reached, calls fall back to this process's store, so a plugin keeps
//! working with per-process counts until the store is back.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;

use crate::metrics::Metrics;

/// Called (outside any lock) when data is enqueued on a queue the VM registered; the embedder
/// schedules `proxy_on_queue_ready` on that VM.
pub type QueueNotify = Arc<dyn Fn(u32) + Send + Sync>;

/// Shared data, queues and metrics.
#[derive(Default)]
pub struct Shared {
    data: Mutex<HashMap<Vec<u8>, (Bytes, u32)>>,
    queues: Mutex<Queues>,
    /// Metrics defined by guests and counters kept by the host.
    pub metrics: Metrics,
}

#[derive(Default)]
struct Queues {
    by_name: HashMap<(String, String), u32>,
    queues: HashMap<u32, Queue>,
    next: u32,
}

struct Queue {
    items: VecDeque<Bytes>,
    owner: Option<QueueNotify>,
    /// Where the items live when the queue is global, and its name there.
    global: Option<(GlobalStoreRef, String)>,
}

/// Shared data and queues kept outside the process. Host calls are synchronous, so every method
/// blocks for at most the implementation's own short timeout. `None` means "unreachable": the
/// caller then uses the process's store.
pub trait GlobalStore: Send + Sync {
    /// The value of `key` and its CAS token (`Some(None)`: no such key).
    fn get(&self, key: &[u8]) -> Option<Option<(Bytes, u32)>>;
    /// Sets `key` with the same CAS rules as [`Shared::set`], atomically across processes.
    fn set(&self, key: &[u8], value: Bytes, cas: u32) -> Option<Result<(), SetError>>;
    /// Appends to the queue named `queue` (the owners are told by the store's own means).
    fn enqueue(&self, queue: &str, value: Bytes) -> Option<()>;
    /// Takes the oldest item of `queue` (`Some(None)`: empty).
    fn dequeue(&self, queue: &str) -> Option<Option<Bytes>>;
}

/// A [`GlobalStore`] as [`crate::PluginInfo`] carries it.
#[derive(Clone)]
pub struct GlobalStoreRef(pub Arc<dyn GlobalStore>);

impl std::fmt::Debug for GlobalStoreRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GlobalStore")
    }
}

/// Why a shared-data write was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum SetError {
    /// The value changed since the caller read it.
    CasMismatch,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere cannot leave these maps half-updated; keep serving.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// A fresh, empty store.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The value of `key` and its CAS token.
    pub fn get(&self, key: &[u8]) -> Option<(Bytes, u32)> {
        lock(&self.data).get(key).cloned()
    }

    /// [`Shared::get`] from `global` when there is one and it answers.
    pub fn get_in(&self, global: Option<&GlobalStoreRef>, key: &[u8]) -> Option<(Bytes, u32)> {
        match global.and_then(|g| g.0.get(key)) {
            Some(found) => found,
            None => self.get(key),
        }
    }

    /// [`Shared::set`] in `global` when there is one and it answers.
    pub fn set_in(
        &self,
        global: Option<&GlobalStoreRef>,
        key: &[u8],
        value: Bytes,
        cas: u32,
    ) -> Result<(), SetError> {
        match global.and_then(|g| g.0.set(key, value.clone(), cas)) {
            Some(result) => result,
            None => self.set(key, value, cas),
        }
    }

    /// Sets `key`; with a non-zero `cas`, only if the value's token is still `cas` (a missing
    /// key is always written, as Envoy does).
    pub fn set(&self, key: &[u8], value: Bytes, cas: u32) -> Result<(), SetError> {
        let mut data = lock(&self.data);
        match data.get_mut(key) {
            Some((v, token)) => {
                if cas != 0 && cas != *token {
                    return Err(SetError::CasMismatch);
                }
                *v = value;
                // Tokens start at 1 so 0 always means "unconditional".
                *token = token.wrapping_add(1).max(1);
            }
            None => {
                data.insert(key.to_vec(), (value, 1));
            }
        }
        Ok(())
    }

    /// Registers (or re-registers) a queue; `owner` is told when data arrives.
    pub fn register_queue(&self, vm_id: &str, name: &str, owner: Option<QueueNotify>) -> u32 {
        self.register_queue_in(None, vm_id, name, owner)
    }

    /// [`Shared::register_queue`], with the items kept in `global` when there is one.
    pub fn register_queue_in(
        &self,
        global: Option<&GlobalStoreRef>,
        vm_id: &str,
        name: &str,
        owner: Option<QueueNotify>,
    ) -> u32 {
        let mut q = lock(&self.queues);
        let key = (vm_id.to_owned(), name.to_owned());
        let global = global.map(|g| (g.clone(), global_queue_name(vm_id, name)));
        if let Some(&id) = q.by_name.get(&key) {
            if let Some(queue) = q.queues.get_mut(&id) {
                queue.owner = owner;
                queue.global = global;
            }
            return id;
        }
        q.next += 1;
        let id = q.next;
        q.by_name.insert(key, id);
        q.queues.insert(
            id,
            Queue {
                items: VecDeque::new(),
                owner,
                global,
            },
        );
        id
    }

    /// The id of a registered queue.
    pub fn resolve_queue(&self, vm_id: &str, name: &str) -> Option<u32> {
        lock(&self.queues)
            .by_name
            .get(&(vm_id.to_owned(), name.to_owned()))
            .copied()
    }

    /// Appends to a queue and tells its owner; `false` when there is no such queue.
    pub fn enqueue(&self, id: u32, value: Bytes) -> bool {
        let owner = {
            let mut q = lock(&self.queues);
            let Some(queue) = q.queues.get_mut(&id) else {
                return false;
            };
            if let Some((store, name)) = queue.global.clone() {
                // The store call blocks for up to its timeout: not under the lock.
                drop(q);
                if store.0.enqueue(&name, value.clone()).is_some() {
                    return true;
                }
                q = lock(&self.queues);
            }
            let Some(queue) = q.queues.get_mut(&id) else {
                return false;
            };
            queue.items.push_back(value);
            queue.owner.clone()
        };
        if let Some(notify) = owner {
            notify(id);
        }
        true
    }

    /// Takes the oldest item: `None` for no such queue, `Some(None)` when empty.
    pub fn dequeue(&self, id: u32) -> Option<Option<Bytes>> {
        let global = {
            let mut q = lock(&self.queues);
            let queue = q.queues.get_mut(&id)?;
            match queue.global.clone() {
                // Items enqueued while the store was unreachable go first.
                None => return Some(queue.items.pop_front()),
                Some(_) if !queue.items.is_empty() => return Some(queue.items.pop_front()),
                Some(g) => g,
            }
        };
        match global.0.0.dequeue(&global.1) {
            Some(item) => Some(item),
            None => Some(None),
        }
    }

    /// Tells the owner of the queue `vm_id`/`name` that data arrived (a global store's
    /// notification from another process); `false` when no such queue is registered here.
    pub fn notify_queue(&self, vm_id: &str, name: &str) -> bool {
        let (id, owner) = {
            let q = lock(&self.queues);
            let Some(&id) = q.by_name.get(&(vm_id.to_owned(), name.to_owned())) else {
                return false;
            };
            (id, q.queues.get(&id).and_then(|queue| queue.owner.clone()))
        };
        if let Some(notify) = owner {
            notify(id);
        }
        true
    }
}

/// A queue's name in a global store: the VM id and the queue name, which together identify a
/// queue in the proxy-wasm ABI. Split again by [`split_global_queue_name`].
pub fn global_queue_name(vm_id: &str, name: &str) -> String {
    format!("{vm_id}/{name}")
}

/// The VM id and queue name of [`global_queue_name`]'s result.
pub fn split_global_queue_name(global: &str) -> Option<(&str, &str)> {
    global.split_once('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cas_rules() {
        let s = Shared::default();
        assert!(s.get(b"k").is_none());
        s.set(b"k", Bytes::from_static(b"1"), 77).unwrap();
        let (v, cas) = s.get(b"k").unwrap();
        assert_eq!(&v[..], b"1");
        s.set(b"k", Bytes::from_static(b"2"), cas).unwrap();
        assert_eq!(
            s.set(b"k", Bytes::from_static(b"3"), cas),
            Err(SetError::CasMismatch)
        );
        s.set(b"k", Bytes::from_static(b"4"), 0).unwrap();
        assert_eq!(&s.get(b"k").unwrap().0[..], b"4");
    }

    /// A second process's store, in memory; `reachable` switches it off.
    #[derive(Default)]
    struct Remote {
        data: Mutex<HashMap<Vec<u8>, (Bytes, u32)>>,
        queue: Mutex<VecDeque<Bytes>>,
        down: std::sync::atomic::AtomicBool,
    }

    impl GlobalStore for Remote {
        fn get(&self, key: &[u8]) -> Option<Option<(Bytes, u32)>> {
            let up = !self.down.load(std::sync::atomic::Ordering::Relaxed);
            up.then(|| lock(&self.data).get(key).cloned())
        }
        fn set(&self, key: &[u8], value: Bytes, cas: u32) -> Option<Result<(), SetError>> {
            if self.down.load(std::sync::atomic::Ordering::Relaxed) {
                return None;
            }
            let mut data = lock(&self.data);
            let token = data.get(key).map_or(0, |e| e.1);
            if cas != 0 && token != 0 && cas != token {
                return Some(Err(SetError::CasMismatch));
            }
            data.insert(key.to_vec(), (value, token + 1));
            Some(Ok(()))
        }
        fn enqueue(&self, queue: &str, value: Bytes) -> Option<()> {
            assert_eq!(queue, "vm/q");
            let up = !self.down.load(std::sync::atomic::Ordering::Relaxed);
            up.then(|| lock(&self.queue).push_back(value))
        }
        fn dequeue(&self, _: &str) -> Option<Option<Bytes>> {
            let up = !self.down.load(std::sync::atomic::Ordering::Relaxed);
            up.then(|| lock(&self.queue).pop_front())
        }
    }

    #[test]
    fn a_global_store_is_used_while_it_answers_and_the_local_one_after() {
        let s = Shared::default();
        let remote = Arc::new(Remote::default());
        let g = GlobalStoreRef(remote.clone());
        s.set_in(Some(&g), b"k", Bytes::from_static(b"1"), 0)
            .unwrap();
        assert!(s.get(b"k").is_none(), "written to the global store only");
        let (_, cas) = s.get_in(Some(&g), b"k").unwrap();
        s.set_in(Some(&g), b"k", Bytes::from_static(b"2"), cas)
            .unwrap();
        assert_eq!(
            s.set_in(Some(&g), b"k", Bytes::from_static(b"3"), cas),
            Err(SetError::CasMismatch)
        );
        let id = s.register_queue_in(Some(&g), "vm", "q", None);
        assert!(s.enqueue(id, Bytes::from_static(b"a")));
        assert_eq!(lock(&remote.queue).len(), 1);
        assert_eq!(s.dequeue(id), Some(Some(Bytes::from_static(b"a"))));

        remote
            .down
            .store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(
            s.get_in(Some(&g), b"k").is_none(),
            "the local store has no k"
        );
        s.set_in(Some(&g), b"k", Bytes::from_static(b"4"), 0)
            .unwrap();
        assert_eq!(&s.get(b"k").unwrap().0[..], b"4");
        assert!(s.enqueue(id, Bytes::from_static(b"b")));
        assert_eq!(s.dequeue(id), Some(Some(Bytes::from_static(b"b"))));
        assert_eq!(s.dequeue(id), Some(None));
        assert_eq!(split_global_queue_name("vm/q/x"), Some(("vm", "q/x")));
    }

    #[test]
    fn queues() {
        let s = Shared::default();
        let hits = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let h = hits.clone();
        let id = s.register_queue(
            "",
            "q",
            Some(Arc::new(move |_| {
                h.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            })),
        );
        assert_eq!(s.resolve_queue("", "q"), Some(id));
        assert!(s.enqueue(id, Bytes::from_static(b"a")));
        assert_eq!(s.dequeue(id), Some(Some(Bytes::from_static(b"a"))));
        assert_eq!(s.dequeue(id), Some(None));
        assert_eq!(s.dequeue(999), None);
        assert_eq!(hits.load(std::sync::atomic::Ordering::Relaxed), 1);
    }
}
