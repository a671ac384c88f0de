//! SMB geometry and the byte layout of page and chunk headers.
//!
//! This module is pure data: constants, page sizes, page layouts and the
//! checked byte views of the two 8-byte headers, in the style of smoltcp's
//! `wire/` layer:
//!
//! * a *view* ([`PageHeader`], [`ChunkHeader`]) wraps any `T: AsRef<[u8]>`
//!   and reads fields through a private table of byte ranges;
//! * a *repr* ([`PageHeaderRepr`], [`ChunkHeaderRepr`]) is the parsed,
//!   high-level form that can be emitted back into a view.
//!
//! # Invariants
//!
//! * All multi-byte integers are little-endian, on every target (the
//!   shared words of a big-endian core too: [`crate::sync::AtomicLeU32`]).
//! * A view built with `new_checked` holds at least 8 bytes; after that check
//!   no accessor or setter panics. A view built with `new_unchecked` is meant
//!   for emission into a buffer the caller sized itself; its accessors panic
//!   if the buffer is shorter than 8 bytes.
//! * [`PageSize`] values are always valid ABI page sizes (a multiple of 4096
//!   in `4096..=65536`), so every geometry computed from one fits in the page:
//!   chunk `j` of a layout with `n` chunks occupies
//!   `8 + j * chunk_size .. 8 + (j + 1) * chunk_size`, with
//!   `8 + n * chunk_size <= page_size`, 4-byte aligned starts, no overlaps.
//! * [`Packets`] is the raw 16-bit `packets` word: any `u16` is a valid value
//!   (10-bit count, 6-bit flags), so the count can never exceed 1023.
//! * [`ChunkFlags`] preserves the undefined flag bits 3..=5 verbatim.

use core::fmt;
use core::mem::{offset_of, size_of};

use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Size in bytes of the header at the start of every page.
pub const PAGE_HEADER_SIZE: usize = 8;
/// Size in bytes of the header at the start of every chunk (included in the
/// chunk size).
pub const CHUNK_HEADER_SIZE: usize = 8;
/// Smallest ABI page size and the granularity of every page size.
pub const MIN_PAGE_SIZE: usize = 4096;
/// Largest ABI page size (the chunk size must fit in 16 bits).
pub const MAX_PAGE_SIZE: usize = 65536;
/// Largest page size the Perfetto service accepts from a producer.
pub const SERVICE_MAX_PAGE_SIZE: usize = 32768;
/// Page size the service picks when the producer gives no hint.
pub const DEFAULT_PAGE_SIZE: usize = 4096;
/// SMB size the service picks when the producer gives no hint.
pub const DEFAULT_SMB_SIZE: usize = 256 * 1024;
/// Largest SMB size the service creates or accepts.
pub const MAX_SMB_SIZE: usize = 32 * 1024 * 1024;
/// Required alignment of the start of an SMB: 8 bytes (page and chunk
/// headers then hold naturally aligned words; an `mmap`ed SMB is
/// page-aligned anyway, and firmware storage needs no 4 KiB gap).
pub const SMB_ALIGNMENT: usize = 8;
/// Alignment of every chunk start inside a page.
pub const CHUNK_ALIGNMENT: usize = 4;
/// Most chunks a page can hold (layout [`PageLayout::Div14`]).
pub const MAX_CHUNKS_PER_PAGE: usize = 14;
/// Largest valid writer id; 0 means "no writer / header cleared".
pub const MAX_WRITER_ID: u16 = 32767;
/// Largest fragment count the 10-bit `count` field can hold.
pub const MAX_PACKET_COUNT: u16 = 0x3FF;

/// Why a page size was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageSizeError {
    /// Smaller than 4096 bytes.
    TooSmall(usize),
    /// Larger than the maximum (65536 for the ABI, 32768 for the service).
    TooLarge(usize),
    /// Not a multiple of 4096 bytes.
    NotMultipleOf4096(usize),
    /// Not a power-of-two number of 4 KiB units (service rule).
    NotPowerOfTwo(usize),
}

impl fmt::Display for PageSizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::TooSmall(s) => write!(f, "page size {s} is below the minimum of 4096 bytes"),
            Self::TooLarge(s) => write!(f, "page size {s} is above the maximum"),
            Self::NotMultipleOf4096(s) => write!(f, "page size {s} is not a multiple of 4096"),
            Self::NotPowerOfTwo(s) => {
                write!(
                    f,
                    "page size {s} is not a power-of-two number of 4 KiB units"
                )
            }
        }
    }
}

impl core::error::Error for PageSizeError {}

