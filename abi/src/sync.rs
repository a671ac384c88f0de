//! Atomic words and the chunk state-machine operations over them.
//!
//! This is the coordination layer of the SMB (bbqueue's "coordination", as
//! opposed to "storage"). It has three parts:
//!
//! 1. **The shim** [`atomic`]: the [`shared`] atomics normally (`core`'s, or
//!    `portable-atomic`'s with that feature), `loom`'s atomics under
//!    `RUSTFLAGS="--cfg loom"` (maitake-sync style). Only
//!    [`OwnedPageWords`] is built from it.
//! 2. **Two tiny traits**, [`AtomicWord32`] and [`AtomicWord16`], implemented
//!    for [`AtomicLeU32`] and [`AtomicLeU16`] (the words [`crate::smb::Smb`]
//!    and the region overlay on shared memory, little-endian on every
//!    target), for the [`shared`] atomics (owned words) and, under
//!    `--cfg loom`, for loom's atomics; plus [`PageWords`], "the atomic
//!    words of one page".
//! 3. **Generic operations** ([`try_partition`], [`try_acquire_for_writing`],
//!    [`release_as_complete`], [`try_acquire_for_reading`],
//!    [`release_as_free`], [`release_complete_as_free`],
//!    [`scrape_snapshot`]) that run unchanged on the real mapping and on owned
//!    loom model pages.
//!
//! # Invariants and memory ordering
//!
//! * Every state change is a compare-and-swap of the whole `header_bitmap`
//!   word with `AcqRel` ordering, computed by [`crate::state::apply`]. Loads
//!   that decide whether to acquire use `Acquire`; hints use `Relaxed`.
//! * A CAS that loses a race re-evaluates the transition on the value it
//!   found, at most [`CAS_ATTEMPTS`] times, then returns a `Contended` error.
//!   The CAS in these loops is a weak one: a spurious failure (an interrupt
//!   between the load-exclusive and the store-exclusive) counts as a lost
//!   race and re-evaluates the same value.
//!   On bare-metal targets every weak CAS on the shared words runs one
//!   out-of-line routine with `AcqRel`/`Acquire` ordering, at least what any
//!   caller asks.
//!   `no_std` code cannot sleep: backing off is the caller's job.
//! * After winning `Free → BeingWritten` the producer initializes the chunk
//!   header: `writer_id` and `chunk_id` with `Relaxed`, then `packets` with
//!   `Release`. Readers load `packets` with `Acquire` before trusting
//!   `writer_id`/`chunk_id` or payload bytes.
//! * Before `BeingRead → Free` (or the emulation `Complete → Free`) the chunk
//!   header is cleared (`writer_id = 0`, `chunk_id = 0` relaxed, `packets = 0`
//!   release) so a later reader can tell an initialized header from a stale
//!   one.
//! * Nothing here panics on any bitmap value: a peer that scribbles on the
//!   shared words gets typed errors, never a crash.
//! * Shared words must be native lock-free atomics (address-free, so they
//!   work across processes): without the `portable-atomic` feature the crate
//!   only builds on targets with native 32- and 16-bit compare-and-swap. With
//!   it, a target without them gets `portable-atomic`'s fallback, which is
//!   atomic only on one core (see [`shared`]).

use core::fmt;
use core::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};

pub use core::sync::atomic::Ordering;

use crate::layout::{ChunkHeaderError, ChunkHeaderRepr, Packets, PageLayout, MAX_CHUNKS_PER_PAGE};
use crate::state::{self, ChunkState, PartitionError, Transition, TransitionError};

/// The atomic types overlaid on shared memory by [`crate::smb`]: `core`'s
/// (native instructions, atomic with respect to every process, core and
/// debug probe that maps the SMB), or with the `portable-atomic` feature
/// `portable-atomic`'s. The latter run native instructions where the target
/// has them and otherwise whatever fallback the firmware build selects
/// (`critical-section` or `unsafe-assume-single-core`), which is atomic only
/// with respect to code on the same core: enable it only where every party
/// that touches the SMB runs on that core (for example a single-core MCU
/// whose firmware both writes chunks and drains them through
/// a [`crate::region::RegionReader`]).
pub mod shared {
    #[cfg(not(feature = "portable-atomic"))]
    pub use core::sync::atomic::{AtomicU16, AtomicU32};
    #[cfg(feature = "portable-atomic")]
    pub use portable_atomic::{AtomicU16, AtomicU32};
}

/// The atomic types the crate's owned words are built from: the
/// [`shared`] ones normally, `loom`'s under `--cfg loom`.
pub mod atomic {
    #[cfg(not(loom))]
    pub use super::shared::{AtomicU16, AtomicU32};
    #[cfg(loom)]
    pub use loom::sync::atomic::{AtomicU16, AtomicU32};
}

/// Most times a state CAS is retried after losing a race before the
/// operation gives up with a `Contended` error (same budget as Perfetto).
pub const CAS_ATTEMPTS: u32 = 64;

