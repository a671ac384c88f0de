//! The memory behind an SMB: a shared mapping of the fd the service sent,
//! or private heap memory (shmem emulation, in-process use, tests).
//!
//! # Invariants
//!
//! * The memory stays mapped/allocated for the whole life of the
//!   [`SharedMemory`], and is only accessed through its [`Smb`] view (the
//!   crate never forms a Rust reference to it).
//! * `SharedMemory` is only ever used behind an `Arc`; whoever holds a
//!   `&'static Smb` obtained from [`SharedMemory::smb_static`] (or a chunk
//!   token borrowed from it) also holds a clone of that `Arc`, declared so
//!   that it is dropped after the borrow. That is what makes the `'static`
//!   lifetime of the view sound.

use std::alloc::Layout;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;

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

impl SharedMemory {
    /// Maps the service's SMB fd (`SetupTracing`) with pages of
    /// `page_size` bytes.
    pub(crate) fn map(fd: OwnedFd, page_size: usize) -> Result<Self, SmbSetupError> {
        let page_size =
            PageSize::new(page_size).map_err(|_| SmbSetupError::BadPageSize(page_size))?;
        let stat = rustix::fs::fstat(fd.as_fd()).map_err(|e| SmbSetupError::Stat(e.into()))?;
        let len = usize::try_from(stat.st_size).map_err(|_| SmbSetupError::BadSize(0))?;
        if len == 0 || len % page_size.get() != 0 || len > shmtrace_abi::layout::MAX_SMB_SIZE {
            return Err(SmbSetupError::BadSize(len));
        }
        // Populated up front: the first write to each page would otherwise
        // take a page fault on a writer's trace path (~1 µs per 4 KiB page
        // per process, paid once per page of the SMB).
        // SAFETY: a fresh shared mapping chosen by the kernel (null hint),
        // of a regular fd we own, at offset 0 and within its size; it does
        // not alias any Rust object.
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
        let layout = Layout::from_size_align(len, shmtrace_abi::layout::SMB_ALIGNMENT)
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
    /// Callers must hold an `Arc` of this `SharedMemory` for as long as they
    /// use the result (module invariants).
    pub(crate) fn smb_static(&self) -> &'static Smb<'static> {
        let ptr: *const Smb<'static> = &self.smb;
        // SAFETY: `self` lives in an `Arc` (module invariants), so the `Smb`
        // has a stable address until the last `Arc` is dropped, and every
        // holder of the returned reference keeps such an `Arc` alive for
        // longer than its use of the reference.
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

    #[test]
    fn maps_a_memfd() {
        let fd =
            rustix::fs::memfd_create("shmtrace-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 32 * 1024).unwrap();
        let shm = SharedMemory::map(fd, 4096).unwrap();
        assert_eq!(shm.smb().num_pages(), 8);
        assert!(!shm.is_emulated());
    }
}
