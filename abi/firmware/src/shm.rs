//! The shared-memory region, the arbiters that hand its chunks to the
//! writers, and the drain that moves committed chunks out: the one place
//! that chooses how chunks travel.
//!
//! The region (header, commit ring, SMB; see `shmtrace_abi::region`) is a
//! [`RegionStorage`] static the binary places (in `.shmtrace`, the RAM QEMU
//! can share with a host process, or in `.bss`); [`init`] takes it once
//! (no `unsafe`), with a header checked and laid out at compile time.
//! Each writer the binary has gets its own [`RegionArbiter`] ([`arbiter`]):
//! they share the SMB and the ring lock-free, so an interrupt's writer never
//! waits for the main loop's.
//!
//! A host attached to the region consumes the ring (`instants` and
//! `minimal` leave their chunks to one: the report reads them from the file
//! QEMU backs PSRAM with). The demos consume it themselves with a [`RegionReader`]
//! ([`Transport::drain`]), the way a host would (`Complete → BeingRead`,
//! copy, `→ Free`), and print what they moved.

use shmtrace_abi::layout::PageLayout;
use shmtrace_abi::region::{
    Record, RegionArbiter, RegionConfig, RegionHandles, RegionHeader, RegionReader, RegionStorage,
};

use crate::events::Moved;
use crate::out;

/// Commit ring slots (32 bytes each).
pub const RING_SLOTS: usize = 8;
/// The demos' region: an SMB of one 4 KiB page, drained as it fills.
pub type Storage = RegionStorage<4096, RING_SLOTS>;
/// `minimal`'s region: an SMB of four pages, which hold the whole run (no
/// host drains it while it runs).
pub type HostStorage = RegionStorage<16384, RING_SLOTS>;
/// The page is split into 4 chunks of 1 KiB.
pub const LAYOUT: PageLayout = PageLayout::Div4;
/// The target buffer id the writers name (a region's host picks the
/// buffer; the id is not recorded).
pub const TARGET_BUFFER: u16 = 0;
/// A chunk copy: the largest chunk of any layout is the page minus its
/// 8-byte header.
const CHUNK_COPY: usize = 4096 - 8;

/// The region's data source and producer names (the other settings are
/// the defaults: 4 KiB pages, clock 65, tracing on).
const CONFIG: RegionConfig<'static> = RegionConfig {
    producer: "shmtrace-firmware-example",
    ..RegionConfig::new("track_event")
};

/// What a writer gets its chunks from.
pub type Arbiter = RegionArbiter<'static>;

/// The consumer's side: a reader of the region.
pub struct Transport {
    reader: RegionReader<'static>,
    /// Polls that failed (the region looked broken).
    errors: u64,
}

/// Takes the region in `storage` (once per program) and returns its
/// handles and, if `drain`, the consumer's side.
pub fn init<const SMB: usize, const SLOTS: usize>(
    storage: &'static RegionStorage<SMB, SLOTS>,
    drain: bool,
) -> (RegionHandles<'static>, Option<Transport>) {
    // Checked and laid out at compile time: the firmware stores the
    // header's words.
    let handles = match &const { RegionHeader::<SMB, SLOTS>::new(&CONFIG) } {
        Ok(header) => storage.take_header(header),
        Err(e) => Err(*e),
    };
    let Ok(handles) = handles else {
        out::fail("region refused")
    };
    let transport = drain.then(|| match RegionReader::attach(&handles) {
        Ok(reader) => Transport { reader, errors: 0 },
        Err(_) => out::fail("reader refused"),
    });
    (handles, transport)
}

/// A writer's own arbiter over the region of `handles` (one per writer).
pub fn arbiter(handles: &RegionHandles<'static>) -> Arbiter {
    match RegionArbiter::new(handles, LAYOUT) {
        Ok(arbiter) => arbiter,
        Err(_) => out::fail("arbiter refused"),
    }
}

impl Transport {
    /// Moves every committed chunk and patch out of the region, handing
    /// each to `f`.
    #[inline(never)]
    pub fn drain(&mut self, f: &mut dyn FnMut(Moved<'_>)) {
        let mut copy = [0u8; CHUNK_COPY];
        loop {
            match self.reader.poll(&mut copy) {
                Ok(Some(Record::Chunk(chunk))) => f(Moved::Chunk(chunk.bytes)),
                Ok(Some(Record::Patch(patch))) => f(Moved::Patch {
                    writer_id: patch.writer_id,
                    chunk_id: patch.chunk_id,
                    offset: patch.offset,
                    data: patch.data,
                    has_more: patch.has_more,
                }),
                // The first poll announces the region (boot) it reads.
                Ok(Some(Record::Reset(_))) => {}
                Ok(None) => return,
                Err(_) => {
                    self.errors += 1;
                    return;
                }
            }
        }
    }

    /// Chunks, patches or polls lost between the writers and the drain.
    pub fn lost(&self) -> u64 {
        let stats = self.reader.stats();
        let counters = self.reader.counters().unwrap_or_default();
        self.errors
            + stats.bad_slots
            + stats.invalid_chunks
            + stats.release_failures
            + u64::from(counters.chunks_lost)
    }
}
