//! A view over a shared memory buffer the crate does not own.
//!
//! [`Smb`] wraps memory that stays valid for `'m`: an `mmap`ed memfd shared
//! with another process, a `static` buffer in firmware, or a test buffer. It
//! validates the geometry once, then drives the chunk state machine of
//! [`crate::sync`] on [`AtomicLeU32`]/[`AtomicLeU16`] words (little-endian
//! on every target) overlaid on the memory, and hands out ownership tokens:
//!
//! * producer: [`Smb::try_partition_page`], [`Smb::try_acquire_chunk_for_writing`]
//!   → [`WritableChunk`] (write payload, bump the packet count, then
//!   [`WritableChunk::release_as_complete`]);
//! * service: [`Smb::try_acquire_chunk_for_reading`] → [`ReadableChunk`]
//!   ([`ReadableChunk::copy_out`], then [`ReadableChunk::release_as_free`]);
//!   [`Smb::scrape`] / [`Smb::scrape_all`] for chunks not committed yet;
//! * shmem emulation: [`Smb::release_complete_as_free`].
//!
//! # Invariants
//!
//! * The base is 8-aligned, the length a non-zero multiple of a valid
//!   ABI page size; all pointer work happens in the private `raw` module.
//! * No `&[u8]`/`&mut [u8]` ever covers SMB bytes: header words are atomics,
//!   payload bytes move with `ptr::copy_nonoverlapping` into or out of
//!   caller-owned slices.
//! * Every page and chunk index, whether from the caller or read from shared
//!   memory (the layout), is bounds-checked; a chunk's geometry is computed
//!   from a validated [`PageSize`] and always lies inside its page.
//! * A [`WritableChunk`] exists only while its chunk is `BeingWritten` by it,
//!   a [`ReadableChunk`] only while its chunk is `BeingRead` by it. Within one
//!   process these tokens make payload access race-free. Scraping reads
//!   chunks other code may own, so it takes `&mut Smb`: no token of the same
//!   `Smb` can be alive meanwhile.
//! * A peer that breaks the protocol (rewrites the layout or a state behind
//!   our back) produces typed errors, never a panic; data it corrupts is only
//!   ever handed out as copies for the caller to validate.

#[allow(unsafe_code)]
mod raw;

use core::fmt;
use core::ptr::NonNull;

use crate::layout::{
    ChunkGeometry, ChunkHeaderError, ChunkHeaderRepr, Packets, PageLayout, PageSize,
    CHUNK_HEADER_SIZE, SMB_ALIGNMENT,
};
use crate::state::{self, ChunkState, PartitionError};
use crate::sync::{
    self, AcquireError, AtomicLeU16, AtomicLeU32, AtomicWord16, AtomicWord32, ChunkWords, Ordering,
    PageWords, ReleaseError, ScrapeError,
};

pub use raw::{OutOfBounds, Window, MIN_WINDOW_LEN, WINDOW_LEN, WINDOW_SLACK};
use raw::{PayloadMut, Region};

/// Zero-initialized, 4096-aligned storage for an SMB of `N` bytes (a
/// zero-filled SMB is a valid, empty one).
///
/// [`Smb::new`] borrows it mutably for the lifetime of the `Smb`. In
/// firmware, obtain a `&'static mut` to a `static` instance once (e.g. with
/// `static_cell::StaticCell` or `cortex_m::singleton!`); in tests, put it in
/// a `Box`.
#[repr(C, align(4096))]
pub struct SmbStorage<const N: usize> {
    bytes: [u8; N],
}

impl<const N: usize> SmbStorage<N> {
    /// Zeroed storage (usable in a `static` initializer).
    pub const fn new() -> Self {
        SmbStorage { bytes: [0; N] }
    }
}

impl<const N: usize> Default for SmbStorage<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> fmt::Debug for SmbStorage<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SmbStorage")
            .field("len", &N)
            .finish_non_exhaustive()
    }
}

/// Why memory was refused as an SMB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmbError {
    /// The pointer was null.
    NullPointer,
    /// The start address is not 8-aligned ([`SMB_ALIGNMENT`]).
    Misaligned {
        /// The start address.
        addr: usize,
    },
    /// The length is zero.
    Empty,
    /// The length is not a multiple of the page size.
    NotMultipleOfPageSize {
        /// The length in bytes.
        len: usize,
        /// The page size.
        page_size: PageSize,
    },
}

impl fmt::Display for SmbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::NullPointer => f.write_str("SMB pointer is null"),
            Self::Misaligned { addr } => {
                write!(f, "SMB start {addr:#x} is not {SMB_ALIGNMENT}-aligned")
            }
            Self::Empty => f.write_str("SMB is empty"),
            Self::NotMultipleOfPageSize { len, page_size } => {
                write!(
                    f,
                    "SMB size {len} is not a multiple of the page size ({page_size})"
                )
            }
        }
    }
}

impl core::error::Error for SmbError {}

/// Why a chunk could not be copied out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyError {
    /// The destination cannot hold the chunk (header + payload); nothing
    /// was copied.
    BufferTooSmall {
        /// Bytes needed (the chunk size).
        needed: usize,
        /// Bytes available.
        got: usize,
    },
    /// The chunk was copied, but its header failed validation: the copy
    /// must be dropped (the chunk still has to be released).
    InvalidHeader(ChunkHeaderError),
}

impl fmt::Display for CopyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::BufferTooSmall { needed, got } => {
                write!(f, "destination holds {got} bytes, chunk needs {needed}")
            }
            Self::InvalidHeader(e) => write!(f, "invalid chunk header: {e}"),
        }
    }
}

impl core::error::Error for CopyError {}

/// Page and chunk index of a chunk (as sent in `CommitData.chunks_to_move`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChunkLocation {
    /// Page index in the SMB.
    pub page: usize,
    /// Chunk index in the page (`0..14`).
    pub chunk: usize,
}

/// A chunk copied out by the service ([`ReadableChunk::copy_out`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopiedChunk {
    /// The header, parsed from the copy and validated.
    pub header: ChunkHeaderRepr,
    /// Bytes written to the destination: the chunk size (8-byte header +
    /// payload). The payload is `dst[8..len]`.
    pub len: usize,
}

/// A chunk copied by [`Smb::scrape`] without changing its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScrapedChunk {
    /// Where the chunk is.
    pub location: ChunkLocation,
    /// Whether the producer had finished the chunk (`Complete`). If not,
    /// only the first `count - 1` fragments are finished and the
    /// `LAST_PACKET_CONTINUES_ON_NEXT_CHUNK` / `CHUNK_NEEDS_PATCHING` flags do
    /// not hold yet: parse the payload with
    /// [`Fragments::new_incomplete`](crate::reader::Fragments::new_incomplete),
    /// and let a later commit of the same chunk replace the copy. The header
    /// and the copy are left exactly as the producer wrote them, so the
    /// prefix rule is applied in one place only.
    pub complete: bool,
    /// The validated header, as copied (also in `dst[..8]`).
    pub header: ChunkHeaderRepr,
    /// Bytes written to the destination: the chunk size.
    pub len: usize,
}

