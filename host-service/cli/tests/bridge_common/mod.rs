//! A simulated firmware for the bridge tests: shmtrace-abi's `TraceWriter`
//! over its own shared memory (4 KiB pages in seven 584-byte chunks),
//! track events stamped on its clock 65.

#![allow(dead_code)]

use std::cell::RefCell;

use shmtrace_abi::layout::{ChunkHeaderRepr, PageLayout, PageSize};
use shmtrace_abi::proto::{Message, Sink};
use shmtrace_abi::smb::{Smb, SmbStorage, WritableChunk};
use shmtrace_abi::writer::{BufferId, ChunkArbiter, PatchGroup, PatchesDeferred, TraceWriter};
use shmtrace_cli::bridge::{FirmwareEvent, ForwardPatch};

/// Slices written (each with an instant inside).
pub const ITERATIONS: u64 = 40;
/// The iteration whose instant carries the big annotation.
pub const BLOB_AT: u64 = ITERATIONS / 2;
/// The big annotation's length: it spans six chunks, with patches.
pub const BLOB: usize = 3000;

/// The simulated firmware's arbiter: committed chunks are copied out and
/// freed at once, as a probe reading its ring would.
struct Arbiter<'s> {
    smb: &'s Smb<'s>,
    out: &'s RefCell<Vec<FirmwareEvent>>,
}

impl<'s> ChunkArbiter<'s> for Arbiter<'s> {
    fn acquire_chunk(&mut self, header: ChunkHeaderRepr) -> Option<WritableChunk<'s>> {
        self.smb
            .try_acquire_any_chunk_for_writing(0, PageLayout::Div7, header)
            .ok()
    }

    fn commit_chunk(&mut self, chunk: WritableChunk<'s>, _: BufferId) {
        let loc = chunk.release_as_complete().unwrap();
        let r = self
            .smb
            .try_acquire_chunk_for_reading(loc.page, loc.chunk)
            .unwrap();
        let mut buf = vec![0u8; r.chunk_size()];
        let n = r.copy_out(&mut buf).unwrap().len;
        buf.truncate(n);
        r.release_as_free().unwrap();
        self.out.borrow_mut().push(FirmwareEvent::Chunk(buf));
    }

    fn send_patches(&mut self, group: &PatchGroup<'_>) -> Result<(), PatchesDeferred> {
        self.out
            .borrow_mut()
            .push(FirmwareEvent::Patches(shmtrace_cli::bridge::PatchGroup {
                writer_id: group.writer_id,
                chunk_id: group.chunk_id,
                has_more: group.has_more,
                patches: group
                    .patches()
                    .map(|p| ForwardPatch {
                        offset: u32::from(p.offset),
                        data: p.data,
                    })
                    .collect(),
            }));
        Ok(())
    }

    fn flush(&mut self) {}
}

/// A track event on clock 65 (TracePacket 8, 58, 11; TrackEvent 9, 23,
/// 22, 4; DebugAnnotation 10, 6).
pub fn event<S: Sink>(p: &mut Message<'_, S>, ts: u64, kind: i32, name: Option<&str>, blob: &str) {
    p.uint64(8, ts);
    p.uint32(58, 65);
    p.nested(11, |e| {
        e.enumeration(9, kind);
        if let Some(n) = name {
            e.string(23, n);
            e.string(22, "fw");
        }
        if !blob.is_empty() {
            e.nested(4, |a| {
                a.string(10, "blob");
                a.string(6, blob);
            });
        }
    });
}

/// What the firmware wrote: one writer, `ITERATIONS` slices with an
/// instant inside, one instant with a 3000-byte annotation (it spans six
/// chunks, with patches).
pub fn firmware_events(fw_now: impl Fn() -> u64) -> Vec<FirmwareEvent> {
    let mut storage = Box::new(SmbStorage::<{ 16 * 1024 }>::new());
    let smb = Smb::new(&mut storage, PageSize::new(4096).unwrap()).unwrap();
    let out = RefCell::new(Vec::new());
    {
        let mut w = TraceWriter::<_>::new(
            Arbiter {
                smb: &smb,
                out: &out,
            },
            3,
            0,
        )
        .unwrap();
        let blob = "x".repeat(BLOB);
        for i in 0..ITERATIONS {
            let t = fw_now();
            let _ = w.write_packet(|p| event(p, t, 1, Some("work"), ""));
            let large = if i == BLOB_AT { blob.as_str() } else { "" };
            let _ = w.write_packet(|p| event(p, t + 1, 3, Some("tick"), large));
            let _ = w.write_packet(|p| event(p, t + 2, 2, None, ""));
        }
        w.flush();
    }
    out.into_inner()
}
