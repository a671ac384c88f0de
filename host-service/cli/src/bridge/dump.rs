//! A RAM dump of a region (`import --region-dump FILE[@OFFSET]`: a probe's
//! memory read, a post-mortem dump, a copy of QEMU's RAM file) as a
//! [`FirmwareSource`] that yields everything at once and then ends.
//!
//! A dump is a snapshot, not a live peer: it is read as bytes (no chunk
//! state machine), every field validated.
//!
//! * The header identifies the firmware (the hello) and its geometry
//!   ([`HeaderRepr::parse`]; a header it refuses is the import's error).
//! * Every chunk of the SMB that is `Complete` (or `BeingRead`: a consumer
//!   was copying it) is taken whole, or up to the `used` bytes its ring
//!   slot announced. A `BeingWritten` chunk is *scraped*, as Perfetto's
//!   service scrapes an SMB: with at least two fragments counted, the first
//!   `count - 1` are taken (the last may be unfinished) and the flags that
//!   concern the last one (continues on the next chunk, needs patching) are
//!   cleared; with fewer it is left out. Scraped chunks are counted apart.
//! * Chunks go out per writer, in chunk-id order (an order that wraps at
//!   2^32 starts after the widest gap), each followed by the patches the
//!   ring still holds for it (published PATCH slots, in ring order).
//! * Counted as lost: chunks with an invalid header, duplicate chunk ids of
//!   one writer, ring slots of an unknown kind, patches for a chunk the
//!   dump does not hold.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use shmtrace_abi::layout::{ChunkFlags, ChunkHeaderRepr, Packets, CHUNK_HEADER_SIZE};
use shmtrace_abi::region::{
    offset as field, HeaderError, HeaderRepr, PatchSlot, SlotRepr, HEADER_SIZE, SLOT_SIZE,
};
use shmtrace_abi::state::{self, ChunkState};

use super::patches::PatchGrouper;
use super::{FirmwareEvent, FirmwareSource, Hello, SourceError};

/// Why a dump cannot be imported.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// Reading the file failed.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file ends before a header at the offset does.
    #[error("{path} has {len} bytes: no room for a region header at offset {offset:#x}")]
    TooShort {
        /// The file.
        path: String,
        /// Its length.
        len: u64,
        /// The offset given.
        offset: u64,
    },
    /// The header is not a region's.
    #[error("{what}: no usable region: {error} (is the offset right?)")]
    Header {
        /// The file and offset.
        what: String,
        /// The reader's verdict.
        error: HeaderError,
    },
}

/// What a dump held, by kind.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DumpStats {
    /// `Complete` (or `BeingRead`) chunks taken.
    pub chunks_complete: u64,
    /// `BeingWritten` chunks scraped.
    pub chunks_scraped: u64,
    /// `BeingWritten` chunks with fewer than two fragments: left out.
    pub chunks_not_scraped: u64,
    /// Chunks with an invalid header (writer id 0 or above 32767).
    pub chunks_invalid: u64,
    /// Chunks whose writer and chunk id another chunk of the dump has.
    pub chunks_duplicate: u64,
    /// Published ring records.
    pub ring_records: u64,
    /// Published ring slots of an unknown kind.
    pub bad_slots: u64,
    /// Patches of a chunk the dump does not hold.
    pub patches_without_chunk: u64,
}

/// The dump as a source. See the module docs.
#[derive(Debug)]
pub struct DumpSource {
    events: VecDeque<FirmwareEvent>,
    stats: DumpStats,
    name: String,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    match b.get(at..at + 4) {
        Some(&[a, b, c, d]) => u32::from_le_bytes([a, b, c, d]),
        _ => 0,
    }
}

struct Chunk {
    chunk_id: u32,
    bytes: Vec<u8>,
}

impl DumpSource {
    /// Reads the region at `offset` of the dump `path`.
    pub fn open(path: &Path, offset: u64) -> Result<Self, DumpError> {
        let name = format!("{}@{offset:#x}", path.display());
        let io = |source| DumpError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len < offset.saturating_add(HEADER_SIZE as u64) {
            return Err(DumpError::TooShort {
                path: path.display().to_string(),
                len,
                offset,
            });
        }
        let mut header = [0u8; HEADER_SIZE];
        file.read_exact_at(&mut header, offset).map_err(io)?;
        let available = usize::try_from(len - offset).unwrap_or(usize::MAX);
        let repr = HeaderRepr::parse(&header, available).map_err(|error| DumpError::Header {
            what: name.clone(),
            error,
        })?;
        let mut bytes = vec![0u8; repr.region_size as usize];
        file.read_exact_at(&mut bytes, offset).map_err(io)?;
        Self::from_bytes(&bytes, name)
    }

