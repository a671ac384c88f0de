//! The bytes of a region: header and ring slot layouts, checked views,
//! parsed forms and validation (smoltcp `wire/` style, as
//! [`crate::layout`] does for pages and chunks).
//!
//! # Invariants
//!
//! * [`HeaderWire`] is exactly [`HEADER_SIZE`] bytes and [`SlotWire`]
//!   exactly [`SLOT_SIZE`]; every field offset is a constant checked at
//!   compile time against the table in the [module docs](super).
//! * A [`HeaderRepr`] returned by [`HeaderRepr::parse`] describes a region
//!   whose header, ring and SMB lie inside the mapped length, do not
//!   overlap, are 8-aligned, and whose ring and SMB geometry is usable
//!   (power-of-two slot count in range, SMB a non-zero multiple of a valid
//!   page size). Code built on it never needs to check these again.
//! * Parsing never panics, whatever the bytes.

use core::fmt;
use core::mem::{offset_of, size_of};

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::layout::{PageSize, PageSizeError};

/// `magic`: the bytes `shmtrace` (`73 68 6d 74 72 61 63 65`).
pub const MAGIC: [u8; 8] = *b"shmtrace";
/// [`MAGIC`] as the two little-endian words at `0x00` and `0x04`.
pub(crate) const MAGIC_WORDS: [u32; 2] = {
    let [a, b, c, d, e, f, g, h] = MAGIC;
    [
        u32::from_le_bytes([a, b, c, d]),
        u32::from_le_bytes([e, f, g, h]),
    ]
};
/// The region ABI version this crate writes and reads.
pub const VERSION: u16 = 1;
/// Size of the header this crate writes (`header_size`).
pub const HEADER_SIZE: usize = 256;
/// Size of a ring slot this crate writes (`slot_size`).
pub const SLOT_SIZE: usize = 32;
/// Capacity of a name field (data source, producer), NUL padded.
pub const NAME_LEN: usize = 64;
/// Fewest ring slots (the slot protocol tells "published" from "consumed"
/// by `seq - pos` in `{1, slots}`, so `slots >= 2`).
pub const MIN_RING_SLOTS: u32 = 2;
/// Most ring slots.
pub const MAX_RING_SLOTS: u32 = 1 << 16;
/// Most pages an SMB of a region may have (CHUNK slots hold a u16 page).
pub const MAX_SMB_PAGES: usize = 1 << 16;
/// Alignment of the region base, the ring and the SMB.
pub const REGION_ALIGNMENT: usize = 8;
/// Smallest sequence-scoped clock id (`clock_id` of a firmware clock).
pub const MIN_CLOCK_ID: u32 = 1;
/// Largest clock id a producer may use (ids from 128 are reserved).
pub const MAX_CLOCK_ID: u32 = 127;

/// `flags` bit 0: the firmware drains the ring itself (stream mode); a host
/// must not consume it.
pub const FLAG_STREAM_MODE: u32 = 1 << 0;

/// Slot `kind`: a committed chunk.
pub const KIND_CHUNK: u8 = 1;
/// Slot `kind`: one patch.
pub const KIND_PATCH: u8 = 2;
/// PATCH slot `flags` bit 0: more patches for the same chunk follow.
pub const PATCH_HAS_MORE: u8 = 1 << 0;

