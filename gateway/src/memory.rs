//! Returning the memory a config load freed to the kernel.
//!
//! Building a generation is a burst of allocation the request path never repeats: compiling
//! Wasm plugins with Cranelift alone frees about 4 MiB. The allocator keeps freed pages resident
//! for reuse and only decays them while it keeps allocating, so an idle gateway would hold that
//! burst's garbage for good. After each load the gateway asks the allocator to return every
//! unused page once: a few milliseconds off the request path, instead of a shorter decay time
//! that would make every request pay for purging.

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