/// A 32-bit atomic word: `load`, `store` and `compare_exchange`.
pub trait AtomicWord32 {
    /// Atomic load.
    fn load(&self, order: Ordering) -> u32;
    /// Atomic store.
    fn store(&self, value: u32, order: Ordering);
    /// Strong compare-and-exchange.
    fn compare_exchange(
        &self,
        current: u32,
        new: u32,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u32, u32>;
    /// Weak compare-and-exchange (may fail spuriously, returning the
    /// value it expected): for loops that retry anyway, where it is one
    /// load-exclusive/store-exclusive pair without a retry loop of its own.
    fn compare_exchange_weak(
        &self,
        current: u32,
        new: u32,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u32, u32>;
}

/// A 16-bit atomic word: `load` and `store` (the u16 header words are only
/// ever written by their single owner).
pub trait AtomicWord16 {
    /// Atomic load.
    fn load(&self, order: Ordering) -> u16;
    /// Atomic store.
    fn store(&self, value: u16, order: Ordering);
}

macro_rules! impl_words {
    ($a32:ty, $a16:ty) => {
        impl AtomicWord32 for $a32 {
            #[inline]
            fn load(&self, order: Ordering) -> u32 {
                <$a32>::load(self, order)
            }
            #[inline]
            fn store(&self, value: u32, order: Ordering) {
                <$a32>::store(self, value, order)
            }
            #[inline]
            // Without native compare-and-swap (thumbv6m without the
            // `portable-atomic` feature) `core`'s type has no inherent
            // `compare_exchange` and this call names the trait method
            // itself. lib.rs rejects that build with `compile_error!`; this
            // keeps the lint from adding a misleading warning to it.
            #[cfg_attr(
                not(any(
                    feature = "portable-atomic",
                    all(target_has_atomic = "32", target_has_atomic = "16")
                )),
                allow(unconditional_recursion)
            )]
            fn compare_exchange(
                &self,
                current: u32,
                new: u32,
                success: Ordering,
                failure: Ordering,
            ) -> Result<u32, u32> {
                <$a32>::compare_exchange(self, current, new, success, failure)
            }
            #[inline]
            #[cfg_attr(
                not(any(
                    feature = "portable-atomic",
                    all(target_has_atomic = "32", target_has_atomic = "16")
                )),
                allow(unconditional_recursion)
            )]
            fn compare_exchange_weak(
                &self,
                current: u32,
                new: u32,
                success: Ordering,
                failure: Ordering,
            ) -> Result<u32, u32> {
                // Bare metal: one shared routine, at least as strong as
                // any ordering asked (see `cas_weak_acq_rel`).
                #[cfg(target_os = "none")]
                {
                    let _ = (success, failure);
                    cas_weak_acq_rel(self, current, new)
                }
                #[cfg(not(target_os = "none"))]
                <$a32>::compare_exchange_weak(self, current, new, success, failure)
            }
        }
        impl AtomicWord16 for $a16 {
            #[inline]
            fn load(&self, order: Ordering) -> u16 {
                <$a16>::load(self, order)
            }
            #[inline]
            fn store(&self, value: u16, order: Ordering) {
                <$a16>::store(self, value, order)
            }
        }
    };
}

/// The weak compare-and-exchange of every shared word on bare-metal targets,
/// out of line: the chunk acquire, the chunk release and the ring's claim
/// share one copy of the exclusive-access sequence instead of inlining one
/// each (a firmware's code size). `AcqRel` on success and `Acquire` on
/// failure: at least what any caller asks (`AcqRel`/`Acquire`,
/// `AcqRel`/`Relaxed`, `Relaxed`/`Relaxed`), so each keeps the ordering its
/// protocol needs; the extra barriers cost a chunk switch, never an event.
#[cfg(target_os = "none")]
#[inline(never)]
fn cas_weak_acq_rel(word: &shared::AtomicU32, current: u32, new: u32) -> Result<u32, u32> {
    word.compare_exchange_weak(current, new, AcqRel, Acquire)
}

impl_words!(shared::AtomicU32, shared::AtomicU16);

/// A 32-bit atomic word of memory shared with another party (a process, a
/// core, a debug probe), stored little-endian on every target: the ABI's
/// byte order (Perfetto assumes it and builds only for little-endian CPUs:
/// `include/perfetto/ext/tracing/core/shared_memory_abi.h`), so a
/// big-endian core and a little-endian host agree on its bytes. On
/// little-endian targets every conversion is a no-op.
///
/// Laid out as `u32` (`repr(transparent)` over [`shared::AtomicU32`]); the
/// crate overlays it on shared memory, and has no other way to make one.
#[repr(transparent)]
pub struct AtomicLeU32(shared::AtomicU32);

/// The 16-bit [`AtomicLeU32`]: a shared word stored little-endian.
#[repr(transparent)]
pub struct AtomicLeU16(shared::AtomicU16);

impl fmt::Debug for AtomicLeU32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&AtomicWord32::load(self, Relaxed), f)
    }
}

impl fmt::Debug for AtomicLeU16 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&AtomicWord16::load(self, Relaxed), f)
    }
}

impl AtomicLeU32 {
    /// Atomic wrapping add, returning the previous value. On big-endian
    /// targets a compare-and-swap loop (the bytes to add to are swapped).
    #[inline]
    pub fn fetch_add(&self, n: u32, order: Ordering) -> u32 {
        #[cfg(target_endian = "little")]
        {
            self.0.fetch_add(n, order)
        }
        #[cfg(target_endian = "big")]
        {
            let mut seen = AtomicWord32::load(self, Relaxed);
            loop {
                match AtomicWord32::compare_exchange_weak(
                    self,
                    seen,
                    seen.wrapping_add(n),
                    order,
                    Relaxed,
                ) {
                    Ok(previous) => return previous,
                    Err(now) => seen = now,
                }
            }
        }
    }
}