/// Counts of one [`Smb::scrape_all`] pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScrapeStats {
    /// Chunks handed to the callback.
    pub scraped: usize,
    /// Chunks being written with fewer than two fragments (nothing
    /// finished yet).
    pub skipped_unfinished: usize,
    /// Chunks whose copied header failed validation.
    pub skipped_invalid_header: usize,
}

/// The SMB: pages of a fixed size over memory valid for `'m`.
#[derive(Debug)]
pub struct Smb<'m> {
    region: Region<'m>,
}

/// The atomic words of one page of an [`Smb`].
struct SmbPage<'s> {
    header_bitmap: &'s AtomicLeU32,
    region: &'s Region<'s>,
    page: usize,
}

impl PageWords for SmbPage<'_> {
    type Word32 = AtomicLeU32;
    type Word16 = AtomicLeU16;

    #[inline]
    fn header_bitmap(&self) -> &AtomicLeU32 {
        self.header_bitmap
    }

    fn chunk_words(
        &self,
        layout: PageLayout,
        chunk: usize,
    ) -> Option<&ChunkWords<AtomicLeU32, AtomicLeU16>> {
        self.region.chunk_words(self.page, layout, chunk)
    }
}

impl<'m> Smb<'m> {
    /// Views `len` bytes at `ptr` as an SMB with pages of `page_size`.
    ///
    /// Fails if `ptr` is null or not 8-aligned, or `len` is not a
    /// non-zero multiple of the page size.
    ///
    /// # Safety
    ///
    /// * `ptr` must be valid for reads and writes of `len` bytes for all of
    ///   `'m` (e.g. a `MAP_SHARED` mapping that is unmapped only after `'m`),
    ///   and no Rust reference to those bytes may exist during `'m`.
    /// * Other processes (or hardware) may access the memory arbitrarily:
    ///   they are the untrusted peer this type defends against. Within this
    ///   process, the memory must only be accessed through `Smb` values.
    /// * If several `Smb`s over the same memory are alive in this process,
    ///   [`scrape`](Self::scrape) and [`scrape_all`](Self::scrape_all) on one
    ///   of them must not run while a [`WritableChunk`] or [`ReadableChunk`]
    ///   of another one is alive. (A single `Smb` enforces this through
    ///   `&mut self`.)
    #[allow(unsafe_code)]
    pub unsafe fn from_raw_parts(
        ptr: *mut u8,
        len: usize,
        page_size: PageSize,
    ) -> Result<Self, SmbError> {
        let base = NonNull::new(ptr).ok_or(SmbError::NullPointer)?;
        // SAFETY: the caller guarantees validity for `'m` and the absence of
        // references (first point of this function's contract).
        let region = unsafe { Region::new(base, len, page_size) }?;
        Ok(Smb { region })
    }

    /// Views `storage` as an SMB with pages of `page_size`, borrowing it
    /// exclusively for `'m`.
    pub fn new<const N: usize>(
        storage: &'m mut SmbStorage<N>,
        page_size: PageSize,
    ) -> Result<Self, SmbError> {
        Ok(Smb {
            region: Region::from_storage(storage, page_size)?,
        })
    }

    /// Number of pages.
    pub fn num_pages(&self) -> usize {
        self.region.num_pages()
    }

    /// The page size.
    pub fn page_size(&self) -> PageSize {
        self.region.page_size()
    }

    /// Total size in bytes.
    pub fn len(&self) -> usize {
        self.region.len()
    }

    /// Always `false`: an SMB has at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Chunk size (header included) of `layout` in this SMB; `None` for
    /// layouts without chunks.
    pub fn chunk_size(&self, layout: PageLayout) -> Option<usize> {
        self.page_size().chunk_size(layout)
    }

