//! Shared memory buffers (SMBs): sealed memfds mapped into the service.
//!
//! The service creates one SMB per producer, lazily, the first time it sets
//! up a data source on it, as upstream does (src/tracing/ipc/posix_shared_memory.cc):
//! `memfd_create("perfetto_shmem")`,
//! sized, sealed against shrinking, growing and further sealing, and mapped
//! shared. A producer may instead provide its own SMB (startup tracing); it
//! is accepted only if sealed the same way and sized exactly as
//! [`ensure_valid_sizes`] would choose.
//!
//! The mapping is shared with an untrusted process. It is only ever read and
//! written through [`shmtrace_abi::smb::Smb`], which copies and uses atomics
//! and never hands out references to that memory.
// `unsafe` here: mmap/munmap of the SMB and the `Smb` view over the mapping.
#![allow(unsafe_code)]

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};
use shmtrace_abi::layout::{
    PageSize, PageSizeError, DEFAULT_PAGE_SIZE, DEFAULT_SMB_SIZE, MAX_SMB_SIZE,
    SERVICE_MAX_PAGE_SIZE,
};
use shmtrace_abi::smb::{Smb, SmbError};
use thiserror::Error;

/// The seals a producer-provided SMB must carry.
const REQUIRED_SEALS: SealFlags = SealFlags::SHRINK
    .union(SealFlags::GROW)
    .union(SealFlags::SEAL);