impl AtomicWord32 for AtomicLeU32 {
    #[inline]
    fn load(&self, order: Ordering) -> u32 {
        u32::from_le(AtomicWord32::load(&self.0, order))
    }
    #[inline]
    fn store(&self, value: u32, order: Ordering) {
        AtomicWord32::store(&self.0, value.to_le(), order);
    }
    #[inline]
    fn compare_exchange(
        &self,
        current: u32,
        new: u32,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u32, u32> {
        from_le(AtomicWord32::compare_exchange(
            &self.0,
            current.to_le(),
            new.to_le(),
            success,
            failure,
        ))
    }
    #[inline]
    fn compare_exchange_weak(
        &self,
        current: u32,
        new: u32,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u32, u32> {
        from_le(AtomicWord32::compare_exchange_weak(
            &self.0,
            current.to_le(),
            new.to_le(),
            success,
            failure,
        ))
    }
}

/// A compare-and-exchange's result (both arms a value as stored) in the
/// native byte order.
#[inline]
fn from_le(stored: Result<u32, u32>) -> Result<u32, u32> {
    stored.map(u32::from_le).map_err(u32::from_le)
}

impl AtomicWord16 for AtomicLeU16 {
    #[inline]
    fn load(&self, order: Ordering) -> u16 {
        u16::from_le(AtomicWord16::load(&self.0, order))
    }
    #[inline]
    fn store(&self, value: u16, order: Ordering) {
        AtomicWord16::store(&self.0, value.to_le(), order);
    }
}
#[cfg(loom)]
impl_words!(loom::sync::atomic::AtomicU32, loom::sync::atomic::AtomicU16);

/// The three atomic words of one chunk header, laid out as in the header
/// (`repr(C)`: `chunk_id` at offset 0, `writer_id` at 4, `packets` at 6),
/// so a handle to a chunk's header is one reference.
#[derive(Debug, Default)]
#[repr(C)]
pub struct ChunkWords<W32, W16> {
    /// `chunk_id` (offset 0).
    pub chunk_id: W32,
    /// `writer_id` (offset 4).
    pub writer_id: W16,
    /// `packets` (offset 6).
    pub packets: W16,
}

impl<W32: AtomicWord32, W16: AtomicWord16> ChunkWords<W32, W16> {
    /// Producer header initialization: ids relaxed, then `packets` release.
    pub fn init(&self, header: &ChunkHeaderRepr) {
        self.writer_id.store(header.writer_id, Relaxed);
        self.chunk_id.store(header.chunk_id, Relaxed);
        self.packets.store(header.packets.bits(), Release);
    }

    /// Header clearing before a chunk is freed: ids relaxed, then `packets`
    /// release.
    pub fn clear(&self) {
        self.writer_id.store(0, Relaxed);
        self.chunk_id.store(0, Relaxed);
        self.packets.store(0, Release);
    }

    /// Loads the header with the given ordering for `packets` (ids are
    /// loaded relaxed, after it).
    pub fn load(&self, packets_order: Ordering) -> ChunkHeaderRepr {
        let packets = Packets::from_bits(self.packets.load(packets_order));
        ChunkHeaderRepr {
            chunk_id: self.chunk_id.load(Relaxed),
            writer_id: self.writer_id.load(Relaxed),
            packets,
        }
    }
}

/// The atomic words of one SMB page: its `header_bitmap` and, per layout,
/// the header words of each chunk.
pub trait PageWords {
    /// Type of the 32-bit words.
    type Word32: AtomicWord32;
    /// Type of the 16-bit words.
    type Word16: AtomicWord16;

    /// The page's `header_bitmap`.
    fn header_bitmap(&self) -> &Self::Word32;

    /// Header words of `chunk` under `layout`, or `None` if the layout has
    /// no such chunk.
    fn chunk_words(
        &self,
        layout: PageLayout,
        chunk: usize,
    ) -> Option<&ChunkWords<Self::Word32, Self::Word16>>;
}

/// A chunk header's words owned by the caller ([`OwnedPageWords`]).
type OwnedChunkWords = ChunkWords<atomic::AtomicU32, atomic::AtomicU16>;

/// A page's atomic words owned by the caller rather than overlaid on shared
/// memory: used by unit tests and by loom models (loom atomics cannot live
/// in a mapping). Chunk header words are indexed by chunk number regardless
/// of layout (the byte aliasing between layouts is a storage concern,
/// tested on [`crate::smb::Smb`]).
#[derive(Debug)]
pub struct OwnedPageWords {
    header_bitmap: atomic::AtomicU32,
    chunks: [OwnedChunkWords; MAX_CHUNKS_PER_PAGE],
}

impl OwnedPageWords {
    /// A free, unpartitioned page with cleared chunk headers.
    pub fn new() -> Self {
        OwnedPageWords {
            header_bitmap: atomic::AtomicU32::new(0),
            chunks: core::array::from_fn(|_| OwnedChunkWords::default()),
        }
    }
}

impl Default for OwnedPageWords {
    fn default() -> Self {
        Self::new()
    }
}

impl PageWords for OwnedPageWords {
    type Word32 = atomic::AtomicU32;
    type Word16 = atomic::AtomicU16;

    fn header_bitmap(&self) -> &Self::Word32 {
        &self.header_bitmap
    }

    fn chunk_words(
        &self,
        layout: PageLayout,
        chunk: usize,
    ) -> Option<&ChunkWords<Self::Word32, Self::Word16>> {
        if chunk >= layout.num_chunks() {
            return None;
        }
        self.chunks.get(chunk)
    }
}

/// Why a chunk could not be acquired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcquireError {
    /// The page index is not below the SMB's page count.
    PageOutOfRange {
        /// The requested page.
        page: usize,
        /// Pages in the SMB.
        num_pages: usize,
    },
    /// The page's current layout has no chunk with this index (the page may
    /// be unpartitioned or repartitioned).
    ChunkOutOfRange {
        /// The requested chunk.
        chunk: usize,
        /// Chunks in the current layout.
        num_chunks: usize,
    },
    /// The chunk is not in the state the acquisition starts from (`Free`
    /// for writing, `Complete` for reading).
    WrongState {
        /// The state the acquisition needs.
        expected: ChunkState,
        /// The state found.
        found: ChunkState,
    },
    /// Other chunks of the page kept changing: every one of the
    /// [`CAS_ATTEMPTS`] compare-and-swaps lost a race. Back off and retry.
    Contended,
    /// No free chunk (only from the acquisitions that pick the chunk: on
    /// the page, or on any page of the SMB).
    NoFreeChunk,
}

impl From<TransitionError> for AcquireError {
    fn from(e: TransitionError) -> Self {
        match e {
            TransitionError::ChunkOutOfRange { chunk, num_chunks } => {
                AcquireError::ChunkOutOfRange { chunk, num_chunks }
            }
            TransitionError::WrongState { expected, found } => {
                AcquireError::WrongState { expected, found }
            }
        }
    }
}

impl fmt::Display for AcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::PageOutOfRange { page, num_pages } => {
                write!(f, "page {page} is out of range (SMB has {num_pages} pages)")
            }
            Self::ChunkOutOfRange { chunk, num_chunks } => {
                write!(
                    f,
                    "chunk {chunk} does not exist in the page's layout of {num_chunks} chunks"
                )
            }
            Self::WrongState { expected, found } => {
                write!(f, "chunk is {found}, expected {expected}")
            }
            Self::Contended => write!(f, "page header kept changing for {CAS_ATTEMPTS} attempts"),
            Self::NoFreeChunk => f.write_str("no free chunk in the SMB"),
        }
    }
}