    fn page(&self, page: usize) -> Option<SmbPage<'_>> {
        Some(SmbPage {
            header_bitmap: self.region.header_bitmap(page)?,
            region: &self.region,
            page,
        })
    }

    /// The page's `header_bitmap` (relaxed load; a hint that may be stale).
    /// `None` if `page` is out of range.
    pub fn header_bitmap(&self, page: usize) -> Option<u32> {
        Some(self.page(page)?.header_bitmap.load(Ordering::Relaxed))
    }

    /// The page's current layout (relaxed hint). `None` if out of range.
    pub fn page_layout(&self, page: usize) -> Option<PageLayout> {
        self.header_bitmap(page).map(state::layout)
    }

    /// A chunk's current state (relaxed hint). `None` if the page is out of
    /// range or its layout has no such chunk.
    pub fn chunk_state(&self, page: usize, chunk: usize) -> Option<ChunkState> {
        state::chunk_state(self.header_bitmap(page)?, chunk)
    }

    /// Whether the page is unpartitioned and free (relaxed hint; `false` if
    /// out of range).
    pub fn is_page_free(&self, page: usize) -> bool {
        self.page(page).is_some_and(|p| sync::is_page_free(&p))
    }

    /// Bit `j` set iff chunk `j` of the page exists and is free (relaxed
    /// hint; `0` if out of range).
    pub fn free_chunks(&self, page: usize) -> u16 {
        self.page(page).map_or(0, |p| sync::free_chunks(&p))
    }

    /// Producer: partitions a free page with `layout` (`Div1..=Div14`).
    pub fn try_partition_page(
        &self,
        page: usize,
        layout: PageLayout,
    ) -> Result<(), PartitionError> {
        let p = self.page(page).ok_or(PartitionError::PageOutOfRange {
            page,
            num_pages: self.num_pages(),
        })?;
        sync::try_partition(&p, layout)
    }

    /// Producer: takes `chunk` of `page` (`Free → BeingWritten`) and writes
    /// `header` into it (ids relaxed, `packets` release).
    pub fn try_acquire_chunk_for_writing(
        &self,
        page: usize,
        chunk: usize,
        header: ChunkHeaderRepr,
    ) -> Result<WritableChunk<'_>, AcquireError> {
        let p = self.page(page).ok_or(AcquireError::PageOutOfRange {
            page,
            num_pages: self.num_pages(),
        })?;
        let layout = sync::try_acquire_for_writing(&p, chunk, &header)?;
        let geometry = self.page_size().chunk_geometry(layout, chunk).ok_or(
            AcquireError::ChunkOutOfRange {
                chunk,
                num_chunks: layout.num_chunks(),
            },
        )?;
        Ok(self.writable(&p, layout, chunk, geometry, None))
    }

    /// The token of `chunk` of page `p` (partitioned with `layout`), which
    /// this producer just took (`Free → BeingWritten`), writing `header`
    /// into it if given. `geometry` must be the chunk's
    /// ([`PageSize::chunk_geometry`] of this SMB's page size): both callers
    /// pass what `chunk_geometry` returned for the layout and chunk they
    /// took.
    #[allow(unsafe_code)]
    fn writable<'a>(
        &'a self,
        p: &SmbPage<'a>,
        layout: PageLayout,
        chunk: usize,
        geometry: ChunkGeometry,
        header: Option<&ChunkHeaderRepr>,
    ) -> WritableChunk<'a> {
        // SAFETY: `p.page` is below the page count (`Smb::page` checked it)
        // and `geometry` is the page size's geometry of the chunk (this
        // function's contract), as `writable_chunk` requires. The caller
        // just won `Free → BeingWritten` for this chunk, so this producer
        // owns its payload until `release_as_complete`; the payload lies
        // after the chunk header and inside the chunk, so it overlaps no
        // live header word; the returned `WritableChunk` is the only handle
        // to it and borrows `self`, so scraping (`&mut self`) cannot run
        // meanwhile.
        let (words, payload) = unsafe { self.region.writable_chunk(p.page, geometry) };
        if let Some(header) = header {
            words.init(header);
        }
        let used = payload.len() as u16;
        WritableChunk {
            header_bitmap: p.header_bitmap,
            page: p.page,
            // Below 14 (the geometry exists).
            chunk: chunk as u8,
            layout: layout.bits() as u8,
            words,
            payload,
            used,
        }
    }

    /// Producer: scans pages from `start_page` (wrapping), partitions free
    /// pages with `layout`, and takes the first free chunk, as the C++
    /// arbiter does. Pages partitioned with another layout are used as they
    /// are. Fails with [`AcquireError::NoFreeChunk`] if no chunk could be
    /// taken, or [`AcquireError::PageOutOfRange`] if `start_page` is.
    pub fn try_acquire_any_chunk_for_writing(
        &self,
        start_page: usize,
        layout: PageLayout,
        header: ChunkHeaderRepr,
    ) -> Result<WritableChunk<'_>, AcquireError> {
        let num_pages = self.num_pages();
        if start_page >= num_pages {
            return Err(AcquireError::PageOutOfRange {
                page: start_page,
                num_pages: self.num_pages(),
            });
        }
        let mut page = start_page;
        for _ in 0..num_pages {
            if let Some(p) = self.page(page) {
                // One CAS partitions a free page and takes its first chunk
                // (whose geometry is found first); its header is written
                // right after.
                let taken = sync::try_take_first_free_with(p.header_bitmap, layout, |found, c| {
                    Some((found, c, self.page_size().chunk_geometry(found, c)?))
                });
                if let Ok((found, chunk, geometry)) = taken {
                    return Ok(self.writable(&p, found, chunk, geometry, Some(&header)));
                }
            }
            page += 1;
            if page == num_pages {
                page = 0;
            }
        }
        Err(AcquireError::NoFreeChunk)
    }

    /// Service: takes a committed chunk (`Complete → BeingRead`). Fails if
    /// the page is out of range, the page's layout has no such chunk, or the
    /// chunk is not `Complete`.
    pub fn try_acquire_chunk_for_reading(
        &self,
        page: usize,
        chunk: usize,
    ) -> Result<ReadableChunk<'_>, AcquireError> {
        let p = self.page(page).ok_or(AcquireError::PageOutOfRange {
            page,
            num_pages: self.num_pages(),
        })?;
        let layout = sync::try_acquire_for_reading(&p, chunk)?;
        let location = ChunkLocation { page, chunk };
        let (offset, size) =
            self.chunk_span(location, layout)
                .ok_or(AcquireError::ChunkOutOfRange {
                    chunk,
                    num_chunks: layout.num_chunks(),
                })?;
        Ok(ReadableChunk {
            smb: self,
            location,
            layout,
            offset,
            size,
        })
    }

    /// Shmem-emulation producer: frees a `Complete` chunk itself
    /// (`Complete → Free`, header cleared first).
    ///
    /// Only for an SMB no service reads (emulation mode, private memory): as
    /// in Perfetto, the header is cleared before the state CAS, so a service
    /// taking the chunk at the same moment could copy a cleared header.
    /// Producers that need the chunk's bytes first can use
    /// [`try_acquire_chunk_for_reading`](Self::try_acquire_chunk_for_reading),
    /// [`ReadableChunk::copy_out`] and [`ReadableChunk::release_as_free`]
    /// instead, which end in the same state (the transient `BeingRead` is
    /// invisible in private memory).
    pub fn release_complete_as_free(
        &self,
        page: usize,
        chunk: usize,
    ) -> Result<ChunkLocation, ReleaseError> {
        let p = self.page(page).ok_or(ReleaseError::PageOutOfRange {
            page,
            num_pages: self.num_pages(),
        })?;
        sync::release_complete_as_free(&p, chunk)?;
        Ok(ChunkLocation { page, chunk })
    }

    /// Offset from the SMB start and size of a chunk.
    fn chunk_span(&self, location: ChunkLocation, layout: PageLayout) -> Option<(usize, usize)> {
        self.region
            .chunk_span(location.page, layout, location.chunk)
    }

    /// Service: copies a `BeingWritten` or `Complete` chunk into `dst`
    /// without changing its state (SMB scraping, on flush, stop or producer
    /// disconnect).
    ///
    /// The bitmap and `packets` are loaded with `Acquire`. A chunk that is
    /// not `Complete` is skipped if it has fewer than two fragments
    /// ([`ScrapeError::NoFinishedFragment`]); otherwise
    /// [`ScrapedChunk::complete`] is `false` and only its first `count - 1`
    /// fragments may be trusted. The header is validated from the copy.
    ///
    /// Takes `&mut self` because it reads chunks other code may own: no
    /// token of this `Smb` can be alive meanwhile, so within this process
    /// nothing writes what it copies (see [`Smb::from_raw_parts`] for several
    /// `Smb`s over the same memory).
    #[allow(unsafe_code)]
    pub fn scrape(
        &mut self,
        page: usize,
        chunk: usize,
        dst: &mut [u8],
    ) -> Result<ScrapedChunk, ScrapeError> {
        let p = self.page(page).ok_or(ScrapeError::PageOutOfRange {
            page,
            num_pages: self.num_pages(),
        })?;
        let snapshot = sync::scrape_snapshot(&p, chunk)?;
        let location = ChunkLocation { page, chunk };
        let out_of_range = ScrapeError::ChunkOutOfRange {
            chunk,
            num_chunks: snapshot.layout.num_chunks(),
        };
        let (offset, size) = self
            .chunk_span(location, snapshot.layout)
            .ok_or(out_of_range)?;
        let too_small = ScrapeError::BufferTooSmall {
            needed: size,
            got: dst.len(),
        };
        if dst.len() < size {
            return Err(too_small);
        }
        let (head, rest) = dst.split_at_mut(CHUNK_HEADER_SIZE);
        head.copy_from_slice(&snapshot.header.to_bytes());
        // SAFETY: `&mut self` guarantees no `WritableChunk`/`ReadableChunk`
        // of this `Smb` is alive, and the `from_raw_parts` contract extends
        // that to other `Smb`s of this process, so no writer of this process
        // touches these bytes while we copy; other processes are untrusted
        // and their bytes are only handed out as a copy. The range is the
        // payload of a chunk of a validated geometry.
        let payload = unsafe {
            self.region
                .payload(offset + CHUNK_HEADER_SIZE, size - CHUNK_HEADER_SIZE)
        }
        .ok_or(out_of_range)?;
        payload.copy_to(rest).map_err(|_| too_small)?;
        let mut copied = [0u8; CHUNK_HEADER_SIZE];
        copied.copy_from_slice(head);
        let header = ChunkHeaderRepr::from_bytes(copied);
        header.validate().map_err(ScrapeError::InvalidHeader)?;
        Ok(ScrapedChunk {
            location,
            complete: snapshot.complete(),
            header,
            len: size,
        })
    }

    /// Service: scrapes every non-free chunk of every page, in page and chunk
    /// order, calling `f` with each [`ScrapedChunk`] and its copied bytes
    /// (`&dst[..len]`, header included). `dst` must hold the largest chunk
    /// (`page_size - 8` bytes); otherwise nothing is scraped and
    /// [`ScrapeError::BufferTooSmall`] is returned.
    pub fn scrape_all<F>(&mut self, dst: &mut [u8], mut f: F) -> Result<ScrapeStats, ScrapeError>
    where
        F: FnMut(&ScrapedChunk, &[u8]),
    {
        let needed = self.chunk_size(PageLayout::Div1).unwrap_or(0);
        if dst.len() < needed {
            return Err(ScrapeError::BufferTooSmall {
                needed,
                got: dst.len(),
            });
        }
        let mut stats = ScrapeStats::default();
        for page in 0..self.num_pages() {
            let Some(bitmap) = self.header_bitmap(page) else {
                continue;
            };
            for chunk in 0..state::num_chunks(bitmap) {
                match self.scrape(page, chunk, dst) {
                    Ok(scraped) => {
                        stats.scraped += 1;
                        if let Some(bytes) = dst.get(..scraped.len) {
                            f(&scraped, bytes);
                        }
                    }
                    Err(ScrapeError::NoFinishedFragment { .. }) => stats.skipped_unfinished += 1,
                    Err(ScrapeError::InvalidHeader(_)) => stats.skipped_invalid_header += 1,
                    // Free chunks, or the layout changed under us: nothing to take.
                    Err(_) => {}
                }
            }
        }
        Ok(stats)
    }
}

