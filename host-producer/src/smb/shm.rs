//! The memory behind an SMB: a shared mapping of the fd the service sent,
//! or private heap memory (shmem emulation, in-process use, tests).
//!
//! # Invariants
//!
//! * The memory stays mapped/allocated for the whole life of the
//!   [`SharedMemory`], and is only accessed through its [`Smb`] view (the
//!   crate never forms a Rust reference to it).
//! * A `&'static Smb` comes only from the `unsafe`
//!   [`SharedMemory::smb_static`], whose callers prove at the call site that
//!   the `SharedMemory` outlives every use of it (and of the chunks borrowed
//!   from it).
// `unsafe` here: mmap/munmap and heap memory behind an SMB, and the `Smb` view over it.
#![allow(unsafe_code)]

use std::alloc::Layout;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use rustix::fs::SealFlags;
use rustix::mm::{MapFlags, ProtFlags};
use shmtrace_abi::layout::PageSize;
use shmtrace_abi::smb::Smb;

use crate::error::SmbSetupError;

enum Memory {
    /// `MAP_SHARED` mapping of the service's fd.
    Mapped { ptr: NonNull<u8>, len: usize },
    /// Zeroed private memory, 4096-aligned.
    Heap { ptr: NonNull<u8>, layout: Layout },
}

// SAFETY: `Memory` is an owned region of plain bytes (no thread affinity);
// all access goes through `Smb`, which is itself `Send + Sync`.
unsafe impl Send for Memory {}
// SAFETY: as above; `&Memory` exposes nothing but the address.
unsafe impl Sync for Memory {}

impl Memory {
    fn ptr(&self) -> *mut u8 {
        match self {
            Memory::Mapped { ptr, .. } | Memory::Heap { ptr, .. } => ptr.as_ptr(),
        }
    }

    fn len(&self) -> usize {
        match self {
            Memory::Mapped { len, .. } => *len,
            Memory::Heap { layout, .. } => layout.size(),
        }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        match *self {
            Memory::Mapped { ptr, len } => {
                // SAFETY: `ptr`/`len` describe a mapping created by `mmap` in
                // `SharedMemory::map` and never unmapped before; the `Smb`
                // view over it was dropped first (field order of
                // `SharedMemory`) and no other view exists (module
                // invariants).
                let _ = unsafe { rustix::mm::munmap(ptr.as_ptr().cast(), len) };
            }
            Memory::Heap { ptr, layout } => {
                // SAFETY: allocated in `SharedMemory::heap` with exactly this
                // layout; the view over it is gone (as above).
                unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
            }
        }
    }
}

/// An SMB's memory and its [`Smb`] view.
pub(crate) struct SharedMemory {
    // Declared first: dropped before the memory it views.
    smb: Smb<'static>,
    // Owned for its `Drop` (unmap or free), which runs after `smb`'s.
    _memory: Memory,
    emulated: bool,
}

/// Makes sure `fd` is a memfd that cannot shrink: it carries
/// `F_SEAL_SHRINK`, or this adds it (a memfd created with
/// `MFD_ALLOW_SEALING` and not sealed yet). Anything else is refused: not a
/// memfd at all ([`SmbSetupError::NotMemfd`]: pipes, directories, files on
/// disk, devices), or a memfd that cannot be sealed
/// ([`SmbSetupError::NotSealed`]).
fn seal_against_shrinking(fd: BorrowedFd<'_>) -> Result<(), SmbSetupError> {
    let seals = rustix::fs::fcntl_get_seals(fd).map_err(|e| SmbSetupError::NotMemfd(e.into()))?;
    if seals.contains(SealFlags::SHRINK) {
        return Ok(());
    }
    rustix::fs::fcntl_add_seals(fd, SealFlags::SHRINK)
        .map_err(|e| SmbSetupError::NotSealed(e.into()))
}