/// The region header as it sits in memory (little-endian, 256 bytes). See
/// the [module docs](super) for the meaning and owner of every field.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct HeaderWire {
    /// `shmtrace`, written last at initialization.
    pub magic: [u8; 8],
    /// [`VERSION`].
    pub version: U16,
    /// [`HEADER_SIZE`].
    pub header_size: U16,
    /// Bytes from the region base to its end.
    pub region_size: U32,
    /// Differs between two consecutive boots.
    pub boot_id: U32,
    /// [`FLAG_STREAM_MODE`]; other bits 0.
    pub flags: U32,
    /// Ring offset from the base.
    pub ring_offset: U32,
    /// Number of ring slots (power of two).
    pub ring_slots: U32,
    /// [`SLOT_SIZE`].
    pub slot_size: U32,
    /// SMB offset from the base.
    pub smb_offset: U32,
    /// SMB size in bytes.
    pub smb_size: U32,
    /// SMB page size in bytes.
    pub page_size: U32,
    /// The firmware's absolute clock id.
    pub clock_id: U32,
    /// Zero.
    pub reserved0: [u8; 12],
    /// Data source name, UTF-8, NUL padded.
    pub data_source_name: [u8; NAME_LEN],
    /// Producer name, UTF-8, NUL padded.
    pub producer_name: [u8; NAME_LEN],
    /// Next ring position producers claim.
    pub ring_head: U32,
    /// Next ring position the consumer reads.
    pub ring_tail: U32,
    /// Host: 1 = trace, 0 = don't.
    pub trace_enabled: U32,
    /// Host increments: writers restart their sequences.
    pub clear_request: U32,
    /// Host increments: firmware commits what it holds.
    pub flush_request: U32,
    /// Firmware: the `flush_request` value it has flushed for.
    pub flush_ack: U32,
    /// Host: a clock-sync nonce.
    pub sync_request: U32,
    /// Firmware: the nonce `sync_time` answers.
    pub sync_response: U32,
    /// Firmware clock (ns) when it answered `sync_request`.
    pub sync_time: U64,
    /// Firmware: packets its writers dropped.
    pub packets_dropped: U32,
    /// Firmware: chunk commits that found the ring full.
    pub ring_overflows: U32,
    /// Firmware: chunks lost (could not be completed).
    pub chunks_lost: U32,
    /// Firmware: incremented while it runs.
    pub heartbeat: U32,
    /// Zero.
    pub reserved1: [u8; 8],
}

/// One ring slot as it sits in memory (little-endian, 32 bytes).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct SlotWire {
    /// The slot's sequence word (ring protocol).
    pub seq: U32,
    /// [`KIND_CHUNK`] or [`KIND_PATCH`].
    pub kind: u8,
    /// PATCH: [`PATCH_HAS_MORE`]. CHUNK: 0.
    pub flags: u8,
    /// Writer id of the chunk.
    pub writer_id: U16,
    /// Chunk id of the chunk.
    pub chunk_id: U32,
    /// CHUNK: page index. PATCH: offset from the chunk payload start.
    pub page_or_offset: U16,
    /// CHUNK: chunk index in the page (low byte), 0. PATCH: 0.
    pub chunk_index: U16,
    /// CHUNK: payload bytes in use. PATCH: the 4 bytes to write.
    pub used_or_data: [u8; 4],
    /// Zero.
    pub reserved: [u8; 12],
}

const _: () = assert!(size_of::<HeaderWire>() == HEADER_SIZE);
const _: () = assert!(size_of::<SlotWire>() == SLOT_SIZE);

/// Byte offsets of the header words accessed atomically (all 4-aligned).
pub mod offset {
    use super::*;

    /// `magic` (as two u32 words; the one at 0 is cleared first, written last).
    pub const MAGIC: usize = offset_of!(HeaderWire, magic);
    /// `boot_id`.
    pub const BOOT_ID: usize = offset_of!(HeaderWire, boot_id);
    /// `ring_head`.
    pub const RING_HEAD: usize = offset_of!(HeaderWire, ring_head);
    /// `ring_tail`.
    pub const RING_TAIL: usize = offset_of!(HeaderWire, ring_tail);
    /// `trace_enabled`.
    pub const TRACE_ENABLED: usize = offset_of!(HeaderWire, trace_enabled);
    /// `clear_request`.
    pub const CLEAR_REQUEST: usize = offset_of!(HeaderWire, clear_request);
    /// `flush_request`.
    pub const FLUSH_REQUEST: usize = offset_of!(HeaderWire, flush_request);
    /// `flush_ack`.
    pub const FLUSH_ACK: usize = offset_of!(HeaderWire, flush_ack);
    /// `sync_request`.
    pub const SYNC_REQUEST: usize = offset_of!(HeaderWire, sync_request);
    /// `sync_response`.
    pub const SYNC_RESPONSE: usize = offset_of!(HeaderWire, sync_response);
    /// `sync_time` (low word; the high word follows).
    pub const SYNC_TIME: usize = offset_of!(HeaderWire, sync_time);
    /// `packets_dropped`.
    pub const PACKETS_DROPPED: usize = offset_of!(HeaderWire, packets_dropped);
    /// `ring_overflows`.
    pub const RING_OVERFLOWS: usize = offset_of!(HeaderWire, ring_overflows);
    /// `chunks_lost`.
    pub const CHUNKS_LOST: usize = offset_of!(HeaderWire, chunks_lost);
    /// `heartbeat`.
    pub const HEARTBEAT: usize = offset_of!(HeaderWire, heartbeat);
    /// First control word: bytes before it are written once at
    /// initialization, bytes from it on change while the region runs.
    pub const CONTROL: usize = RING_HEAD;
}