/// A chunk this producer owns (`BeingWritten`): write its payload, publish
/// fragment counts, then hand it over with
/// [`release_as_complete`](Self::release_as_complete).
///
/// Dropping it without releasing leaves the chunk `BeingWritten` (lost until
/// the SMB is torn down), as in Perfetto.
#[derive(Debug)]
#[must_use = "a chunk that is never released stays BeingWritten forever"]
// `repr(C)`, the payload last. The layout is kept as its bits (no spare
// values), so an `Option<WritableChunk>`'s `None` is a null reference: one
// word load and compare on the writers' fast paths (and, measured on
// Cortex-M4, the smallest code of the orders tried).
#[repr(C)]
pub struct WritableChunk<'a> {
    /// The [`PageLayout`]'s bits.
    layout: u8,
    chunk: u8,
    /// At most the payload's length (below 64 KiB).
    used: u16,
    words: &'a ChunkWords<AtomicLeU32, AtomicLeU16>,
    /// The page's `header_bitmap` (all the release needs of the page).
    header_bitmap: &'a AtomicLeU32,
    page: usize,
    payload: PayloadMut<'a>,
}

impl WritableChunk<'_> {
    /// Where the chunk is.
    pub fn location(&self) -> ChunkLocation {
        ChunkLocation {
            page: self.page,
            chunk: usize::from(self.chunk),
        }
    }

    /// The page layout the chunk was acquired with.
    pub fn layout(&self) -> PageLayout {
        PageLayout::from_bits(u32::from(self.layout))
    }

    /// Payload capacity in bytes (chunk size minus the 8-byte header).
    #[inline]
    pub fn capacity(&self) -> usize {
        self.payload.len()
    }

    /// Copies `bytes` into the payload at `offset` (from the payload start).
    /// One bounds check, one copy, no atomics.
    #[inline]
    pub fn write(&mut self, offset: usize, bytes: &[u8]) -> Result<(), OutOfBounds> {
        self.payload.write(offset, bytes)
    }

    /// Sets where the windows [`limited_window`](Self::limited_window)
    /// hands out must end (capped at the capacity; 0, the initial value,
    /// refuses every one): a writer that keeps its own limits (room, a
    /// count, whether anything must come first) folds them into this one,
    /// so its common case checks one bound.
    #[inline]
    pub fn set_window_limit(&mut self, end: usize) {
        self.payload.set_window_limit(end);
    }

    /// Where the windows [`limited_window`](Self::limited_window) hands
    /// out must end: the limit [`set_window_limit`](Self::set_window_limit)
    /// set (capped at the capacity), or 0 if that was too short for a
    /// window.
    #[inline]
    pub fn window_limit(&self) -> usize {
        self.payload.window_limit()
    }

    /// A [`Window`] over the [`WINDOW_LEN`] (+ [`WINDOW_SLACK`]) payload
    /// bytes at `offset`, if they end at or before the window limit
    /// ([`set_window_limit`](Self::set_window_limit)).
    #[inline(always)]
    pub fn limited_window(&mut self, offset: usize) -> Option<Window<'_>> {
        self.payload.limited_window(offset)
    }

    /// The longest [`Window`] at `offset` (a power of two from
    /// [`MIN_WINDOW_LEN`] to [`WINDOW_LEN`] bytes, plus [`WINDOW_SLACK`])
    /// that fits the payload; `None` if not even the shortest does.
    #[inline]
    pub fn window_at_most(&mut self, offset: usize) -> Option<Window<'_>> {
        self.payload.window_at_most(offset)
    }

    /// Payload bytes in use, as the writer declared them with
    /// [`set_used`](Self::set_used) (the whole payload until it does): an
    /// arbiter may tell a transport that bytes past them need not be
    /// copied.
    #[inline]
    pub fn used(&self) -> usize {
        usize::from(self.used)
    }

    /// Declares the first `used` payload bytes as the ones in use (capped
    /// at the capacity); the fragments a reader parses must lie in them.
    #[inline]
    pub fn set_used(&mut self, used: usize) {
        // At most the payload's length, so it fits 16 bits.
        self.used = used.min(self.payload.len()) as u16;
    }

    /// Writes one payload byte at `offset`.
    #[inline]
    pub fn write_u8(&mut self, offset: usize, byte: u8) -> Result<(), OutOfBounds> {
        self.payload.write(offset, &[byte])
    }

    /// Copies payload bytes at `offset` back into `dst` (the owner may read
    /// what it wrote, e.g. to patch a length field).
    #[inline]
    pub fn read_back(&self, offset: usize, dst: &mut [u8]) -> Result<(), OutOfBounds> {
        self.payload.read(offset, dst)
    }

    /// The current `packets` word (relaxed: only this owner stores it).
    #[inline]
    pub fn packets(&self) -> Packets {
        Packets::from_bits(self.words.packets.load(Ordering::Relaxed))
    }

    /// Publishes a new `packets` word with a release store: every payload
    /// byte written before this call is visible to a reader that observes
    /// the new count.
    #[inline]
    pub fn set_packets(&self, packets: Packets) {
        self.words.packets.store(packets.bits(), Ordering::Release);
    }

    /// The chunk header as currently stored.
    pub fn header(&self) -> ChunkHeaderRepr {
        self.words.load(Ordering::Relaxed)
    }

    /// Hands the chunk over (`BeingWritten → Complete`). On success returns
    /// its location, to be listed in `CommitData.chunks_to_move`. On error
    /// (a peer rewrote the page header, or contention beyond the retry
    /// budget) the chunk is lost and must not be committed.
    pub fn release_as_complete(self) -> Result<ChunkLocation, ReleaseError> {
        // The chunk exists in its layout (it was taken in it).
        sync::release_existing_as_complete(
            self.header_bitmap,
            self.layout(),
            usize::from(self.chunk),
        )?;
        Ok(self.location())
    }
}