impl core::error::Error for AcquireError {}

/// Why a chunk could not be released. The chunk's state is left as it was;
/// it is lost to its owner (the peer broke the protocol, or the page was
/// contended beyond the retry budget).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseError {
    /// The page index is not below the SMB's page count.
    PageOutOfRange {
        /// The requested page.
        page: usize,
        /// Pages in the SMB.
        num_pages: usize,
    },
    /// The page's layout is no longer the one the chunk was acquired with
    /// (a peer repartitioned it).
    LayoutChanged {
        /// Layout at acquisition.
        acquired: PageLayout,
        /// Layout found now.
        found: PageLayout,
    },
    /// The page's current layout has no chunk with this index.
    ChunkOutOfRange {
        /// The chunk index.
        chunk: usize,
        /// Chunks in the current layout.
        num_chunks: usize,
    },
    /// The chunk is not in the state the release starts from.
    WrongState {
        /// The state the release needs.
        expected: ChunkState,
        /// The state found.
        found: ChunkState,
    },
    /// Every one of the [`CAS_ATTEMPTS`] compare-and-swaps lost a race.
    Contended,
}

impl From<TransitionError> for ReleaseError {
    fn from(e: TransitionError) -> Self {
        match e {
            TransitionError::ChunkOutOfRange { chunk, num_chunks } => {
                ReleaseError::ChunkOutOfRange { chunk, num_chunks }
            }
            TransitionError::WrongState { expected, found } => {
                ReleaseError::WrongState { expected, found }
            }
        }
    }
}

impl fmt::Display for ReleaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::PageOutOfRange { page, num_pages } => {
                write!(f, "page {page} is out of range (SMB has {num_pages} pages)")
            }
            Self::LayoutChanged { acquired, found } => {
                write!(
                    f,
                    "page layout changed from {acquired:?} to {found:?} while the chunk was held"
                )
            }
            Self::ChunkOutOfRange { chunk, num_chunks } => {
                write!(
                    f,
                    "chunk {chunk} does not exist in the page's layout of {num_chunks} chunks"
                )
            }
            Self::WrongState { expected, found } => {
                write!(f, "chunk is {found}, expected {expected}")
            }
            Self::Contended => write!(f, "page header kept changing for {CAS_ATTEMPTS} attempts"),
        }
    }
}

impl core::error::Error for ReleaseError {}

/// Why a chunk was not scraped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScrapeError {
    /// The page index is not below the SMB's page count.
    PageOutOfRange {
        /// The requested page.
        page: usize,
        /// Pages in the SMB.
        num_pages: usize,
    },
    /// The page's current layout has no chunk with this index.
    ChunkOutOfRange {
        /// The chunk index.
        chunk: usize,
        /// Chunks in the current layout.
        num_chunks: usize,
    },
    /// The chunk is free: nothing to scrape.
    ChunkFree,
    /// The chunk is still being written and has fewer than two fragments,
    /// so none of them is known to be finished.
    NoFinishedFragment {
        /// The fragment count found.
        count: u16,
    },
    /// The destination buffer cannot hold the chunk.
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes available.
        got: usize,
    },
    /// The copied header failed validation.
    InvalidHeader(ChunkHeaderError),
}