// The offsets the module docs promise.
const _: () = {
    assert!(offset_of!(HeaderWire, version) == 0x08);
    assert!(offset_of!(HeaderWire, region_size) == 0x0C);
    assert!(offset::BOOT_ID == 0x10);
    assert!(offset_of!(HeaderWire, flags) == 0x14);
    assert!(offset_of!(HeaderWire, ring_offset) == 0x18);
    assert!(offset_of!(HeaderWire, smb_offset) == 0x24);
    assert!(offset_of!(HeaderWire, clock_id) == 0x30);
    assert!(offset_of!(HeaderWire, data_source_name) == 0x40);
    assert!(offset_of!(HeaderWire, producer_name) == 0x80);
    assert!(offset::RING_HEAD == 0xC0);
    assert!(offset::SYNC_TIME == 0xE0);
    assert!(offset::HEARTBEAT == 0xF4);
    assert!(offset_of!(SlotWire, kind) == 4);
    assert!(offset_of!(SlotWire, chunk_id) == 8);
    assert!(offset_of!(SlotWire, page_or_offset) == 12);
    assert!(offset_of!(SlotWire, used_or_data) == 16);
};

/// A buffer too short for the view asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Truncated {
    /// Bytes required.
    pub needed: usize,
    /// Bytes available.
    pub got: usize,
}

impl fmt::Display for Truncated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "needs {} bytes, buffer has {}", self.needed, self.got)
    }
}

impl core::error::Error for Truncated {}

/// Checked view of a region header over `T` (at least [`HEADER_SIZE`]
/// bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Header<T> {
    /// Wraps `buffer` after checking it holds a whole header.
    pub fn new_checked(buffer: T) -> Result<Self, Truncated> {
        let got = buffer.as_ref().len();
        if got < HEADER_SIZE {
            return Err(Truncated {
                needed: HEADER_SIZE,
                got,
            });
        }
        Ok(Header { buffer })
    }

    /// The fields (`None` never happens after `new_checked`).
    pub fn wire(&self) -> Option<&HeaderWire> {
        HeaderWire::ref_from_prefix(self.buffer.as_ref())
            .ok()
            .map(|(w, _)| w)
    }

    /// Returns the wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    /// The fields, mutably.
    pub fn wire_mut(&mut self) -> Option<&mut HeaderWire> {
        HeaderWire::mut_from_prefix(self.buffer.as_mut())
            .ok()
            .map(|(w, _)| w)
    }
}

/// Checked view of a ring slot over `T` (at least [`SLOT_SIZE`] bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Slot<T> {
    /// Wraps `buffer` after checking it holds a whole slot.
    pub fn new_checked(buffer: T) -> Result<Self, Truncated> {
        let got = buffer.as_ref().len();
        if got < SLOT_SIZE {
            return Err(Truncated {
                needed: SLOT_SIZE,
                got,
            });
        }
        Ok(Slot { buffer })
    }

    /// The fields (`None` never happens after `new_checked`).
    pub fn wire(&self) -> Option<&SlotWire> {
        SlotWire::ref_from_prefix(self.buffer.as_ref())
            .ok()
            .map(|(w, _)| w)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Slot<T> {
    /// The fields, mutably.
    pub fn wire_mut(&mut self) -> Option<&mut SlotWire> {
        SlotWire::mut_from_prefix(self.buffer.as_mut())
            .ok()
            .map(|(w, _)| w)
    }
}

/// Why a name was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameError {
    /// Longer than [`NAME_LEN`] bytes.
    TooLong(usize),
    /// Holds a NUL byte.
    ContainsNul,
    /// The bytes before the first NUL are not UTF-8.
    NotUtf8,
    /// Empty where a name is required (the data source).
    Empty,
}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::TooLong(n) => write!(f, "name of {n} bytes exceeds {NAME_LEN}"),
            Self::ContainsNul => f.write_str("name contains a NUL byte"),
            Self::NotUtf8 => f.write_str("name is not UTF-8"),
            Self::Empty => f.write_str("name is empty"),
        }
    }
}