/// A chunk the service holds for reading (`BeingRead`): copy it out, then
/// [`release_as_free`](Self::release_as_free).
#[derive(Debug)]
#[must_use = "a chunk that is never released stays BeingRead forever"]
pub struct ReadableChunk<'a> {
    smb: &'a Smb<'a>,
    location: ChunkLocation,
    layout: PageLayout,
    offset: usize,
    size: usize,
}

impl ReadableChunk<'_> {
    /// Where the chunk is.
    pub fn location(&self) -> ChunkLocation {
        self.location
    }

    /// The page layout the chunk was acquired with.
    pub fn layout(&self) -> PageLayout {
        self.layout
    }

    /// Chunk size in bytes (8-byte header + payload): what
    /// [`copy_out`](Self::copy_out) writes.
    pub fn chunk_size(&self) -> usize {
        self.size
    }

    /// Copies the whole chunk (header, then payload) into `dst[..chunk_size]`
    /// first, then parses and validates the header from the copy
    /// (`writer_id` in `1..=32767`). The payload is never parsed here.
    pub fn copy_out(&self, dst: &mut [u8]) -> Result<CopiedChunk, CopyError> {
        self.copy_out_prefix(dst, self.size)
    }

    /// As [`copy_out`](Self::copy_out), but copies only the header and the
    /// first `len - 8` payload bytes (`len` capped at the chunk size, at
    /// least the header): for a producer that said how much of the chunk
    /// it used. [`CopiedChunk::len`] is the number of bytes copied.
    #[allow(unsafe_code)]
    pub fn copy_out_prefix(&self, dst: &mut [u8], len: usize) -> Result<CopiedChunk, CopyError> {
        let len = len.max(CHUNK_HEADER_SIZE).min(self.size);
        let too_small = CopyError::BufferTooSmall {
            needed: len,
            got: dst.len(),
        };
        if dst.len() < len {
            return Err(too_small);
        }
        let p = self.smb.page(self.location.page).ok_or(too_small)?;
        let words = p
            .chunk_words(self.layout, self.location.chunk)
            .ok_or(too_small)?;
        // The S1 acquire already synchronized with the producer's release.
        let header = words.load(Ordering::Relaxed);
        let Some((head, rest)) = dst.split_at_mut_checked(CHUNK_HEADER_SIZE) else {
            return Err(too_small);
        };
        let Ok(head) = <&mut [u8; CHUNK_HEADER_SIZE]>::try_from(head) else {
            return Err(too_small);
        };
        *head = header.to_bytes();
        // SAFETY: we hold this chunk as `BeingRead` (the `ReadableChunk`
        // exists only after winning `Complete → BeingRead` and is consumed by
        // `release_as_free`), so no writer of this process may touch it;
        // another process writing anyway only corrupts its own copy. The
        // range is the payload of a chunk of a validated geometry.
        let payload = unsafe {
            self.smb
                .region
                .payload(self.offset + CHUNK_HEADER_SIZE, len - CHUNK_HEADER_SIZE)
        }
        .ok_or(too_small)?;
        payload.copy_to(rest).map_err(|_| too_small)?;
        let header = ChunkHeaderRepr::from_bytes(*head);
        header.validate().map_err(CopyError::InvalidHeader)?;
        Ok(CopiedChunk { header, len })
    }

    /// Frees the chunk (`BeingRead → Free`): clears its header first, and if
    /// every chunk of the page is then free, unpartitions the page. Fails
    /// (without panicking) if a peer changed the page's layout or the chunk's
    /// state meanwhile; the chunk is then left as the peer made it.
    pub fn release_as_free(self) -> Result<ChunkLocation, ReleaseError> {
        let p = self
            .smb
            .page(self.location.page)
            .ok_or(ReleaseError::PageOutOfRange {
                page: self.location.page,
                num_pages: self.smb.num_pages(),
            })?;
        sync::release_as_free(&p, self.layout, self.location.chunk)?;
        Ok(self.location)
    }
}

#[cfg(test)]
#[allow(unsafe_code)]
mod tests {
    use std::boxed::Box;
    use std::vec;

    use super::*;
    use crate::layout::{ChunkFlags, PAGE_HEADER_SIZE};

    const PAGE: PageSize = PageSize::DEFAULT;

    fn storage<const N: usize>() -> Box<SmbStorage<N>> {
        Box::new(SmbStorage::new())
    }

    fn header(writer_id: u16, chunk_id: u32, count: u16, flags: u8) -> ChunkHeaderRepr {
        ChunkHeaderRepr {
            chunk_id,
            writer_id,
            packets: Packets::new(count, ChunkFlags::from_bits_retain(flags)).unwrap(),
        }
    }