/// A validated SMB page size: a multiple of 4096 in `4096..=65536`.
///
/// The ABI allows every such size; the Perfetto service only accepts the
/// subset checked by [`PageSize::new_service`] (4, 8, 16 or 32 KiB).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageSize(u32);

impl PageSize {
    /// The default page size (4 KiB).
    pub const DEFAULT: PageSize = PageSize(DEFAULT_PAGE_SIZE as u32);

    /// Validates `bytes` against the ABI rules: a multiple of 4096 between
    /// 4096 and 65536 inclusive.
    pub const fn new(bytes: usize) -> Result<Self, PageSizeError> {
        if bytes < MIN_PAGE_SIZE {
            Err(PageSizeError::TooSmall(bytes))
        } else if bytes > MAX_PAGE_SIZE {
            Err(PageSizeError::TooLarge(bytes))
        } else if bytes % MIN_PAGE_SIZE != 0 {
            Err(PageSizeError::NotMultipleOf4096(bytes))
        } else {
            // `bytes <= 65536` so the cast is lossless.
            Ok(PageSize(bytes as u32))
        }
    }

    /// Validates `bytes` against the stricter rules of the Perfetto service:
    /// 4096, 8192, 16384 or 32768.
    pub const fn new_service(bytes: usize) -> Result<Self, PageSizeError> {
        match Self::new(bytes) {
            Err(e) => Err(e),
            Ok(_) if bytes > SERVICE_MAX_PAGE_SIZE => Err(PageSizeError::TooLarge(bytes)),
            Ok(_) if !(bytes / MIN_PAGE_SIZE).is_power_of_two() => {
                Err(PageSizeError::NotPowerOfTwo(bytes))
            }
            Ok(size) => Ok(size),
        }
    }

    /// The page size in bytes.
    pub const fn get(self) -> usize {
        self.0 as usize
    }

    /// Size of one chunk (including its 8-byte header) under `layout`, or
    /// `None` for layouts without chunks.
    pub const fn chunk_size(self, layout: PageLayout) -> Option<usize> {
        let n = layout.num_chunks();
        if n == 0 {
            return None;
        }
        // [`chunk_size`] for a page of at least 4096 bytes (no underflow).
        Some(((self.get() - PAGE_HEADER_SIZE) / n) & !(CHUNK_ALIGNMENT - 1))
    }

    /// Byte range of chunk `chunk` inside the page under `layout`, or `None`
    /// if the layout has no such chunk. The chunk lies inside the page,
    /// starts 4-aligned after the page header and holds at least its
    /// 8-byte header: the SMB's unchecked accesses rely on it (test:
    /// `every_chunk_lies_inside_its_page`).
    pub const fn chunk_geometry(self, layout: PageLayout, chunk: usize) -> Option<ChunkGeometry> {
        let n = layout.num_chunks();
        if chunk >= n {
            return None;
        }
        // `chunk_size`, for `n > chunk`: not 0, so no further check.
        let size = ((self.get() - PAGE_HEADER_SIZE) / n) & !(CHUNK_ALIGNMENT - 1);
        Some(ChunkGeometry {
            offset: PAGE_HEADER_SIZE + chunk * size,
            size,
        })
    }
}

impl fmt::Display for PageSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes", self.0)
    }
}

/// Where a chunk lives inside its page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkGeometry {
    /// Offset of the chunk header from the start of the page (4-aligned).
    pub offset: usize,
    /// Chunk size in bytes, including the 8-byte chunk header.
    pub size: usize,
}

impl ChunkGeometry {
    /// Bytes available for fragments after the chunk header.
    pub const fn payload_size(self) -> usize {
        self.size - CHUNK_HEADER_SIZE
    }

    /// Offset one past the last byte of the chunk, from the page start.
    pub const fn end(self) -> usize {
        self.offset + self.size
    }
}

/// Chunk size (including the header) of `layout` in a page of `page_size`
/// bytes: `align4_down((page_size - 8) / num_chunks)`. `None` for layouts
/// without chunks or a page too small to hold the page header.
pub const fn chunk_size(page_size: usize, layout: PageLayout) -> Option<usize> {
    let n = layout.num_chunks();
    if n == 0 || page_size < PAGE_HEADER_SIZE {
        return None;
    }
    Some(((page_size - PAGE_HEADER_SIZE) / n) & !(CHUNK_ALIGNMENT - 1))
}

/// How a page is divided into chunks (bits 28..=30 of the page header).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum PageLayout {
    /// The page is free and not partitioned (no chunks).
    NotPartitioned = 0,
    /// One chunk per page.
    Div1 = 1,
    /// Two chunks per page.
    Div2 = 2,
    /// Four chunks per page.
    Div4 = 3,
    /// Seven chunks per page.
    Div7 = 4,
    /// Fourteen chunks per page.
    Div14 = 5,
    /// Reserved value 6 (no chunks).
    Reserved1 = 6,
    /// Reserved value 7 (no chunks).
    Reserved2 = 7,
}

