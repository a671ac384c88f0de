//! The 2-bit chunk state machine as pure `const fn`s over the page header
//! bitmap.
//!
//! Bit layout of the 32-bit `header_bitmap` word at offset 0 of every page:
//!
//! ```text
//!  31   30..28   27..26   ...   3..2    1..0
//! [res][layout][state 13] ... [state 1][state 0]
//! ```
//!
//! Every function here is total and side-effect free; [`crate::sync`] runs
//! them inside compare-and-swap loops on the shared word.
//!
//! # Invariants
//!
//! * A zero word is a free, unpartitioned page; a zero-filled SMB is valid.
//! * Chunk indices at or beyond the layout's chunk count have no state:
//!   [`chunk_state`] returns `None` and transitions fail with
//!   [`TransitionError::ChunkOutOfRange`]. State bits beyond the chunk count
//!   are never written.
//! * The only legal transitions are the five of [`Transition`], each from one
//!   exact state to one exact state; everything else is an error, never a
//!   panic.
//! * A transition into `Free` that leaves every chunk free yields `0`: the page
//!   becomes unpartitioned (and the reserved bit 31 is cleared with it).
//!   Every other transition preserves the layout and the reserved bit.

use core::fmt;

use crate::layout::{PageLayout, MAX_CHUNKS_PER_PAGE};

/// Shift of the 3-bit layout field.
pub const LAYOUT_SHIFT: u32 = 28;
/// Mask of the 3-bit layout field (`0x7000_0000`).
pub const LAYOUT_MASK: u32 = 0x7 << LAYOUT_SHIFT;
/// Width in bits of one chunk's state.
pub const CHUNK_STATE_BITS: u32 = 2;
/// Mask of one chunk's state after shifting it down.
pub const CHUNK_STATE_MASK: u32 = 0x3;
/// Mask of all 14 chunk states (`0x0FFF_FFFF`).
pub const ALL_CHUNKS_MASK: u32 = 0x0FFF_FFFF;
/// The reserved top bit.
pub const RESERVED_MASK: u32 = 0x8000_0000;

/// State of one chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ChunkState {
    /// Nobody owns it; a producer may acquire it.
    Free = 0,
    /// A producer writer owns it and is appending fragments.
    BeingWritten = 1,
    /// The service owns it while it copies it out.
    BeingRead = 2,
    /// Handed over by the producer; the service may read it.
    Complete = 3,
}

impl ChunkState {
    /// All four states, by value.
    pub const ALL: [ChunkState; 4] = [
        ChunkState::Free,
        ChunkState::BeingWritten,
        ChunkState::BeingRead,
        ChunkState::Complete,
    ];

    /// Decodes the low two bits.
    pub const fn from_bits(bits: u32) -> Self {
        match bits & CHUNK_STATE_MASK {
            0 => Self::Free,
            1 => Self::BeingWritten,
            2 => Self::BeingRead,
            _ => Self::Complete,
        }
    }

    /// The 2-bit value.
    pub const fn bits(self) -> u32 {
        self as u32
    }
}

impl fmt::Display for ChunkState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Free => "free",
            Self::BeingWritten => "being written",
            Self::BeingRead => "being read",
            Self::Complete => "complete",
        })
    }
}

/// The layout encoded in `bitmap`.
pub const fn layout(bitmap: u32) -> PageLayout {
    PageLayout::from_bits((bitmap & LAYOUT_MASK) >> LAYOUT_SHIFT)
}

/// Number of chunks of the layout encoded in `bitmap`.
pub const fn num_chunks(bitmap: u32) -> usize {
    layout(bitmap).num_chunks()
}

/// The bitmap of a freshly partitioned page: `layout << 28`, all chunks free.
pub const fn partitioned(layout: PageLayout) -> u32 {
    layout.bits() << LAYOUT_SHIFT
}

const fn shift(chunk: usize) -> u32 {
    // Callers guarantee chunk < 14, so the shift is at most 26.
    (chunk as u32) * CHUNK_STATE_BITS
}

/// State of `chunk`, or `None` if the layout has no such chunk.
pub const fn chunk_state(bitmap: u32, chunk: usize) -> Option<ChunkState> {
    if chunk >= num_chunks(bitmap) {
        return None;
    }
    Some(ChunkState::from_bits(bitmap >> shift(chunk)))
}

/// `bitmap` with `chunk` set to `state`, or `None` if the layout has no such
/// chunk. Does not apply the "all free → 0" rule; see [`apply`].
pub const fn with_chunk_state(bitmap: u32, chunk: usize, state: ChunkState) -> Option<u32> {
    if chunk >= num_chunks(bitmap) {
        return None;
    }
    let cleared = bitmap & !(CHUNK_STATE_MASK << shift(chunk));
    Some(cleared | (state.bits() << shift(chunk)))
}