impl fmt::Display for ScrapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::PageOutOfRange { page, num_pages } => {
                write!(f, "page {page} is out of range (SMB has {num_pages} pages)")
            }
            Self::ChunkOutOfRange { chunk, num_chunks } => {
                write!(
                    f,
                    "chunk {chunk} does not exist in the page's layout of {num_chunks} chunks"
                )
            }
            Self::ChunkFree => f.write_str("chunk is free"),
            Self::NoFinishedFragment { count } => {
                write!(
                    f,
                    "chunk being written has {count} fragment(s), none known finished"
                )
            }
            Self::BufferTooSmall { needed, got } => {
                write!(f, "destination holds {got} bytes, chunk needs {needed}")
            }
            Self::InvalidHeader(e) => write!(f, "invalid chunk header: {e}"),
        }
    }
}

impl core::error::Error for ScrapeError {}

/// P0: partitions a free page (`0 → layout << 28`, CAS `AcqRel`).
pub fn try_partition<P: PageWords + ?Sized>(
    page: &P,
    layout: PageLayout,
) -> Result<(), PartitionError> {
    let next = state::partition(0, layout)?;
    page.header_bitmap()
        .compare_exchange(0, next, AcqRel, Relaxed)
        .map(|_| ())
        .map_err(|bitmap| PartitionError::PageNotFree { bitmap })
}

fn acquire<P: PageWords + ?Sized>(
    page: &P,
    chunk: usize,
    transition: Transition,
    header: Option<&ChunkHeaderRepr>,
) -> Result<PageLayout, AcquireError> {
    let word = page.header_bitmap();
    let mut bitmap = word.load(Acquire);
    for _ in 0..CAS_ATTEMPTS {
        let next = state::apply(bitmap, chunk, transition)?;
        let layout = state::layout(bitmap);
        let words = page
            .chunk_words(layout, chunk)
            .ok_or(AcquireError::ChunkOutOfRange {
                chunk,
                num_chunks: layout.num_chunks(),
            })?;
        match word.compare_exchange_weak(bitmap, next, AcqRel, Acquire) {
            Ok(_) => {
                if let Some(header) = header {
                    words.init(header);
                }
                return Ok(layout);
            }
            Err(actual) => bitmap = actual,
        }
    }
    Err(AcquireError::Contended)
}

/// P1: acquires `chunk` for writing (`Free → BeingWritten`) and initializes
/// its header from `header`. Returns the page layout the chunk belongs to.
pub fn try_acquire_for_writing<P: PageWords + ?Sized>(
    page: &P,
    chunk: usize,
    header: &ChunkHeaderRepr,
) -> Result<PageLayout, AcquireError> {
    acquire(page, chunk, Transition::AcquireForWriting, Some(header))
}

/// P1 and P2 in one compare-and-swap: takes the page's first free chunk
/// for writing (`Free → BeingWritten`), partitioning the page with `layout`
/// in the same step if it is free and unpartitioned (a page partitioned
/// with another layout is used as it is), and initializes the chunk's
/// header as [`try_acquire_for_writing`] does. Returns the page's layout
/// and the chunk. [`AcquireError::NoFreeChunk`] if the page has none.
pub fn try_acquire_first_free<P: PageWords + ?Sized>(
    page: &P,
    layout: PageLayout,
    header: &ChunkHeaderRepr,
) -> Result<(PageLayout, usize), AcquireError> {
    let (found, chunk) = try_take_first_free(page.header_bitmap(), layout)?;
    // The chunk exists in the layout just found, so it has header words.
    if let Some(words) = page.chunk_words(found, chunk) {
        words.init(header);
    }
    Ok((found, chunk))
}

/// The compare-and-swap of [`try_acquire_first_free`] alone, on the page's
/// `header_bitmap` word: the caller owns the chunk it returns and must
/// initialize its header before anything else.
pub fn try_take_first_free<W: AtomicWord32 + ?Sized>(
    header_bitmap: &W,
    layout: PageLayout,
) -> Result<(PageLayout, usize), AcquireError> {
    try_take_first_free_with(header_bitmap, layout, |found, chunk| Some((found, chunk)))
}

/// [`try_take_first_free`], with `place` run on the layout and chunk each
/// attempt would take, before its compare-and-swap: what it returns is
/// returned once the chunk is taken; `None` (a chunk the caller has no
/// room for) takes nothing ([`AcquireError::NoFreeChunk`]).
pub fn try_take_first_free_with<W: AtomicWord32 + ?Sized, T>(
    header_bitmap: &W,
    layout: PageLayout,
    mut place: impl FnMut(PageLayout, usize) -> Option<T>,
) -> Result<T, AcquireError> {
    let mut bitmap = header_bitmap.load(Acquire);
    for _ in 0..CAS_ATTEMPTS {
        let base = if bitmap == 0 {
            state::partitioned(layout)
        } else {
            bitmap
        };
        let Some(chunk) = state::first_free(base) else {
            return Err(AcquireError::NoFreeChunk);
        };
        let Some(placed) = place(state::layout(base), chunk) else {
            return Err(AcquireError::NoFreeChunk);
        };
        let next = base | ChunkState::BeingWritten.bits() << (chunk as u32 * 2);
        match header_bitmap.compare_exchange_weak(bitmap, next, AcqRel, Acquire) {
            Ok(_) => return Ok(placed),
            Err(b) => bitmap = b,
        }
    }
    Err(AcquireError::Contended)
}

