//! All pointer work of the crate: the SMB region, atomic words overlaid on
//! it, and byte copies in and out of chunk payloads.
//!
//! # Invariants
//!
//! * A [`Region`] covers `len` bytes starting at a non-null `base` that stay
//!   valid for reads and writes for `'m` and are never referenced through
//!   `&[u8]`/`&mut [u8]` (a peer may change them at any time).
//! * Its pages tile it: `base` is 8-aligned and `len` is `num_pages` (at
//!   least 1) times a validated [`PageSize`] (checked once, by
//!   [`Region::new`]). So a page index below `num_pages` and a chunk of a
//!   [`PageSize::chunk_geometry`] (which lies inside its page, 4-aligned)
//!   need no further check.
//! * Atomic words are handed out only at in-bounds, naturally aligned
//!   offsets ([`Region::header_bitmap`], [`Region::chunk_words`]).
//! * Payload bytes are touched only through [`PayloadMut`] / [`Payload`],
//!   whose (unsafe) constructors require the caller to hold the chunk under
//!   the state machine; their methods bounds-check every access against
//!   the chunk, which was itself checked against the region.
//! * A [`PayloadMut`]'s window limit never exceeds its length; it is kept
//!   as the number of offsets a window within it may start at.
//! * A [`Window`] is `len` + [`WINDOW_SLACK`] bytes of a [`PayloadMut`]
//!   (`len` a power of two, at most [`WINDOW_LEN`]), checked against the
//!   payload when it is made and borrowing it mutably; its byte and 8-byte
//!   writes mask the index to below `len` instead of checking it, so they
//!   stay inside the window (slack included) whatever the index.

use crate::layout::{
    ChunkGeometry, PageLayout, PageSize, CHUNK_HEADER_SIZE, CHUNK_ID_OFFSET, HEADER_BITMAP_OFFSET,
    PACKETS_OFFSET, SMB_ALIGNMENT, WRITER_ID_OFFSET,
};
use crate::sync::ChunkWords;
use crate::sync::{AtomicLeU16, AtomicLeU32};
use core::marker::PhantomData;
use core::ptr::{self, NonNull};

use super::{SmbError, SmbStorage};

// A pointer cast to a shared word must be aligned to the atomic's
// alignment; we check offsets against these, so they must not exceed the
// integer's size.
const _: () = assert!(align_of::<AtomicLeU32>() == 4 && align_of::<AtomicLeU16>() == 2);

/// A byte range was outside the chunk payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfBounds {
    /// Offset from the payload start.
    pub offset: usize,
    /// Bytes requested.
    pub len: usize,
    /// Payload capacity.
    pub capacity: usize,
}

impl core::fmt::Display for OutOfBounds {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "{} byte(s) at offset {} exceed the chunk payload of {} bytes",
            self.len, self.offset, self.capacity
        )
    }
}

impl core::error::Error for OutOfBounds {}

/// The memory of an SMB.
#[derive(Debug)]
pub(crate) struct Region<'m> {
    base: NonNull<u8>,
    len: usize,
    page_size: PageSize,
    /// `len / page_size`, at least 1 (module invariants).
    num_pages: usize,
    _memory: PhantomData<&'m core::cell::UnsafeCell<[u8]>>,
}

// SAFETY: a `Region` is a pointer + length to memory that, by the contract
// of `Region::new`, is valid for `'m` regardless of the thread touching it.
// The region itself only hands out atomics (thread-safe by definition) and
// payload accessors whose unsafe constructors make the caller responsible
// for exclusivity under the chunk state machine.
unsafe impl Send for Region<'_> {}
// SAFETY: see `Send`: every access through `&Region` is either atomic or
// goes through an accessor whose constructor carries the exclusivity proof.
unsafe impl Sync for Region<'_> {}

