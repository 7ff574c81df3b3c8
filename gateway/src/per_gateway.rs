//! State that outlives config generations (rate limiters, the cluster's connection, response
//! caches): a reload finds the live value of the previous generation by key and keeps it. One
//! set per running gateway, told apart by its metrics registry, since several gateways run in
//! one test process. Values are held weakly: the generations own them, and one that no
//! generation holds any more is made anew.

use std::sync::{Arc, Mutex, Weak};

use crate::telemetry::Registry;

struct Entry<K, V> {
    /// Identifies the gateway; a `Weak` keeps the address from being reused while the entry
    /// exists.
    registry: Weak<Registry>,
    key: K,
    value: Weak<V>,
}

/// Live values by gateway and key.
pub struct PerGateway<K, V> {
    entries: Mutex<Vec<Entry<K, V>>>,
}

impl<K: PartialEq, V> PerGateway<K, V> {
    /// An empty set (for a `static`).
    pub const fn new() -> Self {
        Self {
            entries: Mutex::new(Vec::new()),
        }
    }

    /// The live value for `key` in the gateway owning `registry`, or the one `make` gives.
    pub fn get_or_try_insert<E>(
        &self,
        registry: &Arc<Registry>,
        key: K,
        make: impl FnOnce() -> Result<Arc<V>, E>,
    ) -> Result<Arc<V>, E> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.retain(|e| e.registry.strong_count() > 0 && e.value.strong_count() > 0);
        let live = entries
            .iter()
            .find(|e| e.registry.as_ptr() == Arc::as_ptr(registry) && e.key == key)
            .and_then(|e| e.value.upgrade());
        if let Some(v) = live {
            return Ok(v);
        }
        let value = make()?;
        entries.push(Entry {
            registry: Arc::downgrade(registry),
            key,
            value: Arc::downgrade(&value),
        });
        Ok(value)
    }

    /// [`PerGateway::get_or_try_insert`] with a `make` that cannot fail.
    pub fn get_or_insert(
        &self,
        registry: &Arc<Registry>,
        key: K,
        make: impl FnOnce() -> V,
    ) -> Arc<V> {
        match self.get_or_try_insert(registry, key, || {
            Ok::<_, std::convert::Infallible>(Arc::new(make()))
        }) {
            Ok(v) => v,
            Err(never) => match never {},
        }
    }
}

impl<K: PartialEq, V> Default for PerGateway<K, V> {
    fn default() -> Self {
        Self::new()
    }
}
