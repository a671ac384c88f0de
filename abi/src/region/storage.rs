//! Firmware-side storage of a region and its initialization.
//!
//! # Invariants
//!
//! * [`RegionStorage`] is the region: header at 0, `SLOTS` ring slots at
//!   256, an SMB of `SMB_BYTES` after them, all 8-aligned, inside one
//!   `UnsafeCell` whose bytes are accessed only through [`Mem`] (atomic
//!   words) and the `Smb` built over its SMB part.
//! * The region is (re)initialized only by [`RegionStorage::take`] (at most
//!   once per program: a crate-global flag in zero-initialized RAM, so the
//!   storage itself may sit in RAM nobody initializes) or
//!   [`RegionStorage::init`] (under `&mut`). Either way no handle from an
//!   earlier initialization is alive, so no chunk is owned while the page
//!   headers are reset.
//! * The `Smb` cell is written during initialization and only read after
//!   it, through the `&Smb` the returned handles borrow.

use core::cell::UnsafeCell;
use core::mem::{size_of, MaybeUninit};
use core::ptr::NonNull;
use core::sync::atomic::Ordering::{AcqRel, Relaxed, Release};

use crate::layout::{PageSize, PAGE_HEADER_SIZE};
use crate::smb::Smb;
use crate::sync::shared::AtomicU32;

use super::control::Control;
use super::raw::Mem;
use super::ring;
use super::wire::{
    offset, HeaderError, HeaderRepr, Name, RingGeometry, SmbGeometry, FLAG_STREAM_MODE,
    HEADER_SIZE, MAGIC_WORDS, MAX_CLOCK_ID, MAX_RING_SLOTS, MAX_SMB_PAGES, MIN_CLOCK_ID,
    MIN_RING_SLOTS, NAME_LEN, SLOT_SIZE, VERSION,
};

/// Clock id firmware uses for its absolute clock unless configured
/// otherwise (sequence-scoped ids are 64..=127; 64 is the writers'
/// incremental clock).
pub const DEFAULT_CLOCK_ID: u32 = 65;

/// What a region is set up with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionConfig<'a> {
    /// Data source name the host registers (non-empty, <= 64 bytes).
    pub data_source: &'a str,
    /// Producer name (<= 64 bytes, may be empty).
    pub producer: &'a str,
    /// SMB page size (`SMB_BYTES` must be a multiple of it).
    pub page_size: PageSize,
    /// The firmware's absolute clock id (1..=127).
    pub clock_id: u32,
    /// `boot_id` to use when the memory holds no valid header of a previous
    /// boot (with one, its `boot_id + 1` is used instead).
    pub boot_id: u32,
    /// The firmware drains the ring itself (stream mode).
    pub stream_mode: bool,
    /// Initial `trace_enabled`.
    pub trace_enabled: bool,
}

impl<'a> RegionConfig<'a> {
    /// Defaults: no producer name, 4 KiB pages, clock
    /// [`DEFAULT_CLOCK_ID`], boot id 1, shared-RAM mode, tracing enabled.
    pub const fn new(data_source: &'a str) -> Self {
        RegionConfig {
            data_source,
            producer: "",
            page_size: PageSize::DEFAULT,
            clock_id: DEFAULT_CLOCK_ID,
            boot_id: 1,
            stream_mode: false,
            trace_enabled: true,
        }
    }
}

/// Why a region could not be taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TakeError {
    /// [`RegionStorage::take`] already succeeded in this program.
    AlreadyTaken,
    /// The configuration or the storage's sizes make no valid region.
    Invalid(HeaderError),
}

impl core::fmt::Display for TakeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::AlreadyTaken => f.write_str("the region was already taken"),
            Self::Invalid(e) => write!(f, "invalid region: {e}"),
        }
    }
}

impl core::error::Error for TakeError {}

/// What the firmware uses a region through.
#[derive(Clone, Copy, Debug)]
pub struct RegionHandles<'m> {
    /// The SMB: give it to [`RegionArbiter`](super::RegionArbiter)s.
    pub smb: &'m Smb<'m>,
    /// Control words and ring.
    pub control: Control<'m>,
    /// The header as written.
    pub header: HeaderRepr,
}

#[repr(C, align(8))]
struct Bytes<const SMB_BYTES: usize, const SLOTS: usize> {
    header: [u8; HEADER_SIZE],
    ring: [[u8; SLOT_SIZE]; SLOTS],
    smb: [u8; SMB_BYTES],
}

/// The crate-global "taken" flag of [`RegionStorage::take`]: in
/// zero-initialized RAM, so it is clear at every boot even when the
/// storage is not.
static TAKEN: AtomicU32 = AtomicU32::new(0);

