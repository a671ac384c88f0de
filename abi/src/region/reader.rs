//! The consumer side: reads a region it does not trust.
//!
//! # Invariants
//!
//! * The header is only used after a copy of it validated
//!   ([`HeaderRepr::parse`]) under the magic/boot-id check described in the
//!   [module docs](super); ring and SMB geometry come from that copy, never
//!   from live memory.
//! * One [`RegionReader::poll`] inspects at most `ring_slots` ring slots
//!   and at most every chunk of the SMB once, copies at most one chunk,
//!   and never waits: whatever the firmware writes, a poll ends.
//! * Chunks are copied under the chunk state machine (`Complete →
//!   BeingRead`, copy, `→ Free`) and their headers validated from the copy;
//!   a slot's `used` length is trusted only when the copied header is the
//!   one the slot announced, and is capped at the chunk size.
//! * Every record lost to bad input is counted in [`ReaderStats`].

use core::ptr::NonNull;
use core::sync::atomic::Ordering::{Acquire, Relaxed};

use crate::layout::{ChunkHeaderRepr, CHUNK_HEADER_SIZE, MAX_CHUNKS_PER_PAGE};
use crate::smb::{ChunkLocation, Smb, SmbError};
use crate::state::ChunkState;
use crate::sync::AtomicWord32;

use super::control::{Control, Counters};
use super::raw::Mem;
use super::ring::{self, Peek};
use super::storage::RegionHandles;
use super::wire::{offset, HeaderError, HeaderRepr, PatchSlot, SlotRepr, HEADER_SIZE, MAGIC_WORDS};

/// A record the reader hands over.
#[derive(Debug)]
pub enum Record<'b> {
    /// A chunk moved out of the SMB.
    Chunk(ChunkRecord<'b>),
    /// A patch for a chunk moved earlier (or, if its chunk was lost, for
    /// nothing: the host counts it).
    Patch(PatchSlot),
    /// The firmware (re)initialized the region: a new boot (or the first
    /// one the reader sees after the header was invalid). Writer sequences
    /// of the old boot are over; chunks of the new one follow.
    Reset(HeaderRepr),
}

/// A chunk copied out of the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRecord<'b> {
    /// Where it was.
    pub location: ChunkLocation,
    /// Its header, validated from the copy.
    pub header: ChunkHeaderRepr,
    /// The copy: the 8-byte header, then the payload (the bytes in use, if
    /// the ring slot said how many; else the whole payload).
    pub bytes: &'b [u8],
    /// `true` if a ring slot announced it; `false` if the reader found it
    /// `Complete` in the SMB after a ring overflow.
    pub announced: bool,
}

/// Why a poll (or attaching) failed. Nothing was consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReaderError {
    /// The header is invalid: not initialized yet, being reinitialized
    /// (`BadMagic`), or wrong. Poll again later; once it is valid again
    /// the reader reports a [`Record::Reset`].
    Header(HeaderError),
    /// The firmware drains the ring itself (stream mode): a host must not.
    StreamMode,
    /// The buffer cannot hold the largest chunk of this region.
    BufferTooSmall {
        /// Bytes needed (page size - 8).
        needed: usize,
        /// Bytes given.
        got: usize,
    },
    /// The SMB part could not be viewed (a pointer not 8-aligned).
    Smb(SmbError),
}

impl core::fmt::Display for ReaderError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Header(e) => write!(f, "region header: {e}"),
            Self::StreamMode => f.write_str("the firmware consumes this region's ring itself"),
            Self::BufferTooSmall { needed, got } => {
                write!(f, "chunk buffer holds {got} bytes, a chunk needs {needed}")
            }
            Self::Smb(e) => write!(f, "region SMB: {e}"),
        }
    }
}

impl core::error::Error for ReaderError {}