    #[test]
    fn geometry_is_validated() {
        let mut st = storage::<8192>();
        let base = st.bytes.as_mut_ptr();
        // SAFETY: the storage outlives every Smb built here and is only
        // accessed through them, one at a time.
        unsafe {
            assert_eq!(
                Smb::from_raw_parts(core::ptr::null_mut(), 4096, PAGE).err(),
                Some(SmbError::NullPointer)
            );
            let addr = base.add(4) as usize;
            assert_eq!(
                Smb::from_raw_parts(base.add(4), 4096, PAGE).err(),
                Some(SmbError::Misaligned { addr })
            );
            assert_eq!(
                Smb::from_raw_parts(base, 0, PAGE).err(),
                Some(SmbError::Empty)
            );
            assert_eq!(
                Smb::from_raw_parts(base, 6000, PAGE).err(),
                Some(SmbError::NotMultipleOfPageSize {
                    len: 6000,
                    page_size: PAGE
                })
            );
            let smb = Smb::from_raw_parts(base, 8192, PAGE).unwrap();
            assert_eq!((smb.num_pages(), smb.len()), (2, 8192));
        }
        let big = PageSize::new(8192).unwrap();
        let smb = Smb::new(&mut *st, big).unwrap();
        assert_eq!(smb.num_pages(), 1);
        assert_eq!(smb.chunk_size(PageLayout::Div7), Some(1168));
        let mut small = storage::<4096>();
        assert_eq!(
            Smb::new(&mut *small, big).err(),
            Some(SmbError::NotMultipleOfPageSize {
                len: 4096,
                page_size: big
            })
        );
    }

    #[test]
    fn limited_windows_end_at_the_limit() {
        let mut st = storage::<4096>();
        let smb = Smb::new(&mut *st, PAGE).unwrap();
        let mut c = smb
            .try_acquire_any_chunk_for_writing(0, PageLayout::Div1, header(1, 0, 0, 0))
            .unwrap();
        let len = WINDOW_LEN + WINDOW_SLACK;
        assert!(c.limited_window(0).is_none(), "a new chunk's limit is 0");
        // Too short for a window: none, and read back as 0.
        c.set_window_limit(len - 1);
        assert!(c.limited_window(0).is_none());
        assert_eq!(c.window_limit(), 0);
        c.set_window_limit(len + 5);
        assert_eq!(c.window_limit(), len + 5);
        assert!(c.limited_window(5).is_some());
        assert!(c.limited_window(6).is_none());
        assert!(c.limited_window(usize::MAX).is_none());
        // Capped at the payload.
        let cap = c.capacity();
        c.set_window_limit(usize::MAX);
        assert_eq!(c.window_limit(), cap);
        assert!(c.limited_window(cap - len).is_some());
        assert!(c.limited_window(cap - len + 1).is_none());
        c.set_window_limit(0);
        assert!(c.limited_window(0).is_none());
    }

    #[test]
    fn appendix_b_page_through_the_api() {
        let mut st = storage::<8192>();
        {
            let smb = Smb::new(&mut *st, PAGE).unwrap();
            smb.try_partition_page(0, PageLayout::Div1).unwrap();
            let mut c = smb
                .try_acquire_chunk_for_writing(0, 0, header(1, 0, 0, 0))
                .unwrap();
            assert_eq!(c.capacity(), 4080);
            c.write(0, &[0x02, 0x40, 0x64]).unwrap();
            c.set_packets(Packets::new(1, ChunkFlags::EMPTY).unwrap());
            c.write(3, &[0x02, 0x40]).unwrap();
            c.write_u8(5, 0x65).unwrap();
            c.set_packets(c.packets().with_count(2).unwrap());
            assert_eq!(c.header(), header(1, 0, 2, 0));
            let loc = c.release_as_complete().unwrap();
            assert_eq!(loc, ChunkLocation { page: 0, chunk: 0 });
        }
        let expected: [u8; 22] = [
            0x03, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00,
            0x02, 0x00, 0x02, 0x40, 0x64, 0x02, 0x40, 0x65,
        ];
        assert_eq!(&st.bytes[..22], &expected);
        assert!(st.bytes[22..].iter().all(|&b| b == 0));

        let smb = Smb::new(&mut *st, PAGE).unwrap();
        let r = smb.try_acquire_chunk_for_reading(0, 0).unwrap();
        assert_eq!(smb.chunk_state(0, 0), Some(ChunkState::BeingRead));
        let mut dst = vec![0xEEu8; 4096];
        let copied = r.copy_out(&mut dst).unwrap();
        assert_eq!(copied.len, 4088);
        assert_eq!(copied.header, header(1, 0, 2, 0));
        assert_eq!(&dst[..14], &expected[8..22]);
        assert!(dst[14..4088].iter().all(|&b| b == 0));
        assert_eq!(dst[4088], 0xEE, "copy_out wrote past the chunk");
        assert_eq!(
            r.release_as_free().unwrap(),
            ChunkLocation { page: 0, chunk: 0 }
        );
        assert!(smb.is_page_free(0));
        assert!(
            st.bytes[..16].iter().all(|&b| b == 0),
            "page and chunk header cleared"
        );
    }

    #[test]
    fn chunks_land_at_their_page_and_chunk_offsets() {
        let mut st = storage::<{ 3 * 4096 }>();
        {
            let smb = Smb::new(&mut *st, PAGE).unwrap();
            smb.try_partition_page(2, PageLayout::Div4).unwrap();
            let mut c = smb
                .try_acquire_chunk_for_writing(2, 3, header(0x0102, 0xA0B0C0D0, 0, 0))
                .unwrap();
            assert_eq!(c.capacity(), 1012);
            c.write(1011, &[0x5A]).unwrap();
            c.set_packets(Packets::new(1023, ChunkFlags::ALL).unwrap());
            let _ = c.release_as_complete().unwrap();
            assert_eq!(smb.free_chunks(2), 0b0111);
            assert_eq!(smb.header_bitmap(2), Some(0x3000_00C0));
            assert_eq!(smb.page_layout(1), Some(PageLayout::NotPartitioned));
            assert_eq!(smb.page_layout(3), None);
        }
        let chunk = 2 * 4096 + PAGE_HEADER_SIZE + 3 * 1020;
        assert_eq!(
            &st.bytes[2 * 4096..2 * 4096 + 4],
            &0x3000_00C0u32.to_le_bytes()
        );
        assert_eq!(
            &st.bytes[chunk..chunk + 8],
            &[0xD0, 0xC0, 0xB0, 0xA0, 0x02, 0x01, 0xFF, 0xFF]
        );
        assert_eq!(st.bytes[chunk + 8 + 1011], 0x5A);
        assert_eq!(chunk + 1020, 3 * 4096 - 8, "Div4 leaves an 8-byte tail");
    }