/// S1: acquires `chunk` for reading (`Complete → BeingRead`). Returns the
/// page layout the chunk belongs to.
pub fn try_acquire_for_reading<P: PageWords + ?Sized>(
    page: &P,
    chunk: usize,
) -> Result<PageLayout, AcquireError> {
    acquire(page, chunk, Transition::AcquireForReading, None)
}

fn release<P: PageWords + ?Sized>(
    page: &P,
    acquired: Option<PageLayout>,
    chunk: usize,
    transition: Transition,
) -> Result<(), ReleaseError> {
    release_on(page.header_bitmap(), acquired, chunk, transition, |found| {
        if transition.to() == ChunkState::Free {
            // Clear the header of the chunk as the current layout places it,
            // before the CAS publishes the free state.
            let words = page
                .chunk_words(found, chunk)
                .ok_or(ReleaseError::ChunkOutOfRange {
                    chunk,
                    num_chunks: found.num_chunks(),
                })?;
            words.clear();
        }
        Ok(())
    })
}

/// The CAS loop of a release on the page's `header_bitmap` word; `before`
/// runs before each CAS with the layout found.
fn release_on<W: AtomicWord32 + ?Sized>(
    word: &W,
    acquired: Option<PageLayout>,
    chunk: usize,
    transition: Transition,
    mut before: impl FnMut(PageLayout) -> Result<(), ReleaseError>,
) -> Result<(), ReleaseError> {
    let mut bitmap = word.load(Relaxed);
    for _ in 0..CAS_ATTEMPTS {
        let found = state::layout(bitmap);
        if let Some(acquired) = acquired {
            if found != acquired {
                return Err(ReleaseError::LayoutChanged { acquired, found });
            }
        }
        let next = state::apply(bitmap, chunk, transition)?;
        before(found)?;
        match word.compare_exchange_weak(bitmap, next, AcqRel, Relaxed) {
            Ok(_) => return Ok(()),
            Err(actual) => bitmap = actual,
        }
    }
    Err(ReleaseError::Contended)
}

/// P2: the producer hands a chunk it acquired with layout `acquired` over
/// (`BeingWritten → Complete`).
pub fn release_as_complete<P: PageWords + ?Sized>(
    page: &P,
    acquired: PageLayout,
    chunk: usize,
) -> Result<(), ReleaseError> {
    release_word_as_complete(page.header_bitmap(), acquired, chunk)
}

/// [`release_as_complete`] on the page's `header_bitmap` word alone (all a
/// producer's chunk token needs to keep of its page).
pub fn release_word_as_complete<W: AtomicWord32 + ?Sized>(
    header_bitmap: &W,
    acquired: PageLayout,
    chunk: usize,
) -> Result<(), ReleaseError> {
    let num_chunks = acquired.num_chunks();
    if chunk >= num_chunks {
        return Err(ReleaseError::ChunkOutOfRange { chunk, num_chunks });
    }
    release_existing_as_complete(header_bitmap, acquired, chunk)
}

/// The compare-and-swap loop of [`release_word_as_complete`], for a chunk
/// that exists in `acquired` (`chunk < acquired.num_chunks()`: checked by
/// the caller, or a producer's chunk token's invariant). While the page
/// keeps that layout the chunk has its state bits, so an attempt checks the
/// layout and the chunk's state, not the index.
pub(crate) fn release_existing_as_complete<W: AtomicWord32 + ?Sized>(
    header_bitmap: &W,
    acquired: PageLayout,
    chunk: usize,
) -> Result<(), ReleaseError> {
    // Below 28: the chunk exists in a layout.
    let shift = chunk as u32 * state::CHUNK_STATE_BITS;
    let (from, to) = (ChunkState::BeingWritten, ChunkState::Complete);
    let mut bitmap = header_bitmap.load(Relaxed);
    for _ in 0..CAS_ATTEMPTS {
        let found = state::layout(bitmap);
        if found != acquired {
            return Err(ReleaseError::LayoutChanged { acquired, found });
        }
        let state = ChunkState::from_bits(bitmap >> shift);
        if state != from {
            return Err(ReleaseError::WrongState {
                expected: from,
                found: state,
            });
        }
        let next = bitmap & !(state::CHUNK_STATE_MASK << shift) | to.bits() << shift;
        match header_bitmap.compare_exchange_weak(bitmap, next, AcqRel, Relaxed) {
            Ok(_) => return Ok(()),
            Err(actual) => bitmap = actual,
        }
    }
    Err(ReleaseError::Contended)
}

/// S2: the service frees a chunk it acquired for reading with layout
/// `acquired` (`BeingRead → Free`), clearing its header first. If every
/// chunk of the page is then free the page becomes unpartitioned (`0`).
pub fn release_as_free<P: PageWords + ?Sized>(
    page: &P,
    acquired: PageLayout,
    chunk: usize,
) -> Result<(), ReleaseError> {
    release(page, Some(acquired), chunk, Transition::ReleaseAsFree)
}

/// E1: a producer in shmem-emulation mode frees a `Complete` chunk itself
/// (`Complete → Free`), clearing its header first.
pub fn release_complete_as_free<P: PageWords + ?Sized>(
    page: &P,
    chunk: usize,
) -> Result<(), ReleaseError> {
    release(page, None, chunk, Transition::EmulationReleaseAsFree)
}