impl SharedMemory {
    /// Maps the service's SMB fd (`SetupTracing`) with pages of
    /// `page_size` bytes.
    ///
    /// The fd must be a memfd sealed against shrinking, or one this
    /// function can seal (see [`seal_against_shrinking`]): otherwise the
    /// service could shrink it later, and the program's next write to the
    /// mapping past the new end would be a `SIGBUS`. Both services seal it
    /// (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`), so this costs nothing
    /// with them; upstream's producer attaches without this check.
    pub(crate) fn map(fd: OwnedFd, page_size: usize) -> Result<Self, SmbSetupError> {
        let page_size =
            PageSize::new(page_size).map_err(|_| SmbSetupError::BadPageSize(page_size))?;
        // Sealed before the size is read: from here on it can only grow,
        // which leaves the mapping of the size read below intact.
        seal_against_shrinking(fd.as_fd())?;
        let stat = rustix::fs::fstat(fd.as_fd()).map_err(|e| SmbSetupError::Stat(e.into()))?;
        let len = usize::try_from(stat.st_size).map_err(|_| SmbSetupError::BadSize(0))?;
        if len == 0 || len % page_size.get() != 0 || len > shmtrace_abi::layout::MAX_SMB_SIZE {
            return Err(SmbSetupError::BadSize(len));
        }
        // Populated up front: the first write to each page would otherwise
        // take a page fault on a writer's trace path (~1 µs per 4 KiB page
        // per process, paid once per page of the SMB).
        // SAFETY: a fresh shared mapping chosen by the kernel (null hint),
        // of a memfd we own, at offset 0 and within its size, which the
        // shrink seal keeps for the mapping's life; it does not alias any
        // Rust object.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED | MapFlags::POPULATE,
                fd.as_fd(),
                0,
            )
        }
        .map_err(|e| SmbSetupError::Map(e.into()))?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(SmbSetupError::BadSize(len))?;
        let memory = Memory::Mapped { ptr, len };
        Self::with_memory(memory, page_size, false)
    }

    /// Private zeroed memory of `len` bytes (emulation or in-process use).
    pub(crate) fn heap(
        len: usize,
        page_size: usize,
        emulated: bool,
    ) -> Result<Self, SmbSetupError> {
        let page_size =
            PageSize::new(page_size).map_err(|_| SmbSetupError::BadPageSize(page_size))?;
        if len == 0 || len % page_size.get() != 0 {
            return Err(SmbSetupError::BadSize(len));
        }
        // Page-aligned like a mapping (the ABI itself needs 8 bytes).
        let layout = Layout::from_size_align(len, shmtrace_abi::layout::MIN_PAGE_SIZE)
            .map_err(|_| SmbSetupError::BadSize(len))?;
        // SAFETY: `layout` has a non-zero size (checked above).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(SmbSetupError::OutOfMemory(len))?;
        Self::with_memory(Memory::Heap { ptr, layout }, page_size, emulated)
    }

    fn with_memory(
        memory: Memory,
        page_size: PageSize,
        emulated: bool,
    ) -> Result<Self, SmbSetupError> {
        // SAFETY: `memory` is valid for reads and writes of `len` bytes until
        // it is dropped, which happens after the `Smb` (field order); the
        // crate never creates references to these bytes, and the only views
        // are this `Smb` and borrows of it that the module invariants keep
        // shorter than the `SharedMemory`.
        let smb = unsafe { Smb::from_raw_parts(memory.ptr(), memory.len(), page_size) }
            .map_err(SmbSetupError::Geometry)?;
        Ok(SharedMemory {
            smb,
            _memory: memory,
            emulated,
        })
    }

    /// The view.
    pub(crate) fn smb(&self) -> &Smb<'static> {
        &self.smb
    }

    /// The view with its lifetime extended to `'static`.
    ///
    /// # Safety
    ///
    /// `self` must not move nor be dropped while the result, or anything
    /// borrowed from it (chunks, windows), is in use: the view points into
    /// `self` and at the memory `self` frees when dropped. In practice
    /// `self` lives in an `Arc` and the caller keeps a clone of that `Arc`,
    /// dropped after the last use.
    pub(crate) unsafe fn smb_static(&self) -> &'static Smb<'static> {
        let ptr: *const Smb<'static> = &self.smb;
        // SAFETY: `ptr` comes from a reference, so it is valid and aligned
        // now; the caller guarantees that it stays so for every use of the
        // `'static` result (this function's contract).
        unsafe { &*ptr }
    }

    /// Size in bytes.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self._memory.len()
    }

    /// `true` if chunks travel over the socket (shmem emulation).
    pub(crate) fn is_emulated(&self) -> bool {
        self.emulated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_memory_is_a_valid_empty_smb() {
        let shm = SharedMemory::heap(64 * 1024, 4096, false).unwrap();
        assert_eq!(shm.smb().num_pages(), 16);
        assert!(shm.smb().is_page_free(15));
        assert_eq!(shm.len(), 65536);
        assert!(matches!(
            SharedMemory::heap(5000, 4096, false),
            Err(SmbSetupError::BadSize(5000))
        ));
        assert!(matches!(
            SharedMemory::heap(8192, 1000, false),
            Err(SmbSetupError::BadPageSize(1000))
        ));
    }

    fn memfd(flags: rustix::fs::MemfdFlags, len: u64) -> OwnedFd {
        let fd = rustix::fs::memfd_create("shmtrace-test", flags).unwrap();
        rustix::fs::ftruncate(&fd, len).unwrap();
        fd
    }

    #[test]
    fn maps_a_memfd_and_keeps_it_from_shrinking() {
        use rustix::fs::MemfdFlags;
        // Sealed by its creator, as both services do.
        let fd = memfd(MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING, 32 * 1024);
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .unwrap();
        let shm = SharedMemory::map(fd, 4096).unwrap();
        assert_eq!(shm.smb().num_pages(), 8);
        assert!(!shm.is_emulated());

        // Sealable but not sealed: sealed here, so the service's copy of
        // the fd can no longer shrink it (growing stays allowed).
        let fd = memfd(MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING, 32 * 1024);
        let theirs = fd.try_clone().unwrap();
        let shm = SharedMemory::map(fd, 4096).unwrap();
        assert_eq!(
            rustix::fs::ftruncate(&theirs, 4096),
            Err(rustix::io::Errno::PERM)
        );
        rustix::fs::ftruncate(&theirs, 64 * 1024).unwrap();
        assert_eq!(shm.smb().num_pages(), 8);
    }

    #[test]
    fn refuses_what_could_shrink_or_is_no_memfd() {
        use rustix::fs::MemfdFlags;
        // A memfd created without MFD_ALLOW_SEALING cannot be sealed.
        let fd = memfd(MemfdFlags::CLOEXEC, 32 * 1024);
        assert!(matches!(
            SharedMemory::map(fd, 4096),
            Err(SmbSetupError::NotSealed(_))
        ));
        // A socket, a directory: no seals at all.
        let (socket, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let dir = std::fs::File::open(std::env::temp_dir()).unwrap();
        for fd in [OwnedFd::from(socket), OwnedFd::from(dir)] {
            assert!(matches!(
                SharedMemory::map(fd, 4096),
                Err(SmbSetupError::NotMemfd(_))
            ));
        }
        // Sizes: empty, not a multiple of the page, above the maximum.
        let sealable = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
        for len in [0, 5000, shmtrace_abi::layout::MAX_SMB_SIZE as u64 + 4096] {
            assert!(
                matches!(
                    SharedMemory::map(memfd(sealable, len), 4096),
                    Err(SmbSetupError::BadSize(l)) if l as u64 == len
                ),
                "{len} bytes"
            );
        }
        assert!(matches!(
            SharedMemory::map(memfd(sealable, 8192), 0),
            Err(SmbSetupError::BadPageSize(0))
        ));
    }
}