/// Counters of a [`RegionReader`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReaderStats {
    /// Chunks handed over.
    pub chunks: u64,
    /// Of those, found by an SMB scan rather than announced.
    pub chunks_scanned: u64,
    /// Patches handed over.
    pub patches: u64,
    /// Ring slots with a sequence word or kind no correct firmware writes
    /// (each a lost record).
    pub bad_slots: u64,
    /// CHUNK slots whose chunk was not `Complete` (taken by a scan already,
    /// or a bogus location).
    pub stale_commits: u64,
    /// Chunks dropped because their copied header was invalid.
    pub invalid_chunks: u64,
    /// Chunks whose `BeingRead → Free` failed (a peer broke the page).
    pub release_failures: u64,
    /// Increase of the firmware's `ring_overflows` the reader has seen.
    pub ring_overflows: u64,
    /// Resets reported.
    pub resets: u64,
}

#[derive(Debug)]
struct Live<'m> {
    header: HeaderRepr,
    control: Control<'m>,
    smb: Smb<'m>,
    tail: u32,
    /// The `ring_tail` word as this reader last stored it (or found it at
    /// attach). Only the consumer writes it, so finding another value
    /// means the firmware initialized the region again: a reset, even when
    /// its `boot_id` is the old one (RAM that a reset zeroes, such as a
    /// QEMU ELF segment, keeps no `boot_id` to count from).
    published_tail: u32,
    overflows: u32,
    /// Next (page, chunk) an SMB scan looks at, if one is due.
    scan: Option<(usize, usize)>,
}

/// Reads a region: validates its header, takes ring records in order, finds
/// chunks the ring could not announce, and notices firmware resets. See the
/// [module docs](super) for the protocol.
///
/// ```
/// use shmtrace_abi::layout::PageLayout;
/// use shmtrace_abi::region::{Record, RegionArbiter, RegionConfig, RegionReader, RegionStorage};
/// use shmtrace_abi::writer::TraceWriter;
///
/// let mut storage = Box::new(RegionStorage::<8192, 16>::new());
/// let handles = storage.init(&RegionConfig::new("fw.track_event")).unwrap();
/// let mut writer: TraceWriter<_> =
///     TraceWriter::new(RegionArbiter::new(&handles, PageLayout::Div4).unwrap(), 1, 0).unwrap();
/// let _ = writer.write_packet(|p| p.uint64(8, 100));
/// writer.flush();
///
/// let mut reader = RegionReader::attach(&handles).unwrap();
/// assert_eq!(reader.header().unwrap().data_source.as_str(), "fw.track_event");
/// let mut buf = vec![0u8; reader.chunk_buffer_len()];
/// let Ok(Some(Record::Chunk(chunk))) = reader.poll(&mut buf) else { panic!() };
/// assert_eq!((chunk.header.writer_id, chunk.header.chunk_id), (1, 0));
/// assert!(matches!(reader.poll(&mut buf), Ok(None)));
/// ```
#[derive(Debug)]
pub struct RegionReader<'m> {
    mem: Mem<'m>,
    live: Option<Live<'m>>,
    /// A header was valid once: the next valid one is a reset.
    seen: bool,
    allow_stream_mode: bool,
    stats: ReaderStats,
}

impl<'m> RegionReader<'m> {
    /// A reader over a region mapped at `ptr` (`len` bytes), e.g. a file
    /// shared with an emulator, a UIO device or a RAM dump. Fails if the
    /// header is not valid yet (retry later) or the region is in stream
    /// mode.
    ///
    /// # Safety
    ///
    /// * `ptr` must be valid for reads and writes of `len` bytes for all of
    ///   `'m` (e.g. a `MAP_SHARED` mapping unmapped only after `'m`), and no
    ///   Rust reference to those bytes may exist during `'m`.
    /// * Other processes, cores or probes may change the memory at any
    ///   time: they are the untrusted peer. Within this process it must be
    ///   accessed only through region and `Smb` values, and no `Smb` over
    ///   it may be scraped while the reader lives (the reader moves chunks
    ///   through the state machine only).
    #[allow(unsafe_code)]
    pub unsafe fn from_raw_parts(ptr: *mut u8, len: usize) -> Result<Self, ReaderError> {
        let base = NonNull::new(ptr).ok_or(ReaderError::Smb(SmbError::NullPointer))?;
        // SAFETY: this function's contract is `Mem::new`'s.
        let mem = unsafe { Mem::new(base, len) };
        Self::with_mem(mem, false)
    }