/// What a scraper learned about a chunk before copying it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScrapeSnapshot {
    /// The page layout at the time of the snapshot.
    pub layout: PageLayout,
    /// The chunk state (`BeingWritten`, `BeingRead` or `Complete`).
    pub state: ChunkState,
    /// The header as loaded (`packets` with `Acquire`), not yet validated.
    pub header: ChunkHeaderRepr,
}

impl ScrapeSnapshot {
    /// Whether the producer finished the chunk (`Complete`): then every
    /// counted fragment is final. Otherwise only the first `count - 1`
    /// fragments are.
    pub fn complete(&self) -> bool {
        self.state == ChunkState::Complete
    }
}

/// Reads the state and header of a non-free chunk without changing its
/// state: bitmap `Acquire`, then `packets` `Acquire`. A chunk that is not
/// `Complete` (being written, or in a transient read) needs at least two
/// fragments, otherwise [`ScrapeError::NoFinishedFragment`].
pub fn scrape_snapshot<P: PageWords + ?Sized>(
    page: &P,
    chunk: usize,
) -> Result<ScrapeSnapshot, ScrapeError> {
    let bitmap = page.header_bitmap().load(Acquire);
    let layout = state::layout(bitmap);
    let out_of_range = ScrapeError::ChunkOutOfRange {
        chunk,
        num_chunks: layout.num_chunks(),
    };
    let chunk_state = state::chunk_state(bitmap, chunk).ok_or(out_of_range)?;
    if chunk_state == ChunkState::Free {
        return Err(ScrapeError::ChunkFree);
    }
    let words = page.chunk_words(layout, chunk).ok_or(out_of_range)?;
    let header = words.load(Acquire);
    let snapshot = ScrapeSnapshot {
        layout,
        state: chunk_state,
        header,
    };
    if !snapshot.complete() && header.packets.count() < 2 {
        return Err(ScrapeError::NoFinishedFragment {
            count: header.packets.count(),
        });
    }
    Ok(snapshot)
}

/// Relaxed hint: bit `j` set iff chunk `j` exists and is free.
pub fn free_chunks<P: PageWords + ?Sized>(page: &P) -> u16 {
    state::free_chunks(page.header_bitmap().load(Relaxed))
}

