//! An optional component that a reload swaps (the access log, the tracer), with a flag beside
//! it. Every request asks whether the component is on; when it is off, the flag answers with
//! one atomic load instead of `arc-swap`'s protected load (a debt slot taken and released).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwapOption;

/// An optional `Arc<T>` swapped at runtime.
pub struct Switch<T> {
    value: ArcSwapOption<T>,
    /// Whether `value` is `Some`. Written after `value`, so a reader that sees it set also sees
    /// the value stored before it; a request racing a reload may see the old state, as it
    /// would with the value alone.
    on: AtomicBool,
}

impl<T> Switch<T> {
    /// Off.
    pub fn empty() -> Self {
        Self {
            value: ArcSwapOption::empty(),
            on: AtomicBool::new(false),
        }
    }

    /// Replaces the component (`None`: off).
    pub fn store(&self, value: Option<Arc<T>>) {
        self.swap(value);
    }

    /// Replaces the component and returns the one it replaced.
    pub fn swap(&self, value: Option<Arc<T>>) -> Option<Arc<T>> {
        let on = value.is_some();
        let old = self.value.swap(value);
        self.on.store(on, Ordering::Release);
        old
    }

    /// Whether the component is on (one atomic load).
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// The component, when on.
    pub fn load_full(&self) -> Option<Arc<T>> {
        if !self.on.load(Ordering::Acquire) {
            return None;
        }
        self.value.load_full()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_what_was_stored() {
        let s = Switch::empty();
        assert!(s.load_full().is_none());
        s.store(Some(Arc::new(7)));
        assert_eq!(s.load_full().as_deref(), Some(&7));
        assert_eq!(s.swap(None).as_deref(), Some(&7));
        assert!(s.load_full().is_none());
        assert!(s.swap(Some(Arc::new(8))).is_none());
        assert_eq!(s.load_full().as_deref(), Some(&8));
    }
}