    /// A reader of a region this program initialized (firmware draining
    /// its own ring in stream mode, or tests). Run one reader per region.
    pub fn attach(handles: &RegionHandles<'m>) -> Result<Self, ReaderError> {
        Self::with_mem(handles.mem, true)
    }

    fn with_mem(mem: Mem<'m>, allow_stream_mode: bool) -> Result<Self, ReaderError> {
        let mut reader = RegionReader {
            mem,
            live: None,
            seen: false,
            allow_stream_mode,
            stats: ReaderStats::default(),
        };
        reader.revalidate()?;
        Ok(reader)
    }

    /// The header last validated. (Before the first valid header, which
    /// `from_raw_parts`/`attach` require, there is none; after a reset, the
    /// new one.)
    pub fn header(&self) -> Option<&HeaderRepr> {
        self.live.as_ref().map(|l| &l.header)
    }

    /// The region's control words (`None` while the header is invalid).
    pub fn control(&self) -> Option<Control<'m>> {
        self.live.as_ref().map(|l| l.control)
    }

    /// The firmware's counters (`None` while the header is invalid).
    pub fn counters(&self) -> Option<Counters> {
        self.live.as_ref().map(|l| l.control.counters())
    }

    /// The reader's counters.
    pub fn stats(&self) -> ReaderStats {
        self.stats
    }

    /// Bytes [`poll`](Self::poll)'s buffer needs: the largest chunk of the
    /// region (page size - 8).
    pub fn chunk_buffer_len(&self) -> usize {
        self.live
            .as_ref()
            .map_or(0, |l| l.header.smb.page_size.get() - CHUNK_HEADER_SIZE)
    }

    /// Copies the header under the magic / boot-id check.
    fn load_header(&self) -> Result<HeaderRepr, HeaderError> {
        let word = |at: usize| self.mem.word(at);
        let (Some(magic), Some(boot)) = (word(offset::MAGIC), word(offset::BOOT_ID)) else {
            return Err(HeaderError::Truncated(super::wire::Truncated {
                needed: HEADER_SIZE,
                got: self.mem.len(),
            }));
        };
        let boot_before = boot.load(Acquire);
        let magic_before = magic.load(Acquire);
        let mut bytes = [0u8; HEADER_SIZE];
        for (i, b) in bytes.chunks_exact_mut(4).enumerate() {
            let value = word(4 * i).map_or(0, |w| w.load(Relaxed));
            b.copy_from_slice(&value.to_le_bytes());
        }
        core::sync::atomic::fence(Acquire);
        let header = HeaderRepr::parse(&bytes, self.mem.len())?;
        let stable = magic_before == MAGIC_WORDS[0]
            && magic.load(Relaxed) == magic_before
            && boot.load(Relaxed) == boot_before
            && header.boot_id == boot_before;
        if !stable {
            // Changed under us: report it as the reinitialization it is.
            return Err(HeaderError::BadMagic([0; 8]));
        }
        Ok(header)
    }

    fn revalidate(&mut self) -> Result<bool, ReaderError> {
        self.live = None;
        let header = self.load_header().map_err(ReaderError::Header)?;
        if header.stream_mode() && !self.allow_stream_mode {
            return Err(ReaderError::StreamMode);
        }
        let control = Control::new(self.mem, header.ring).ok_or(ReaderError::Header(
            HeaderError::Truncated(super::wire::Truncated {
                needed: HEADER_SIZE,
                got: self.mem.len(),
            }),
        ))?;
        let smb = self
            .mem
            .smb(
                header.smb.offset as usize,
                header.smb.size as usize,
                header.smb.page_size,
            )
            .ok_or(ReaderError::Smb(SmbError::Empty))?
            .map_err(ReaderError::Smb)?;
        let counters = control.counters();
        self.live = Some(Live {
            header,
            control,
            smb,
            tail: counters.ring_tail,
            published_tail: counters.ring_tail,
            overflows: 0,
            scan: None,
        });
        let reset = self.seen;
        self.seen = true;
        Ok(reset)
    }

    /// Takes the next record, if any: never blocks. `buf` must hold
    /// [`chunk_buffer_len`](Self::chunk_buffer_len) bytes; a chunk record
    /// borrows its copy from it.
    pub fn poll<'b>(&mut self, buf: &'b mut [u8]) -> Result<Option<Record<'b>>, ReaderError> {
        let current = self.live.as_ref().map(|l| l.header.boot_id);
        let (Some(magic), Some(boot)) =
            (self.mem.word(offset::MAGIC), self.mem.word(offset::BOOT_ID))
        else {
            return Err(ReaderError::Smb(SmbError::Empty));
        };
        let intact = magic.load(Acquire) == MAGIC_WORDS[0];
        let reinitialized = self
            .live
            .as_ref()
            .is_some_and(|l| l.control.counters().ring_tail != l.published_tail);
        if (!intact || reinitialized || current != Some(boot.load(Acquire))) && self.revalidate()? {
            self.stats.resets += 1;
            if let Some(live) = &self.live {
                return Ok(Some(Record::Reset(live.header)));
            }
        }
        let needed = self.chunk_buffer_len();
        if buf.len() < needed {
            return Err(ReaderError::BufferTooSmall {
                needed,
                got: buf.len(),
            });
        }
        let Some(live) = self.live.as_mut() else {
            return Ok(None);
        };
        // Ring records first; the scan an overflow calls for runs when the
        // ring is empty, or before a patch (which may be for a chunk the
        // ring never announced). A few rounds at most, so a poll always
        // ends.
        for _ in 0..3 {
            live.note_overflows(&mut self.stats);
            match live.ring_step(&mut self.stats, buf) {
                Taken::Nothing | Taken::Rescan => {}
                Taken::Patch(p) => return Ok(Some(Record::Patch(p))),
                Taken::Chunk(location, header, len) => {
                    self.stats.chunks += 1;
                    return Ok(Some(chunk_record(buf, location, header, len, true)));
                }
            }
            if live.scan.is_none() {
                return Ok(None);
            }
            if let Some((location, header, len)) = live.scan_step(&mut self.stats, buf) {
                self.stats.chunks += 1;
                self.stats.chunks_scanned += 1;
                return Ok(Some(chunk_record(buf, location, header, len, false)));
            }
        }
        Ok(None)
    }
}