impl<'m> Region<'m> {
    /// The region of pages of `page_size` over `len` bytes at `base`.
    /// Fails unless `base` is 8-aligned and `len` a non-zero multiple of
    /// the page size.
    ///
    /// # Safety
    ///
    /// `base` must be valid for reads and writes of `len` bytes for all of
    /// `'m`, and during `'m` no Rust reference to those bytes may exist.
    pub(crate) unsafe fn new(
        base: NonNull<u8>,
        len: usize,
        page_size: PageSize,
    ) -> Result<Self, SmbError> {
        let addr = base.as_ptr() as usize;
        if addr % SMB_ALIGNMENT != 0 {
            return Err(SmbError::Misaligned { addr });
        }
        if len == 0 {
            return Err(SmbError::Empty);
        }
        // (`checked_rem`: a page size is never 0, and firmware gets no
        // panic path for it.)
        if len.checked_rem(page_size.get()) != Some(0) {
            return Err(SmbError::NotMultipleOfPageSize { len, page_size });
        }
        Ok(Region {
            base,
            len,
            page_size,
            num_pages: len / page_size.get(),
            _memory: PhantomData,
        })
    }

    /// Region over storage the caller lends exclusively for `'m`.
    pub(crate) fn from_storage<const N: usize>(
        storage: &'m mut SmbStorage<N>,
        page_size: PageSize,
    ) -> Result<Self, SmbError> {
        let base = NonNull::from(&mut storage.bytes).cast::<u8>();
        // SAFETY: `base` comes from a `&'m mut [u8; N]`, so it is valid for
        // reads and writes of `N` bytes for `'m`; the exclusive borrow is
        // held by the returned region for all of `'m`, so no other reference
        // to the bytes can exist meanwhile.
        unsafe { Region::new(base, N, page_size) }
    }

    /// The page size.
    pub(crate) fn page_size(&self) -> PageSize {
        self.page_size
    }