/// A region in firmware memory: a 256-byte header, `SLOTS` ring slots and an
/// SMB of `SMB_BYTES`, 8-aligned, with no gap between them.
///
/// A zero-filled storage is a valid "not yet initialized" region, so it
/// can live in `.bss`; it may also be placed (with `#[link_section]`) in RAM
/// that is not cleared at reset, where the previous boot's header survives
/// and the new `boot_id` is derived from it. Everything is initialized by
/// [`take`](Self::take).
///
/// ```
/// use shmtrace_abi::region::{RegionConfig, RegionStorage};
///
/// static REGION: RegionStorage<8192, 16> = RegionStorage::new();
///
/// let handles = REGION.take(&RegionConfig::new("fw.track_event")).unwrap();
/// assert_eq!(handles.smb.num_pages(), 2);
/// assert!(REGION.take(&RegionConfig::new("fw.track_event")).is_err());
/// ```
#[repr(C, align(8))]
pub struct RegionStorage<const SMB_BYTES: usize, const SLOTS: usize> {
    bytes: UnsafeCell<Bytes<SMB_BYTES, SLOTS>>,
    smb: UnsafeCell<MaybeUninit<Smb<'static>>>,
}

// SAFETY: the bytes are accessed only through atomics and the `Smb`'s state
// machine (module invariants), from any thread or interrupt; the `Smb`
// cell is written once, while no other access to it can exist (`take`'s
// global flag, or `init`'s `&mut`), and only read afterwards.
unsafe impl<const SMB_BYTES: usize, const SLOTS: usize> Sync for RegionStorage<SMB_BYTES, SLOTS> {}

impl<const SMB_BYTES: usize, const SLOTS: usize> Default for RegionStorage<SMB_BYTES, SLOTS> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const SMB_BYTES: usize, const SLOTS: usize> core::fmt::Debug
    for RegionStorage<SMB_BYTES, SLOTS>
{
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RegionStorage")
            .field("smb_bytes", &SMB_BYTES)
            .field("slots", &SLOTS)
            .finish_non_exhaustive()
    }
}

impl<const SMB_BYTES: usize, const SLOTS: usize> RegionStorage<SMB_BYTES, SLOTS> {
    /// Bytes of the region (`region_size`).
    pub const REGION_SIZE: usize = size_of::<Bytes<SMB_BYTES, SLOTS>>();

    /// The first byte of the region (tests look at the bytes).
    #[cfg(test)]
    pub(crate) fn bytes_ptr(&self) -> *mut u8 {
        self.bytes.get().cast()
    }

    /// Zeroed storage (usable in a `static`).
    pub const fn new() -> Self {
        RegionStorage {
            bytes: UnsafeCell::new(Bytes {
                header: [0; HEADER_SIZE],
                ring: [[0; SLOT_SIZE]; SLOTS],
                smb: [0; SMB_BYTES],
            }),
            smb: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }

    /// Initializes the region and returns its handles; succeeds once per
    /// program (whichever storage it is called on), so firmware needs no
    /// `unsafe` and no cell crate to share the handles with interrupts.
    pub fn take(
        &'static self,
        config: &RegionConfig<'_>,
    ) -> Result<RegionHandles<'static>, TakeError> {
        let header = Self::header_for(config)?;
        if TAKEN.swap(1, AcqRel) != 0 {
            return Err(TakeError::AlreadyTaken);
        }
        self.setup(header, config)
    }

