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
use core::sync::atomic::Ordering::{Relaxed, Release};

use crate::layout::{PageSize, PAGE_HEADER_SIZE};
use crate::smb::Smb;
use crate::sync::shared::AtomicU32;
use crate::sync::{AtomicLeU32, AtomicWord32};

use super::control::Control;
use super::raw::Mem;
use super::wire::{
    offset, HeaderError, HeaderRepr, Name, NameError, RingGeometry, SmbGeometry, FLAG_STREAM_MODE,
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
    /// The firmware's absolute clock id (1..=127): the clock the host
    /// relates to its own. Its writers stamp their packets on it, so a
    /// track event writer's [`SequenceConfig`] says the same id
    /// ([`SequenceConfig::new`] uses [`DEFAULT_CLOCK_ID`], this field's
    /// default; with another, `.with_clock_id(config.clock_id)`).
    ///
    /// [`SequenceConfig`]: crate::track_event::SequenceConfig
    /// [`SequenceConfig::new`]: crate::track_event::SequenceConfig::new
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
    /// The region's memory (for a [`RegionReader`](super::RegionReader)).
    pub(crate) mem: Mem<'m>,
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
/// `SMB_BYTES` must be a non-zero multiple of the config's page size (4 KiB
/// by default) of at most 65536 pages, and `SLOTS` a power of two in
/// 2..=65536; [`take`](Self::take) refuses other sizes
/// ([`TakeError::Invalid`]). To have them checked at build time, make the
/// header in a `const` and assert it ([`RegionHeader`]).
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

    /// Initializes the region with the header `config` makes and returns
    /// its handles; succeeds once per program (whichever storage it is
    /// called on), so firmware needs no `unsafe` and no cell crate to share
    /// the handles with interrupts. A firmware whose config is a constant
    /// gives [`take_header`](Self::take_header) a [`RegionHeader`] built in
    /// a `const` instead: the same initialization, without the code that
    /// checks the config and lays the header out.
    pub fn take(
        &'static self,
        config: &RegionConfig<'_>,
    ) -> Result<RegionHandles<'static>, TakeError> {
        self.take_header(&RegionHeader::new(config)?)
    }

    /// Initializes the region with `header` and returns its handles; as
    /// [`take`](Self::take), succeeds once per program.
    pub fn take_header(
        &'static self,
        header: &RegionHeader<SMB_BYTES, SLOTS>,
    ) -> Result<RegionHandles<'static>, TakeError> {
        // Relaxed: the flag publishes nothing. Exactly one swap finds 0,
        // and only that caller touches the storage; the handles reach other
        // contexts through whatever the program shares them with.
        if TAKEN.swap(1, Relaxed) != 0 {
            return Err(TakeError::AlreadyTaken);
        }
        self.setup(header)
    }

    /// Initializes the region under an exclusive borrow (tests, or storage
    /// the program already holds as `&mut`). May be called again once the
    /// handles of the previous call are gone: that is a firmware reset as
    /// the host sees it.
    pub fn init(&mut self, config: &RegionConfig<'_>) -> Result<RegionHandles<'_>, TakeError> {
        self.setup(&RegionHeader::new(config)?)
    }

    /// Runs the initialization protocol (module docs of
    /// [`region`](super)) and builds the handles.
    fn setup(
        &self,
        header: &RegionHeader<SMB_BYTES, SLOTS>,
    ) -> Result<RegionHandles<'_>, TakeError> {
        let fail = TakeError::Invalid(HeaderError::RegionTooLarge {
            region_size: header.words[REGION_SIZE_WORD],
            mapped: Self::REGION_SIZE,
        });
        let base = NonNull::new(self.bytes.get().cast::<u8>()).ok_or(fail)?;
        // SAFETY: the storage's bytes are valid for reads and writes for as
        // long as `self` is borrowed (they sit in an `UnsafeCell`, so shared
        // borrows allow writes), no reference to them is ever created, and
        // they are accessed only through `Mem` and the `Smb` built from it
        // (module invariants).
        let mem = unsafe { Mem::new(base, Self::REGION_SIZE) };
        let words: &[AtomicLeU32; HEADER_WORDS] = mem
            .words(0, HEADER_WORDS)
            .and_then(|w| w.try_into().ok())
            .ok_or(fail)?;

        // 1. Clear the magic first (a host must not trust the header while
        //    it changes), then pick a boot id the host has not seen.
        let [m0, m1] = MAGIC_WORDS;
        let [magic, magic_hi, version, ..] = words;
        let boot = &words[BOOT_WORD];
        let mut boot_id = header.words[BOOT_WORD];
        if magic.load(Relaxed) == m0
            && magic_hi.load(Relaxed) == m1
            && version.load(Relaxed) & 0xFFFF == u32::from(VERSION)
        {
            boot_id = boot.load(Relaxed).wrapping_add(1);
        }
        magic.store(0, Relaxed);
        core::sync::atomic::fence(Release);
        boot.store(boot_id, Relaxed);

        // 2. The other words (static part and control words), then ring
        //    and page headers.
        for (i, (word, &value)) in words.iter().zip(&header.words).enumerate() {
            if i != 0 && i != BOOT_WORD {
                word.store(value, Relaxed);
            }
        }
        let repr = header.repr(boot_id);
        let control = Control::new(mem, repr.ring).ok_or(fail)?;
        // The ring: `seq` of slot `i` is `i`, bodies 0 (`ring_head` and
        // `ring_tail`, control words, are 0 already).
        let stride = SLOT_SIZE / 4;
        let ring_words = mem.words(HEADER_SIZE, SLOTS * stride).ok_or(fail)?;
        for (k, word) in ring_words.iter().enumerate() {
            let seq = if k % stride == 0 { k / stride } else { 0 };
            word.store(seq as u32, Relaxed);
        }
        let smb_at = repr.smb.offset as usize;
        let page_size = repr.smb.page_size;
        for page in (smb_at..smb_at + SMB_BYTES).step_by(page_size.get()) {
            let header: &[AtomicLeU32; PAGE_HEADER_SIZE / 4] = mem
                .words(page, PAGE_HEADER_SIZE / 4)
                .and_then(|w| w.try_into().ok())
                .ok_or(fail)?;
            let [header_bitmap, reserved] = header;
            header_bitmap.store(0, Relaxed);
            reserved.store(0, Relaxed);
        }
        // The `Smb` is stored in the storage's own cell, so it is typed
        // `'static`; it is only ever handed out as `&'m Smb<'m>`, with `'m`
        // the borrow of the storage, so no use outlives the memory.
        // SAFETY: as for `mem`; the longer lifetime is never observable
        // (see above).
        let mem_in_cell: Mem<'static> = unsafe { Mem::new(base, Self::REGION_SIZE) };
        let smb = mem_in_cell
            .smb(smb_at, SMB_BYTES, page_size)
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
            header: repr,
            mem,
        })
    }
}