impl core::error::Error for NameError {}

/// A name field: UTF-8, at most [`NAME_LEN`] bytes, NUL padded.
///
/// (Word-aligned, so moving one and reading its words is word copies.)
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[repr(align(4))]
pub struct Name {
    bytes: [u8; NAME_LEN],
}

impl Name {
    /// The empty name.
    pub const EMPTY: Name = Name {
        bytes: [0; NAME_LEN],
    };

    /// `s` as a name field.
    pub const fn new(s: &str) -> Result<Self, NameError> {
        let src = s.as_bytes();
        if src.len() > NAME_LEN {
            return Err(NameError::TooLong(src.len()));
        }
        let mut bytes = [0u8; NAME_LEN];
        let mut i = 0;
        while i < src.len() {
            if src[i] == 0 {
                return Err(NameError::ContainsNul);
            }
            bytes[i] = src[i];
            i += 1;
        }
        Ok(Name { bytes })
    }

    /// Parses a field as stored: the name ends at the first NUL (or after
    /// 64 bytes) and must be UTF-8; bytes after the first NUL are ignored.
    pub fn from_field(field: [u8; NAME_LEN]) -> Result<Self, NameError> {
        let len = field.iter().position(|&b| b == 0).unwrap_or(NAME_LEN);
        let (name, _) = field.split_at(len);
        core::str::from_utf8(name).map_err(|_| NameError::NotUtf8)?;
        let mut bytes = [0u8; NAME_LEN];
        bytes[..len].copy_from_slice(name);
        Ok(Name { bytes })
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        let len = self.bytes.iter().position(|&b| b == 0).unwrap_or(NAME_LEN);
        core::str::from_utf8(&self.bytes[..len]).unwrap_or("")
    }

    /// The stored field (NUL padded).
    pub const fn field(&self) -> &[u8; NAME_LEN] {
        &self.bytes
    }

    /// Whether the name is empty.
    pub const fn is_empty(&self) -> bool {
        self.bytes[0] == 0
    }

    /// The name whose field is the 16 little-endian `words`, as
    /// [`Name::word`] made them from a name (so they are a name: not
    /// checked again).
    pub(crate) fn from_words(words: [u32; NAME_LEN / 4]) -> Name {
        Name {
            bytes: zerocopy::transmute!(words.map(u32::to_le)),
        }
    }

    /// The little-endian word of the field at byte `at` (rounded down to a
    /// multiple of 4, taken modulo [`NAME_LEN`]).
    const fn word(&self, at: usize) -> u32 {
        let i = at & (NAME_LEN - 4);
        let b = &self.bytes;
        u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// Where the ring lies and how it is cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingGeometry {
    /// Offset from the region base (8-aligned).
    pub offset: u32,
    /// Number of slots: a power of two in
    /// [`MIN_RING_SLOTS`]`..=`[`MAX_RING_SLOTS`].
    pub slots: u32,
    /// Bytes per slot: [`SLOT_SIZE`] in v1 (a larger multiple of 8 is
    /// accepted; bytes past the 32th are ignored).
    pub slot_size: u32,
}

impl RingGeometry {
    /// Bytes the ring occupies.
    /// (Saturating: a huge `slot_size` from a peer fails the range check
    /// instead of wrapping on 32-bit targets.)
    pub const fn len(&self) -> usize {
        (self.slots as usize).saturating_mul(self.slot_size as usize)
    }