/// Chunk-state bits of a page with `num_chunks` chunks all `Complete`
/// (`num_chunks` is clamped to 14).
pub const fn all_complete_mask(num_chunks: usize) -> u32 {
    let n = if num_chunks > MAX_CHUNKS_PER_PAGE {
        MAX_CHUNKS_PER_PAGE
    } else {
        num_chunks
    };
    // 2 * 14 = 28 < 32: no overflow.
    ((1u32 << (2 * n as u32)) - 1) & ALL_CHUNKS_MASK
}

/// Whether every chunk state in `bitmap` is `Free`.
pub const fn is_all_free(bitmap: u32) -> bool {
    bitmap & ALL_CHUNKS_MASK == 0
}

/// Whether the page has chunks and all of them are `Complete`.
pub const fn is_all_complete(bitmap: u32) -> bool {
    let n = num_chunks(bitmap);
    n != 0 && bitmap & ALL_CHUNKS_MASK == all_complete_mask(n)
}

/// Bit `j` is set iff chunk `j` exists in the layout and is `Free`.
pub const fn free_chunks(bitmap: u32) -> u16 {
    let n = num_chunks(bitmap);
    let mut res = 0u16;
    let mut j = 0;
    while j < n {
        if (bitmap >> shift(j)) & CHUNK_STATE_MASK == ChunkState::Free as u32 {
            res |= 1 << j;
        }
        j += 1;
    }
    res
}

/// The first free chunk of the page `bitmap` describes, if any (the
/// lowest bit of [`free_chunks`], without a loop).
#[inline]
pub const fn first_free(bitmap: u32) -> Option<usize> {
    // Bit 2j set iff chunk j (of the 14 a word holds) is free; the lowest
    // is the first free chunk if it exists in the layout (none set: 16).
    let states = bitmap & ALL_CHUNKS_MASK;
    let free = !(states | states >> 1) & LOW_BITS;
    let chunk = (free.trailing_zeros() / CHUNK_STATE_BITS) as usize;
    if chunk < num_chunks(bitmap) {
        Some(chunk)
    } else {
        None
    }
}

/// The low bit of every chunk's state.
const LOW_BITS: u32 = 0x0555_5555;

/// Why a state transition was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransitionError {
    /// The page's current layout has no chunk with this index (the page may
    /// be unpartitioned, or a peer changed its layout).
    ChunkOutOfRange {
        /// The requested chunk index.
        chunk: usize,
        /// Chunks in the current layout.
        num_chunks: usize,
    },
    /// The chunk is not in the state the transition starts from.
    WrongState {
        /// The state the transition needs.
        expected: ChunkState,
        /// The state found.
        found: ChunkState,
    },
}

impl fmt::Display for TransitionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::ChunkOutOfRange { chunk, num_chunks } => {
                write!(
                    f,
                    "chunk {chunk} does not exist in a layout of {num_chunks} chunks"
                )
            }
            Self::WrongState { expected, found } => {
                write!(f, "chunk is {found}, expected {expected}")
            }
        }
    }
}

impl core::error::Error for TransitionError {}

/// The legal chunk state transitions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transition {
    /// Producer: `Free → BeingWritten`.
    AcquireForWriting,
    /// Producer: `BeingWritten → Complete`.
    ReleaseAsComplete,
    /// Service: `Complete → BeingRead`.
    AcquireForReading,
    /// Service: `BeingRead → Free`.
    ReleaseAsFree,
    /// Producer in shmem-emulation mode: `Complete → Free`.
    EmulationReleaseAsFree,
}

impl Transition {
    /// All transitions.
    pub const ALL: [Transition; 5] = [
        Transition::AcquireForWriting,
        Transition::ReleaseAsComplete,
        Transition::AcquireForReading,
        Transition::ReleaseAsFree,
        Transition::EmulationReleaseAsFree,
    ];

    /// The state the transition starts from.
    pub const fn from(self) -> ChunkState {
        match self {
            Self::AcquireForWriting => ChunkState::Free,
            Self::ReleaseAsComplete => ChunkState::BeingWritten,
            Self::AcquireForReading | Self::EmulationReleaseAsFree => ChunkState::Complete,
            Self::ReleaseAsFree => ChunkState::BeingRead,
        }
    }

    /// The state the transition ends in.
    pub const fn to(self) -> ChunkState {
        match self {
            Self::AcquireForWriting => ChunkState::BeingWritten,
            Self::ReleaseAsComplete => ChunkState::Complete,
            Self::AcquireForReading => ChunkState::BeingRead,
            Self::ReleaseAsFree | Self::EmulationReleaseAsFree => ChunkState::Free,
        }
    }
}