impl PageLayout {
    /// The five layouts a producer may partition a page with, in order.
    pub const PARTITIONED: [PageLayout; 5] = [
        PageLayout::Div1,
        PageLayout::Div2,
        PageLayout::Div4,
        PageLayout::Div7,
        PageLayout::Div14,
    ];

    /// Decodes the 3-bit layout value (higher bits are ignored).
    pub const fn from_bits(bits: u32) -> Self {
        match bits & 0x7 {
            0 => Self::NotPartitioned,
            1 => Self::Div1,
            2 => Self::Div2,
            3 => Self::Div4,
            4 => Self::Div7,
            5 => Self::Div14,
            6 => Self::Reserved1,
            _ => Self::Reserved2,
        }
    }

    /// The 3-bit value stored in the page header.
    pub const fn bits(self) -> u32 {
        self as u32
    }

    /// Number of chunks in a page with this layout (0 for
    /// [`NotPartitioned`](Self::NotPartitioned) and the reserved values).
    pub const fn num_chunks(self) -> usize {
        // A table (by the 3-bit value) rather than a match: one load.
        const CHUNKS: [u8; 8] = [0, 1, 2, 4, 7, 14, 0, 0];
        CHUNKS[self as usize & 7] as usize
    }

    /// Whether a producer may partition a page with this layout
    /// (`Div1..=Div14`).
    pub const fn is_partition_layout(self) -> bool {
        self.num_chunks() != 0
    }
}

/// The little-endian page header as it sits in memory (zerocopy form).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct PageHeaderWire {
    /// Layout + chunk states (see [`crate::state`]).
    pub header_bitmap: U32,
    /// Unused by the ABI; kept verbatim.
    pub reserved: U32,
}

/// The little-endian chunk header as it sits in memory (zerocopy form).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct ChunkHeaderWire {
    /// Per-writer chunk sequence number.
    pub chunk_id: U32,
    /// Producer-local writer id (1..=32767; 0 = cleared).
    pub writer_id: U16,
    /// Fragment count (bits 0..=9) and flags (bits 10..=15).
    pub packets: U16,
}

const _: () = assert!(size_of::<PageHeaderWire>() == PAGE_HEADER_SIZE);
const _: () = assert!(size_of::<ChunkHeaderWire>() == CHUNK_HEADER_SIZE);

/// Byte offset of `header_bitmap` in the page header.
pub const HEADER_BITMAP_OFFSET: usize = offset_of!(PageHeaderWire, header_bitmap);
/// Byte offset of `chunk_id` in the chunk header.
pub const CHUNK_ID_OFFSET: usize = offset_of!(ChunkHeaderWire, chunk_id);
/// Byte offset of `writer_id` in the chunk header.
pub const WRITER_ID_OFFSET: usize = offset_of!(ChunkHeaderWire, writer_id);
/// Byte offset of `packets` in the chunk header.
pub const PACKETS_OFFSET: usize = offset_of!(ChunkHeaderWire, packets);

// The atomic words overlaid on these fields need natural alignment relative to
// a 4-aligned chunk start.
const _: () = assert!(CHUNK_ID_OFFSET % 4 == 0 && HEADER_BITMAP_OFFSET % 4 == 0);
const _: () = assert!(WRITER_ID_OFFSET % 2 == 0 && PACKETS_OFFSET % 2 == 0);

mod field {
    use core::ops::Range;

    pub type Field = Range<usize>;

    pub const HEADER_BITMAP: Field = super::HEADER_BITMAP_OFFSET..super::HEADER_BITMAP_OFFSET + 4;
    pub const RESERVED: Field = 4..8;

    pub const CHUNK_ID: Field = super::CHUNK_ID_OFFSET..super::CHUNK_ID_OFFSET + 4;
    pub const WRITER_ID: Field = super::WRITER_ID_OFFSET..super::WRITER_ID_OFFSET + 2;
    pub const PACKETS: Field = super::PACKETS_OFFSET..super::PACKETS_OFFSET + 2;
}

/// A buffer was too short to hold the header it was viewed as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Truncated {
    /// Bytes required.
    pub needed: usize,
    /// Bytes available.
    pub got: usize,
}

impl fmt::Display for Truncated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "header needs {} bytes, buffer has {}",
            self.needed, self.got
        )
    }
}

impl core::error::Error for Truncated {}

fn read_u32(data: &[u8], field: field::Field) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&data[field]);
    u32::from_le_bytes(b)
}