/// Why an SMB could not be created or adopted.
#[derive(Debug, Error)]
pub enum ShmError {
    /// A system call failed.
    #[error("{what}: {source}")]
    Os {
        /// What was being done.
        what: &'static str,
        /// The error.
        source: rustix::io::Errno,
    },
    /// A producer-provided SMB is not sealed.
    #[error("producer-provided shared memory lacks the shrink/grow/seal seals")]
    NotSealed,
    /// A producer-provided SMB has a size the service would not choose.
    #[error("producer-provided shared memory of {size} bytes with {page_size}-byte pages is not a valid geometry")]
    InvalidGeometry {
        /// Size of the memfd.
        size: u64,
        /// Page size the producer announced.
        page_size: u32,
    },
    /// The page size is not one the service uses.
    #[error("invalid page size: {0}")]
    PageSize(#[from] PageSizeError),
    /// The mapping is not a valid SMB.
    #[error("invalid shared memory buffer: {0}")]
    Smb(#[from] SmbError),
    /// A descriptor of the SMB for its producer cannot be made.
    #[error("cannot duplicate the SMB descriptor: {0}")]
    Dup(#[source] std::io::Error),
}

fn os(what: &'static str) -> impl FnOnce(rustix::io::Errno) -> ShmError {
    move |source| ShmError::Os { what, source }
}

/// The SMB size and page size the service uses for hints `size` and `page`
/// (Perfetto's `EnsureValidShmSizes`, src/tracing/service/tracing_service_impl.cc):
/// 0 picks the default,
/// values are clamped to the maximum, and an inconsistent pair reverts both
/// to the defaults.
pub fn ensure_valid_sizes(size: usize, page: usize) -> (usize, usize) {
    let size = if size == 0 {
        DEFAULT_SMB_SIZE
    } else {
        size.min(MAX_SMB_SIZE)
    };
    let page = if page == 0 {
        DEFAULT_PAGE_SIZE
    } else {
        page.min(SERVICE_MAX_PAGE_SIZE)
    };
    let pages_ok = page % DEFAULT_PAGE_SIZE == 0 && (page / DEFAULT_PAGE_SIZE).is_power_of_two();
    if !pages_ok || size < page || size % page != 0 {
        return (DEFAULT_SMB_SIZE, DEFAULT_PAGE_SIZE);
    }
    (size, page)
}

/// A mapped SMB.
#[derive(Debug)]
pub struct SharedMemory {
    fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
    page_size: PageSize,
    provided_by_producer: bool,
}

impl SharedMemory {
    /// Creates a sealed memfd SMB of `size` bytes with pages of
    /// `page_size` bytes (a pair returned by [`ensure_valid_sizes`]).
    pub fn create(size: usize, page_size: usize) -> Result<Self, ShmError> {
        let page_size = PageSize::new_service(page_size)?;
        let fd = rustix::fs::memfd_create(
            "perfetto_shmem",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )
        .map_err(os("memfd_create"))?;
        rustix::fs::ftruncate(&fd, size as u64).map_err(os("ftruncate"))?;
        rustix::fs::fcntl_add_seals(&fd, REQUIRED_SEALS).map_err(os("fcntl(F_ADD_SEALS)"))?;
        Self::map(fd, size, page_size, false)
    }

    /// Adopts an SMB the producer created, announced with pages of
    /// `page_size_hint` bytes.
    pub fn adopt(fd: OwnedFd, page_size_hint: u32) -> Result<Self, ShmError> {
        let seals = rustix::fs::fcntl_get_seals(&fd).map_err(os("fcntl(F_GET_SEALS)"))?;
        if !seals.contains(REQUIRED_SEALS) {
            return Err(ShmError::NotSealed);
        }
        let size = rustix::fs::fstat(&fd).map_err(os("fstat"))?.st_size;
        let invalid = ShmError::InvalidGeometry {
            size: size as u64,
            page_size: page_size_hint,
        };
        let Ok(len) = usize::try_from(size) else {
            return Err(invalid);
        };
        let page = page_size_hint as usize;
        if len == 0 || page == 0 || ensure_valid_sizes(len, page) != (len, page) {
            return Err(invalid);
        }
        let page_size = PageSize::new_service(page)?;
        Self::map(fd, len, page_size, true)
    }

    fn map(
        fd: OwnedFd,
        len: usize,
        page_size: PageSize,
        provided_by_producer: bool,
    ) -> Result<Self, ShmError> {
        // SAFETY: a fresh shared mapping of `len` bytes of `fd` at an address
        // the kernel chooses: it aliases no Rust object. The memfd is sealed
        // against shrinking, so the pages stay backed for the mapping's life.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )
        }
        .map_err(os("mmap"))?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(ShmError::Os {
            what: "mmap",
            source: rustix::io::Errno::FAULT,
        })?;
        let mut shm = Self {
            fd,
            ptr,
            len,
            page_size,
            provided_by_producer,
        };
        // Validate the geometry once (alignment, multiple of the page size).
        shm.smb()?;
        Ok(shm)
    }

    /// The SMB view of the mapping. It borrows `self` exclusively, so this
    /// process has at most one view of the mapping at a time (what `Smb`'s
    /// contract asks of several views: no scrape on one while another holds
    /// a chunk).
    pub fn smb(&mut self) -> Result<Smb<'_>, SmbError> {
        // SAFETY: `ptr..ptr+len` is our shared mapping, valid until `self`
        // is dropped, which the returned `Smb<'_>` cannot outlive. This
        // process never creates Rust references into it: all access goes
        // through `Smb`. Other processes may write it at any time, which the
        // `Smb` contract allows. The view borrows `self` mutably, so no other
        // view of this mapping exists in this process while it lives.
        unsafe { Smb::from_raw_parts(self.ptr.as_ptr(), self.len, self.page_size) }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false` (an SMB has at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Page size.
    pub fn page_size(&self) -> PageSize {
        self.page_size
    }

    /// Whether the producer created it.
    pub fn provided_by_producer(&self) -> bool {
        self.provided_by_producer
    }

    /// The memfd.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// A new descriptor of the memfd, to send to the producer.
    pub fn dup_fd(&self) -> std::io::Result<OwnedFd> {
        self.fd.try_clone()
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` is the mapping created in `map`, unmapped only
        // here; no `Smb` borrowing it can be alive (they borrow `self`).
        if let Err(e) = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) } {
            log::warn!("munmap of a shared memory buffer failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shmtrace_abi::layout::{ChunkFlags, ChunkHeaderRepr, Packets, PageLayout};

    #[test]
    fn sizes_follow_upstream() {
        assert_eq!(ensure_valid_sizes(0, 0), (262_144, 4096));
        assert_eq!(ensure_valid_sizes(1 << 20, 16384), (1 << 20, 16384));
        // Clamped.
        assert_eq!(ensure_valid_sizes(64 << 20, 65536), (32 << 20, 32768));
        // Page not a power-of-two multiple of 4 KiB, size not a multiple of
        // the page, size below the page: both revert.
        assert_eq!(ensure_valid_sizes(1 << 20, 12288), (262_144, 4096));
        assert_eq!(ensure_valid_sizes(10_000, 4096), (262_144, 4096));
        assert_eq!(ensure_valid_sizes(4096, 8192), (262_144, 4096));
    }

    #[test]
    fn a_created_smb_is_sealed_shared_and_usable() {
        let mut shm = SharedMemory::create(64 * 1024, 4096).expect("memfd");
        let seals = rustix::fs::fcntl_get_seals(shm.fd()).expect("seals");
        assert!(seals.contains(REQUIRED_SEALS));
        assert_eq!(
            rustix::fs::fstat(shm.fd()).expect("fstat").st_size,
            64 * 1024
        );
        // A second mapping of the same fd (what the producer does) sees the
        // chunk the first one wrote.
        let mut other = SharedMemory::adopt(shm.dup_fd().expect("dup"), 4096).expect("adopt");
        let smb = other.smb().expect("smb");
        let header = ChunkHeaderRepr {
            chunk_id: 7,
            writer_id: 3,
            packets: Packets::new(1, ChunkFlags::EMPTY).unwrap(),
        };
        let mut w = smb
            .try_acquire_any_chunk_for_writing(0, PageLayout::Div1, header)
            .expect("chunk");
        w.write(0, &[1, 0x42]).expect("write");
        let loc = w.release_as_complete().expect("release");
        let service = shm.smb().expect("smb");
        let r = service
            .try_acquire_chunk_for_reading(loc.page, loc.chunk)
            .expect("complete");
        let mut copy = vec![0u8; 4096];
        let copied = r.copy_out(&mut copy).expect("copy");
        assert_eq!(copied.header.chunk_id, 7);
        assert_eq!(&copy[8..10], &[1, 0x42]);
    }

    #[test]
    fn producer_smbs_must_be_sealed_and_sized_exactly() {
        let fd =
            rustix::fs::memfd_create("x", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&fd, 65536).unwrap();
        assert!(matches!(
            SharedMemory::adopt(fd.try_clone().unwrap(), 4096),
            Err(ShmError::NotSealed)
        ));
        rustix::fs::fcntl_add_seals(&fd, REQUIRED_SEALS).unwrap();
        assert!(matches!(
            SharedMemory::adopt(fd.try_clone().unwrap(), 12288),
            Err(ShmError::InvalidGeometry {
                size: 65536,
                page_size: 12288
            })
        ));
        let mut shm = SharedMemory::adopt(fd, 4096).expect("valid");
        assert!(shm.provided_by_producer());
        assert_eq!(shm.smb().unwrap().num_pages(), 16);
    }
}