/// Applies `transition` to `chunk` of `bitmap`, returning the new bitmap.
///
/// A transition into `Free` that leaves every chunk free returns `0`
/// (the page becomes unpartitioned).
#[inline]
pub const fn apply(
    bitmap: u32,
    chunk: usize,
    transition: Transition,
) -> Result<u32, TransitionError> {
    let found = match chunk_state(bitmap, chunk) {
        Some(s) => s,
        None => {
            return Err(TransitionError::ChunkOutOfRange {
                chunk,
                num_chunks: num_chunks(bitmap),
            })
        }
    };
    let expected = transition.from();
    if found as u8 != expected as u8 {
        return Err(TransitionError::WrongState { expected, found });
    }
    let next = match with_chunk_state(bitmap, chunk, transition.to()) {
        Some(next) => next,
        // Unreachable: the index was checked above against the same layout.
        None => {
            return Err(TransitionError::ChunkOutOfRange {
                chunk,
                num_chunks: 0,
            })
        }
    };
    if transition.to() as u8 == ChunkState::Free as u8 && is_all_free(next) {
        Ok(0)
    } else {
        Ok(next)
    }
}

/// Why a page could not be partitioned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartitionError {
    /// The page index is not below the SMB's page count.
    PageOutOfRange {
        /// The requested page.
        page: usize,
        /// Pages in the SMB.
        num_pages: usize,
    },
    /// The layout is not one of `Div1..=Div14`.
    NotAPartitionLayout(PageLayout),
    /// The page is already partitioned or not entirely free.
    PageNotFree {
        /// The bitmap found.
        bitmap: u32,
    },
}

impl fmt::Display for PartitionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::PageOutOfRange { page, num_pages } => {
                write!(f, "page {page} is out of range (SMB has {num_pages} pages)")
            }
            Self::NotAPartitionLayout(l) => {
                write!(f, "{l:?} is not a layout pages can be partitioned with")
            }
            Self::PageNotFree { bitmap } => {
                write!(f, "page is not free (header bitmap {bitmap:#010x})")
            }
        }
    }
}

impl core::error::Error for PartitionError {}

/// The bitmap after partitioning a page currently holding `bitmap` with
/// `layout`: only a zero (free, unpartitioned) page can be partitioned, and
/// only with `Div1..=Div14`.
pub const fn partition(bitmap: u32, layout: PageLayout) -> Result<u32, PartitionError> {
    if !layout.is_partition_layout() {
        return Err(PartitionError::NotAPartitionLayout(layout));
    }
    if bitmap != 0 {
        return Err(PartitionError::PageNotFree { bitmap });
    }
    Ok(partitioned(layout))
}