    /// Whether the ring has no slot (never after validation).
    pub const fn is_empty(&self) -> bool {
        self.slots == 0
    }
}

/// Where the SMB lies and its page size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmbGeometry {
    /// Offset from the region base (8-aligned).
    pub offset: u32,
    /// Size in bytes: a non-zero multiple of `page_size`.
    pub size: u32,
    /// Page size.
    pub page_size: PageSize,
}

/// The parsed, validated static part of a header (bytes `0x00..0xC0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderRepr {
    /// `header_size` (>= 256; only the first 256 bytes are defined).
    pub header_size: u16,
    /// `region_size`.
    pub region_size: u32,
    /// `boot_id`.
    pub boot_id: u32,
    /// `flags`.
    pub flags: u32,
    /// The ring.
    pub ring: RingGeometry,
    /// The SMB.
    pub smb: SmbGeometry,
    /// The firmware's absolute clock id.
    pub clock_id: u32,
    /// Data source name (non-empty).
    pub data_source: Name,
    /// Producer name (may be empty).
    pub producer: Name,
}

/// Which part of a region a geometry error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The header.
    Header,
    /// The commit ring.
    Ring,
    /// The SMB.
    Smb,
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Header => "header",
            Self::Ring => "ring",
            Self::Smb => "SMB",
        })
    }
}

/// Why a header was refused. Each variant carries the offending values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderError {
    /// The mapping is shorter than a header.
    Truncated(Truncated),
    /// `magic` is not `shmtrace` (not initialized, or being reinitialized).
    BadMagic([u8; 8]),
    /// `version` is not 1.
    UnsupportedVersion(u16),
    /// `header_size` below 256 or not a multiple of 8.
    BadHeaderSize(u16),
    /// `slot_size` below 32 or not a multiple of 8.
    BadSlotSize(u32),
    /// `ring_slots` not a power of two in 2..=65536.
    BadRingSlots(u32),
    /// `region_size` exceeds the mapping.
    RegionTooLarge {
        /// `region_size`.
        region_size: u32,
        /// Bytes mapped.
        mapped: usize,
    },
    /// A part's offset is not 8-aligned.
    Misaligned {
        /// Which part.
        part: Part,
        /// Its offset.
        offset: u32,
    },
    /// A part extends past `region_size` (or past the mapping).
    OutOfRange {
        /// Which part.
        part: Part,
        /// Its offset.
        offset: u32,
        /// Its length.
        len: usize,
        /// `region_size`.
        region_size: u32,
    },
    /// Two parts overlap.
    Overlap(Part, Part),
    /// `page_size` is not a valid ABI page size.
    BadPageSize(PageSizeError),
    /// `smb_size` is 0, not a multiple of `page_size`, or more than
    /// [`MAX_SMB_PAGES`] pages.
    BadSmbSize {
        /// `smb_size`.
        smb_size: u32,
        /// `page_size`.
        page_size: u32,
    },
    /// `clock_id` outside 1..=127.
    BadClockId(u32),
    /// The data source name is invalid.
    DataSourceName(NameError),
    /// The producer name is invalid.
    ProducerName(NameError),
}

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Truncated(t) => write!(f, "region header truncated: {t}"),
            Self::BadMagic(m) => write!(f, "region magic is {m:02x?}, expected \"shmtrace\""),
            Self::UnsupportedVersion(v) => write!(f, "region version {v} (supported: {VERSION})"),
            Self::BadHeaderSize(s) => write!(f, "header_size {s} (need >= 256, multiple of 8)"),
            Self::BadSlotSize(s) => write!(f, "slot_size {s} (need >= 32, multiple of 8)"),
            Self::BadRingSlots(n) => write!(
                f,
                "ring_slots {n} (need a power of two in {MIN_RING_SLOTS}..={MAX_RING_SLOTS})"
            ),
            Self::RegionTooLarge {
                region_size,
                mapped,
            } => write!(
                f,
                "region_size {region_size} exceeds the {mapped} bytes mapped"
            ),
            Self::Misaligned { part, offset } => {
                write!(f, "{part} offset {offset:#x} is not 8-aligned")
            }
            Self::OutOfRange {
                part,
                offset,
                len,
                region_size,
            } => write!(
                f,
                "{part} at {offset:#x} ({len} bytes) exceeds region_size {region_size}"
            ),
            Self::Overlap(a, b) => write!(f, "{a} and {b} overlap"),
            Self::BadPageSize(e) => write!(f, "page_size: {e}"),
            Self::BadSmbSize {
                smb_size,
                page_size,
            } => write!(
                f,
                "smb_size {smb_size} is not 1..={MAX_SMB_PAGES} pages of page_size {page_size}"
            ),
            Self::BadClockId(id) => {
                write!(f, "clock_id {id} outside {MIN_CLOCK_ID}..={MAX_CLOCK_ID}")
            }
            Self::DataSourceName(e) => write!(f, "data source name: {e}"),
            Self::ProducerName(e) => write!(f, "producer name: {e}"),
        }
    }
}