    /// A dump already in memory (`bytes` from the region's start).
    pub fn from_bytes(bytes: &[u8], name: String) -> Result<Self, DumpError> {
        let header = bytes.get(..HEADER_SIZE).unwrap_or(bytes);
        let repr = HeaderRepr::parse(header, bytes.len()).map_err(|error| DumpError::Header {
            what: name.clone(),
            error,
        })?;
        let mut source = DumpSource {
            events: VecDeque::new(),
            stats: DumpStats::default(),
            name,
        };
        source.read(bytes, &repr);
        Ok(source)
    }

    /// What the dump held.
    pub fn stats(&self) -> DumpStats {
        self.stats
    }

    fn read(&mut self, region: &[u8], h: &HeaderRepr) {
        let (used, mut patches) = self.ring(region, h);
        let chunks = self.chunks(region, h, &used);
        self.events.push_back(FirmwareEvent::Hello(Hello {
            boot_id: h.boot_id,
            data_source: h.data_source.as_str().to_owned(),
            producer: h.producer.as_str().to_owned(),
            clock_id: h.clock_id,
        }));
        let mut grouper = PatchGrouper::new();
        for (writer_id, list) in chunks {
            for c in in_id_order(list) {
                let key = (writer_id, c.chunk_id);
                self.events.push_back(FirmwareEvent::Chunk(c.bytes));
                for p in patches.remove(&key).unwrap_or_default() {
                    grouper.push(p, &mut self.events);
                }
                grouper.finish(&mut self.events);
            }
        }
        self.stats.patches_without_chunk = patches.values().map(|v| v.len() as u64).sum();
        self.events.push_back(FirmwareEvent::Stats(vec![
            (
                "packets_dropped".into(),
                u64::from(u32_at(region, field::PACKETS_DROPPED)),
            ),
            (
                "ring_overflows".into(),
                u64::from(u32_at(region, field::RING_OVERFLOWS)),
            ),
            (
                "chunks_lost".into(),
                u64::from(u32_at(region, field::CHUNKS_LOST)),
            ),
        ]));
    }

    /// The published ring records: the `used` length each CHUNK slot
    /// announced, and the patches per chunk in ring order.
    #[allow(clippy::type_complexity)]
    fn ring(
        &mut self,
        region: &[u8],
        h: &HeaderRepr,
    ) -> (
        HashMap<(u16, u32), u32>,
        HashMap<(u16, u32), Vec<PatchSlot>>,
    ) {
        let slots = h.ring.slots;
        let tail = u32_at(region, field::RING_TAIL);
        let mut records = Vec::new();
        for i in 0..slots {
            let at = h.ring.offset as usize + i as usize * h.ring.slot_size as usize;
            let Some(bytes) = region.get(at..at + SLOT_SIZE) else {
                continue;
            };
            let mut slot = [0u8; SLOT_SIZE];
            slot.copy_from_slice(bytes);
            let (seq, record) = SlotRepr::from_bytes(&slot);
            // Published for position `pos` means `seq == pos + 1`, and
            // position `pos` lives in slot `pos % slots`.
            let pos = seq.wrapping_sub(1);
            if pos & (slots - 1) != i {
                continue;
            }
            match record {
                Ok(r) => records.push((pos.wrapping_sub(tail), r)),
                Err(_) => self.stats.bad_slots += 1,
            }
        }
        records.sort_by_key(|(order, _)| *order);
        self.stats.ring_records = records.len() as u64 + self.stats.bad_slots;
        let mut used = HashMap::new();
        let mut patches: HashMap<_, Vec<_>> = HashMap::new();
        for (_, r) in records {
            match r {
                SlotRepr::Chunk(c) => {
                    used.insert((c.writer_id, c.chunk_id), c.used);
                }
                SlotRepr::Patch(p) => patches
                    .entry((p.writer_id, p.chunk_id))
                    .or_default()
                    .push(p),
            }
        }
        (used, patches)
    }