/// `(i, word)` for `i` in `0..rounds` (500 under miri, which runs some
/// 10,000 times slower): pseudo-random state words (xorshift32 from
/// `seed`), for the sweeps of the state word's tests here and in `sync`.
#[cfg(test)]
pub(crate) fn sweep(seed: u32, rounds: u32) -> impl Iterator<Item = (u32, u32)> {
    let rounds = if cfg!(miri) { 500 } else { rounds };
    (0..rounds).scan(seed, |x, i| {
        *x ^= *x << 13;
        *x ^= *x >> 17;
        *x ^= *x << 5;
        Some((i, *x))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appendix_b_bitmap() {
        let b = with_chunk_state(partitioned(PageLayout::Div1), 0, ChunkState::Complete).unwrap();
        assert_eq!(b, 0x1000_0003);
        assert_eq!(b.to_le_bytes(), [0x03, 0x00, 0x00, 0x10]);
        assert!(is_all_complete(b));
    }

    #[test]
    fn masks() {
        assert_eq!(LAYOUT_MASK, 0x7000_0000);
        assert_eq!(all_complete_mask(0), 0);
        assert_eq!(all_complete_mask(1), 0x3);
        assert_eq!(all_complete_mask(4), 0xFF);
        assert_eq!(all_complete_mask(14), 0x0FFF_FFFF);
        assert_eq!(all_complete_mask(99), 0x0FFF_FFFF);
        assert!(!is_all_complete(0));
        assert!(is_all_free(partitioned(PageLayout::Div14)));
    }

    #[test]
    fn state_out_of_range_for_layout() {
        let b = partitioned(PageLayout::Div2);
        assert_eq!(chunk_state(b, 1), Some(ChunkState::Free));
        assert_eq!(chunk_state(b, 2), None);
        assert_eq!(chunk_state(0, 0), None);
        assert_eq!(with_chunk_state(b, 2, ChunkState::Complete), None);
        assert_eq!(
            apply(b, 5, Transition::AcquireForWriting),
            Err(TransitionError::ChunkOutOfRange {
                chunk: 5,
                num_chunks: 2
            })
        );
        // Reserved layouts have no chunks at all.
        let r = partitioned(PageLayout::Reserved1) | 0x1;
        assert_eq!(
            apply(r, 0, Transition::AcquireForReading),
            Err(TransitionError::ChunkOutOfRange {
                chunk: 0,
                num_chunks: 0
            })
        );
    }

    #[test]
    fn full_lifecycle_departitions() {
        let mut b = partition(0, PageLayout::Div4).unwrap();
        assert_eq!(b, 0x3000_0000);
        b = apply(b, 2, Transition::AcquireForWriting).unwrap();
        b = apply(b, 0, Transition::AcquireForWriting).unwrap();
        assert_eq!(free_chunks(b), 0b1010);
        b = apply(b, 2, Transition::ReleaseAsComplete).unwrap();
        assert_eq!(chunk_state(b, 2), Some(ChunkState::Complete));
        b = apply(b, 2, Transition::AcquireForReading).unwrap();
        b = apply(b, 2, Transition::ReleaseAsFree).unwrap();
        // Chunk 0 still being written: layout stays.
        assert_eq!(b, 0x3000_0001);
        b = apply(b, 0, Transition::ReleaseAsComplete).unwrap();
        b = apply(b, 0, Transition::EmulationReleaseAsFree).unwrap();
        assert_eq!(b, 0);
    }

    /// `first_free` is the lowest chunk `free_chunks` reports, for every
    /// layout value and state pattern, with garbage in the state bits past
    /// the layout's chunks and in the reserved bit (pseudo-random words,
    /// plus all-free and all-taken).
    #[test]
    fn first_free_is_the_lowest_free_chunk() {
        for (i, x) in sweep(0x9E37_79B9, 200_000) {
            let states = match i % 4 {
                0 => 0,
                1 => ALL_CHUNKS_MASK,
                _ => x & ALL_CHUNKS_MASK,
            };
            let bitmap = (i % 16) << LAYOUT_SHIFT | states;
            let free = free_chunks(bitmap);
            let lowest = (free != 0).then(|| free.trailing_zeros() as usize);
            assert_eq!(first_free(bitmap), lowest, "{bitmap:#010x}");
        }
    }

    #[test]
    fn reserved_bit_kept_until_departition() {
        let b = partitioned(PageLayout::Div2) | RESERVED_MASK;
        let b = apply(b, 1, Transition::AcquireForWriting).unwrap();
        assert_eq!(b & RESERVED_MASK, RESERVED_MASK);
        let b = apply(b, 1, Transition::ReleaseAsComplete).unwrap();
        let b = apply(b, 1, Transition::EmulationReleaseAsFree).unwrap();
        assert_eq!(b, 0);
    }

    #[test]
    fn every_illegal_transition_is_refused() {
        let base = partitioned(PageLayout::Div7);
        for t in Transition::ALL {
            for s in ChunkState::ALL {
                let b = with_chunk_state(base, 3, s).unwrap();
                let r = apply(b, 3, t);
                if s == t.from() {
                    let next = r.unwrap();
                    if t.to() == ChunkState::Free {
                        assert_eq!(next, 0);
                    } else {
                        assert_eq!(chunk_state(next, 3), Some(t.to()));
                        assert_eq!(layout(next), PageLayout::Div7);
                    }
                } else {
                    assert_eq!(
                        r,
                        Err(TransitionError::WrongState {
                            expected: t.from(),
                            found: s
                        })
                    );
                }
            }
        }
    }

    #[test]
    fn partition_rules() {
        assert_eq!(partition(0, PageLayout::Div14), Ok(0x5000_0000));
        assert_eq!(
            partition(0, PageLayout::NotPartitioned),
            Err(PartitionError::NotAPartitionLayout(
                PageLayout::NotPartitioned
            ))
        );
        assert_eq!(
            partition(0, PageLayout::Reserved2),
            Err(PartitionError::NotAPartitionLayout(PageLayout::Reserved2))
        );
        assert_eq!(
            partition(0x1000_0000, PageLayout::Div1),
            Err(PartitionError::PageNotFree {
                bitmap: 0x1000_0000
            })
        );
        assert_eq!(
            partition(RESERVED_MASK, PageLayout::Div1),
            Err(PartitionError::PageNotFree {
                bitmap: RESERVED_MASK
            })
        );
    }
}