impl Live<'_> {
    /// Starts a scan if the firmware counted ring overflows since last time.
    fn note_overflows(&mut self, stats: &mut ReaderStats) -> bool {
        let overflows = self.control.counters().ring_overflows;
        if overflows == self.overflows {
            return false;
        }
        stats.ring_overflows += u64::from(overflows.wrapping_sub(self.overflows));
        self.overflows = overflows;
        self.scan = Some((0, 0));
        true
    }

    /// Continues a due SMB scan up to the next `Complete` chunk, moving it
    /// into `buf`.
    fn scan_step(
        &mut self,
        stats: &mut ReaderStats,
        buf: &mut [u8],
    ) -> Option<(ChunkLocation, ChunkHeaderRepr, usize)> {
        while let Some((page, chunk)) = self.scan {
            if page >= self.smb.num_pages() {
                self.scan = None;
                break;
            }
            let chunks = self.smb.page_layout(page).map_or(0, |l| l.num_chunks());
            self.scan = if chunk + 1 < chunks.min(MAX_CHUNKS_PER_PAGE) {
                Some((page, chunk + 1))
            } else {
                Some((page + 1, 0))
            };
            if self.smb.chunk_state(page, chunk) != Some(ChunkState::Complete) {
                continue;
            }
            let location = ChunkLocation { page, chunk };
            if let Taken::Chunk(location, header, len) =
                take_chunk(&self.smb, location, None, stats, buf)
            {
                return Some((location, header, len));
            }
        }
        None
    }

    /// Takes ring records until one is for the caller (at most one lap);
    /// [`Taken::Rescan`] if a patch must wait for the scan.
    fn ring_step(&mut self, stats: &mut ReaderStats, buf: &mut [u8]) -> Taken {
        let ring = *self.control.ring();
        for _ in 0..ring.slots() {
            let pos = self.tail;
            let body = match ring::peek(&ring, pos) {
                Peek::NotReady => return Taken::Nothing,
                Peek::Consumed => {
                    self.tail = pos.wrapping_add(1);
                    continue;
                }
                Peek::Garbage { .. } => {
                    stats.bad_slots += 1;
                    ring::release(&ring, pos);
                    self.tail = pos.wrapping_add(1);
                    self.published_tail = self.tail;
                    continue;
                }
                Peek::Ready(body) => body,
            };
            let record = SlotRepr::from_body(&body);
            // A patch waits for the scan of every overflow counted before
            // it was published (the acquire in `peek` makes those counts
            // visible): its chunk may be one the ring never announced.
            if matches!(record, Ok(SlotRepr::Patch(_)))
                && (self.note_overflows(stats) || self.scan.is_some())
            {
                return Taken::Rescan;
            }
            let taken = match record {
                Ok(SlotRepr::Chunk(slot)) => {
                    let location = ChunkLocation {
                        page: usize::from(slot.page),
                        chunk: usize::from(slot.chunk),
                    };
                    let announced = (slot.writer_id, slot.chunk_id, slot.used);
                    take_chunk(&self.smb, location, Some(announced), stats, buf)
                }
                Ok(SlotRepr::Patch(p)) => {
                    stats.patches += 1;
                    Taken::Patch(p)
                }
                Err(_) => {
                    stats.bad_slots += 1;
                    Taken::Nothing
                }
            };
            ring::release(&ring, pos);
            self.tail = pos.wrapping_add(1);
            self.published_tail = self.tail;
            if !matches!(taken, Taken::Nothing) {
                return taken;
            }
        }
        Taken::Nothing
    }
}