    /// The chunks worth taking, per writer.
    fn chunks(
        &mut self,
        region: &[u8],
        h: &HeaderRepr,
        used: &HashMap<(u16, u32), u32>,
    ) -> BTreeMap<u16, Vec<Chunk>> {
        let page_size = h.smb.page_size;
        let mut out: BTreeMap<u16, Vec<Chunk>> = BTreeMap::new();
        let pages = h.smb.size as usize / page_size.get();
        for page in 0..pages {
            let start = h.smb.offset as usize + page * page_size.get();
            let Some(page_bytes) = region.get(start..start + page_size.get()) else {
                continue;
            };
            let bitmap = u32_at(page_bytes, 0);
            let layout = state::layout(bitmap);
            for j in 0..layout.num_chunks() {
                let (Some(st), Some(geo)) = (
                    state::chunk_state(bitmap, j),
                    page_size.chunk_geometry(layout, j),
                ) else {
                    continue;
                };
                if st == ChunkState::Free {
                    continue;
                }
                let Some(bytes) = page_bytes.get(geo.offset..geo.end()) else {
                    continue;
                };
                let mut head = [0u8; CHUNK_HEADER_SIZE];
                head.copy_from_slice(&bytes[..CHUNK_HEADER_SIZE]);
                let mut header = ChunkHeaderRepr::from_bytes(head);
                if header.validate().is_err() {
                    self.stats.chunks_invalid += 1;
                    continue;
                }
                let mut len = bytes.len();
                if st == ChunkState::BeingWritten {
                    let count = header.packets.count();
                    if count < 2 {
                        self.stats.chunks_not_scraped += 1;
                        continue;
                    }
                    let flags = header.packets.flags().difference(
                        ChunkFlags::LAST_PACKET_CONTINUES_ON_NEXT_CHUNK
                            .union(ChunkFlags::CHUNK_NEEDS_PATCHING),
                    );
                    header.packets = Packets::masked(count - 1, flags);
                    self.stats.chunks_scraped += 1;
                } else {
                    if let Some(&u) = used.get(&(header.writer_id, header.chunk_id)) {
                        len = len.min(CHUNK_HEADER_SIZE.saturating_add(u as usize));
                    }
                    self.stats.chunks_complete += 1;
                }
                let mut copy = bytes[..len].to_vec();
                copy[..CHUNK_HEADER_SIZE].copy_from_slice(&header.to_bytes());
                let list = out.entry(header.writer_id).or_default();
                if list.iter().any(|c| c.chunk_id == header.chunk_id) {
                    self.stats.chunks_duplicate += 1;
                    continue;
                }
                list.push(Chunk {
                    chunk_id: header.chunk_id,
                    bytes: copy,
                });
            }
        }
        out
    }
}

/// One writer's chunks in id order; ids wrap at 2^32, so the order starts
/// after the widest gap between neighbouring ids.
fn in_id_order(mut list: Vec<Chunk>) -> Vec<Chunk> {
    list.sort_by_key(|c| c.chunk_id);
    let n = list.len();
    if n < 2 {
        return list;
    }
    let gap = |i: usize| list[(i + 1) % n].chunk_id.wrapping_sub(list[i].chunk_id);
    let widest = (0..n).max_by_key(|&i| gap(i)).unwrap_or(n - 1);
    list.rotate_left((widest + 1) % n);
    list
}

impl FirmwareSource for DumpSource {
    fn poll(&mut self, _timeout: Duration) -> Result<Option<FirmwareEvent>, SourceError> {
        self.events.pop_front().map(Some).ok_or(SourceError::Ended)
    }

    fn transport_loss(&self) -> Vec<(&'static str, u64)> {
        let s = &self.stats;
        vec![
            ("chunks_invalid", s.chunks_invalid),
            ("chunks_duplicate", s.chunks_duplicate),
            ("bad_slots", s.bad_slots),
            ("patches_without_chunk", s.patches_without_chunk),
        ]
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let s = &self.stats;
        vec![
            ("chunks_complete", s.chunks_complete),
            ("chunks_scraped", s.chunks_scraped),
            ("chunks_not_scraped", s.chunks_not_scraped),
            ("ring_records", s.ring_records),
        ]
    }

    fn describe(&self) -> String {
        format!("region dump {}", self.name)
    }
}

#[cfg(test)]
mod tests;