    /// Number of pages (at least 1).
    pub(crate) fn num_pages(&self) -> usize {
        self.num_pages
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn in_bounds(&self, offset: usize, len: usize) -> bool {
        matches!(offset.checked_add(len), Some(end) if end <= self.len)
    }

    /// Page `page`'s `header_bitmap` word; `None` if there is no such page.
    #[inline]
    pub(crate) fn header_bitmap(&self, page: usize) -> Option<&AtomicLeU32> {
        if page >= self.num_pages {
            return None;
        }
        let offset = page * self.page_size.get() + HEADER_BITMAP_OFFSET;
        // SAFETY: the page is one of those that tile the region (module
        // invariants), so its 8-byte page header, this word included, lies
        // inside the region, which is valid for reads and writes for `'m`
        // (outliving `&self`); the page starts at a multiple of 4096 from an
        // 8-aligned base and the word at offset 0 of it, so it is 4-aligned,
        // matching `align_of::<AtomicLeU32>()`. Within this process the word
        // is only accessed atomically: non-atomic accesses go through
        // `Payload*`, whose constructors require exclusive ownership of
        // payload bytes, and payloads never overlap page headers. With
        // `portable-atomic`'s lock-based fallback every access of this
        // process goes through the same `AtomicLeU32` type, as it requires.
        // `AtomicLeU32` is a `repr(transparent)` atomic `u32`, so the cast
        // is `AtomicU32::from_ptr`'s.
        Some(unsafe { &*self.base.as_ptr().add(offset).cast::<AtomicLeU32>() })
    }

    /// Offset from the base and size (header included) of chunk `chunk` of
    /// page `page` under `layout`; `None` if there is no such page or chunk.
    /// The chunk lies inside its page and starts 4-aligned (module
    /// invariants).
    #[inline]
    pub(crate) fn chunk_span(
        &self,
        page: usize,
        layout: PageLayout,
        chunk: usize,
    ) -> Option<(usize, usize)> {
        if page >= self.num_pages {
            return None;
        }
        let g = self.page_size.chunk_geometry(layout, chunk)?;
        Some((page * self.page_size.get() + g.offset, g.size))
    }

    /// The three header words (`chunk_id`, `writer_id`, `packets`) of chunk
    /// `chunk` of page `page` under `layout`; `None` if there is no such
    /// page or chunk.
    pub(crate) fn chunk_words(
        &self,
        page: usize,
        layout: PageLayout,
        chunk: usize,
    ) -> Option<&ChunkWords<AtomicLeU32, AtomicLeU16>> {
        let (offset, _) = self.chunk_span(page, layout, chunk)?;
        // SAFETY: a chunk's span lies in the region and starts 4-aligned,
        // and a chunk holds at least its 8-byte header (module invariants,
        // `PageSize::chunk_geometry`).
        Some(unsafe { self.chunk_words_unchecked(offset) })
    }

    /// [`Region::chunk_words`] without the checks.
    ///
    /// # Safety
    ///
    /// `offset + 8 <= len` and `addr() + offset` is 4-aligned.
    unsafe fn chunk_words_unchecked(&self, offset: usize) -> &ChunkWords<AtomicLeU32, AtomicLeU16> {
        const {
            assert!(
                core::mem::offset_of!(ChunkWords<AtomicLeU32, AtomicLeU16>, chunk_id)
                    == CHUNK_ID_OFFSET
            );
            assert!(
                core::mem::offset_of!(ChunkWords<AtomicLeU32, AtomicLeU16>, writer_id)
                    == WRITER_ID_OFFSET
            );
            assert!(
                core::mem::offset_of!(ChunkWords<AtomicLeU32, AtomicLeU16>, packets)
                    == PACKETS_OFFSET
            );
            assert!(
                core::mem::size_of::<ChunkWords<AtomicLeU32, AtomicLeU16>>() == CHUNK_HEADER_SIZE
            );
        }
        let at = self.base.as_ptr().wrapping_add(offset);
        // SAFETY: `offset + 8 <= len` (contract), so the header's 8 bytes
        // lie inside the region, which is valid for reads and writes for
        // `'m` (outliving `&self`); its address is 4-aligned (contract), the
        // alignment of `ChunkWords` (`repr(C)`: its u32 at `CHUNK_ID_OFFSET`
        // (0), its u16s at `WRITER_ID_OFFSET` and `PACKETS_OFFSET` (4, 6),
        // 8 bytes in all, checked above), so each atomic lies on its word of
        // the header. As for `atomic_u32`, these bytes are only ever
        // accessed atomically within this process.
        unsafe { &*at.cast::<ChunkWords<AtomicLeU32, AtomicLeU16>>() }
    }

    fn sub_ptr(&self, offset: usize, len: usize) -> Option<NonNull<u8>> {
        if !self.in_bounds(offset, len) {
            return None;
        }
        // SAFETY: `offset <= len` of the region, so the result stays inside
        // (or one past the end of) the same allocation.
        Some(unsafe { self.base.add(offset) })
    }

    /// The header words and write access to the payload of the chunk of
    /// page `page` at `geometry`.
    ///
    /// # Safety
    ///
    /// `page` is below the page count and `geometry` is one the region's
    /// page size gives ([`PageSize::chunk_geometry`]), so the chunk lies in
    /// that page. For the lifetime of the result, nothing in this process
    /// may access the payload bytes except through it: the caller owns the
    /// chunk as `BeingWritten`.
    #[inline]
    pub(crate) unsafe fn writable_chunk(
        &self,
        page: usize,
        geometry: ChunkGeometry,
    ) -> (&ChunkWords<AtomicLeU32, AtomicLeU16>, PayloadMut<'_>) {
        let offset = page * self.page_size.get() + geometry.offset;
        let size = geometry.size;
        // SAFETY: the chunk lies in one of the pages that tile the region
        // (contract, module invariants), starts 4-aligned and holds at least
        // its 8-byte header (`PageSize::chunk_geometry`).
        let words = unsafe { self.chunk_words_unchecked(offset) };
        // SAFETY: as above: the payload's `size - 8` bytes after the header
        // lie inside the region, so the pointer stays in the same
        // allocation.
        let ptr = unsafe { self.base.add(offset + CHUNK_HEADER_SIZE) };
        (
            words,
            PayloadMut {
                ptr,
                // Lossless: a chunk is at most a page (64 KiB) less its
                // page header.
                len: (size - CHUNK_HEADER_SIZE) as u16,
                window_starts: 0,
                _chunk: PhantomData,
            },
        )
    }

    /// Read access to `len` payload bytes at `offset`; `None` if out of the
    /// region.
    ///
    /// # Safety
    ///
    /// For the lifetime of the result, nothing in this process may write
    /// these bytes: the caller holds the chunk as `BeingRead`, or otherwise
    /// knows that no writer of this process can be active (other processes
    /// are untrusted peers and are handled by copying out and validating).
    pub(crate) unsafe fn payload(&self, offset: usize, len: usize) -> Option<Payload<'_>> {
        let ptr = self.sub_ptr(offset, len)?;
        Some(Payload {
            ptr,
            len,
            _chunk: PhantomData,
        })
    }
}