/// Words of a header.
const HEADER_WORDS: usize = HEADER_SIZE / 4;
/// Index of `boot_id` among them.
const BOOT_WORD: usize = offset::BOOT_ID / 4;
/// Index of `region_size`.
const REGION_SIZE_WORD: usize = 0x0C / 4;

/// The header a [`RegionStorage`] of `SMB_BYTES` and `SLOTS` is initialized
/// with: a [`RegionConfig`] checked for that storage, and the 64 words it
/// makes (control words included; `boot_id` the config's, used when the
/// memory holds no header of a previous boot).
///
/// [`RegionHeader::new`] is a `const fn`: in a `const`, the checks and the
/// layout run at compile time, and a firmware holds the header's words,
/// not the code that makes them. Hand [`RegionStorage::take_header`] a
/// reference to the constant (`&HEADER`, as below): the words are read from
/// flash where they are (a copy of the constant on the stack would be read
/// back word by word).
///
/// ```
/// use shmtrace_abi::region::{RegionConfig, RegionHeader, RegionStorage, TakeError};
///
/// static REGION: RegionStorage<8192, 16> = RegionStorage::new();
/// const HEADER: Result<RegionHeader<8192, 16>, TakeError> =
///     RegionHeader::new(&RegionConfig::new("fw.track_event"));
///
/// // A config that does not fit the storage fails the build here.
/// const _: () = assert!(HEADER.is_ok(), "the region's config does not fit its storage");
///
/// let handles = match &HEADER {
///     Ok(header) => REGION.take_header(header),
///     Err(e) => Err(*e),
/// };
/// let handles = handles.unwrap();
/// assert_eq!(handles.header.data_source.as_str(), "fw.track_event");
/// ```
///
/// ```compile_fail
/// use shmtrace_abi::region::{RegionConfig, RegionHeader, TakeError};
///
/// // 1 KiB: less than a page.
/// const HEADER: Result<RegionHeader<1024, 16>, TakeError> =
///     RegionHeader::new(&RegionConfig::new("fw.track_event"));
/// const _: () = assert!(HEADER.is_ok(), "the region's config does not fit its storage");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionHeader<const SMB_BYTES: usize, const SLOTS: usize> {
    /// The header's words as initialized ([`HeaderRepr::word`], and the
    /// control words).
    pub(super) words: [u32; HEADER_WORDS],
    /// The page size (also in the words, where it is a plain `u32`).
    page_size: PageSize,
}