fn read_u16(data: &[u8], field: field::Field) -> u16 {
    let mut b = [0u8; 2];
    b.copy_from_slice(&data[field]);
    u16::from_le_bytes(b)
}

/// Checked view of an 8-byte page header over `T`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> PageHeader<T> {
    /// Wraps `buffer` without checking its length (for emission into a
    /// buffer of known size). Accessors panic if it is shorter than 8 bytes.
    pub const fn new_unchecked(buffer: T) -> Self {
        PageHeader { buffer }
    }

    /// Wraps `buffer` after checking it holds at least 8 bytes.
    pub fn new_checked(buffer: T) -> Result<Self, Truncated> {
        let view = Self::new_unchecked(buffer);
        view.check_len()?;
        Ok(view)
    }

    /// Checks the buffer holds at least 8 bytes.
    pub fn check_len(&self) -> Result<(), Truncated> {
        let got = self.buffer.as_ref().len();
        if got < PAGE_HEADER_SIZE {
            return Err(Truncated {
                needed: PAGE_HEADER_SIZE,
                got,
            });
        }
        Ok(())
    }

    /// Returns the wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The raw `header_bitmap` word.
    pub fn header_bitmap(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::HEADER_BITMAP)
    }

    /// The layout encoded in the bitmap.
    pub fn layout(&self) -> PageLayout {
        crate::state::layout(self.header_bitmap())
    }

    /// The reserved word (unused by the ABI).
    pub fn reserved(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::RESERVED)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> PageHeader<T> {
    /// Sets the raw `header_bitmap` word.
    pub fn set_header_bitmap(&mut self, value: u32) {
        self.buffer.as_mut()[field::HEADER_BITMAP].copy_from_slice(&value.to_le_bytes());
    }

    /// Sets the reserved word.
    pub fn set_reserved(&mut self, value: u32) {
        self.buffer.as_mut()[field::RESERVED].copy_from_slice(&value.to_le_bytes());
    }
}

/// Parsed page header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PageHeaderRepr {
    /// Layout + per-chunk states; decode with the functions in
    /// [`crate::state`].
    pub header_bitmap: u32,
    /// The reserved word, preserved verbatim.
    pub reserved: u32,
}

impl PageHeaderRepr {
    /// Parses a checked view.
    pub fn parse<T: AsRef<[u8]>>(view: &PageHeader<T>) -> Self {
        PageHeaderRepr {
            header_bitmap: view.header_bitmap(),
            reserved: view.reserved(),
        }
    }

    /// Writes this header into `view`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, view: &mut PageHeader<T>) {
        view.set_header_bitmap(self.header_bitmap);
        view.set_reserved(self.reserved);
    }

    /// The 8 little-endian bytes of this header.
    pub fn to_bytes(&self) -> [u8; PAGE_HEADER_SIZE] {
        zerocopy::transmute!(PageHeaderWire {
            header_bitmap: U32::new(self.header_bitmap),
            reserved: U32::new(self.reserved),
        })
    }

    /// Parses 8 little-endian bytes.
    pub fn from_bytes(bytes: [u8; PAGE_HEADER_SIZE]) -> Self {
        let wire: PageHeaderWire = zerocopy::transmute!(bytes);
        PageHeaderRepr {
            header_bitmap: wire.header_bitmap.get(),
            reserved: wire.reserved.get(),
        }
    }
}

/// The 6-bit flags field of a chunk header.
///
/// Only bits 0..=2 have a meaning; bits 3..=5 are kept verbatim so a copy of
/// a chunk never loses what the producer wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ChunkFlags(u8);

impl ChunkFlags {
    /// No flags.
    pub const EMPTY: ChunkFlags = ChunkFlags(0);
    /// `0x1`: the first fragment continues a packet from the writer's
    /// previous chunk.
    pub const FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK: ChunkFlags = ChunkFlags(0x1);
    /// `0x2`: the last fragment continues on the writer's next chunk.
    pub const LAST_PACKET_CONTINUES_ON_NEXT_CHUNK: ChunkFlags = ChunkFlags(0x2);
    /// `0x4`: the last packet has length fields that out-of-band patches will
    /// fill in; do not parse past it until patched.
    pub const CHUNK_NEEDS_PATCHING: ChunkFlags = ChunkFlags(0x4);
    /// Mask of the three defined bits.
    pub const DEFINED: ChunkFlags = ChunkFlags(0x7);
    /// Mask of all six bits of the field.
    pub const ALL: ChunkFlags = ChunkFlags(0x3F);

    /// Builds flags from raw bits, keeping undefined bits 3..=5 and dropping
    /// anything above bit 5 (which does not exist in the header).
    pub const fn from_bits_retain(bits: u8) -> Self {
        ChunkFlags(bits & Self::ALL.0)
    }