fn check(offset: usize, len: usize, capacity: usize) -> Result<(), OutOfBounds> {
    match offset.checked_add(len) {
        Some(end) if end <= capacity => Ok(()),
        _ => Err(OutOfBounds {
            offset,
            len,
            capacity,
        }),
    }
}

/// Exclusive write access to one chunk payload.
#[derive(Debug)]
pub(crate) struct PayloadMut<'a> {
    ptr: NonNull<u8>,
    /// 16 bits: a chunk payload is shorter than 64 KiB (the largest page).
    len: u16,
    /// Offsets below this are where windows from
    /// [`PayloadMut::limited_window`] may start: the window limit (at most
    /// `len`) less [`WINDOW_LEN`] + [`WINDOW_SLACK`] - 1, or 0 (none).
    window_starts: u16,
    _chunk: PhantomData<&'a ()>,
}

// SAFETY: the payload is exclusively owned (constructor contract), so moving
// that ownership to another thread is fine.
unsafe impl Send for PayloadMut<'_> {}

impl PayloadMut<'_> {
    /// Capacity in bytes.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Copies `src` to `offset`.
    #[inline]
    pub(crate) fn write(&mut self, offset: usize, src: &[u8]) -> Result<(), OutOfBounds> {
        check(offset, src.len(), self.len())?;
        // SAFETY: `offset + src.len() <= self.len` (checked), and the
        // payload's `len` bytes lie in the region (checked at construction),
        // so the destination is valid for writes; we own the bytes
        // exclusively (constructor contract) and `&mut self` prevents two
        // writes through this handle at once; `src` is a Rust slice and
        // cannot overlap memory nobody may reference.
        unsafe { ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len()) };
        Ok(())
    }

    /// Sets where windows from [`PayloadMut::limited_window`] must end
    /// (capped at the length).
    #[inline]
    pub(crate) fn set_window_limit(&mut self, limit: usize) {
        // At most `len`, so it fits 16 bits.
        let limit = limit.min(self.len());
        self.window_starts = (limit + 1).saturating_sub(WINDOW_LEN + WINDOW_SLACK) as u16;
    }

    /// Where windows from [`PayloadMut::limited_window`] must end: the
    /// limit set, or 0 if it was too short for a window.
    #[inline]
    pub(crate) fn window_limit(&self) -> usize {
        match usize::from(self.window_starts) {
            0 => 0,
            starts => starts + WINDOW_LEN + WINDOW_SLACK - 1,
        }
    }

    /// The [`WINDOW_LEN`] + [`WINDOW_SLACK`] bytes at `offset`, if they end
    /// at or before the window limit: one compare, as the limit is within
    /// the payload and kept as the offsets a window may start at.
    #[inline(always)]
    pub(crate) fn limited_window(&mut self, offset: usize) -> Option<Window<'_>> {
        if offset >= usize::from(self.window_starts) {
            return None;
        }
        // SAFETY: `offset < window_starts` (checked), so
        // `offset + WINDOW_LEN + WINDOW_SLACK <= limit <= len` (the limit
        // never exceeds the length, module invariants), so the result
        // points inside the payload and is not null.
        let ptr = unsafe { self.ptr.add(offset) };
        Some(Window {
            ptr,
            mask: WINDOW_LEN - 1,
            _payload: PhantomData,
        })
    }

    /// The largest window at `offset` of a power-of-two length between
    /// [`MIN_WINDOW_LEN`] and [`WINDOW_LEN`] whose bytes (slack included)
    /// are all in the payload.
    #[inline]
    pub(crate) fn window_at_most(&mut self, offset: usize) -> Option<Window<'_>> {
        let room = self.len().checked_sub(offset)?.checked_sub(WINDOW_SLACK)?;
        if room < MIN_WINDOW_LEN {
            return None;
        }
        let len = if room >= WINDOW_LEN {
            WINDOW_LEN
        } else {
            1 << (usize::BITS - 1 - room.leading_zeros())
        };
        self.window_of(offset, len)
    }

    /// The `len` (a power of two, at most [`WINDOW_LEN`]) + [`WINDOW_SLACK`]
    /// bytes at `offset`, if they are all in the payload.
    #[inline]
    fn window_of(&mut self, offset: usize, len: usize) -> Option<Window<'_>> {
        if !len.is_power_of_two() || len > WINDOW_LEN {
            return None;
        }
        check(offset, len + WINDOW_SLACK, self.len()).ok()?;
        // SAFETY: `offset + len + WINDOW_SLACK <= self.len` (checked), so the
        // result points inside the payload and is not null.
        let ptr = unsafe { self.ptr.add(offset) };
        Some(Window {
            ptr,
            mask: len - 1,
            _payload: PhantomData,
        })
    }

    /// Copies `dst.len()` bytes from `offset` into `dst`.
    #[inline]
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), OutOfBounds> {
        check(offset, dst.len(), self.len())?;
        // SAFETY: in bounds as checked; we own the bytes exclusively and
        // `&self` excludes a concurrent `write` through this handle.
        unsafe {
            ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), dst.as_mut_ptr(), dst.len())
        };
        Ok(())
    }
}