impl core::error::Error for HeaderError {}

fn span(
    part: Part,
    offset: u32,
    len: usize,
    region_size: u32,
) -> Result<(usize, usize), HeaderError> {
    if offset as usize % REGION_ALIGNMENT != 0 {
        return Err(HeaderError::Misaligned { part, offset });
    }
    let start = offset as usize;
    match start.checked_add(len) {
        Some(end) if end <= region_size as usize && len != 0 => Ok((start, end)),
        _ => Err(HeaderError::OutOfRange {
            part,
            offset,
            len,
            region_size,
        }),
    }
}

fn overlaps(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

impl HeaderRepr {
    /// Parses and validates a header copied from a region of `mapped`
    /// bytes. Control words (`0xC0..`) are not looked at.
    pub fn parse(bytes: &[u8], mapped: usize) -> Result<Self, HeaderError> {
        let view = Header::new_checked(bytes).map_err(HeaderError::Truncated)?;
        let Some(w) = view.wire() else {
            return Err(HeaderError::Truncated(Truncated {
                needed: HEADER_SIZE,
                got: bytes.len(),
            }));
        };
        if w.magic != MAGIC {
            return Err(HeaderError::BadMagic(w.magic));
        }
        if w.version.get() != VERSION {
            return Err(HeaderError::UnsupportedVersion(w.version.get()));
        }
        let header_size = w.header_size.get();
        if (header_size as usize) < HEADER_SIZE || header_size as usize % REGION_ALIGNMENT != 0 {
            return Err(HeaderError::BadHeaderSize(header_size));
        }
        let slot_size = w.slot_size.get();
        if (slot_size as usize) < SLOT_SIZE || slot_size as usize % REGION_ALIGNMENT != 0 {
            return Err(HeaderError::BadSlotSize(slot_size));
        }
        let slots = w.ring_slots.get();
        if !slots.is_power_of_two() || !(MIN_RING_SLOTS..=MAX_RING_SLOTS).contains(&slots) {
            return Err(HeaderError::BadRingSlots(slots));
        }
        let region_size = w.region_size.get();
        if region_size as usize > mapped {
            return Err(HeaderError::RegionTooLarge {
                region_size,
                mapped,
            });
        }
        let page_size =
            PageSize::new(w.page_size.get() as usize).map_err(HeaderError::BadPageSize)?;
        let smb_size = w.smb_size.get();
        if smb_size == 0
            || smb_size as usize % page_size.get() != 0
            || smb_size as usize / page_size.get() > MAX_SMB_PAGES
        {
            return Err(HeaderError::BadSmbSize {
                smb_size,
                page_size: w.page_size.get(),
            });
        }
        let header = span(Part::Header, 0, header_size as usize, region_size)?;
        let ring = RingGeometry {
            offset: w.ring_offset.get(),
            slots,
            slot_size,
        };
        let ring_span = span(Part::Ring, ring.offset, ring.len(), region_size)?;
        let smb = SmbGeometry {
            offset: w.smb_offset.get(),
            size: smb_size,
            page_size,
        };
        let smb_span = span(Part::Smb, smb.offset, smb_size as usize, region_size)?;
        if overlaps(header, ring_span) {
            return Err(HeaderError::Overlap(Part::Header, Part::Ring));
        }
        if overlaps(header, smb_span) {
            return Err(HeaderError::Overlap(Part::Header, Part::Smb));
        }
        if overlaps(ring_span, smb_span) {
            return Err(HeaderError::Overlap(Part::Ring, Part::Smb));
        }
        let clock_id = w.clock_id.get();
        if !(MIN_CLOCK_ID..=MAX_CLOCK_ID).contains(&clock_id) {
            return Err(HeaderError::BadClockId(clock_id));
        }
        let data_source =
            Name::from_field(w.data_source_name).map_err(HeaderError::DataSourceName)?;
        if data_source.is_empty() {
            return Err(HeaderError::DataSourceName(NameError::Empty));
        }
        let producer = Name::from_field(w.producer_name).map_err(HeaderError::ProducerName)?;
        Ok(HeaderRepr {
            header_size,
            region_size,
            boot_id: w.boot_id.get(),
            flags: w.flags.get(),
            ring,
            smb,
            clock_id,
            data_source,
            producer,
        })
    }

    /// Whether the firmware drains the ring itself ([`FLAG_STREAM_MODE`]).
    pub const fn stream_mode(&self) -> bool {
        self.flags & FLAG_STREAM_MODE != 0
    }

    /// Writes the static part (`0x00..0xC0`, magic included) into `buf`;
    /// control words are left as they are. `header_size` and `slot_size`
    /// are written as this repr holds them.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), Truncated> {
        let got = buf.len();
        let Some(head) = buf.get_mut(..offset::CONTROL) else {
            return Err(Truncated {
                needed: HEADER_SIZE,
                got,
            });
        };
        if got < HEADER_SIZE {
            return Err(Truncated {
                needed: HEADER_SIZE,
                got,
            });
        }
        for (at, dst) in (0..).step_by(4).zip(head.chunks_exact_mut(4)) {
            dst.copy_from_slice(&self.word(at).to_le_bytes());
        }
        Ok(())
    }

    /// The little-endian word at byte `at` (a multiple of 4 below
    /// `0xC0`) of the static part as [`HeaderRepr::emit`] writes it: the
    /// one encoder of the header, which a firmware also stores word by
    /// word into its region. 0 for reserved words (and any other `at`).
    pub const fn word(&self, at: usize) -> u32 {
        const DATA_SOURCE: usize = offset_of!(HeaderWire, data_source_name);
        const PRODUCER: usize = offset_of!(HeaderWire, producer_name);
        match at {
            0 => MAGIC_WORDS[0],
            4 => MAGIC_WORDS[1],
            0x08 => VERSION as u32 | (self.header_size as u32) << 16,
            0x0C => self.region_size,
            offset::BOOT_ID => self.boot_id,
            0x14 => self.flags,
            0x18 => self.ring.offset,
            0x1C => self.ring.slots,
            0x20 => self.ring.slot_size,
            0x24 => self.smb.offset,
            0x28 => self.smb.size,
            0x2C => self.smb.page_size.get() as u32,
            0x30 => self.clock_id,
            DATA_SOURCE..PRODUCER => self.data_source.word(at - DATA_SOURCE),
            PRODUCER..offset::CONTROL => self.producer.word(at - PRODUCER),
            _ => 0,
        }
    }
}

