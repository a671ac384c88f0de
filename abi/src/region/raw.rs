//! The pointer work of the region: atomic words overlaid on its memory.
//!
//! # Invariants
//!
//! * A [`Mem`] covers `len` bytes at a non-null `base` that stay valid for
//!   reads and writes for `'m` and are never referenced through
//!   `&[u8]`/`&mut [u8]`: a peer (another process, core or probe) may change
//!   them at any time.
//! * Header and ring bytes are only ever accessed as the 32-bit atomics
//!   [`Mem::word`] hands out (in bounds, 4-aligned), so two parties in one
//!   process never race non-atomically on them either. The SMB part is
//!   handed to [`Smb::from_raw_parts`](crate::smb::Smb::from_raw_parts) and
//!   accessed only through `Smb` values.

use core::cell::UnsafeCell;
use core::marker::PhantomData;
use core::ptr::NonNull;

use crate::layout::PageSize;
use crate::smb::{Smb, SmbError};
use crate::sync::AtomicLeU32;

/// Region memory valid for `'m`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mem<'m> {
    base: NonNull<u8>,
    len: usize,
    _memory: PhantomData<&'m UnsafeCell<[u8]>>,
}

// SAFETY: a `Mem` is a pointer + length to memory that, by the contract of
// `Mem::new`, is valid for `'m` whichever thread touches it; it only hands
// out atomics (thread-safe by definition) and `Smb` views, which are
// `Send`/`Sync` on their own terms.
unsafe impl Send for Mem<'_> {}
// SAFETY: see `Send`.
unsafe impl Sync for Mem<'_> {}

impl<'m> Mem<'m> {
    /// # Safety
    ///
    /// `base` must be valid for reads and writes of `len` bytes for all of
    /// `'m`; during `'m` no Rust reference to those bytes may exist, and
    /// within this process they are accessed only through `Mem` values (and
    /// the `Smb` built by [`Mem::smb`]).
    pub(crate) const unsafe fn new(base: NonNull<u8>, len: usize) -> Self {
        Mem {
            base,
            len,
            _memory: PhantomData,
        }
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Address of the first byte.
    pub(crate) fn addr(&self) -> usize {
        self.base.as_ptr() as usize
    }

    /// The 32-bit atomic at `offset`, if in bounds and 4-aligned.
    pub(crate) fn word(&self, offset: usize) -> Option<&'m AtomicLeU32> {
        let end = offset.checked_add(4)?;
        if end > self.len || self.addr().wrapping_add(offset) % 4 != 0 {
            return None;
        }
        // SAFETY: `offset + 4 <= len`, so the word lies inside memory valid
        // for reads and writes for `'m` (`new`'s contract); its address is
        // 4-aligned as checked, matching `align_of::<AtomicLeU32>()`. Within
        // this process these bytes are only accessed through such atomics
        // (module invariant), so no non-atomic access races with it.
        // `AtomicLeU32` is a `repr(transparent)` atomic `u32`, so the cast
        // is `AtomicU32::from_ptr`'s.
        Some(unsafe { &*self.base.as_ptr().add(offset).cast::<AtomicLeU32>() })
    }

    /// The `count` 32-bit atomics from `offset` on, if in bounds and
    /// 4-aligned: one check for a run of words (a ring's slots).
    pub(crate) fn words(&self, offset: usize, count: usize) -> Option<&'m [AtomicLeU32]> {
        let end = count.checked_mul(4)?.checked_add(offset)?;
        if end > self.len || self.addr().wrapping_add(offset) % 4 != 0 {
            return None;
        }
        // SAFETY: `offset + 4 * count <= len`, so the words lie inside
        // memory valid for reads and writes for `'m` (`new`'s contract);
        // the first is 4-aligned as checked, so all are, matching
        // `align_of::<AtomicLeU32>()`, whose size and in-memory
        // representation are those of `u32` (a `repr(transparent)` atomic:
        // `core`'s and `portable-atomic`'s alike). Within this process these bytes are
        // only accessed through such atomics (module invariant), so no
        // non-atomic access races with them.
        Some(unsafe {
            core::slice::from_raw_parts(self.base.as_ptr().add(offset).cast::<AtomicLeU32>(), count)
        })
    }

    /// An `Smb` over `len` bytes at `offset` (the region's SMB part).
    pub(crate) fn smb(
        &self,
        offset: usize,
        len: usize,
        page_size: PageSize,
    ) -> Option<Result<Smb<'m>, SmbError>> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        // SAFETY: `offset + len <= self.len`, so the pointer stays inside
        // the same allocation.
        let ptr = unsafe { self.base.as_ptr().add(offset) };
        // SAFETY: the bytes are valid for reads and writes for `'m` and
        // referenced by no Rust reference (`new`'s contract); within this
        // process the SMB part is accessed only through `Smb` values (module
        // invariant: header and ring words lie outside it, which the caller
        // checked when it validated the geometry). No `Smb` built here is
        // ever scraped (`RegionReader` and the arbiter only use the chunk
        // state machine), which the `from_raw_parts` contract asks of
        // several `Smb`s over the same memory.
        Some(unsafe { Smb::from_raw_parts(ptr, len, page_size) })
    }
}