/// Longest [`Window`]: a power of two, so an index is kept in range by a
/// mask. A packet encoded in a window fits a 1-byte size (127 bytes).
pub const WINDOW_LEN: usize = 128;

/// Shortest [`Window`] [`WritableChunk::window_at_most`](super::WritableChunk::window_at_most) hands out.
pub const MIN_WINDOW_LEN: usize = 16;

/// Bytes a [`Window`] owns past [`WINDOW_LEN`], so an 8-byte write at any
/// index below [`WINDOW_LEN`] stays inside it.
pub const WINDOW_SLACK: usize = 8;

/// Write access to `len()` bytes of a chunk payload this writer owns (a
/// power of two, at most [`WINDOW_LEN`], plus [`WINDOW_SLACK`]), for
/// encoding a packet in place. Every write lands inside the window: an index
/// is reduced modulo `len()` (a wrapped-around write garbles the window,
/// never memory outside it), a slice that does not fit is refused. The bytes
/// are never read through it.
#[derive(Debug)]
pub struct Window<'a> {
    ptr: NonNull<u8>,
    /// `len() - 1`; `len()` is a power of two.
    mask: usize,
    _payload: PhantomData<&'a mut ()>,
}

impl Window<'_> {
    /// The same bytes, borrowed from this window for as long as the
    /// result lives (a copy a caller can keep in registers while it
    /// writes: see [`Cursor::local`](crate::proto::Cursor::local)).
    #[inline(always)]
    pub fn reborrow(&mut self) -> Window<'_> {
        Window {
            ptr: self.ptr,
            mask: self.mask,
            _payload: PhantomData,
        }
    }

    /// Length in bytes (a power of two), slack excluded.
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.mask + 1
    }

    /// Always `false`: a window has at least one byte.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Writes `byte` at `index % len()`.
    #[inline(always)]
    pub fn put(&mut self, index: usize, byte: u8) {
        // SAFETY: the masked index is below `len()`, and the window's
        // `len()` bytes lie inside a payload this writer owns exclusively
        // (checked and borrowed mutably in `PayloadMut::window_of`).
        unsafe { self.ptr.as_ptr().add(index & self.mask).write(byte) }
    }

    /// Writes the 8 little-endian bytes of `word` at `index % len()` (a
    /// caller keeping fewer of them overwrites the rest later, or leaves
    /// them as garbage past its packet).
    #[inline(always)]
    pub fn put_u64(&mut self, index: usize, word: u64) {
        // SAFETY: the masked index is below `len()`, so the 8 bytes end
        // within `len() + WINDOW_SLACK`, all inside a payload this writer
        // owns exclusively (checked and borrowed mutably in
        // `PayloadMut::window_of`); an unaligned write needs no alignment.
        unsafe {
            self.ptr
                .as_ptr()
                .add(index & self.mask)
                .cast::<[u8; 8]>()
                .write_unaligned(word.to_le_bytes())
        }
    }

    /// Writes the 4 little-endian bytes of `word` at `index % len()` (as
    /// [`Window::put_u64`] does 8).
    #[inline(always)]
    pub fn put_u32(&mut self, index: usize, word: u32) {
        // SAFETY: the masked index is below `len()`, so the 4 bytes end
        // within `len() + WINDOW_SLACK`, inside a payload this writer owns
        // exclusively (as in `put_u64`); an unaligned write needs no
        // alignment.
        unsafe {
            self.ptr
                .as_ptr()
                .add(index & self.mask)
                .cast::<[u8; 4]>()
                .write_unaligned(word.to_le_bytes())
        }
    }

    /// Copies `src` to `index`; `false` (nothing written) if it does not
    /// fit in the window.
    ///
    /// On bare-metal targets (`target_os = "none"`) the bytes are stored one
    /// by one: strings in events are short, and there a `memcpy` is a
    /// library call that costs more than the copy (and its code more than
    /// the rest of the writer).
    #[inline(always)]
    pub fn put_slice(&mut self, index: usize, src: &[u8]) -> bool {
        match index.checked_add(src.len()) {
            Some(end) if end <= self.len() => {
                #[cfg(not(target_os = "none"))]
                // SAFETY: `index + src.len() <= len()` (checked), inside the
                // exclusively owned window; `src` is a Rust slice and cannot
                // overlap memory nobody may reference.
                unsafe {
                    ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(index), src.len())
                };
                #[cfg(target_os = "none")]
                for (i, &b) in src.iter().enumerate() {
                    // SAFETY: `index + i < index + src.len() <= len()`
                    // (checked), inside the exclusively owned window. The
                    // volatile store keeps the compiler from turning the
                    // loop back into a `memcpy` call.
                    unsafe { self.ptr.as_ptr().add(index + i).write_volatile(b) };
                }
                true
            }
            _ => false,
        }
    }
}

/// Read access to one chunk payload that no writer of this process touches.
#[derive(Debug)]
pub(crate) struct Payload<'a> {
    ptr: NonNull<u8>,
    len: usize,
    _chunk: PhantomData<&'a ()>,
}

// SAFETY: read-only access to bytes no writer of this process touches
// (constructor contract); any thread may perform it.
unsafe impl Send for Payload<'_> {}

impl Payload<'_> {
    /// Copies the whole payload into the start of `dst`; the caller checked
    /// `dst.len() >= self.len`.
    pub(crate) fn copy_to(&self, dst: &mut [u8]) -> Result<(), OutOfBounds> {
        if dst.len() < self.len {
            return Err(OutOfBounds {
                offset: 0,
                len: self.len,
                capacity: dst.len(),
            });
        }
        // SAFETY: the source is `self.len` in-region bytes (checked at
        // construction) that no writer of this process touches (constructor
        // contract); the destination is a Rust slice of at least `self.len`
        // bytes and cannot overlap the region, which no reference covers.
        unsafe { ptr::copy_nonoverlapping(self.ptr.as_ptr(), dst.as_mut_ptr(), self.len) };
        Ok(())
    }
}