    #[test]
    fn writes_are_bounds_checked() {
        let mut st = storage::<4096>();
        let smb = Smb::new(&mut *st, PAGE).unwrap();
        smb.try_partition_page(0, PageLayout::Div14).unwrap();
        let mut c = smb
            .try_acquire_chunk_for_writing(0, 13, header(3, 1, 0, 0))
            .unwrap();
        let cap = c.capacity();
        assert_eq!(cap, 284);
        assert_eq!(
            c.write(cap - 1, &[1, 2]),
            Err(OutOfBounds {
                offset: cap - 1,
                len: 2,
                capacity: cap
            })
        );
        assert_eq!(
            c.write(usize::MAX, &[1]),
            Err(OutOfBounds {
                offset: usize::MAX,
                len: 1,
                capacity: cap
            })
        );
        assert_eq!(
            c.write_u8(cap, 1),
            Err(OutOfBounds {
                offset: cap,
                len: 1,
                capacity: cap
            })
        );
        c.write(cap - 2, &[7, 8]).unwrap();
        c.write(0, &[]).unwrap();
        let mut back = [0u8; 2];
        c.read_back(cap - 2, &mut back).unwrap();
        assert_eq!(back, [7, 8]);
        assert_eq!(
            c.read_back(cap - 1, &mut back),
            Err(OutOfBounds {
                offset: cap - 1,
                len: 2,
                capacity: cap
            })
        );
        let _ = c.release_as_complete().unwrap();
    }

    #[test]
    fn acquisition_errors_are_typed() {
        let mut st = storage::<8192>();
        let smb = Smb::new(&mut *st, PAGE).unwrap();
        let h = header(1, 0, 0, 0);
        assert_eq!(
            smb.try_acquire_chunk_for_writing(2, 0, h).err(),
            Some(AcquireError::PageOutOfRange {
                page: 2,
                num_pages: 2
            })
        );
        assert_eq!(
            smb.try_acquire_chunk_for_writing(0, 0, h).err(),
            Some(AcquireError::ChunkOutOfRange {
                chunk: 0,
                num_chunks: 0
            })
        );
        assert_eq!(
            smb.try_partition_page(9, PageLayout::Div1),
            Err(PartitionError::PageOutOfRange {
                page: 9,
                num_pages: 2
            })
        );
        smb.try_partition_page(0, PageLayout::Div2).unwrap();
        let c = smb.try_acquire_chunk_for_writing(0, 1, h).unwrap();
        assert_eq!(
            smb.try_acquire_chunk_for_writing(0, 1, h).err(),
            Some(AcquireError::WrongState {
                expected: ChunkState::Free,
                found: ChunkState::BeingWritten
            })
        );
        assert_eq!(
            smb.try_acquire_chunk_for_reading(0, 1).err(),
            Some(AcquireError::WrongState {
                expected: ChunkState::Complete,
                found: ChunkState::BeingWritten
            })
        );
        assert_eq!(
            smb.try_acquire_chunk_for_reading(5, 0).err(),
            Some(AcquireError::PageOutOfRange {
                page: 5,
                num_pages: 2
            })
        );
        let _ = c.release_as_complete().unwrap();
        let r = smb.try_acquire_chunk_for_reading(0, 1).unwrap();
        assert_eq!(
            smb.try_acquire_chunk_for_reading(0, 1).err(),
            Some(AcquireError::WrongState {
                expected: ChunkState::Complete,
                found: ChunkState::BeingRead
            })
        );
        let _ = r.release_as_free().unwrap();
        assert!(smb.is_page_free(0));
        assert!(!smb.is_page_free(7));
        assert_eq!(smb.free_chunks(7), 0);
    }

    #[test]
    fn any_chunk_acquisition_scans_and_partitions() {
        let mut st = storage::<8192>();
        let smb = Smb::new(&mut *st, PAGE).unwrap();
        let h = header(1, 0, 0, 0);
        let a = smb
            .try_acquire_any_chunk_for_writing(1, PageLayout::Div2, h)
            .unwrap();
        assert_eq!(a.location(), ChunkLocation { page: 1, chunk: 0 });
        let b = smb
            .try_acquire_any_chunk_for_writing(1, PageLayout::Div2, h)
            .unwrap();
        assert_eq!(b.location(), ChunkLocation { page: 1, chunk: 1 });
        let c = smb
            .try_acquire_any_chunk_for_writing(1, PageLayout::Div1, h)
            .unwrap();
        assert_eq!(
            (c.location(), c.layout()),
            (ChunkLocation { page: 0, chunk: 0 }, PageLayout::Div1)
        );
        assert_eq!(
            smb.try_acquire_any_chunk_for_writing(0, PageLayout::Div1, h)
                .err(),
            Some(AcquireError::NoFreeChunk)
        );
        assert_eq!(
            smb.try_acquire_any_chunk_for_writing(2, PageLayout::Div1, h)
                .err(),
            Some(AcquireError::PageOutOfRange {
                page: 2,
                num_pages: 2
            })
        );
        for w in [a, b, c] {
            let _ = w.release_as_complete().unwrap();
        }
    }

    #[test]
    fn hostile_peer_changes_cause_errors_not_panics() {
        let mut st = storage::<4096>();
        let smb = Smb::new(&mut *st, PAGE).unwrap();
        smb.try_partition_page(0, PageLayout::Div4).unwrap();
        let w = smb
            .try_acquire_chunk_for_writing(0, 2, header(5, 9, 0, 0))
            .unwrap();
        let _ = w.release_as_complete().unwrap();
        let r = smb.try_acquire_chunk_for_reading(0, 2).unwrap();
        // The "producer" repartitions the page while the service reads.
        let bitmap = smb.page(0).unwrap().header_bitmap;
        bitmap.store(
            state::partitioned(PageLayout::Div14) | (2 << 4),
            Ordering::Relaxed,
        );
        assert_eq!(
            r.release_as_free(),
            Err(ReleaseError::LayoutChanged {
                acquired: PageLayout::Div4,
                found: PageLayout::Div14
            })
        );
        // ... or flips the state of a chunk the service holds.
        bitmap.store(
            state::partitioned(PageLayout::Div4) | (3 << 4),
            Ordering::Relaxed,
        );
        let r = smb.try_acquire_chunk_for_reading(0, 2).unwrap();
        bitmap.store(
            state::partitioned(PageLayout::Div4) | (1 << 4),
            Ordering::Relaxed,
        );
        assert_eq!(
            r.release_as_free(),
            Err(ReleaseError::WrongState {
                expected: ChunkState::BeingRead,
                found: ChunkState::BeingWritten
            })
        );
        // ... or writes a reserved layout.
        bitmap.store(
            state::partitioned(PageLayout::Reserved2) | 0xFFF,
            Ordering::Relaxed,
        );
        assert_eq!(smb.chunk_state(0, 0), None);
        assert_eq!(
            smb.try_acquire_chunk_for_reading(0, 0).err(),
            Some(AcquireError::ChunkOutOfRange {
                chunk: 0,
                num_chunks: 0
            })
        );
        assert_eq!(
            smb.release_complete_as_free(0, 0),
            Err(ReleaseError::ChunkOutOfRange {
                chunk: 0,
                num_chunks: 0
            })
        );
    }