    /// The raw 6-bit value.
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Whether every bit of `other` is set in `self`.
    pub const fn contains(self, other: ChunkFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether no bit is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Bits set in either.
    pub const fn union(self, other: ChunkFlags) -> Self {
        ChunkFlags(self.0 | other.0)
    }

    /// Bits of `self` not set in `other`.
    pub const fn difference(self, other: ChunkFlags) -> Self {
        ChunkFlags(self.0 & !other.0)
    }
}

impl core::ops::BitOr for ChunkFlags {
    type Output = ChunkFlags;
    fn bitor(self, rhs: ChunkFlags) -> ChunkFlags {
        self.union(rhs)
    }
}

/// The 16-bit `packets` word of a chunk header: fragment count in bits 0..=9,
/// flags in bits 10..=15. Every `u16` is a valid value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Packets(u16);

impl Packets {
    /// Count 0, no flags.
    pub const EMPTY: Packets = Packets(0);
    const COUNT_MASK: u16 = MAX_PACKET_COUNT;
    const FLAGS_SHIFT: u32 = 10;

    /// Packs `count` and `flags`; `None` if `count > 1023`.
    pub const fn new(count: u16, flags: ChunkFlags) -> Option<Self> {
        if count > MAX_PACKET_COUNT {
            return None;
        }
        Some(Packets(
            count | ((flags.bits() as u16) << Self::FLAGS_SHIFT),
        ))
    }

    /// Packs `count` (its low 10 bits) and `flags`, for a writer that keeps
    /// its count below 1024 by construction.
    #[inline(always)]
    pub const fn masked(count: u16, flags: ChunkFlags) -> Self {
        Packets((count & Self::COUNT_MASK) | ((flags.bits() as u16) << Self::FLAGS_SHIFT))
    }

    /// Reinterprets a raw word (as loaded from shared memory).
    pub const fn from_bits(bits: u16) -> Self {
        Packets(bits)
    }

    /// The raw word.
    pub const fn bits(self) -> u16 {
        self.0
    }

    /// Number of fragments (0..=1023).
    pub const fn count(self) -> u16 {
        self.0 & Self::COUNT_MASK
    }

    /// The flags.
    pub const fn flags(self) -> ChunkFlags {
        ChunkFlags::from_bits_retain((self.0 >> Self::FLAGS_SHIFT) as u8)
    }

    /// Same flags, new count; `None` if `count > 1023`.
    pub const fn with_count(self, count: u16) -> Option<Self> {
        Self::new(count, self.flags())
    }

    /// Same count, new flags.
    pub const fn with_flags(self, flags: ChunkFlags) -> Self {
        Packets((self.0 & Self::COUNT_MASK) | ((flags.bits() as u16) << Self::FLAGS_SHIFT))
    }
}

/// Checked view of an 8-byte chunk header over `T` (the chunk's payload, if
/// present, follows at offset 8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ChunkHeader<T> {
    /// Wraps `buffer` without checking its length (for emission into a
    /// buffer of known size). Accessors panic if it is shorter than 8 bytes.
    pub const fn new_unchecked(buffer: T) -> Self {
        ChunkHeader { buffer }
    }

    /// Wraps `buffer` after checking it holds at least 8 bytes.
    pub fn new_checked(buffer: T) -> Result<Self, Truncated> {
        let view = Self::new_unchecked(buffer);
        view.check_len()?;
        Ok(view)
    }

    /// Checks the buffer holds at least 8 bytes.
    pub fn check_len(&self) -> Result<(), Truncated> {
        let got = self.buffer.as_ref().len();
        if got < CHUNK_HEADER_SIZE {
            return Err(Truncated {
                needed: CHUNK_HEADER_SIZE,
                got,
            });
        }
        Ok(())
    }

    /// Returns the wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The `chunk_id` field.
    pub fn chunk_id(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::CHUNK_ID)
    }

    /// The `writer_id` field.
    pub fn writer_id(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::WRITER_ID)
    }

    /// The `packets` word.
    pub fn packets(&self) -> Packets {
        Packets::from_bits(read_u16(self.buffer.as_ref(), field::PACKETS))
    }

    /// Bytes after the header (the fragments, if the buffer holds a whole
    /// chunk).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[CHUNK_HEADER_SIZE..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ChunkHeader<T> {
    /// Sets `chunk_id`.
    pub fn set_chunk_id(&mut self, value: u32) {
        self.buffer.as_mut()[field::CHUNK_ID].copy_from_slice(&value.to_le_bytes());
    }

    /// Sets `writer_id`.
    pub fn set_writer_id(&mut self, value: u16) {
        self.buffer.as_mut()[field::WRITER_ID].copy_from_slice(&value.to_le_bytes());
    }

    /// Sets the `packets` word.
    pub fn set_packets(&mut self, value: Packets) {
        self.buffer.as_mut()[field::PACKETS].copy_from_slice(&value.bits().to_le_bytes());
    }

    /// Mutable bytes after the header.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[CHUNK_HEADER_SIZE..]
    }
}

