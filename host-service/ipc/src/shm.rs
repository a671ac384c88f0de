//! Shared memory buffers (SMBs): the memory a producer and the service
//! share, and the one type both ends hold it with.
//!
//! # Who does what
//!
//! * The service creates one SMB per producer ([`SharedMemory::create`]):
//!   a memfd named `perfetto_shmem`, sized, sealed against shrinking,
//!   growing and further sealing, and mapped shared, as upstream does
//!   (src/tracing/ipc/posix_shared_memory.cc). A duplicate of its fd
//!   ([`SharedMemory::dup_fd`]) goes to the producer with `SetupTracing`.
//! * The producer maps the fd it receives ([`SharedMemory::adopt`] with
//!   [`Adoption::ByProducer`]); a producer-provided SMB goes the other way
//!   and the service adopts it with [`Adoption::ByService`]. What each end
//!   asks of the fd's seals is in [`Adoption`]; what sizes the service
//!   accepts beyond the ABI's is service policy and stays in the service.
//! * A transport that cannot pass fds (shmem emulation) gets private
//!   memory instead ([`SharedMemory::heap`]): the producer copies its chunks
//!   into `CommitData`, the service never sees the memory.
//!
//! # Invariants
//!
//! * The memory stays mapped (or allocated) for the whole life of its
//!   [`SharedMemory`] and is released only by its `Drop`. A received memfd
//!   carries at least the shrink seal before its size is read, so the
//!   mapping stays backed: no access can fault with `SIGBUS`.
//! * The size and page size form a valid SMB (checked once, when made): a
//!   non-zero whole number of pages, at most
//!   [`MAX_SMB_SIZE`] for memory a peer sized.
//! * Memory shared with another process never becomes a Rust reference:
//!   this process reaches it only through the [`Smb`] view, which uses
//!   atomics and copies. The other process may write any byte at any time;
//!   `Smb` is built for that peer.
//! * There is one view per `SharedMemory`, borrowed from it:
//!   [`smb`](SharedMemory::smb) lends it shared (acquire, commit and read
//!   chunks), [`scrape_all`](SharedMemory::scrape_all) uses it exclusively
//!   (what `Smb` asks of scraping: no chunk of it held meanwhile). The one
//!   way to hold it longer than a borrow is the `unsafe`
//!   [`smb_static`](SharedMemory::smb_static), whose caller proves that the
//!   `SharedMemory` outlives every use.
// `unsafe` here: mmap/munmap and heap memory behind an SMB, and the `Smb`
// view over it.
#![allow(unsafe_code)]

use std::alloc::Layout;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};
use shmtrace_abi::layout::{
    PageSize, PageSizeError, HEADER_BITMAP_OFFSET, MAX_SMB_SIZE, MIN_PAGE_SIZE,
};
use shmtrace_abi::smb::{ScrapeStats, ScrapedChunk, Smb, SmbError};
use shmtrace_abi::sync::ScrapeError;
use thiserror::Error;

/// The seals [`SharedMemory::create`] puts on its memfd, and what
/// [`Adoption::ByService`] requires.
const ALL_SEALS: SealFlags = SealFlags::SHRINK
    .union(SealFlags::GROW)
    .union(SealFlags::SEAL);