// The words `HeaderRepr::word` places, where the wire struct has them.
const _: () = {
    assert!(offset_of!(HeaderWire, version) == 0x08 && offset_of!(HeaderWire, header_size) == 0x0A);
    assert!(
        offset_of!(HeaderWire, ring_slots) == 0x1C && offset_of!(HeaderWire, slot_size) == 0x20
    );
    assert!(offset_of!(HeaderWire, smb_size) == 0x28 && offset_of!(HeaderWire, page_size) == 0x2C);
    assert!(offset_of!(HeaderWire, reserved0) == 0x34 && offset::CONTROL == 0xC0);
    assert!(offset_of!(HeaderWire, producer_name) + NAME_LEN == offset::CONTROL);
};

/// A ring record: what a slot carries besides its sequence word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotRepr {
    /// A committed chunk.
    Chunk(ChunkSlot),
    /// One patch of a committed chunk.
    Patch(PatchSlot),
}

/// A CHUNK slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkSlot {
    /// Writer id of the chunk.
    pub writer_id: u16,
    /// Chunk id of the chunk.
    pub chunk_id: u32,
    /// Page index in the SMB.
    pub page: u16,
    /// Chunk index in the page.
    pub chunk: u8,
    /// Payload bytes in use (after the 8-byte chunk header): bytes past
    /// them need not be copied.
    pub used: u32,
}