/// Why a chunk header copied from an untrusted peer was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkHeaderError {
    /// `writer_id` is 0: the header was never initialized or was cleared.
    WriterIdZero,
    /// `writer_id` is above 32767.
    WriterIdTooLarge(u16),
}

impl fmt::Display for ChunkHeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::WriterIdZero => f.write_str("chunk header has writer id 0 (not initialized)"),
            Self::WriterIdTooLarge(id) => write!(f, "chunk header writer id {id} exceeds 32767"),
        }
    }
}

impl core::error::Error for ChunkHeaderError {}

/// Parsed chunk header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ChunkHeaderRepr {
    /// Per-writer chunk sequence number (wraps at 2^32).
    pub chunk_id: u32,
    /// Producer-local writer id; valid ids are 1..=32767.
    pub writer_id: u16,
    /// Fragment count and flags.
    pub packets: Packets,
}

impl ChunkHeaderRepr {
    /// Parses a checked view. Never fails: every bit pattern is a header;
    /// use [`validate`](Self::validate) for the service's sanity rules.
    pub fn parse<T: AsRef<[u8]>>(view: &ChunkHeader<T>) -> Self {
        ChunkHeaderRepr {
            chunk_id: view.chunk_id(),
            writer_id: view.writer_id(),
            packets: view.packets(),
        }
    }

