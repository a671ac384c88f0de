//! The tracing calls: the one module of the firmware that uses shmtrace-abi.
//!
//! This version writes with the SMB writer of the crate's first release:
//! a [`TraceWriter`] over a [`PollingArbiter`] that queues commits into a
//! [`CommitQueue`], which [`ShmTracer::drain`] empties the way the tracing
//! service would (`Complete → BeingRead`, copy, `→ Free`). Every event is one
//! TracePacket written with `write_packet`; field numbers are those of
//! Perfetto's `trace_packet.proto` and `track_event.proto`.
//!
//! The packets form a valid track-event sequence: the first one clears the
//! incremental state, interns the event names and makes [`TRACK_UUID`] the
//! default track; two track descriptors follow; events carry timestamps on
//! the default clock (BOOTTIME).

use core::convert::Infallible;
use core::mem::size_of;

use shmtrace_abi::layout::{PageLayout, PageSize};
use shmtrace_abi::smb::{Smb, SmbStorage};
use shmtrace_abi::writer::{CommitQueue, CommitReceiver, Drained, PollingArbiter, TraceWriter};

use crate::events::{Moved, Name, Tracer, NAMES};
use crate::out;

/// Bytes of the SMB: two 4 KiB pages.
pub const SMB_BYTES: usize = 8192;
/// The storage the demo binaries put in a `static`.
pub type Storage = SmbStorage<SMB_BYTES>;

/// Each page is split into 4 chunks of 1 KiB.
const LAYOUT: PageLayout = PageLayout::Div4;
/// Commit events the queue holds, minus one.
const QUEUE_LEN: usize = 16;
/// The writer's id (its packet sequence).
const WRITER_ID: u16 = 1;
/// The target buffer id the commits name.
const TARGET_BUFFER: u16 = 1;
/// A chunk copy: the largest chunk of any layout is the page minus its
/// 8-byte header.
const CHUNK_COPY: usize = 4096 - 8;

/// Track of the slices and instants (the sequence's default track).
pub const TRACK_UUID: u64 = 0x5348_4d54;
/// The counter track, a child of [`TRACK_UUID`].
pub const COUNTER_UUID: u64 = TRACK_UUID + 1;

// TracePacket fields.
const PACKET_TIMESTAMP: u32 = 8;
const PACKET_TRACK_EVENT: u32 = 11;
const PACKET_INTERNED_DATA: u32 = 12;
const PACKET_SEQUENCE_FLAGS: u32 = 13;
const PACKET_DEFAULTS: u32 = 59;
const PACKET_TRACK_DESCRIPTOR: u32 = 60;
// TracePacket.sequence_flags values.
const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;
const SEQ_NEEDS_INCREMENTAL_STATE: u32 = 2;
// TracePacketDefaults.track_event_defaults, TrackEventDefaults.track_uuid.
const DEFAULTS_TRACK_EVENT: u32 = 11;
const TRACK_EVENT_DEFAULTS_TRACK_UUID: u32 = 11;
// InternedData.event_names; EventName.iid, .name.
const INTERNED_EVENT_NAMES: u32 = 2;
const EVENT_NAME_IID: u32 = 1;
const EVENT_NAME_NAME: u32 = 2;
// TrackDescriptor fields.
const TRACK_UUID_FIELD: u32 = 1;
const TRACK_NAME: u32 = 2;
const TRACK_PARENT_UUID: u32 = 5;
const TRACK_COUNTER: u32 = 8;
// TrackEvent fields and TrackEvent.Type values.
const EVENT_TYPE: u32 = 9;
const EVENT_NAME_IID_FIELD: u32 = 10;
const EVENT_TRACK_UUID: u32 = 11;
const EVENT_COUNTER_VALUE: u32 = 30;
const TYPE_SLICE_BEGIN: u32 = 1;
const TYPE_SLICE_END: u32 = 2;
const TYPE_INSTANT: u32 = 3;
const TYPE_COUNTER: u32 = 4;

/// A [`Tracer`] writing into an SMB through shmtrace-abi.
pub struct ShmTracer<'a> {
    smb: &'a Smb<'a>,
    writer: TraceWriter<'a, PollingArbiter<'a, 'a>>,
    rx: CommitReceiver<'a>,
    /// Chunks the commit queue named that could not be moved.
    chunks_lost: u64,
}