/// Relaxed hint: whether the page is unpartitioned and entirely free.
pub fn is_page_free<P: PageWords + ?Sized>(page: &P) -> bool {
    page.header_bitmap().load(Relaxed) == 0
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::layout::ChunkFlags;

    fn header(writer_id: u16, chunk_id: u32, count: u16) -> ChunkHeaderRepr {
        ChunkHeaderRepr {
            chunk_id,
            writer_id,
            packets: Packets::new(count, ChunkFlags::EMPTY).unwrap(),
        }
    }

    #[test]
    fn lifecycle_on_owned_page() {
        let page = OwnedPageWords::new();
        assert!(is_page_free(&page));
        try_partition(&page, PageLayout::Div2).unwrap();
        assert_eq!(
            try_partition(&page, PageLayout::Div1),
            Err(PartitionError::PageNotFree {
                bitmap: 0x2000_0000
            })
        );
        assert_eq!(free_chunks(&page), 0b11);
        let layout = try_acquire_for_writing(&page, 1, &header(7, 42, 0)).unwrap();
        assert_eq!(layout, PageLayout::Div2);
        assert_eq!(free_chunks(&page), 0b01);
        let words = page.chunk_words(layout, 1).unwrap();
        assert_eq!(words.load(Acquire), header(7, 42, 0));
        // Not complete yet: the service cannot take it.
        assert_eq!(
            try_acquire_for_reading(&page, 1),
            Err(AcquireError::WrongState {
                expected: ChunkState::Complete,
                found: ChunkState::BeingWritten
            })
        );
        assert_eq!(
            scrape_snapshot(&page, 1),
            Err(ScrapeError::NoFinishedFragment { count: 0 })
        );
        words
            .packets
            .store(Packets::new(3, ChunkFlags::EMPTY).unwrap().bits(), Release);
        let snap = scrape_snapshot(&page, 1).unwrap();
        assert!(!snap.complete());
        assert_eq!(snap.header.packets.count(), 3);
        release_as_complete(&page, layout, 1).unwrap();
        assert!(scrape_snapshot(&page, 1).unwrap().complete());
        assert_eq!(try_acquire_for_reading(&page, 1), Ok(PageLayout::Div2));
        release_as_free(&page, layout, 1).unwrap();
        assert_eq!(words.load(Acquire), ChunkHeaderRepr::default());
        assert!(is_page_free(&page));
        assert_eq!(
            scrape_snapshot(&page, 0),
            Err(ScrapeError::ChunkOutOfRange {
                chunk: 0,
                num_chunks: 0
            })
        );
    }

    #[test]
    fn release_detects_layout_change_and_wrong_state() {
        let page = OwnedPageWords::new();
        try_partition(&page, PageLayout::Div4).unwrap();
        let layout = try_acquire_for_writing(&page, 0, &header(1, 0, 0)).unwrap();
        // A hostile peer rewrites the layout.
        page.header_bitmap
            .store(state::partitioned(PageLayout::Div14) | 1, Relaxed);
        assert_eq!(
            release_as_complete(&page, layout, 0),
            Err(ReleaseError::LayoutChanged {
                acquired: PageLayout::Div4,
                found: PageLayout::Div14
            })
        );
        // ... or the state.
        page.header_bitmap
            .store(state::partitioned(PageLayout::Div4) | 2, Relaxed);
        assert_eq!(
            release_as_complete(&page, layout, 0),
            Err(ReleaseError::WrongState {
                expected: ChunkState::BeingWritten,
                found: ChunkState::BeingRead
            })
        );
        assert_eq!(
            release_as_free(&page, PageLayout::Div1, 0),
            Err(ReleaseError::LayoutChanged {
                acquired: PageLayout::Div1,
                found: PageLayout::Div4
            })
        );
        page.header_bitmap
            .store(state::partitioned(PageLayout::Div4), Relaxed);
        assert_eq!(
            release_as_free(&page, layout, 0),
            Err(ReleaseError::WrongState {
                expected: ChunkState::BeingRead,
                found: ChunkState::Free
            })
        );
    }

    /// `try_take_first_free_with` runs `place` on what it would take,
    /// before taking it: a refusal takes nothing, an answer comes back
    /// once the chunk is taken.
    #[test]
    fn a_chunk_is_placed_before_it_is_taken() {
        let word = shared::AtomicU32::new(0);
        let refused = try_take_first_free_with(&word, PageLayout::Div4, |_, _| None::<()>);
        assert_eq!(refused, Err(AcquireError::NoFreeChunk));
        assert_eq!(word.load(Relaxed), 0, "nothing taken, nothing partitioned");
        let mut seen = None;
        let placed = try_take_first_free_with(&word, PageLayout::Div4, |layout, chunk| {
            seen = Some((layout, chunk));
            Some(chunk + 100)
        });
        assert_eq!((placed, seen), (Ok(100), Some((PageLayout::Div4, 0))));
        assert_eq!(word.load(Relaxed), 0x3000_0001);
        let next = try_take_first_free_with(&word, PageLayout::Div1, |layout, chunk| {
            Some((layout, chunk))
        });
        assert_eq!(next, Ok((PageLayout::Div4, 1)), "the page keeps its layout");
        assert_eq!(word.load(Relaxed), 0x3000_0005);
    }

    /// The release's own loop makes the state machine's transition
    /// (`state::apply`): for every layout value and chunk index, over
    /// pseudo-random words (garbage past the chunks and in the reserved
    /// bit included), the same new word or the same refusal; a chunk the
    /// acquired layout does not have is refused before any attempt.
    #[test]
    fn release_as_complete_is_the_state_machine_transition() {
        for (i, x) in state::sweep(0x2545_F491, 100_000) {
            let bitmap = (i % 16) << state::LAYOUT_SHIFT | x & state::ALL_CHUNKS_MASK;
            let layout = state::layout(bitmap);
            for chunk in 0..16 {
                let word = shared::AtomicU32::new(bitmap);
                let got = release_word_as_complete(&word, layout, chunk);
                match state::apply(bitmap, chunk, Transition::ReleaseAsComplete) {
                    Ok(next) => {
                        assert_eq!(got, Ok(()), "{bitmap:#010x} {chunk}");
                        assert_eq!(word.load(Relaxed), next, "{bitmap:#010x} {chunk}");
                    }
                    Err(e) => {
                        assert_eq!(got, Err(e.into()), "{bitmap:#010x} {chunk}");
                        assert_eq!(word.load(Relaxed), bitmap, "{bitmap:#010x} {chunk}");
                    }
                }
            }
        }
    }

    #[test]
    fn emulation_release_frees_and_clears() {
        let page = OwnedPageWords::new();
        try_partition(&page, PageLayout::Div1).unwrap();
        let layout = try_acquire_for_writing(&page, 0, &header(9, 5, 2)).unwrap();
        assert_eq!(
            release_complete_as_free(&page, 0),
            Err(ReleaseError::WrongState {
                expected: ChunkState::Complete,
                found: ChunkState::BeingWritten
            })
        );
        release_as_complete(&page, layout, 0).unwrap();
        release_complete_as_free(&page, 0).unwrap();
        assert!(is_page_free(&page));
        assert_eq!(
            page.chunk_words(PageLayout::Div1, 0).unwrap().load(Acquire),
            ChunkHeaderRepr::default()
        );
    }

    #[test]
    fn out_of_range_and_non_partition_layouts() {
        let page = OwnedPageWords::new();
        assert_eq!(
            try_acquire_for_writing(&page, 0, &header(1, 0, 0)),
            Err(AcquireError::ChunkOutOfRange {
                chunk: 0,
                num_chunks: 0
            })
        );
        assert_eq!(
            try_partition(&page, PageLayout::Reserved1),
            Err(PartitionError::NotAPartitionLayout(PageLayout::Reserved1))
        );
        try_partition(&page, PageLayout::Div7).unwrap();
        assert_eq!(
            try_acquire_for_writing(&page, 7, &header(1, 0, 0)),
            Err(AcquireError::ChunkOutOfRange {
                chunk: 7,
                num_chunks: 7
            })
        );
        assert_eq!(
            release_as_complete(&page, PageLayout::Div7, 6),
            Err(ReleaseError::WrongState {
                expected: ChunkState::BeingWritten,
                found: ChunkState::Free
            })
        );
        assert_eq!(page.chunk_words(PageLayout::Div7, 7).map(|_| ()), None);
    }
}
