//! Returning the memory a config load freed to the kernel.
//!
//! Building a generation is a burst of allocation the request path never repeats: compiling
//! Wasm plugins with Cranelift alone frees about 4 MiB. The allocator keeps freed pages resident
//! for reuse and only decays them while it keeps allocating, so an idle gateway would hold that
//! burst's garbage for good. After each load the gateway asks the allocator to return every
//! unused page once: a few milliseconds off the request path, instead of a shorter decay time
//! that would make every request pay for purging. The Wasm compiler's thread allocates from an
//! arena of its own, so that what it frees comes back as whole pages.

/// Hands pages that no live allocation uses back to the kernel.
#[allow(
    unsafe_code,
    reason = "one call into the allocator's C control interface (jemalloc's mallctl or glibc's malloc_trim)"
)]
pub fn release_freed() {
    #[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
    {
        // `MALLCTL_ARENAS_ALL`: every arena.
        let name = c"arena.4096.purge";
        // SAFETY: `arena.<i>.purge` is a write-only control that takes no value: null old and
        // new pointers with zero lengths are its documented use, and the name is a valid
        // NUL-terminated string. jemalloc is linked whenever this feature is on.
        let rc = unsafe {
            tikv_jemalloc_sys::mallctl(
                name.as_ptr(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if rc != 0 {
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
/// config's long-lived data, and `release_freed` can return only whole unused pages. Measured
/// with the benchmark's config pinned to one core: 10.8 MB of anonymous memory idle against
/// 5.8 MB with the arena (docs/benchmarks.md, "Memory left by a config load").
#[allow(
    unsafe_code,
    reason = "two calls into jemalloc's C control interface (mallctl)"
)]
pub fn use_private_arena() {
    #[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
    {
        use std::sync::OnceLock;
        static ARENA: OnceLock<Option<u32>> = OnceLock::new();
        let arena = ARENA.get_or_init(|| {
            let mut index: u32 = 0;
            let mut len = std::mem::size_of::<u32>();
            // SAFETY: `arenas.create` reads nothing and writes the new arena's index, an
            // `unsigned`, into `index`, whose size `len` gives; the name is NUL-terminated.
            let rc = unsafe {
                tikv_jemalloc_sys::mallctl(
                    c"arenas.create".as_ptr(),
                    (&raw mut index).cast(),
                    &mut len,
                    std::ptr::null_mut(),
                    0,
                )
            };
            (rc == 0).then_some(index)
        });
        let Some(mut index) = *arena else {
            return;
        };
        // SAFETY: `thread.arena` takes an `unsigned` arena index to write, read from `index`
        // with its size; no old value is asked for.
        let rc = unsafe {
            tikv_jemalloc_sys::mallctl(
                c"thread.arena".as_ptr(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                (&raw mut index).cast(),
                std::mem::size_of::<u32>(),
            )
        };
        if rc != 0 {
            tracing::debug!(rc, "the allocator did not move the thread to its own arena");
        }
    }
}