    /// Initializes the region under an exclusive borrow (tests, or storage
    /// the program already holds as `&mut`). May be called again once the
    /// handles of the previous call are gone: that is a firmware reset as
    /// the host sees it.
    pub fn init(&mut self, config: &RegionConfig<'_>) -> Result<RegionHandles<'_>, TakeError> {
        let header = Self::header_for(config)?;
        self.setup(header, config)
    }

    fn header_for(config: &RegionConfig<'_>) -> Result<HeaderRepr, TakeError> {
        let invalid = TakeError::Invalid;
        let slots = u32::try_from(SLOTS).unwrap_or(u32::MAX);
        if !slots.is_power_of_two() || !(MIN_RING_SLOTS..=MAX_RING_SLOTS).contains(&slots) {
            return Err(invalid(HeaderError::BadRingSlots(slots)));
        }
        let page = config.page_size.get();
        if SMB_BYTES == 0
            || SMB_BYTES % page != 0
            || SMB_BYTES / page > MAX_SMB_PAGES
            || u32::try_from(Self::REGION_SIZE).is_err()
        {
            return Err(invalid(HeaderError::BadSmbSize {
                smb_size: u32::try_from(SMB_BYTES).unwrap_or(u32::MAX),
                page_size: page as u32,
            }));
        }
        if !(MIN_CLOCK_ID..=MAX_CLOCK_ID).contains(&config.clock_id) {
            return Err(invalid(HeaderError::BadClockId(config.clock_id)));
        }
        let data_source =
            Name::new(config.data_source).map_err(|e| invalid(HeaderError::DataSourceName(e)))?;
        if data_source.is_empty() {
            return Err(invalid(HeaderError::DataSourceName(
                super::wire::NameError::Empty,
            )));
        }
        let producer =
            Name::new(config.producer).map_err(|e| invalid(HeaderError::ProducerName(e)))?;
        let ring_offset = HEADER_SIZE as u32;
        Ok(HeaderRepr {
            header_size: HEADER_SIZE as u16,
            region_size: Self::REGION_SIZE as u32,
            boot_id: config.boot_id,
            flags: if config.stream_mode {
                FLAG_STREAM_MODE
            } else {
                0
            },
            ring: RingGeometry {
                offset: ring_offset,
                slots,
                slot_size: SLOT_SIZE as u32,
            },
            smb: SmbGeometry {
                offset: ring_offset + slots * SLOT_SIZE as u32,
                size: SMB_BYTES as u32,
                page_size: config.page_size,
            },
            clock_id: config.clock_id,
            data_source,
            producer,
        })
    }

    /// Runs the initialization protocol (module docs of
    /// [`region`](super)) and builds the handles.
    fn setup(
        &self,
        mut header: HeaderRepr,
        config: &RegionConfig<'_>,
    ) -> Result<RegionHandles<'_>, TakeError> {
        let fail = TakeError::Invalid(HeaderError::RegionTooLarge {
            region_size: header.region_size,
            mapped: Self::REGION_SIZE,
        });
        let base = NonNull::new(self.bytes.get().cast::<u8>()).ok_or(fail)?;
        // SAFETY: the storage's bytes are valid for reads and writes for as
        // long as `self` is borrowed (they sit in an `UnsafeCell`, so shared
        // borrows allow writes), no reference to them is ever created, and
        // they are accessed only through `Mem` and the `Smb` built from it
        // (module invariants).
        let mem = unsafe { Mem::new(base, Self::REGION_SIZE) };
        let word = |at: usize| mem.word(at).ok_or(fail);

        // 1. Clear the magic first (a host must not trust the header while
        //    it changes), then pick a boot id the host has not seen.
        let magic = word(offset::MAGIC)?;
        let magic_hi = word(offset::MAGIC + 4)?;
        let [m0, m1] = MAGIC_WORDS;
        let old_valid = magic.load(Relaxed) == m0
            && magic_hi.load(Relaxed) == m1
            && word(8)?.load(Relaxed) & 0xFFFF == u32::from(VERSION);
        let boot = word(offset::BOOT_ID)?;
        if old_valid {
            header.boot_id = boot.load(Relaxed).wrapping_add(1);
        }
        magic.store(0, Relaxed);
        core::sync::atomic::fence(Release);
        boot.store(header.boot_id, Relaxed);

        // 2. The static part, then control words, ring and page headers.
        for at in (4..HEADER_SIZE).step_by(4) {
            let value = match at {
                offset::BOOT_ID => continue,
                offset::TRACE_ENABLED => u32::from(config.trace_enabled),
                // `word` is 0 for the control words.
                _ => header.word(at),
            };
            word(at)?.store(value, Relaxed);
        }
        let control = Control::new(mem, header.ring).ok_or(fail)?;
        ring::reset(control.ring());
        let smb_at = header.smb.offset as usize;
        for page in 0..SMB_BYTES / header.smb.page_size.get() {
            for k in (0..PAGE_HEADER_SIZE).step_by(4) {
                word(smb_at + page * header.smb.page_size.get() + k)?.store(0, Relaxed);
            }
        }
        // The `Smb` is stored in the storage's own cell, so it is typed
        // `'static`; it is only ever handed out as `&'m Smb<'m>`, with `'m`
        // the borrow of the storage, so no use outlives the memory.
        // SAFETY: as for `mem`; the longer lifetime is never observable
        // (see above).
        let mem_in_cell: Mem<'static> = unsafe { Mem::new(base, Self::REGION_SIZE) };
        let smb = mem_in_cell
            .smb(smb_at, SMB_BYTES, header.smb.page_size)
            .and_then(Result::ok)
            .ok_or(fail)?;
        // SAFETY: initialization runs at most once at a time for this
        // storage (`take`'s flag or `init`'s `&mut self`, module
        // invariants), and no reference into the cell from an earlier
        // initialization is alive (its handles borrowed `self` and are
        // gone), so this write races with nothing.
        let smb: &Smb<'static> = unsafe { (*self.smb.get()).write(smb) };

        // 3. Publish: the magic word at 0 last, with release ordering.
        magic.store(m0, Release);
        Ok(RegionHandles {
            smb,
            control,
            header,
        })
    }
}

const _: () = assert!(NAME_LEN == 64);
