//! Returning the memory a config load or a burst of connections freed to the kernel.
//!
//! Building a generation is a burst of allocation the request path never repeats: compiling
//! Wasm plugins with Cranelift alone frees megabytes. The allocator keeps freed pages resident
//! for reuse and only decays them while it keeps allocating, so an idle gateway would hold that
//! burst's garbage for good. After each load the gateway asks the allocator to return every
//! unused page once: a few milliseconds off the request path, instead of a shorter decay time
//! that would make every request pay for purging. The Wasm compiler's thread allocates from an
//! arena of its own, so that what it frees comes back as whole pages. The same release runs
//! once after a burst of connections has closed ([`bursts`]).

mod bursts;

pub use bursts::{
    OpenConnection, connection_opened, render_prometheus, set_burst_size, stream_hooks,
};

/// Hands pages that no live allocation uses back to the kernel.
#[allow(
    unsafe_code,
    reason = "glibc's malloc_trim, when the binary is built without jemalloc"
)]
pub fn release_freed() {
    #[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
    {
        // `MALLCTL_ARENAS_ALL`: every arena. A control that takes and gives no value.
        if let Err(rc) = jemalloc::control(c"arena.4096.purge", None, None) {
            tracing::debug!(rc, "the allocator did not purge its free pages");
        }
    }
    #[cfg(all(
        not(all(feature = "jemalloc", not(target_env = "msvc"))),
        target_os = "linux",
        target_env = "gnu"
    ))]
    {
        // SAFETY: `malloc_trim` only releases free memory at the top of glibc's heaps and in
        // its arenas; it takes no pointers.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

/// Points the calling thread's allocations at an arena that only such threads use (created on
/// first use). For a thread whose allocations are nearly all garbage when it ends, the Wasm
/// compiler's: sharing an arena, its freed blocks would sit in pages that also hold the
/// config's long-lived data, and `release_freed` can return only whole unused pages, so the
/// compile's garbage would stay resident (docs/performance-log.md, "Then: the Wasm compiler's
/// memory").
pub fn use_private_arena() {
    #[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
    {
        use std::sync::OnceLock;
        static ARENA: OnceLock<Option<u32>> = OnceLock::new();
        let arena = ARENA.get_or_init(|| {
            let mut index = 0;
            jemalloc::control(c"arenas.create", Some(&mut index), None)
                .ok()
                .map(|()| index)
        });
        if let Some(index) = *arena
            && let Err(rc) = jemalloc::control(c"thread.arena", None, Some(index))
        {
            tracing::debug!(rc, "the allocator did not move the thread to its own arena");
        }
    }
}

#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
mod jemalloc {
    use std::ffi::CStr;

    /// One `mallctl` call for a control whose value, if any, is an `unsigned`: `read` receives
    /// the value it gives, `write` is the value it takes. `Err` carries jemalloc's error code.
    #[allow(
        unsafe_code,
        reason = "the allocator's C control interface (jemalloc's mallctl)"
    )]
    pub(super) fn control(
        name: &CStr,
        read: Option<&mut u32>,
        write: Option<u32>,
    ) -> Result<(), i32> {
        let mut write = write;
        let mut read_len = std::mem::size_of::<u32>();
        let (old, old_len) = match read {
            Some(value) => (std::ptr::from_mut(value).cast(), &raw mut read_len),
            None => (std::ptr::null_mut(), std::ptr::null_mut()),
        };
        let (new, new_len) = match write.as_mut() {
            Some(value) => (std::ptr::from_mut(value).cast(), std::mem::size_of::<u32>()),
            None => (std::ptr::null_mut(), 0),
        };
        // SAFETY: `name` is NUL-terminated. Each pointer is either null with a zero length or
        // points at a live `u32` with its size, which is what jemalloc reads or writes for a
        // control whose value is an `unsigned` (`arenas.create`, `thread.arena`); controls
        // without a value (`arena.<i>.purge`) get null pointers. jemalloc is linked whenever
        // this feature is on.
        let rc = unsafe { tikv_jemalloc_sys::mallctl(name.as_ptr(), old, old_len, new, new_len) };
        if rc == 0 { Ok(()) } else { Err(rc) }
    }
}

#[cfg(all(test, feature = "jemalloc", not(target_env = "msvc")))]
mod tests {
    use super::*;

    #[test]
    fn a_thread_moved_to_the_private_arena_allocates_from_it() {
        std::thread::spawn(|| {
            let mut before = u32::MAX;
            jemalloc::control(c"thread.arena", Some(&mut before), None).expect("readable");
            use_private_arena();
            let mut after = u32::MAX;
            jemalloc::control(c"thread.arena", Some(&mut after), None).expect("readable");
            assert_ne!(after, before, "the thread still uses arena {before}");
            // A second thread joins the same arena rather than creating another.
            let again = std::thread::spawn(|| {
                use_private_arena();
                let mut index = u32::MAX;
                jemalloc::control(c"thread.arena", Some(&mut index), None).expect("readable");
                index
            })
            .join()
            .expect("thread");
            assert_eq!(again, after);
            release_freed();
        })
        .join()
        .expect("thread");
    }
}