impl<const SMB_BYTES: usize, const SLOTS: usize> RegionHeader<SMB_BYTES, SLOTS> {
    /// Checks `config` for the storage and lays its header out.
    pub const fn new(config: &RegionConfig<'_>) -> Result<Self, TakeError> {
        let region_size = RegionStorage::<SMB_BYTES, SLOTS>::REGION_SIZE;
        let slots = if SLOTS > u32::MAX as usize {
            u32::MAX
        } else {
            SLOTS as u32
        };
        if !slots.is_power_of_two() || slots < MIN_RING_SLOTS || slots > MAX_RING_SLOTS {
            return Err(TakeError::Invalid(HeaderError::BadRingSlots(slots)));
        }
        let page = config.page_size.get();
        if SMB_BYTES == 0
            || SMB_BYTES % page != 0
            || SMB_BYTES / page > MAX_SMB_PAGES
            || region_size > u32::MAX as usize
        {
            return Err(TakeError::Invalid(HeaderError::BadSmbSize {
                smb_size: if SMB_BYTES > u32::MAX as usize {
                    u32::MAX
                } else {
                    SMB_BYTES as u32
                },
                page_size: page as u32,
            }));
        }
        if config.clock_id < MIN_CLOCK_ID || config.clock_id > MAX_CLOCK_ID {
            return Err(TakeError::Invalid(HeaderError::BadClockId(config.clock_id)));
        }
        let data_source = match Name::new(config.data_source) {
            Ok(name) if !name.is_empty() => name,
            Ok(_) => {
                return Err(TakeError::Invalid(HeaderError::DataSourceName(
                    NameError::Empty,
                )))
            }
            Err(e) => return Err(TakeError::Invalid(HeaderError::DataSourceName(e))),
        };
        let producer = match Name::new(config.producer) {
            Ok(name) => name,
            Err(e) => return Err(TakeError::Invalid(HeaderError::ProducerName(e))),
        };
        let ring_offset = HEADER_SIZE as u32;
        let repr = HeaderRepr {
            header_size: HEADER_SIZE as u16,
            region_size: region_size as u32,
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
        };
        // `HeaderRepr::word` is 0 for the control words.
        let mut words = [0; HEADER_WORDS];
        let mut i = 0;
        while i < HEADER_WORDS {
            words[i] = repr.word(4 * i);
            i += 1;
        }
        words[offset::TRACE_ENABLED / 4] = config.trace_enabled as u32;
        Ok(RegionHeader {
            words,
            page_size: config.page_size,
        })
    }

    /// The header's parsed form, with `boot_id` (as
    /// [`RegionHandles::header`] returns it): its words read back, without
    /// checks, as [`new`](Self::new) checked them.
    pub fn repr(&self, boot_id: u32) -> HeaderRepr {
        let w = &self.words;
        let name = |from: usize| {
            let words = w
                .get(from..from + NAME_LEN / 4)
                .and_then(|n| n.try_into().ok());
            Name::from_words(words.unwrap_or_default())
        };
        HeaderRepr {
            header_size: (w[0x08 / 4] >> 16) as u16,
            region_size: w[REGION_SIZE_WORD],
            boot_id,
            flags: w[0x14 / 4],
            ring: RingGeometry {
                offset: w[0x18 / 4],
                slots: w[0x1C / 4],
                slot_size: w[0x20 / 4],
            },
            smb: SmbGeometry {
                offset: w[0x24 / 4],
                size: w[0x28 / 4],
                page_size: self.page_size,
            },
            clock_id: w[0x30 / 4],
            data_source: name(0x40 / 4),
            producer: name(0x80 / 4),
        }
    }
}

const _: () = assert!(NAME_LEN == 64);