    #[test]
    fn copy_out_validates_the_copied_header() {
        let mut st = storage::<4096>();
        let smb = Smb::new(&mut *st, PAGE).unwrap();
        smb.try_partition_page(0, PageLayout::Div2).unwrap();
        let mut w = smb
            .try_acquire_chunk_for_writing(0, 0, header(0, 1, 1, 0))
            .unwrap();
        w.write(0, &[0x01, 0xAB]).unwrap();
        let _ = w.release_as_complete().unwrap();
        let r = smb.try_acquire_chunk_for_reading(0, 0).unwrap();
        assert_eq!(r.chunk_size(), 2044);
        let mut small = [0u8; 2043];
        assert_eq!(
            r.copy_out(&mut small),
            Err(CopyError::BufferTooSmall {
                needed: 2044,
                got: 2043
            })
        );
        let mut dst = [0u8; 2044];
        assert_eq!(
            r.copy_out(&mut dst),
            Err(CopyError::InvalidHeader(ChunkHeaderError::WriterIdZero))
        );
        assert_eq!(
            &dst[..10],
            &[1, 0, 0, 0, 0, 0, 1, 0, 0x01, 0xAB],
            "copied before validating"
        );
        let _ = r.release_as_free().unwrap();
        assert!(smb.is_page_free(0));
    }

    #[test]
    fn scraping_follows_the_count_minus_one_rule() {
        let mut st = storage::<8192>();
        let mut smb = Smb::new(&mut *st, PAGE).unwrap();
        smb.try_partition_page(0, PageLayout::Div2).unwrap();
        {
            let mut w = smb
                .try_acquire_chunk_for_writing(0, 0, header(4, 10, 1, 0x1))
                .unwrap();
            w.write(0, &[0x01, 0x11]).unwrap();
            // Chunk 1: complete with two fragments.
            let mut c = smb
                .try_acquire_chunk_for_writing(0, 1, header(4, 11, 0, 0))
                .unwrap();
            c.write(0, &[0x01, 0x22, 0x01, 0x33]).unwrap();
            c.set_packets(Packets::new(2, ChunkFlags::CHUNK_NEEDS_PATCHING).unwrap());
            let _ = c.release_as_complete().unwrap();
            // `w` goes out of scope: chunk 0 stays BeingWritten with count 1.
        }
        let mut dst = vec![0u8; 4088];
        assert_eq!(
            smb.scrape(0, 0, &mut dst),
            Err(ScrapeError::NoFinishedFragment { count: 1 })
        );
        let s = smb.scrape(0, 1, &mut dst).unwrap();
        assert!(s.complete);
        assert_eq!(s.header, header(4, 11, 2, 0x4));
        assert_eq!(
            &dst[..12],
            &[11, 0, 0, 0, 4, 0, 0x02, 0x10, 0x01, 0x22, 0x01, 0x33]
        );
        assert_eq!(
            smb.scrape(1, 0, &mut dst),
            Err(ScrapeError::ChunkOutOfRange {
                chunk: 0,
                num_chunks: 0
            })
        );
        assert_eq!(
            smb.scrape(2, 0, &mut dst),
            Err(ScrapeError::PageOutOfRange {
                page: 2,
                num_pages: 2
            })
        );
        assert_eq!(
            smb.scrape(0, 1, &mut dst[..100]),
            Err(ScrapeError::BufferTooSmall {
                needed: 2044,
                got: 100
            })
        );

        // The writer starts a second fragment: the first is now trusted.
        // Plays the producer of chunk 0 (page 0, Div2).
        fn poke(smb: &Smb<'_>, writer_id: u16, packets: u16) {
            let words = smb.region.chunk_words(0, PageLayout::Div2, 0).unwrap();
            words.writer_id.store(writer_id, Ordering::Relaxed);
            words.packets.store(packets, Ordering::Release);
        }
        poke(
            &smb,
            4,
            Packets::new(2, ChunkFlags::from_bits_retain(0x7))
                .unwrap()
                .bits(),
        );
        let s = smb.scrape(0, 0, &mut dst).unwrap();
        assert!(!s.complete);
        assert_eq!(
            s.header,
            header(4, 10, 2, 0x7),
            "raw header, the reader applies count - 1"
        );
        assert_eq!(&dst[8..10], &[0x01, 0x11]);

        let mut seen = std::vec::Vec::new();
        let stats = smb
            .scrape_all(&mut dst, |c, bytes| {
                seen.push((c.location, c.complete, bytes.len()))
            })
            .unwrap();
        assert_eq!(
            stats,
            ScrapeStats {
                scraped: 2,
                skipped_unfinished: 0,
                skipped_invalid_header: 0
            }
        );
        assert_eq!(
            seen,
            [
                (ChunkLocation { page: 0, chunk: 0 }, false, 2044),
                (ChunkLocation { page: 0, chunk: 1 }, true, 2044)
            ]
        );
        assert_eq!(
            smb.scrape_all(&mut dst[..4087], |_, _| {}),
            Err(ScrapeError::BufferTooSmall {
                needed: 4088,
                got: 4087
            })
        );
        poke(&smb, 0, 1);
        let stats = smb.scrape_all(&mut dst, |_, _| {}).unwrap();
        assert_eq!(
            stats,
            ScrapeStats {
                scraped: 1,
                skipped_unfinished: 1,
                skipped_invalid_header: 0
            }
        );
        poke(&smb, 0, 5);
        let stats = smb.scrape_all(&mut dst, |_, _| {}).unwrap();
        assert_eq!(
            stats,
            ScrapeStats {
                scraped: 1,
                skipped_unfinished: 0,
                skipped_invalid_header: 1
            }
        );
    }

    #[test]
    fn emulation_release_and_relayout_reinitialize_headers() {
        let mut st = storage::<4096>();
        let smb = Smb::new(&mut *st, PAGE).unwrap();
        smb.try_partition_page(0, PageLayout::Div1).unwrap();
        let mut w = smb
            .try_acquire_chunk_for_writing(0, 0, header(2, 3, 0, 0))
            .unwrap();
        let fill = vec![0xFFu8; w.capacity()];
        w.write(0, &fill).unwrap();
        assert_eq!(
            smb.release_complete_as_free(0, 0),
            Err(ReleaseError::WrongState {
                expected: ChunkState::Complete,
                found: ChunkState::BeingWritten
            })
        );
        let _ = w.release_as_complete().unwrap();
        assert_eq!(
            smb.release_complete_as_free(0, 0),
            Ok(ChunkLocation { page: 0, chunk: 0 })
        );
        assert!(smb.is_page_free(0));
        // Div14 chunk 5's header now sits on bytes that held 0xFF payload.
        smb.try_partition_page(0, PageLayout::Div14).unwrap();
        let c = smb
            .try_acquire_chunk_for_writing(0, 5, header(9, 8, 0, 0))
            .unwrap();
        assert_eq!(c.header(), header(9, 8, 0, 0));
        let mut back = [0u8; 4];
        c.read_back(0, &mut back).unwrap();
        assert_eq!(back, [0xFF; 4], "payload is not cleared, only headers are");
        let _ = c.release_as_complete().unwrap();
    }
}