/// Zeroes `storage` (a `.shmtrace` static is not zeroed at reset), builds a
/// [`ShmTracer`] over it and passes it to `f`. The SMB, the queue and the
/// writer live in this function's frame, which `f` never leaves (it returns
/// [`Infallible`]: pass a closure that calls [`crate::run`]).
pub fn with_tracer(
    storage: &'static mut Storage,
    f: impl FnOnce(&mut ShmTracer<'_>) -> Infallible,
) -> ! {
    *storage = Storage::new();
    let Ok(smb) = Smb::new(storage, PageSize::DEFAULT) else {
        out::fail("SMB storage refused")
    };
    let mut queue = CommitQueue::<QUEUE_LEN>::new();
    let (tx, rx) = queue.split();
    let Ok(arbiter) = PollingArbiter::new(&smb, LAYOUT, tx) else {
        out::fail("arbiter refused")
    };
    let Ok(writer) = TraceWriter::new(arbiter, WRITER_ID, TARGET_BUFFER) else {
        out::fail("writer refused")
    };
    let mut tracer = ShmTracer {
        smb: &smb,
        writer,
        rx,
        chunks_lost: 0,
    };
    match f(&mut tracer) {}
}

// Packet outcomes are ignored: the writer counts every loss in its stats,
// which `dropped` reports.
impl ShmTracer<'_> {
    fn event(&mut self, ts: u64, kind: u32, name: Option<Name>, track: u64, value: i64) {
        let _ = self.writer.write_packet(|p| {
            p.uint64(PACKET_TIMESTAMP, ts);
            p.uint32(PACKET_SEQUENCE_FLAGS, SEQ_NEEDS_INCREMENTAL_STATE);
            p.nested(PACKET_TRACK_EVENT, |e| {
                e.uint32(EVENT_TYPE, kind);
                if let Some(name) = name {
                    e.uint64(EVENT_NAME_IID_FIELD, name.iid);
                }
                if track != 0 {
                    e.uint64(EVENT_TRACK_UUID, track);
                }
                if kind == TYPE_COUNTER {
                    e.int64(EVENT_COUNTER_VALUE, value);
                }
            });
        });
    }
}

impl Tracer for ShmTracer<'_> {
    fn start(&mut self) {
        let _ = self.writer.write_packet(|p| {
            p.uint32(PACKET_SEQUENCE_FLAGS, SEQ_INCREMENTAL_STATE_CLEARED);
            p.nested(PACKET_DEFAULTS, |d| {
                d.nested(DEFAULTS_TRACK_EVENT, |t| {
                    t.uint64(TRACK_EVENT_DEFAULTS_TRACK_UUID, TRACK_UUID)
                })
            });
            p.nested(PACKET_INTERNED_DATA, |i| {
                for name in NAMES {
                    i.nested(INTERNED_EVENT_NAMES, |n| {
                        n.uint64(EVENT_NAME_IID, name.iid);
                        n.string(EVENT_NAME_NAME, name.text);
                    });
                }
            });
        });
        let _ = self.writer.write_packet(|p| {
            p.nested(PACKET_TRACK_DESCRIPTOR, |t| {
                t.uint64(TRACK_UUID_FIELD, TRACK_UUID);
                t.string(TRACK_NAME, "firmware");
            })
        });
        let _ = self.writer.write_packet(|p| {
            p.nested(PACKET_TRACK_DESCRIPTOR, |t| {
                t.uint64(TRACK_UUID_FIELD, COUNTER_UUID);
                t.uint64(TRACK_PARENT_UUID, TRACK_UUID);
                t.string(TRACK_NAME, "level");
                t.nested(TRACK_COUNTER, |_| {});
            })
        });
    }

    fn slice_begin(&mut self, ts: u64, name: Name) {
        self.event(ts, TYPE_SLICE_BEGIN, Some(name), 0, 0);
    }

    fn slice_end(&mut self, ts: u64) {
        self.event(ts, TYPE_SLICE_END, None, 0, 0);
    }

    fn instant(&mut self, ts: u64, name: Name) {
        self.event(ts, TYPE_INSTANT, Some(name), 0, 0);
    }

    fn counter(&mut self, ts: u64, value: i64) {
        self.event(ts, TYPE_COUNTER, None, COUNTER_UUID, value);
    }

    fn flush(&mut self) {
        self.writer.flush();
    }

    fn drain(&mut self, f: &mut dyn FnMut(Moved<'_>)) {
        let mut copy = [0u8; CHUNK_COPY];
        let stats = self.rx.drain(self.smb, &mut copy, |drained| match drained {
            Drained::Chunk { bytes, .. } => f(Moved::Chunk(bytes)),
            Drained::Patches(batch) => {
                let last = batch.patches().len();
                for (i, patch) in batch.patches().iter().enumerate() {
                    f(Moved::Patch {
                        writer_id: batch.writer_id,
                        chunk_id: batch.chunk_id,
                        offset: patch.offset,
                        data: patch.data,
                        has_more: batch.has_more || i + 1 < last,
                    });
                }
            }
        });
        self.chunks_lost += stats.chunks_not_complete + stats.chunks_dropped;
    }

    fn dropped(&self) -> u64 {
        let stats = self.writer.stats();
        stats.packets_dropped() + stats.packets_incomplete + self.chunks_lost
    }

    fn state_bytes(&self) -> usize {
        size_of::<Self>() + size_of::<Smb<'_>>() + size_of::<CommitQueue<QUEUE_LEN>>()
    }
}
