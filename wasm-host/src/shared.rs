//! Process-wide state every plugin VM sees: the shared key-value store with compare-and-swap
//! (how per-worker VMs of a rate limiter agree on counts), shared queues, and the metrics
//! registry. One [`Shared`] per process; VMs hold an `Arc` to it.

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
        let mut q = lock(&self.queues);
        let key = (vm_id.to_owned(), name.to_owned());
        if let Some(&id) = q.by_name.get(&key) {
            if let Some(queue) = q.queues.get_mut(&id) {
                queue.owner = owner;
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
        let mut q = lock(&self.queues);
        q.queues.get_mut(&id).map(|queue| queue.items.pop_front())
    }
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