    /// Writes this header into `view`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, view: &mut ChunkHeader<T>) {
        view.set_chunk_id(self.chunk_id);
        view.set_writer_id(self.writer_id);
        view.set_packets(self.packets);
    }

    /// The 8 little-endian bytes of this header.
    pub fn to_bytes(&self) -> [u8; CHUNK_HEADER_SIZE] {
        zerocopy::transmute!(ChunkHeaderWire {
            chunk_id: U32::new(self.chunk_id),
            writer_id: U16::new(self.writer_id),
            packets: U16::new(self.packets.bits()),
        })
    }

    /// Parses 8 little-endian bytes.
    pub fn from_bytes(bytes: [u8; CHUNK_HEADER_SIZE]) -> Self {
        let wire: ChunkHeaderWire = zerocopy::transmute!(bytes);
        ChunkHeaderRepr {
            chunk_id: wire.chunk_id.get(),
            writer_id: wire.writer_id.get(),
            packets: Packets::from_bits(wire.packets.get()),
        }
    }

    /// Checks the rules the service applies to a header copied from a
    /// producer: `writer_id` in `1..=32767` (the count is at most 1023 by
    /// construction).
    pub const fn validate(&self) -> Result<(), ChunkHeaderError> {
        if self.writer_id == 0 {
            Err(ChunkHeaderError::WriterIdZero)
        } else if self.writer_id > MAX_WRITER_ID {
            Err(ChunkHeaderError::WriterIdTooLarge(self.writer_id))
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static GOLDEN_HEADER: [u8; 8] = [0x44, 0x33, 0x22, 0x11, 0x66, 0x55, 0x05, 0x1c];

    fn golden_repr() -> ChunkHeaderRepr {
        ChunkHeaderRepr {
            chunk_id: 0x1122_3344,
            writer_id: 0x5566,
            packets: Packets::new(5, ChunkFlags::from_bits_retain(7)).unwrap(),
        }
    }

    #[test]
    fn test_deconstruct_golden_chunk_header() {
        let view = ChunkHeader::new_checked(&GOLDEN_HEADER[..]).unwrap();
        assert_eq!(view.chunk_id(), 0x1122_3344);
        assert_eq!(view.writer_id(), 0x5566);
        assert_eq!(view.packets().count(), 5);
        assert_eq!(view.packets().flags().bits(), 7);
        assert_eq!(ChunkHeaderRepr::parse(&view), golden_repr());
        assert_eq!(ChunkHeaderRepr::from_bytes(GOLDEN_HEADER), golden_repr());
    }

    #[test]
    fn test_emit_golden_chunk_header() {
        let mut buf = [0xAAu8; 8];
        golden_repr().emit(&mut ChunkHeader::new_unchecked(&mut buf[..]));
        assert_eq!(buf, GOLDEN_HEADER);
        assert_eq!(golden_repr().to_bytes(), GOLDEN_HEADER);
    }

    #[test]
    fn test_impossible_len() {
        assert_eq!(
            ChunkHeader::new_checked(&[0u8; 7][..]),
            Err(Truncated { needed: 8, got: 7 })
        );
        assert_eq!(
            PageHeader::new_checked(&[0u8; 3][..]),
            Err(Truncated { needed: 8, got: 3 })
        );
        assert!(ChunkHeader::new_checked(&[0u8; 8][..]).is_ok());
    }

    #[test]
    fn appendix_b_page_bytes() {
        // Page 0 of Appendix B: Div1, chunk 0 Complete, writer 1, chunk id 0,
        // two compacted fragments.
        let page: [u8; 22] = [
            0x03, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, // page header
            0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x02, 0x00, // chunk header
            0x02, 0x40, 0x64, 0x02, 0x40, 0x65, // fragments
        ];
        let ph = PageHeader::new_checked(&page[..]).unwrap();
        assert_eq!(ph.header_bitmap(), (1 << 28) | 3);
        assert_eq!(ph.layout(), PageLayout::Div1);
        let ch = ChunkHeader::new_checked(&page[8..]).unwrap();
        let repr = ChunkHeaderRepr::parse(&ch);
        assert_eq!(repr.chunk_id, 0);
        assert_eq!(repr.writer_id, 1);
        assert_eq!(repr.packets, Packets::new(2, ChunkFlags::EMPTY).unwrap());
        assert_eq!(ch.payload(), &[0x02, 0x40, 0x64, 0x02, 0x40, 0x65]);

        let mut emitted = [0u8; 8];
        PageHeaderRepr {
            header_bitmap: 0x1000_0003,
            reserved: 0,
        }
        .emit(&mut PageHeader::new_unchecked(&mut emitted[..]));
        assert_eq!(&emitted, &page[..8]);
        assert_eq!(
            PageHeaderRepr::from_bytes(emitted).header_bitmap,
            0x1000_0003
        );
    }

    #[test]
    fn appendix_b_packets_words() {
        let cont =
            ChunkFlags::LAST_PACKET_CONTINUES_ON_NEXT_CHUNK | ChunkFlags::CHUNK_NEEDS_PATCHING;
        assert_eq!(
            Packets::new(3, cont).unwrap().bits().to_le_bytes(),
            [0x03, 0x18]
        );
        let first = ChunkFlags::FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK;
        assert_eq!(
            Packets::new(1, first).unwrap().bits().to_le_bytes(),
            [0x01, 0x04]
        );
        let both = first | ChunkFlags::LAST_PACKET_CONTINUES_ON_NEXT_CHUNK;
        assert_eq!(
            Packets::new(1, both).unwrap().bits().to_le_bytes(),
            [0x01, 0x0c]
        );
    }

    #[test]
    fn packets_bounds_and_undefined_flags() {
        assert_eq!(Packets::new(1024, ChunkFlags::EMPTY), None);
        let p = Packets::new(1023, ChunkFlags::ALL).unwrap();
        assert_eq!(p.bits(), 0xFFFF);
        assert_eq!(Packets::from_bits(0xFFFF).count(), 1023);
        // Undefined bits 3..=5 survive a parse/emit round trip.
        let odd = ChunkFlags::from_bits_retain(0x28);
        let p = Packets::new(9, odd).unwrap();
        assert_eq!(p.flags().bits(), 0x28);
        assert_eq!(p.with_count(10).unwrap().flags(), odd);
        assert_eq!(p.with_flags(ChunkFlags::EMPTY).count(), 9);
        assert_eq!(ChunkFlags::from_bits_retain(0xC1).bits(), 0x01);
    }

    #[test]
    fn header_validation() {
        let mut h = golden_repr();
        h.writer_id = 0;
        assert_eq!(h.validate(), Err(ChunkHeaderError::WriterIdZero));
        h.writer_id = 32768;
        assert_eq!(h.validate(), Err(ChunkHeaderError::WriterIdTooLarge(32768)));
        h.writer_id = 32767;
        assert_eq!(h.validate(), Ok(()));
        h.writer_id = 1;
        assert_eq!(h.validate(), Ok(()));
    }

    #[test]
    fn page_size_validators() {
        for kib in [4usize, 8, 12, 16, 20, 32, 60, 64] {
            assert_eq!(PageSize::new(kib * 1024).unwrap().get(), kib * 1024);
        }
        assert_eq!(PageSize::new(0), Err(PageSizeError::TooSmall(0)));
        assert_eq!(PageSize::new(2048), Err(PageSizeError::TooSmall(2048)));
        assert_eq!(
            PageSize::new(4097),
            Err(PageSizeError::NotMultipleOf4096(4097))
        );
        assert_eq!(PageSize::new(69632), Err(PageSizeError::TooLarge(69632)));
        for kib in [4usize, 8, 16, 32] {
            assert!(PageSize::new_service(kib * 1024).is_ok());
        }
        assert_eq!(
            PageSize::new_service(12288),
            Err(PageSizeError::NotPowerOfTwo(12288))
        );
        assert_eq!(
            PageSize::new_service(65536),
            Err(PageSizeError::TooLarge(65536))
        );
        assert_eq!(
            PageSize::new_service(4095),
            Err(PageSizeError::TooSmall(4095))
        );
        assert_eq!(
            PageSize::new_service(40000),
            Err(PageSizeError::NotMultipleOf4096(40000))
        );
    }

    #[test]
    fn chunk_size_table_matches_upstream() {
        // Upstream's chunk sizes (`SharedMemoryABI`'s layouts,
        // include/perfetto/ext/tracing/core/shared_memory_abi.h): page size,
        // Div1, Div2, Div4, Div7, Div14.
        let table: [(usize, [usize; 5]); 5] = [
            (4096, [4088, 2044, 1020, 584, 292]),
            (8192, [8184, 4092, 2044, 1168, 584]),
            (16384, [16376, 8188, 4092, 2336, 1168]),
            (32768, [32760, 16380, 8188, 4680, 2340]),
            (65536, [65528, 32764, 16380, 9360, 4680]),
        ];
        for (page, sizes) in table {
            let ps = PageSize::new(page).unwrap();
            for (layout, size) in PageLayout::PARTITIONED.iter().zip(sizes) {
                assert_eq!(ps.chunk_size(*layout), Some(size), "page {page} {layout:?}");
            }
            assert_eq!(ps.chunk_size(PageLayout::NotPartitioned), None);
            assert_eq!(ps.chunk_size(PageLayout::Reserved1), None);
            assert_eq!(ps.chunk_size(PageLayout::Reserved2), None);
        }
    }

    #[test]
    fn layout_bits_round_trip() {
        for bits in 0..8u32 {
            let l = PageLayout::from_bits(bits);
            assert_eq!(l.bits(), bits);
            assert_eq!(l.is_partition_layout(), (1..=5).contains(&bits));
        }
        assert_eq!(PageLayout::from_bits(0xF9), PageLayout::Div1);
        let nums: [usize; 8] = [0, 1, 2, 4, 7, 14, 0, 0];
        for (bits, n) in nums.iter().enumerate() {
            assert_eq!(PageLayout::from_bits(bits as u32).num_chunks(), *n);
        }
    }

    #[test]
    fn chunk_geometry_edges() {
        let ps = PageSize::new(4096).unwrap();
        let g = ps.chunk_geometry(PageLayout::Div14, 13).unwrap();
        assert_eq!(
            g,
            ChunkGeometry {
                offset: 8 + 13 * 292,
                size: 292
            }
        );
        assert_eq!(g.payload_size(), 284);
        assert!(g.end() <= 4096);
        assert_eq!(ps.chunk_geometry(PageLayout::Div14, 14), None);
        assert_eq!(ps.chunk_geometry(PageLayout::NotPartitioned, 0), None);
    }

    /// What the SMB's unchecked accesses rely on, for every page size,
    /// layout value and chunk index: a chunk lies inside its page after the
    /// page header, starts 4-aligned, holds its header and a payload whose
    /// length fits 16 bits; chunks do not overlap; and `PageSize::chunk_size`
    /// agrees with the free `chunk_size`.
    #[test]
    fn every_chunk_lies_inside_its_page() {
        for bytes in (MIN_PAGE_SIZE..=MAX_PAGE_SIZE).step_by(MIN_PAGE_SIZE) {
            let ps = PageSize::new(bytes).unwrap();
            for bits in 0..8 {
                let layout = PageLayout::from_bits(bits);
                let n = layout.num_chunks();
                assert_eq!(ps.chunk_size(layout), chunk_size(bytes, layout));
                let mut end = PAGE_HEADER_SIZE;
                for chunk in 0..MAX_CHUNKS_PER_PAGE + 2 {
                    let Some(g) = ps.chunk_geometry(layout, chunk) else {
                        assert!(chunk >= n, "{bytes} {layout:?} {chunk}");
                        continue;
                    };
                    assert!(chunk < n);
                    assert!(g.offset >= end && g.offset % CHUNK_ALIGNMENT == 0);
                    assert!(g.size >= CHUNK_HEADER_SIZE);
                    assert!(g.payload_size() <= usize::from(u16::MAX));
                    assert!(g.end() <= bytes);
                    end = g.end();
                }
            }
        }
    }
}