/// A PATCH slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PatchSlot {
    /// Writer id of the chunk.
    pub writer_id: u16,
    /// Chunk id of the chunk.
    pub chunk_id: u32,
    /// More patches for this chunk follow.
    pub has_more: bool,
    /// Offset from the chunk payload start.
    pub offset: u16,
    /// The 4 bytes to write there.
    pub data: [u8; 4],
}

/// Why a published slot could not be parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotError {
    /// `kind` is neither CHUNK nor PATCH.
    UnknownKind(u8),
}

impl fmt::Display for SlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::UnknownKind(k) => {
                write!(f, "ring slot kind {k} is neither CHUNK (1) nor PATCH (2)")
            }
        }
    }
}

impl core::error::Error for SlotError {}

/// A slot without its sequence word, as the ring moves it: the seven
/// little-endian words at slot bytes `4..32`.
pub type SlotBody = [u32; 7];

impl SlotRepr {
    /// Parses a slot body. Reserved bytes are ignored.
    pub fn from_body(body: &SlotBody) -> Result<Self, SlotError> {
        let [w1, chunk_id, w3, w4, ..] = *body;
        let kind = w1 as u8;
        let flags = (w1 >> 8) as u8;
        let writer_id = (w1 >> 16) as u16;
        match kind {
            KIND_CHUNK => Ok(SlotRepr::Chunk(ChunkSlot {
                writer_id,
                chunk_id,
                page: w3 as u16,
                chunk: (w3 >> 16) as u8,
                used: w4,
            })),
            KIND_PATCH => Ok(SlotRepr::Patch(PatchSlot {
                writer_id,
                chunk_id,
                has_more: flags & PATCH_HAS_MORE != 0,
                offset: w3 as u16,
                data: w4.to_le_bytes(),
            })),
            other => Err(SlotError::UnknownKind(other)),
        }
    }

    /// The slot body (reserved words zero).
    pub fn to_body(&self) -> SlotBody {
        let (w1, chunk_id, w3, w4) = match *self {
            SlotRepr::Chunk(c) => (
                u32::from(KIND_CHUNK) | u32::from(c.writer_id) << 16,
                c.chunk_id,
                u32::from(c.page) | u32::from(c.chunk) << 16,
                c.used,
            ),
            SlotRepr::Patch(p) => (
                u32::from(KIND_PATCH)
                    | u32::from(if p.has_more { PATCH_HAS_MORE } else { 0 }) << 8
                    | u32::from(p.writer_id) << 16,
                p.chunk_id,
                u32::from(p.offset),
                u32::from_le_bytes(p.data),
            ),
        };
        [w1, chunk_id, w3, w4, 0, 0, 0]
    }

    /// The 32 slot bytes with sequence word `seq`.
    pub fn to_bytes(&self, seq: u32) -> [u8; SLOT_SIZE] {
        let mut out = [0u8; SLOT_SIZE];
        let words = core::iter::once(seq).chain(self.to_body());
        for (dst, word) in out.chunks_exact_mut(4).zip(words) {
            dst.copy_from_slice(&word.to_le_bytes());
        }
        out
    }

    /// Parses 32 slot bytes: the sequence word and the record.
    pub fn from_bytes(bytes: &[u8; SLOT_SIZE]) -> (u32, Result<Self, SlotError>) {
        let mut words = [0u32; 8];
        for (w, b) in words.iter_mut().zip(bytes.chunks_exact(4)) {
            *w = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        let [seq, body @ ..] = words;
        (seq, Self::from_body(&body))
    }
}
