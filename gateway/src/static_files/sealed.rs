//! A large cached body held in a sealed memory file (`memfd`) mapped read-only: the general
//! path sends it as `Bytes` over the mapping, and the HTTP/1.1 fast path hands the file itself
//! to `sendfile(2)` on plain TCP ([`crate::server::sendfile`]).
//!
//! Why: written from user memory, a large cached body is copied by the kernel into socket buffers,
//! and that copy is the largest part of the CPU such a request costs, and varies from run to run;
//! nginx sends such files with `sendfile` and makes no copy. `sendfile` needs a file, and the file
//! on disk will not do: it may change between re-checks while the cache keeps answering with the
//! bytes (and the `Content-Length`) it read. A memory file holds exactly the cached bytes, and its
//! seals make the kernel refuse any change to them, so the pages a socket still references after
//! `sendfile` returns never change under it. The mapping means the bytes are held once: the cache's
//! budget charges them as before.
//!
//! Each memory file is a descriptor, and descriptors are what connections need: memory files
//! take a place in the static files' share of them ([`super::descriptors`]); past that, bodies
//! stay on the heap and are written.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;

use bytes::Bytes;

use super::descriptors::{self, Slot};

/// A sealed memory file with the bytes it was made from, mapped read-only.
pub struct SealedFile {
    file: OwnedFd,
    map: NonNull<u8>,
    len: usize,
    _slot: Slot<'static>,
}

// SAFETY: the mapping is read-only and lives as long as the value; sharing or sending a pointer
// to bytes that nothing can write is sound.
#[allow(unsafe_code, reason = "a read-only mapping is shared between threads")]
unsafe impl Send for SealedFile {}
#[allow(unsafe_code, reason = "a read-only mapping is shared between threads")]
unsafe impl Sync for SealedFile {}

impl SealedFile {
    /// A sealed memory file holding a copy of `bytes` (which must not be empty: an empty
    /// mapping does not exist).
    pub fn copy_of(bytes: &[u8]) -> io::Result<Self> {
        if bytes.is_empty() {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        let slot = descriptors::slot()?;
        let file = memfd()?;
        let mut writer = File::from(file);
        writer.write_all(bytes)?;
        let file = OwnedFd::from(writer);
        seal(file.as_fd())?;
        let map = map_read_only(file.as_fd(), bytes.len())?;
        Ok(Self {
            file,
            map,
            len: bytes.len(),
            _slot: slot,
        })
    }

    /// The bytes, as the general path sends them.
    pub fn bytes(self: &Arc<Self>) -> Bytes {
        Bytes::from_owner(Held(self.clone()))
    }

    /// The file, as `sendfile` reads it.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// How many bytes it holds.
    #[expect(
        clippy::len_without_is_empty,
        reason = "never empty: `copy_of` refuses an empty body"
    )]
    pub fn len(&self) -> usize {
        self.len
    }

    /// The bytes, through the mapping.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `map` is a live read-only mapping of `len` bytes until `drop`, and sealed
        // against writes, so the slice neither dangles nor changes while borrowed.
        #[allow(unsafe_code, reason = "the mapping's bytes as a slice")]
        unsafe {
            std::slice::from_raw_parts(self.map.as_ptr(), self.len)
        }
    }
}

impl Drop for SealedFile {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `map_read_only` with this length and nothing borrows
        // it any more (every `Bytes` over it holds an `Arc` of this value).
        #[allow(unsafe_code, reason = "unmapping what `copy_of` mapped")]
        unsafe {
            libc::munmap(self.map.as_ptr().cast(), self.len);
        }
    }
}

impl std::fmt::Debug for SealedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedFile")
            .field("len", &self.len)
            .finish()
    }
}

/// What a `Bytes` over the mapping owns.
struct Held(Arc<SealedFile>);

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

fn memfd() -> io::Result<OwnedFd> {
    // SAFETY: a plain system call with a NUL-terminated name; the descriptor it returns is new
    // and owned by nothing else.
    #[allow(
        unsafe_code,
        reason = "memfd_create and taking ownership of its descriptor"
    )]
    unsafe {
        let fd = libc::memfd_create(
            c"gateway-static-file".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(<OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd))
    }
}

/// Forbids every change to the file's size and bytes, and further seals.
fn seal(file: BorrowedFd<'_>) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on a descriptor this process owns, with an integer argument.
    #[allow(unsafe_code, reason = "fcntl(F_ADD_SEALS)")]
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn map_read_only(file: BorrowedFd<'_>, len: usize) -> io::Result<NonNull<u8>> {
    use std::os::fd::AsRawFd;
    // SAFETY: a new read-only shared mapping of `len` bytes of a file at least that long; no
    // existing memory is touched.
    #[allow(unsafe_code, reason = "mmap of the sealed file")]
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if map == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(map.cast()).ok_or_else(|| io::ErrorKind::Other.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bytes_are_a_copy_that_nothing_can_change() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let sealed = Arc::new(SealedFile::copy_of(&data).expect("memfd"));
        let bytes = sealed.bytes();
        assert_eq!(&bytes[..], &data[..]);
        assert_eq!(sealed.len(), data.len());
        // The file refuses writes and size changes (the seals), through any descriptor.
        let dup = sealed.fd().try_clone_to_owned().expect("dup");
        let mut file = File::from(dup);
        assert!(file.write_all(b"x").is_err());
        assert!(file.set_len(10).is_err());
        assert!(file.set_len(200_000).is_err());
        // The bytes outlive every other handle on them.
        let slice = bytes.slice(10..20);
        drop((sealed, bytes, file));
        assert_eq!(&slice[..], &data[10..20]);
    }

    #[test]
    fn an_empty_body_is_refused() {
        assert!(SealedFile::copy_of(&[]).is_err());
    }
}