enum Taken {
    Nothing,
    Rescan,
    Patch(PatchSlot),
    Chunk(ChunkLocation, ChunkHeaderRepr, usize),
}

fn chunk_record(
    buf: &[u8],
    location: ChunkLocation,
    header: ChunkHeaderRepr,
    len: usize,
    announced: bool,
) -> Record<'_> {
    Record::Chunk(ChunkRecord {
        location,
        header,
        bytes: buf.get(..len).unwrap_or_default(),
        announced,
    })
}

/// Moves one chunk out (`Complete → BeingRead`, copy, `→ Free`). With
/// `announced = (writer, chunk id, used)` from a slot, copies only the bytes
/// in use when the copied header is that chunk.
fn take_chunk(
    smb: &Smb<'_>,
    location: ChunkLocation,
    announced: Option<(u16, u32, u32)>,
    stats: &mut ReaderStats,
    buf: &mut [u8],
) -> Taken {
    let Ok(chunk) = smb.try_acquire_chunk_for_reading(location.page, location.chunk) else {
        if announced.is_some() {
            stats.stale_commits += 1;
        }
        return Taken::Nothing;
    };
    let prefix = announced.map_or(chunk.chunk_size(), |(_, _, used)| {
        (used as usize).saturating_add(CHUNK_HEADER_SIZE)
    });
    let mut copied = chunk.copy_out_prefix(buf, prefix);
    if let (Ok(c), Some((writer, id, _))) = (copied, announced) {
        if (c.header.writer_id, c.header.chunk_id) != (writer, id) {
            // Not the chunk the slot announced: its `used` says nothing.
            copied = chunk.copy_out(buf);
        }
    }
    if chunk.release_as_free().is_err() {
        stats.release_failures += 1;
    }
    match copied {
        Ok(c) => Taken::Chunk(location, c.header, c.len),
        Err(_) => {
            stats.invalid_chunks += 1;
            Taken::Nothing
        }
    }
}