/// Why an SMB could not be made, adopted or shared.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ShmError {
    /// A system call failed.
    #[error("{what}: {source}")]
    Os {
        /// The call.
        what: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The fd has no seals to read: it is not a memfd (a pipe, a directory,
    /// a file on disk, ...), so nothing stops its owner from shrinking it
    /// under the mapping.
    #[error("the shared memory fd is not a memfd: {0}")]
    NotMemfd(#[source] io::Error),
    /// The memfd lacks the shrink, grow and seal seals
    /// ([`Adoption::ByService`]).
    #[error("the shared memory lacks the shrink/grow/seal seals")]
    NotSealed,
    /// The memfd is not sealed against shrinking and cannot be sealed
    /// (created without `MFD_ALLOW_SEALING`, or `F_SEAL_SEAL` is set;
    /// [`Adoption::ByProducer`]): its owner could shrink it, and the next
    /// write past the new end would kill this process with `SIGBUS`.
    #[error("the shared memory is not sealed against shrinking and cannot be sealed: {0}")]
    CannotSeal(#[source] io::Error),
    /// The page size is not one the ABI allows.
    #[error("invalid shared memory page size: {0}")]
    PageSize(#[from] PageSizeError),
    /// The size is zero, not a whole number of pages, or (memory a peer
    /// sized) above [`MAX_SMB_SIZE`].
    #[error(
        "invalid shared memory size: {size} bytes with {page_size}-byte pages \
         (a whole number of pages, at most {MAX_SMB_SIZE} bytes from a peer)"
    )]
    InvalidSize {
        /// The size in bytes.
        size: u64,
        /// The page size in bytes.
        page_size: usize,
    },
    /// Private memory has no descriptor to send to a peer.
    #[error("a private shared memory buffer has no descriptor")]
    NoFd,
    /// Private memory could not be allocated.
    #[error("cannot allocate {0} bytes of shared memory buffer")]
    OutOfMemory(usize),
    /// The memory does not form a valid SMB.
    #[error("invalid shared memory buffer: {0}")]
    Smb(#[from] SmbError),
}

fn os(what: &'static str) -> impl FnOnce(rustix::io::Errno) -> ShmError {
    move |e| ShmError::Os {
        what,
        source: e.into(),
    }
}

/// `len` as the size of an SMB with pages of `page_size` bytes, if it is a
/// non-zero whole number of pages (and at most [`MAX_SMB_SIZE`] if
/// `bounded`).
fn checked_size(len: u64, page_size: PageSize, bounded: bool) -> Result<usize, ShmError> {
    usize::try_from(len)
        .ok()
        .filter(|&l| l != 0 && l % page_size.get() == 0 && (!bounded || l <= MAX_SMB_SIZE))
        .ok_or(ShmError::InvalidSize {
            size: len,
            page_size: page_size.get(),
        })
}

/// How [`SharedMemory::adopt`] treats an fd the peer sent: what it asks of
/// its seals, and how it maps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Adoption {
    /// The service adopting a producer-provided SMB: the memfd must already
    /// carry the shrink, grow and seal seals ([`ShmError::NotSealed`]
    /// otherwise), as upstream's service requires, so that the producer can
    /// neither resize it nor lift the seals. Mapped without populating: the
    /// service touches only the pages of the chunks it reads.
    ByService,
    /// A producer mapping the SMB its service sent: the memfd must be
    /// sealed against shrinking, or sealable, and is then sealed here
    /// (growing stays allowed, and harmless). Both services seal it
    /// already, so this costs nothing with them; upstream's producer maps
    /// without this check. Anything else is refused: not a memfd at all
    /// ([`ShmError::NotMemfd`]), or a memfd that cannot be sealed
    /// ([`ShmError::CannotSeal`]). Populated up front: the first write to
    /// each page would otherwise take a page fault on a writer's trace path
    /// (about 1 µs per 4 KiB page, once per page of the SMB), and every
    /// page's header is written once (unchanged), as the first write to
    /// each page costs more again.
    ByProducer,
}

/// The memory behind an SMB.
#[derive(Debug)]
enum Memory {
    /// A `MAP_SHARED` mapping of the memfd `fd`.
    Mapped {
        ptr: NonNull<u8>,
        len: usize,
        fd: OwnedFd,
    },
    /// Zeroed private memory, allocated with `layout`.
    Heap { ptr: NonNull<u8>, layout: Layout },
}

// SAFETY: `Memory` owns plain bytes (a mapping or an allocation) that any
// thread may use and release; every access goes through `Smb`, which is
// `Send + Sync` itself.
unsafe impl Send for Memory {}
// SAFETY: as above; `&Memory` exposes the address and the fd, nothing else.
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

/// An SMB's memory and its one [`Smb`] view. See the module docs.
#[derive(Debug)]
pub struct SharedMemory {
    /// Points into `memory`, which outlives it (released in `Drop`); the
    /// `'static` is never handed out but through `smb_static`.
    view: Smb<'static>,
    memory: Memory,
}

impl SharedMemory {
    /// Creates an SMB of `size` bytes with pages of `page_size`: a memfd
    /// sealed against shrinking, growing and further sealing, mapped
    /// shared.
    pub fn create(size: usize, page_size: PageSize) -> Result<Self, ShmError> {
        let len = checked_size(size as u64, page_size, false)?;
        let fd = rustix::fs::memfd_create(
            "perfetto_shmem",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )
        .map_err(os("memfd_create"))?;
        rustix::fs::ftruncate(&fd, len as u64).map_err(os("ftruncate"))?;
        rustix::fs::fcntl_add_seals(&fd, ALL_SEALS).map_err(os("fcntl(F_ADD_SEALS)"))?;
        Self::map(fd, len, page_size, MapFlags::SHARED)
    }

    /// Maps `fd`, an SMB the peer sent, with pages of `page_size`, after
    /// checking (and for a producer, making) its seals as `how` says. Its
    /// size must be a whole number of pages, at most [`MAX_SMB_SIZE`].
    pub fn adopt(fd: OwnedFd, page_size: PageSize, how: Adoption) -> Result<Self, ShmError> {
        let seals = rustix::fs::fcntl_get_seals(&fd).map_err(|e| ShmError::NotMemfd(e.into()))?;
        let flags = match how {
            Adoption::ByService if !seals.contains(ALL_SEALS) => return Err(ShmError::NotSealed),
            Adoption::ByService => MapFlags::SHARED,
            Adoption::ByProducer => {
                if !seals.contains(SealFlags::SHRINK) {
                    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK)
                        .map_err(|e| ShmError::CannotSeal(e.into()))?;
                }
                MapFlags::SHARED | MapFlags::POPULATE
            }
        };
        // Read after the shrink seal: from here on the size can only grow,
        // which leaves a mapping of the size read here intact.
        let size = rustix::fs::fstat(&fd).map_err(os("fstat"))?.st_size;
        let len = checked_size(u64::try_from(size).unwrap_or(0), page_size, true)?;
        let shm = Self::map(fd, len, page_size, flags)?;
        if how == Adoption::ByProducer {
            shm.write_page_headers_once();
        }
        Ok(shm)
    }

    /// Writes every page's header word once, leaving it as it is (a
    /// compare-exchange of the value with itself: on x86 a locked
    /// compare-exchange writes the line even when it fails). The first
    /// write into a page of a fresh SMB costs far more than later ones
    /// (measured under KVM: about 800 cycles against 50, and
    /// `MADV_POPULATE_WRITE` does not remove it); done here, on the
    /// connection's thread as it adopts the SMB, it no longer lands on
    /// the trace writers, whose first acquisition in each page would pay
    /// it.
    fn write_page_headers_once(&self) {
        let base = self.memory.ptr();
        for offset in (0..self.memory.len()).step_by(self.view.page_size().get()) {
            // SAFETY: `offset + HEADER_BITMAP_OFFSET + 4 <= len` (pages are
            // at least MIN_PAGE_SIZE bytes, far more than the page header),
            // so the word lies in our mapping, alive for this borrow; it is
            // 4-aligned (the mapping is page-aligned, and the offset a
            // multiple of 4). Every party accesses a page's header bitmap
            // atomically only, so this atomic view races with nothing.
            let word = unsafe {
                AtomicU32::from_ptr(base.add(offset + HEADER_BITMAP_OFFSET).cast::<u32>())
            };
            let v = word.load(Ordering::Relaxed);
            // Fails harmlessly if a peer changed the word meanwhile: the
            // page was written then, which is all this is for.
            let _ = word.compare_exchange(v, v, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// Private zeroed memory of `len` bytes with pages of `page_size`, in
    /// place of a shared mapping (shmem emulation, startup tracing, tests).
    pub fn heap(len: usize, page_size: PageSize) -> Result<Self, ShmError> {
        let len = checked_size(len as u64, page_size, false)?;
        // Page-aligned like a mapping (the ABI itself needs 8 bytes).
        let layout =
            Layout::from_size_align(len, MIN_PAGE_SIZE).map_err(|_| ShmError::OutOfMemory(len))?;
        // SAFETY: `layout` has a non-zero size (`checked_size`).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(ShmError::OutOfMemory(len))?;
        Self::with_memory(Memory::Heap { ptr, layout }, page_size)
    }

    fn map(
        fd: OwnedFd,
        len: usize,
        page_size: PageSize,
        flags: MapFlags,
    ) -> Result<Self, ShmError> {
        // SAFETY: a fresh shared mapping of `len` bytes at offset 0 of the
        // memfd `fd`, at an address the kernel chooses (null hint): it
        // aliases no Rust object. `len` is at most the memfd's size, which
        // its shrink seal keeps for the mapping's life.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                flags,
                &fd,
                0,
            )
        }
        .map_err(os("mmap"))?;
        let Some(ptr) = NonNull::new(ptr.cast::<u8>()) else {
            return Err(ShmError::Os {
                what: "mmap",
                source: rustix::io::Errno::FAULT.into(),
            });
        };
        Self::with_memory(Memory::Mapped { ptr, len, fd }, page_size)
    }

    /// The SMB over `memory`; `memory` is released if it is not one.
    fn with_memory(memory: Memory, page_size: PageSize) -> Result<Self, ShmError> {
        // SAFETY: `memory` is valid for reads and writes of its `len` bytes
        // until it is released, which only `SharedMemory`'s `Drop` does:
        // the view cannot be used after that, as it is lent out only for
        // borrows of the `SharedMemory` (or by `smb_static`, whose caller
        // guarantees the same). This process never makes references into
        // the memory: all access goes through this one view. Other processes
        // may write it at any time, which `Smb` allows. On error `memory` is
        // dropped here, with no view left.
        let view = unsafe { Smb::from_raw_parts(memory.ptr(), memory.len(), page_size) }?;
        Ok(SharedMemory { view, memory })
    }

    /// The view, shared: acquire, commit and read chunks. Its chunks borrow
    /// `self`.
    #[inline]
    pub fn smb(&self) -> &Smb<'_> {
        &self.view
    }

    /// Asks the CPU to fetch the cache line at byte `offset` ahead of a
    /// write (and the page's address translation with it), without waiting
    /// for it: a hint that reads nothing and cannot fault. A no-op for an
    /// offset out of range, and on targets without a prefetch instruction.
    #[inline]
    pub fn prefetch_for_write(&self, offset: usize) {
        #[cfg(target_arch = "x86_64")]
        if offset < self.len() {
            let line = self.memory.ptr().wrapping_add(offset);
            // SAFETY: a prefetch is a hint: it dereferences nothing, never
            // faults and changes no memory (the address is in our mapping
            // anyway). `_MM_HINT_ET0` is `prefetchw` (the line in exclusive
            // state) where the build enables `prfchw`; in a default x86-64
            // build LLVM emits `prefetcht0`, which still brings in the line
            // and the page's address translation, shared.
            unsafe {
                core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_ET0 }>(
                    line.cast::<i8>(),
                )
            };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = offset;
    }

    /// The view with its lifetime extended to `'static`, for chunks kept
    /// across calls by a writer that cannot borrow (a trace writer in a
    /// thread-local).
    ///
    /// # Safety
    ///
    /// Until the last use of the result and of everything borrowed from it
    /// (chunks, windows), `self` must not be dropped, moved nor borrowed
    /// mutably: the result points into `self`, and at the memory `self`
    /// releases when dropped. E.g. `self` lives in an `Arc` whose clone the
    /// holder of the result keeps, and drops after its last chunk.
    pub unsafe fn smb_static(&self) -> &'static Smb<'static> {
        let ptr: *const Smb<'static> = &self.view;
        // SAFETY: `ptr` comes from a reference, so it is valid and aligned
        // now; the caller guarantees that it stays so for every use of the
        // `'static` result (this function's contract).
        unsafe { &*ptr }
    }

    /// Copies every chunk being written or complete-but-uncommitted into
    /// `dst`, one after the other, and calls `f` on each
    /// ([`Smb::scrape_all`]). Takes `self` exclusively, so no chunk of the
    /// view is held meanwhile.
    pub fn scrape_all<F>(&mut self, dst: &mut [u8], f: F) -> Result<ScrapeStats, ScrapeError>
    where
        F: FnMut(&ScrapedChunk, &[u8]),
    {
        self.view.scrape_all(dst, f)
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.memory.len()
    }

    /// Always `false` (an SMB has at least one page).
    pub fn is_empty(&self) -> bool {
        self.memory.len() == 0
    }

    /// Page size.
    pub fn page_size(&self) -> PageSize {
        self.view.page_size()
    }

    /// The memfd; `None` for private memory.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.memory {
            Memory::Mapped { fd, .. } => Some(fd.as_fd()),
            Memory::Heap { .. } => None,
        }
    }

    /// A new descriptor of the memfd, to send to the peer.
    pub fn dup_fd(&self) -> Result<OwnedFd, ShmError> {
        let fd = self.fd().ok_or(ShmError::NoFd)?;
        fd.try_clone_to_owned().map_err(|source| ShmError::Os {
            what: "dup",
            source,
        })
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // `view` has no drop glue that touches the memory; it is unusable
        // from here on (nothing borrows `self` any more, and `smb_static`'s
        // callers guarantee the same).
        match self.memory {
            Memory::Mapped { ptr, len, .. } => {
                // SAFETY: `ptr`/`len` is the mapping `map` created, unmapped
                // only here; nothing uses the view over it any more (above).
                if let Err(e) = unsafe { rustix::mm::munmap(ptr.as_ptr().cast(), len) } {
                    log::warn!("munmap of a shared memory buffer failed: {e}");
                }
            }
            Memory::Heap { ptr, layout } => {
                // SAFETY: allocated in `heap` with exactly this layout, freed
                // only here; nothing uses the view over it any more (above).
                unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shmtrace_abi::layout::{ChunkFlags, ChunkHeaderRepr, Packets, PageLayout};

    const PAGE: PageSize = PageSize::DEFAULT;

    fn memfd(flags: MemfdFlags, len: u64) -> OwnedFd {
        let fd = rustix::fs::memfd_create("shmtrace-test", flags).unwrap();
        rustix::fs::ftruncate(&fd, len).unwrap();
        fd
    }

    fn sealable(len: u64) -> OwnedFd {
        memfd(MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING, len)
    }

    #[test]
    fn a_producer_adopting_an_smb_in_use_changes_no_page_header() {
        let service = SharedMemory::create(64 * 1024, PAGE).expect("memfd");
        let header = ChunkHeaderRepr {
            chunk_id: 1,
            writer_id: 2,
            packets: Packets::new(0, ChunkFlags::EMPTY).unwrap(),
        };
        // Pages in every state: partitioned with a chunk being written, a
        // complete one, and free.
        let smb = service.smb();
        let _writing = smb
            .try_acquire_any_chunk_for_writing(0, PageLayout::Div4, header)
            .expect("chunk");
        let complete = smb
            .try_acquire_any_chunk_for_writing(3, PageLayout::Div1, header)
            .expect("chunk");
        complete.release_as_complete().expect("release");
        let headers = |smb: &Smb<'_>| -> Vec<_> {
            (0..smb.num_pages()).map(|p| smb.header_bitmap(p)).collect()
        };
        let before = headers(smb);
        assert_ne!(before[0], Some(0));
        assert_ne!(before[3], Some(0));
        let producer =
            SharedMemory::adopt(service.dup_fd().expect("dup"), PAGE, Adoption::ByProducer)
                .expect("maps");
        assert_eq!(headers(producer.smb()), before);
        assert_eq!(headers(smb), before);
    }

    #[test]
    fn prefetching_changes_nothing_and_ignores_offsets_out_of_range() {
        let shm = SharedMemory::create(16 * 1024, PAGE).expect("memfd");
        let smb = shm.smb();
        let before: Vec<_> = (0..smb.num_pages()).map(|p| smb.header_bitmap(p)).collect();
        for offset in [0, 1, 4095, 4096, 16 * 1024 - 1, 16 * 1024, usize::MAX] {
            shm.prefetch_for_write(offset);
        }
        let after: Vec<_> = (0..smb.num_pages()).map(|p| smb.header_bitmap(p)).collect();
        assert_eq!(before, after);
        assert_eq!(after, vec![Some(0); 4], "fresh pages stay free");
    }

    #[test]
    fn a_created_smb_is_sealed_and_shared_with_its_peer() {
        let mut service = SharedMemory::create(64 * 1024, PAGE).expect("memfd");
        let fd = service.fd().expect("a memfd");
        assert!(rustix::fs::fcntl_get_seals(fd).unwrap().contains(ALL_SEALS));
        assert_eq!(rustix::fs::fstat(fd).unwrap().st_size, 64 * 1024);
        assert_eq!((service.len(), service.page_size()), (65536, PAGE));
        // The producer's mapping of a duplicate sees what the service's
        // does, both ways.
        let dup = service.dup_fd().expect("dup");
        let producer = SharedMemory::adopt(dup, PAGE, Adoption::ByProducer).expect("maps");
        let header = ChunkHeaderRepr {
            chunk_id: 7,
            writer_id: 3,
            packets: Packets::new(1, ChunkFlags::EMPTY).unwrap(),
        };
        let mut w = producer
            .smb()
            .try_acquire_any_chunk_for_writing(0, PageLayout::Div1, header)
            .expect("chunk");
        w.write(0, &[1, 0x42]).expect("write");
        let mut scraped = Vec::new();
        let mut dst = vec![0u8; 4096];
        let stats = service
            .scrape_all(&mut dst, |c, bytes| {
                scraped.push((c.complete, bytes.to_vec()))
            })
            .expect("scrape");
        assert_eq!(
            (stats.scraped, stats.skipped_unfinished),
            (0, 1),
            "one fragment, not finished yet"
        );
        let loc = w.release_as_complete().expect("release");
        let r = service
            .smb()
            .try_acquire_chunk_for_reading(loc.page, loc.chunk)
            .expect("complete");
        let copied = r.copy_out(&mut dst).expect("copy");
        assert_eq!(copied.header.chunk_id, 7);
        assert_eq!(&dst[8..10], &[1, 0x42]);
        r.release_as_free().expect("free");
        assert!(scraped.is_empty());
        // The producer sees the chunk the service freed.
        let again = producer
            .smb()
            .try_acquire_any_chunk_for_writing(0, PageLayout::Div1, header)
            .expect("chunk");
        assert_eq!(again.location(), loc);
    }

    #[test]
    fn the_service_adopts_only_a_memfd_sealed_by_its_creator() {
        let fd = sealable(65536);
        assert!(matches!(
            SharedMemory::adopt(fd.try_clone().unwrap(), PAGE, Adoption::ByService),
            Err(ShmError::NotSealed)
        ));
        // Not sealed by the failed adoption either.
        assert!(rustix::fs::fcntl_get_seals(&fd).unwrap().is_empty());
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK).unwrap();
        assert!(matches!(
            SharedMemory::adopt(fd.try_clone().unwrap(), PAGE, Adoption::ByService),
            Err(ShmError::NotSealed)
        ));
        rustix::fs::fcntl_add_seals(&fd, ALL_SEALS).unwrap();
        let shm = SharedMemory::adopt(fd, PAGE, Adoption::ByService).expect("sealed");
        assert_eq!(shm.smb().num_pages(), 16);
    }

    #[test]
    fn a_producer_maps_a_memfd_and_keeps_it_from_shrinking() {
        // Sealed by its creator, as both services do.
        let fd = sealable(32 * 1024);
        rustix::fs::fcntl_add_seals(&fd, ALL_SEALS).unwrap();
        let shm = SharedMemory::adopt(fd, PAGE, Adoption::ByProducer).unwrap();
        assert_eq!(shm.smb().num_pages(), 8);

        // Sealable but not sealed: sealed here, so the service's copy of
        // the fd can no longer shrink it (growing stays allowed).
        let fd = sealable(32 * 1024);
        let theirs = fd.try_clone().unwrap();
        let shm = SharedMemory::adopt(fd, PAGE, Adoption::ByProducer).unwrap();
        assert_eq!(
            rustix::fs::ftruncate(&theirs, 4096),
            Err(rustix::io::Errno::PERM)
        );
        rustix::fs::ftruncate(&theirs, 64 * 1024).unwrap();
        assert_eq!(shm.smb().num_pages(), 8);
    }

    #[test]
    fn refuses_what_could_shrink_or_is_no_memfd_or_no_smb() {
        // A memfd created without MFD_ALLOW_SEALING cannot be sealed.
        let fd = memfd(MemfdFlags::CLOEXEC, 32 * 1024);
        assert!(matches!(
            SharedMemory::adopt(fd, PAGE, Adoption::ByProducer),
            Err(ShmError::CannotSeal(_))
        ));
        // A socket, a directory: no seals at all.
        for how in [Adoption::ByProducer, Adoption::ByService] {
            let (socket, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
            let dir = std::fs::File::open(std::env::temp_dir()).unwrap();
            for fd in [OwnedFd::from(socket), OwnedFd::from(dir)] {
                assert!(matches!(
                    SharedMemory::adopt(fd, PAGE, how),
                    Err(ShmError::NotMemfd(_))
                ));
            }
        }
        // Sizes: empty, not a multiple of the page, above the maximum.
        for len in [0, 5000, MAX_SMB_SIZE as u64 + 4096] {
            let fd = sealable(len);
            rustix::fs::fcntl_add_seals(&fd, ALL_SEALS).unwrap();
            for how in [Adoption::ByProducer, Adoption::ByService] {
                assert!(
                    matches!(
                        SharedMemory::adopt(fd.try_clone().unwrap(), PAGE, how),
                        Err(ShmError::InvalidSize { size, page_size: 4096 }) if size == len
                    ),
                    "{len} bytes, {how:?}"
                );
            }
        }
    }

    #[test]
    fn private_memory_is_a_valid_empty_smb() {
        let shm = SharedMemory::heap(64 * 1024, PAGE).unwrap();
        assert_eq!(shm.smb().num_pages(), 16);
        assert!(shm.smb().is_page_free(15));
        assert_eq!(shm.len(), 65536);
        assert!(shm.fd().is_none());
        assert!(matches!(shm.dup_fd(), Err(ShmError::NoFd)));
        // Only memory a peer sized is bounded.
        let big = MAX_SMB_SIZE + 4096;
        assert_eq!(SharedMemory::heap(big, PAGE).unwrap().len(), big);
        assert!(matches!(
            SharedMemory::heap(5000, PAGE),
            Err(ShmError::InvalidSize {
                size: 5000,
                page_size: 4096
            })
        ));
        let page = PageSize::new(16384).unwrap();
        assert!(matches!(
            SharedMemory::heap(8192, page),
            Err(ShmError::InvalidSize {
                size: 8192,
                page_size: 16384
            })
        ));
    }
}
