//! Writer tests with exact expected chunk bytes, flags and patches.

use std::boxed::Box;
use std::vec::Vec;

use super::*;
use crate::layout::{ChunkFlags, ChunkHeaderRepr, Packets, PageLayout};
use crate::proto::wire::redundant_varint4;
use crate::proto::MAX_DEPTH;
use crate::reader::{apply_patch, FragmentEvent, Fragments};
use crate::region::{PatchSlot, Record, RegionArbiter, RegionConfig, RegionReader, RegionStorage};
use crate::smb::{ChunkLocation, WritableChunk};

#[derive(Debug)]
enum Ev {
    Chunk {
        header: ChunkHeaderRepr,
        location: ChunkLocation,
        /// The payload bytes the arbiter announced as used.
        payload: Vec<u8>,
    },
    Patch(PatchSlot),
}

fn config() -> RegionConfig<'static> {
    RegionConfig::new("test")
}

/// Everything the region's reader has for us, in order.
fn drain(rx: &mut RegionReader<'_>) -> Vec<Ev> {
    let mut buf = std::vec![0u8; rx.chunk_buffer_len()];
    let mut out = Vec::new();
    while let Some(record) = rx.poll(&mut buf).unwrap() {
        match record {
            Record::Chunk(c) => out.push(Ev::Chunk {
                header: c.header,
                location: c.location,
                payload: c.bytes[8..].to_vec(),
            }),
            Record::Patch(p) => out.push(Ev::Patch(p)),
            Record::Reset(h) => panic!("unexpected reset {h:?}"),
        }
    }
    let stats = rx.stats();
    assert_eq!(
        (
            stats.bad_slots,
            stats.invalid_chunks,
            stats.release_failures
        ),
        (0, 0, 0)
    );
    // A commit finds its chunk gone only if an overflow scan took it.
    assert!(stats.stale_commits <= stats.chunks_scanned);
    out
}

fn packets(count: u16, flags: u8) -> Packets {
    Packets::new(count, ChunkFlags::from_bits_retain(flags)).unwrap()
}

fn chunk(ev: &Ev) -> (&ChunkHeaderRepr, &[u8]) {
    match ev {
        Ev::Chunk {
            header, payload, ..
        } => (header, payload),
        Ev::Patch(_) => panic!("expected a chunk, got {ev:?}"),
    }
}

fn data_fragments(payload: &[u8], p: Packets) -> Vec<Vec<u8>> {
    Fragments::new(payload, p)
        .map(|f| match f.unwrap() {
            FragmentEvent::Data(f) => f.data.to_vec(),
            FragmentEvent::Dropped(d) => panic!("unexpected sentinel {d:?}"),
        })
        .collect()
}

/// Field 87 (first_packet_on_sequence = true): every writer's first packet.
const FIRST: [u8; 3] = [0xB8, 0x05, 0x01];

#[test]
fn small_packets_are_compacted_and_padded_on_flush() {
    // Encoded field by field, and as whole pre-encoded packets (the first
    // one through the general path, for field 87; the second through the
    // one-copy path): the same bytes.
    for encoded in [false, true] {
        small_packets_case(encoded);
    }
}

fn small_packets_case(encoded: bool) {
    let mut storage = Box::new(RegionStorage::<4096, 16>::new());
    let handles = storage.init(&config()).unwrap();
    let mut rx = RegionReader::attach(&handles).unwrap();
    let arbiter = RegionArbiter::new(&handles, PageLayout::Div1).unwrap();
    let mut w: TraceWriter<_> = TraceWriter::new(arbiter, 1, 7).unwrap();
    for ts in [100u8, 101] {
        let outcome = if encoded {
            w.write_encoded_packet(&[0x40, ts])
        } else {
            w.write_packet(|p| p.uint64(8, ts.into()))
        };
        assert_eq!(outcome, PacketOutcome::Written);
    }
    let (scraped, _) = w.enc.sink().snapshot().unwrap();
    assert_eq!(scraped.count(), 3, "two packets + the inflated slot");
    if encoded {
        // A length beyond the buffer: dropped whole, counted, and marked
        // on the next packet (field 42 = 1).
        assert_eq!(
            w.write_encoded_packet_in(&[0x40], 2),
            PacketOutcome::Dropped(DropReason::PacketTooLong)
        );
        assert_eq!(w.stats().packets_dropped_too_long, 1);
        assert_eq!(
            w.enc.sink().pending_loss(),
            crate::trace::data_loss::PRESENT
        );
        assert_eq!(w.enc.sink().snapshot().unwrap().0.count(), 3);
    }
    // Nothing is committed before the flush.
    assert!(drain(&mut rx).is_empty());
    w.flush();
    let ev = drain(&mut rx);
    assert_eq!(ev.len(), 1);
    let Ev::Chunk {
        header,
        location,
        payload,
    } = &ev[0]
    else {
        panic!()
    };
    assert_eq!(*location, ChunkLocation { page: 0, chunk: 0 });
    assert_eq!(payload.len(), 10, "only the used bytes are copied");
    assert_eq!((header.chunk_id, header.writer_id), (0, 1));
    // Two packets + the empty fragment padding the inflated count.
    assert_eq!(header.packets, packets(3, 0));
    assert_eq!(
        &payload[..10],
        &[0x05, 0xB8, 0x05, 0x01, 0x40, 0x64, 0x02, 0x40, 0x65, 0x00]
    );
    assert_eq!(w.stats().packets_written, 2);
    assert_eq!(w.stats().chunks_committed, 1);
}

#[test]
fn packet_split_across_two_chunks_golden() {
    let mut storage = Box::new(RegionStorage::<4096, 16>::new());
    let handles = storage.init(&config()).unwrap();
    let mut rx = RegionReader::attach(&handles).unwrap();
    // Div14 of a 4 KiB page: 292-byte chunks, 284-byte payloads.
    let arbiter = RegionArbiter::new(&handles, PageLayout::Div14).unwrap();
    let mut w: TraceWriter<_> = TraceWriter::new(arbiter, 1, 7).unwrap();
    let blob: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
    let outcome = w.write_packet(|p| {
        p.uint64(8, 100);
        p.nested(11, |m| m.bytes(2, &blob));
    });
    assert_eq!(outcome, PacketOutcome::Written);
    w.flush();
    let ev = drain(&mut rx);
    assert_eq!(ev.len(), 3, "{ev:?}");

    // Chunk 0: one fragment (280 bytes) that continues, needs patching.
    let (h0, p0) = chunk(&ev[0]);
    assert_eq!((h0.chunk_id, h0.writer_id), (0, 1));
    assert_eq!(h0.packets, packets(1, 0x2 | 0x4));
    assert_eq!(h0.packets.bits().to_le_bytes(), [0x01, 0x18]);
    assert_eq!(p0.len(), 284);
    let mut expected0 = Vec::new();
    expected0.extend_from_slice(&[0x98, 0x82, 0x80, 0x00]); // 280
    expected0.extend_from_slice(&FIRST);
    expected0.extend_from_slice(&[0x40, 0x64, 0x5A]);
    expected0.extend_from_slice(&[0, 0, 0, 0]); // nested size: left for the patch
    expected0.extend_from_slice(&[0x12, 0xAC, 0x02]);
    expected0.extend_from_slice(&blob[..267]);
    assert_eq!(p0, &expected0[..]);

    // The patch: offset 10 (after the 8-byte header), nested size 303.
    let Ev::Patch(patch) = &ev[1] else {
        panic!("{:?}", ev[1])
    };
    assert_eq!(
        *patch,
        PatchSlot {
            writer_id: 1,
            chunk_id: 0,
            has_more: false,
            offset: 10,
            data: [0xAF, 0x82, 0x80, 0x00]
        }
    );

    // Chunk 1: the 33-byte tail, then the pad for the inflated count.
    let (h1, p1) = chunk(&ev[2]);
    assert_eq!((h1.chunk_id, h1.writer_id), (1, 1));
    assert_eq!(h1.packets, packets(2, 0x1));
    assert_eq!(h1.packets.bits().to_le_bytes(), [0x02, 0x04]);
    let mut expected1 = Vec::new();
    expected1.extend_from_slice(&[0xA1, 0x80, 0x80, 0x00]); // 33
    expected1.extend_from_slice(&blob[267..]);
    expected1.push(0x00);
    assert_eq!(&p1[..expected1.len()], &expected1[..]);

    // Service side: patch, then reassemble.
    let mut p0 = p0.to_vec();
    apply_patch(&mut p0, u32::from(patch.offset), &patch.data).unwrap();
    let mut packet = Vec::new();
    for f in data_fragments(&p0, h0.packets) {
        packet.extend_from_slice(&f);
    }
    for f in data_fragments(p1, h1.packets) {
        packet.extend_from_slice(&f);
    }
    let mut expected = FIRST.to_vec();
    expected.extend_from_slice(&[0x40, 0x64, 0x5A, 0xAF, 0x82, 0x80, 0x00, 0x12, 0xAC, 0x02]);
    expected.extend_from_slice(&blob);
    assert_eq!(packet, expected);
}

#[test]
fn middle_chunks_hold_one_fragment_continuing_both_ways() {
    let mut storage = Box::new(RegionStorage::<4096, 16>::new());
    let handles = storage.init(&config()).unwrap();
    let mut rx = RegionReader::attach(&handles).unwrap();
    let arbiter = RegionArbiter::new(&handles, PageLayout::Div14).unwrap();
    let mut w: TraceWriter<_> = TraceWriter::new(arbiter, 3, 1).unwrap();
    let blob = [0x33u8; 1000];
    assert_eq!(
        w.write_packet(|p| p.bytes(1, &blob)),
        PacketOutcome::Written
    );
    assert_eq!(w.write_packet(|p| p.uint32(13, 2)), PacketOutcome::Written);
    w.flush();
    let ev = drain(&mut rx);
    let chunks: Vec<_> = ev.iter().map(chunk).collect();
    assert_eq!(chunks.len(), 4);
    let flags: Vec<u8> = chunks
        .iter()
        .map(|(h, _)| h.packets.flags().bits())
        .collect();
    let counts: Vec<u16> = chunks.iter().map(|(h, _)| h.packets.count()).collect();
    let ids: Vec<u32> = chunks.iter().map(|(h, _)| h.chunk_id).collect();
    assert_eq!(ids, [0, 1, 2, 3]);
    assert_eq!(flags, [0x2, 0x3, 0x3, 0x1]);
    // Last chunk: the tail, the second packet (compacted) and the pad.
    assert_eq!(counts, [1, 1, 1, 3]);
    let mut packet = Vec::new();
    for (h, p) in &chunks {
        let frags = data_fragments(p, h.packets);
        packet.extend_from_slice(&frags[0]);
    }
    let mut expected = FIRST.to_vec();
    expected.extend_from_slice(&[0x0A, 0xE8, 0x07]);
    expected.extend_from_slice(&blob);
    assert_eq!(packet, expected);
    let last = data_fragments(chunks[3].1, chunks[3].0.packets);
    assert_eq!(last[1], [0x68, 0x02]);
}

#[test]
fn a_chunk_filled_exactly_is_returned_at_once() {
    let mut storage = Box::new(RegionStorage::<4096, 16>::new());
    let handles = storage.init(&config()).unwrap();
    let mut rx = RegionReader::attach(&handles).unwrap();
    let arbiter = RegionArbiter::new(&handles, PageLayout::Div1).unwrap();
    let mut w: TraceWriter<_> = TraceWriter::new(arbiter, 1, 1).unwrap();
    // 4 (size) + 3 (field 87) + 1 + 2 (tag, length) + 4070 = 4080 = payload.
    let blob = std::vec![0x11u8; 4070];
    assert_eq!(
        w.write_packet(|p| p.bytes(2, &blob)),
        PacketOutcome::Written
    );
    // No byte left to inflate the count: the chunk is committed right away.
    let ev = drain(&mut rx);
    assert_eq!(ev.len(), 1);
    let (h, p) = chunk(&ev[0]);
    assert_eq!(h.packets, packets(1, 0));
    assert_eq!(&p[..4], &redundant_varint4(4076));
}

#[test]
fn a_packet_starts_in_a_new_chunk_when_fewer_than_12_bytes_are_left() {
    let mut storage = Box::new(RegionStorage::<8192, 16>::new());
    let handles = storage.init(&config()).unwrap();
    let mut rx = RegionReader::attach(&handles).unwrap();
    let arbiter = RegionArbiter::new(&handles, PageLayout::Div1).unwrap();
    let mut w: TraceWriter<_> = TraceWriter::new(arbiter, 1, 1).unwrap();
    // Leave exactly 11 bytes: 4 + 3 + 3 + n = 4080 - 11 -> n = 4059.
    let blob = std::vec![0x22u8; 4059];
    assert_eq!(
        w.write_packet(|p| p.bytes(2, &blob)),
        PacketOutcome::Written
    );
    assert!(drain(&mut rx).is_empty());
    assert_eq!(w.write_packet(|p| p.uint64(8, 1)), PacketOutcome::Written);
    let ev = drain(&mut rx);
    assert_eq!(
        ev.len(),
        1,
        "the full chunk was returned for the second packet"
    );
    let (h, p) = chunk(&ev[0]);
    assert_eq!((h.chunk_id, h.packets), (0, packets(2, 0)));
    assert_eq!(p[4069], 0x00, "pad fragment after the first packet");
    w.flush();
    let ev = drain(&mut rx);
    let (h, p) = chunk(&ev[0]);
    assert_eq!(h.chunk_id, 1);
    assert_eq!(&p[..3], &[0x02, 0x40, 0x01]);
}

#[test]
fn at_most_1022_fragments_per_chunk() {
    let mut storage = Box::new(RegionStorage::<8192, 16>::new());
    let handles = storage.init(&config()).unwrap();
    let mut rx = RegionReader::attach(&handles).unwrap();
    let arbiter = RegionArbiter::new(&handles, PageLayout::Div1).unwrap();
    let mut w: TraceWriter<_> = TraceWriter::new(arbiter, 1, 1).unwrap();
    for i in 0..1023u64 {
        assert_eq!(
            w.write_packet(|p| p.uint64(8, i % 100)),
            PacketOutcome::Written
        );
    }
    w.flush();
    let ev = drain(&mut rx);
    assert_eq!(ev.len(), 2);
    let (h0, p0) = chunk(&ev[0]);
    // 1022 packets, then the pad that made the inflated 1023rd slot honest.
    assert_eq!(h0.packets, packets(1023, 0));
    assert_eq!(data_fragments(p0, h0.packets).len(), 1022);
    let (h1, p1) = chunk(&ev[1]);
    assert_eq!(h1.packets, packets(2, 0));
    assert_eq!(data_fragments(p1, h1.packets), [[0x40, 22]]);
}

#[test]
fn smb_exhaustion_drops_whole_packets_and_marks_the_next_one() {
    let mut storage = Box::new(RegionStorage::<4096, 16>::new());
    let handles = storage.init(&config()).unwrap();
    let mut rx = RegionReader::attach(&handles).unwrap();
    let arbiter = RegionArbiter::new(&handles, PageLayout::Div1).unwrap();
    let mut w: TraceWriter<_> = TraceWriter::new(arbiter, 1, 1).unwrap();
    let blob = [0x44u8; 1500];
    assert_eq!(
        w.write_packet(|p| p.bytes(2, &blob)),
        PacketOutcome::Written
    );
    assert_eq!(
        w.write_packet(|p| p.bytes(2, &blob)),
        PacketOutcome::Written
    );
    // Does not fit: the only chunk is full and the service is not draining.
    let third = w.write_packet(|p| {
        p.uint64(8, 3);
        p.nested(11, |m| m.bytes(2, &blob));
    });
    assert_eq!(third, PacketOutcome::Dropped(DropReason::SmbFull));
    assert_eq!(
        w.write_packet(|p| p.uint64(8, 4)),
        PacketOutcome::Dropped(DropReason::SmbFull)
    );
    assert_eq!(w.stats().packets_dropped_smb_full, 2);
    assert_eq!(
        w.pending_patches(),
        0,
        "open sizes in the abandoned chunk were detached"
    );

    // The service drains: two whole packets, then the sentinel.
    let ev = drain(&mut rx);
    assert_eq!(ev.len(), 1);
    let (h, p) = chunk(&ev[0]);
    assert_eq!(h.packets, packets(3, 0));
    let items: Vec<_> = Fragments::new(p, h.packets).map(|f| f.unwrap()).collect();
    assert_eq!(items.len(), 3);
    let FragmentEvent::Dropped(d) = items[2] else {
        panic!("{:?}", items[2])
    };
    assert_eq!(&p[d.offset..d.offset + 4], &[0xFF, 0xFF, 0xFF, 0x7F]);

    // Recovery: the next packet says what was lost.
    assert_eq!(w.write_packet(|p| p.uint64(8, 5)), PacketOutcome::Written);
    assert_eq!(w.write_packet(|p| p.uint64(8, 6)), PacketOutcome::Written);
    w.flush();
    let ev = drain(&mut rx);
    let (h, p) = chunk(&ev[0]);
    assert_eq!(h.chunk_id, 1);
    assert_eq!(
        data_fragments(p, h.packets),
        [
            std::vec![0xD0, 0x02, 0x81, 0x02, 0x40, 0x05],
            std::vec![0x40, 0x06]
        ]
    );
    assert_eq!(w.stats().packets_dropped_smb_full, 2);
}

#[test]
fn ensure_chunk_drops_before_encoding_while_the_smb_is_full() {
    let mut storage = Box::new(RegionStorage::<4096, 16>::new());
    let handles = storage.init(&config()).unwrap();
    let mut rx = RegionReader::attach(&handles).unwrap();
    let arbiter = RegionArbiter::new(&handles, PageLayout::Div1).unwrap();
    let mut w: TraceWriter<_> = TraceWriter::new(arbiter, 1, 1).unwrap();
    // No chunk yet: one is acquired with a count of 0, and the next packet
    // is its first.
    assert!(w.ensure_chunk());
    assert!(w.ensure_chunk(), "a chunk held: nothing to do");
    assert_eq!(w.write_packet(|p| p.uint64(8, 1)), PacketOutcome::Written);
    let blob = [0x44u8; 4090];
    // Needs a second chunk, and there is none: dropped.
    assert_eq!(
        w.write_packet(|p| p.bytes(2, &blob)),
        PacketOutcome::Dropped(DropReason::SmbFull)
    );
    // Holding no chunk: each call asks again, fails, counts a drop.
    assert!(!w.ensure_chunk());
    assert!(!w.ensure_chunk());
    assert_eq!(w.stats().packets_dropped_smb_full, 3);
    let ev = drain(&mut rx);
    assert_eq!(ev.len(), 1);
    let (h, p) = chunk(&ev[0]);
    assert_eq!((h.chunk_id, h.packets), (0, packets(2, 0)));
    let items: Vec<_> = Fragments::new(p, h.packets).map(|f| f.unwrap()).collect();
    assert!(matches!(items[1], FragmentEvent::Dropped(_)), "{items:?}");
    // Drained: the chunk comes back, count 0, and the packet after it
    // carries the loss.
    assert!(w.ensure_chunk());
    assert_eq!(w.write_packet(|p| p.uint64(8, 2)), PacketOutcome::Written);
    w.flush();
    let ev = drain(&mut rx);
    let (h, p) = chunk(&ev[0]);
    assert_eq!(h.chunk_id, 1);
    assert_eq!(
        data_fragments(p, h.packets),
        [std::vec![0xD0, 0x02, 0x81, 0x02, 0x40, 0x02]]
    );
}

#[test]
fn full_patch_storage_abandons_the_packet() {
    let mut storage = Box::new(RegionStorage::<4096, 16>::new());
    let handles = storage.init(&config()).unwrap();
    let mut rx = RegionReader::attach(&handles).unwrap();
    let arbiter = RegionArbiter::new(&handles, PageLayout::Div14).unwrap();
    let mut w: TraceWriter<_, 1> = TraceWriter::new(arbiter, 1, 1).unwrap();
    let blob = [0x55u8; 400];
    // Two nested sizes are open in the first chunk when it fills up; only
    // one patch entry fits.
    let outcome = w.write_packet(|p| p.nested(1, |a| a.nested(2, |b| b.bytes(3, &blob))));
    assert_eq!(
        outcome,
        PacketOutcome::Dropped(DropReason::PatchStorageFull)
    );
    assert_eq!(w.write_packet(|p| p.uint64(8, 9)), PacketOutcome::Written);
    w.flush();
    let ev = drain(&mut rx);
    assert_eq!(ev.len(), 2);
    let (h0, p0) = chunk(&ev[0]);
    assert_eq!(
        h0.packets,
        packets(1, 0),
        "no continuation or patch flags on an abandoned packet"
    );
    assert_eq!(&p0[..4], &[0xFF, 0xFF, 0xFF, 0x7F]);
    let (h1, p1) = chunk(&ev[1]);
    // previous_packet_dropped = 1, and field 87 still pending (no packet
    // was written before).
    assert_eq!(
        data_fragments(p1, h1.packets),
        [std::vec![0xD0, 0x02, 0x01, 0xB8, 0x05, 0x01, 0x40, 0x09]]
    );
    assert_eq!(w.stats().packets_dropped_patch_storage, 1);
}

#[test]
fn chunk_ids_wrap_around() {
    let mut storage = Box::new(RegionStorage::<4096, 16>::new());
    let handles = storage.init(&config()).unwrap();
    let mut rx = RegionReader::attach(&handles).unwrap();
    let arbiter = RegionArbiter::new(&handles, PageLayout::Div2).unwrap();
    let mut w: TraceWriter<_> = TraceWriter::new(arbiter, 9, 1).unwrap();
    w.set_next_chunk_id(u32::MAX);
    assert_eq!(w.write_packet(|p| p.uint64(8, 1)), PacketOutcome::Written);
    w.flush();
    assert_eq!(w.write_packet(|p| p.uint64(8, 2)), PacketOutcome::Written);
    w.flush();
    let ids: Vec<u32> = drain(&mut rx).iter().map(|e| chunk(e).0.chunk_id).collect();
    assert_eq!(ids, [u32::MAX, 0]);
    assert_eq!(w.next_chunk_id(), 1);
}

#[test]
fn writer_ids_are_validated() {
    let mut storage = Box::new(RegionStorage::<4096, 16>::new());
    let handles = storage.init(&config()).unwrap();
    for (id, ok) in [(0u16, false), (1, true), (32767, true), (32768, false)] {
        let arbiter = RegionArbiter::new(&handles, PageLayout::Div1).unwrap();
        let r: Result<TraceWriter<_>, _> = TraceWriter::new(arbiter, id, 1);
        assert_eq!(r.is_ok(), ok, "writer id {id}");
        if !ok {
            assert_eq!(r.err(), Some(WriterError::InvalidWriterId(id)));
        }
    }
}

#[test]
fn too_deep_nesting_keeps_the_packet_and_counts_the_drop() {
    let mut storage = Box::new(RegionStorage::<4096, 16>::new());
    let handles = storage.init(&config()).unwrap();
    let mut rx = RegionReader::attach(&handles).unwrap();
    let arbiter = RegionArbiter::new(&handles, PageLayout::Div1).unwrap();
    let mut w: TraceWriter<_> = TraceWriter::new(arbiter, 1, 1).unwrap();
    fn nest<S: crate::proto::Sink>(m: &mut crate::proto::Message<'_, S>, n: usize) {
        if n == 0 {
            m.uint32(1, 1);
        } else {
            m.nested(1, |c| nest(c, n - 1));
        }
    }
    let outcome = w.write_packet(|p| {
        p.uint64(8, 1);
        nest(p, MAX_DEPTH + 1);
    });
    assert_eq!(
        outcome,
        PacketOutcome::Incomplete(EncodeError::NestingTooDeep)
    );
    assert_eq!(w.stats().nested_messages_dropped, 1);
    assert_eq!(w.stats().packets_incomplete, 1);
    w.flush();
    let ev = drain(&mut rx);
    let (h, p) = chunk(&ev[0]);
    let frags = data_fragments(p, h.packets);
    // 87, timestamp, then MAX_DEPTH levels with the innermost empty.
    assert_eq!(frags[0].len(), 3 + 2 + 2 * MAX_DEPTH);
}

#[test]
fn a_full_ring_leaves_the_chunk_complete_for_a_scan() {
    let mut storage = Box::new(RegionStorage::<16384, 2>::new());
    let handles = storage.init(&config()).unwrap();
    let mut rx = RegionReader::attach(&handles).unwrap();
    let arbiter = RegionArbiter::new(&handles, PageLayout::Div1).unwrap();
    let mut w: TraceWriter<_> = TraceWriter::new(arbiter, 1, 1).unwrap();
    // Packets leaving fewer than 12 bytes of a chunk: one chunk each,
    // committed when the next packet starts. The third commit finds both
    // slots taken.
    let blob = [0u8; 4066];
    for _ in 0..4 {
        assert_eq!(
            w.write_packet(|p| p.bytes(2, &blob)),
            PacketOutcome::Written
        );
    }
    let counters = handles.control.counters();
    assert_eq!((counters.ring_head, counters.ring_overflows), (2, 1));
    // The ring's two chunks, then the third found by the scan; the fourth
    // chunk is still being written.
    let ev = drain(&mut rx);
    let ids: Vec<u32> = ev.iter().map(|e| chunk(e).0.chunk_id).collect();
    assert_eq!(ids, [0, 1, 2]);
    let stats = rx.stats();
    assert_eq!(
        (stats.chunks, stats.chunks_scanned, stats.ring_overflows),
        (3, 1, 1)
    );
    // A scanned chunk is copied whole (no slot said how much was used).
    assert_eq!(chunk(&ev[2]).1.len(), 4088 - 8);
    // Size field, tag, length, blob, pad: the bytes used.
    assert_eq!(chunk(&ev[1]).1.len(), 4 + 1 + 2 + 4066 + 1);
    assert_eq!(w.write_packet(|p| p.uint64(8, 1)), PacketOutcome::Written);
    w.flush();
    let ev = drain(&mut rx);
    // The fourth chunk, and the fifth the last packet needed.
    assert_eq!(
        ev.iter().map(|e| chunk(e).0.chunk_id).collect::<Vec<_>>(),
        [3, 4]
    );
}

#[test]
fn a_leaked_packet_handle_is_finished_by_the_next_packet() {
    let mut storage = Box::new(RegionStorage::<4096, 16>::new());
    let handles = storage.init(&config()).unwrap();
    let mut rx = RegionReader::attach(&handles).unwrap();
    let arbiter = RegionArbiter::new(&handles, PageLayout::Div1).unwrap();
    let mut w: TraceWriter<_> = TraceWriter::new(arbiter, 1, 1).unwrap();
    let mut p = w.new_packet();
    p.uint64(8, 1);
    let child = p.begin_nested(11);
    core::mem::forget(child);
    core::mem::forget(p);
    assert_eq!(w.write_packet(|p| p.uint64(8, 2)), PacketOutcome::Written);
    assert_eq!(w.stats().packets_written, 2);
    w.flush();
    let ev = drain(&mut rx);
    let (h, p) = chunk(&ev[0]);
    assert_eq!(
        data_fragments(p, h.packets),
        [
            std::vec![0xB8, 0x05, 0x01, 0x40, 0x01, 0x5A, 0x00],
            std::vec![0x40, 0x02]
        ]
    );
}

#[test]
fn region_arbiter_rejects_layouts_without_chunks() {
    let mut storage = Box::new(RegionStorage::<4096, 2>::new());
    let handles = storage.init(&config()).unwrap();
    for layout in [PageLayout::NotPartitioned, PageLayout::Reserved1] {
        assert_eq!(
            RegionArbiter::new(&handles, layout).err(),
            Some(crate::region::ArbiterError::LayoutWithoutChunks(layout))
        );
    }
}

#[test]
fn drained_chunks_parse_as_whole_copied_chunks() {
    let mut storage = Box::new(RegionStorage::<4096, 16>::new());
    let handles = storage.init(&config()).unwrap();
    let mut rx = RegionReader::attach(&handles).unwrap();
    let arbiter = RegionArbiter::new(&handles, PageLayout::Div7).unwrap();
    let mut w: TraceWriter<_> = TraceWriter::new(arbiter, 4, 9).unwrap();
    assert_eq!(w.write_packet(|p| p.uint64(8, 7)), PacketOutcome::Written);
    w.flush();
    let mut buf = [0u8; 4088];
    let Some(Record::Chunk(c)) = rx.poll(&mut buf).unwrap() else {
        panic!("expected a chunk")
    };
    assert_eq!(c.location, ChunkLocation { page: 0, chunk: 0 });
    assert!(c.announced);
    // Header + the 6 bytes used (5-byte packet behind a 1-byte size) + the
    // pad of the inflated count.
    assert_eq!(c.bytes.len(), 8 + 7);
    let (parsed, frags) = Fragments::from_chunk(c.bytes).unwrap();
    assert_eq!(parsed, c.header);
    let data: Vec<_> = frags
        .map(|f| match f.unwrap() {
            FragmentEvent::Data(f) => f.data.to_vec(),
            FragmentEvent::Dropped(_) => panic!(),
        })
        .collect();
    assert_eq!(data, [std::vec![0xB8, 0x05, 0x01, 0x40, 0x07]]);
    assert!(rx.poll(&mut buf).unwrap().is_none());
    assert_eq!(rx.stats().chunks, 1);
    // The chunk is free again, the page unpartitioned.
    assert!(handles.smb.is_page_free(0));
}

#[test]
fn a_scraper_sees_every_finished_packet() {
    let mut storage = Box::new(RegionStorage::<4096, 16>::new());
    let handles = storage.init(&config()).unwrap();
    let mut _rx = RegionReader::attach(&handles).unwrap();
    let arbiter = RegionArbiter::new(&handles, PageLayout::Div1).unwrap();
    let mut w: TraceWriter<_> = TraceWriter::new(arbiter, 1, 1).unwrap();
    fn scrape<'s, A: ChunkArbiter<'s>>(w: &TraceWriter<'s, A>) -> (u16, Vec<Vec<u8>>) {
        let (packets, payload) = w.enc.sink().snapshot().unwrap();
        let frags = Fragments::new_incomplete(&payload, packets)
            .map(|f| match f.unwrap() {
                FragmentEvent::Data(f) => f.data.to_vec(),
                FragmentEvent::Dropped(_) => panic!(),
            })
            .collect();
        (packets.count(), frags)
    }
    assert_eq!(w.write_packet(|p| p.uint64(8, 1)), PacketOutcome::Written);
    // Count inflated right after the packet: 1 finished + 1 reserved slot.
    let (count, frags) = scrape(&w);
    assert_eq!(count, 2);
    assert_eq!(frags, [std::vec![0xB8, 0x05, 0x01, 0x40, 0x01]]);
    // The next packet reuses the slot (no store), then inflates again.
    let mut p = w.new_packet();
    p.uint64(8, 2);
    drop(p);
    let (count, frags) = scrape(&w);
    assert_eq!(count, 3);
    assert_eq!(frags.len(), 2);
    assert_eq!(frags[1], [0x40, 0x02]);
}

/// Records the order in which a writer talks to its arbiter.
struct OrderLog<A> {
    inner: A,
    calls: Vec<&'static str>,
}

impl<'s, A: ChunkArbiter<'s>> ChunkArbiter<'s> for OrderLog<A> {
    fn acquire_chunk(&mut self, header: ChunkHeaderRepr) -> Option<WritableChunk<'s>> {
        self.calls.push("acquire");
        self.inner.acquire_chunk(header)
    }

    fn commit_chunk(&mut self, chunk: WritableChunk<'s>, target_buffer: BufferId) {
        self.calls.push("commit");
        self.inner.commit_chunk(chunk, target_buffer)
    }

    fn send_patches(&mut self, group: &PatchGroup<'_>) -> Result<(), PatchesDeferred> {
        self.inner.send_patches(group)
    }

    fn flush(&mut self) {
        self.inner.flush()
    }
}

#[test]
fn a_full_chunk_is_returned_before_the_next_one_is_requested() {
    // Hold-and-wait would let N stalling writers hold N full chunks while
    // each waits for a free one; between packets the old chunk must go back
    // first.
    let mut storage = Box::new(RegionStorage::<8192, 16>::new());
    let handles = storage.init(&config()).unwrap();
    let mut _rx = RegionReader::attach(&handles).unwrap();
    let inner = RegionArbiter::new(&handles, PageLayout::Div1).unwrap();
    let log = OrderLog {
        inner,
        calls: Vec::new(),
    };
    let mut w: TraceWriter<_> = TraceWriter::new(log, 1, 1).unwrap();
    // 4 (size) + 1 (tag) + 2 (length) + 4066 bytes leave 7 of the 4080
    // payload bytes: fewer than 12, so the next packet needs a new chunk.
    let blob = [0x44u8; 4066];
    assert_eq!(
        w.write_packet(|p| p.bytes(2, &blob)),
        PacketOutcome::Written
    );
    assert_eq!(w.write_packet(|p| p.uint64(8, 1)), PacketOutcome::Written);
    assert_eq!(w.arbiter().calls, ["acquire", "commit", "acquire"]);
}

/// Fragments of a chunk payload as a reader parses them (sentinels as
/// `None`), complete chunks or (`incomplete`) a scraped one.
fn fragments(payload: &[u8], p: Packets, incomplete: bool) -> Vec<Option<Vec<u8>>> {
    let frags = if incomplete {
        Fragments::new_incomplete(payload, p)
    } else {
        Fragments::new(payload, p)
    };
    frags
        .map(|f| match f.unwrap() {
            FragmentEvent::Data(f) => Some(f.data.to_vec()),
            FragmentEvent::Dropped(_) => None,
        })
        .collect()
}

/// One step of [`encoded_packets_match_the_general_path`].
#[derive(Debug, Clone)]
enum Step {
    Packet(Vec<u8>),
    Flush,
    Drain,
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        12 => proptest::collection::vec(any::<u8>(), 0..140).prop_map(Step::Packet),
        1 => proptest::collection::vec(any::<u8>(), 120..600).prop_map(Step::Packet),
        1 => Just(Step::Flush),
        2 => Just(Step::Drain),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config {
        cases: if cfg!(miri) { 2 } else { 64 },
        failure_persistence: None,
        ..Default::default()
    })]

    /// `write_encoded_packet` (its one-copy fast path included) and
    /// `write_small_packet_in_place` leave the same chunks, headers, flags
    /// and patches as `write_packet` with the same bytes, through chunk switches, fragmentation, the 1022-fragment
    /// and 12-byte rules, and an exhausted SMB.
    #[test]
    fn encoded_packets_match_the_general_path(
        steps in proptest::collection::vec(step(), 1..if cfg!(miri) { 12 } else { 300 }),
        layout in proptest::sample::select(&[PageLayout::Div1, PageLayout::Div4, PageLayout::Div14][..]),
    ) {
        let mut sa = Box::new(RegionStorage::<16384, 64>::new());
        let mut sb = Box::new(RegionStorage::<16384, 64>::new());
        let ha = sa.init(&config()).unwrap();
        let hb = sb.init(&config()).unwrap();
        let mut ra = RegionReader::attach(&ha).unwrap();
        let mut rb = RegionReader::attach(&hb).unwrap();
        let mut a: TraceWriter<_> =
            TraceWriter::new(RegionArbiter::new(&ha, layout).unwrap(), 3, 1).unwrap();
        let mut b: TraceWriter<_> =
            TraceWriter::new(RegionArbiter::new(&hb, layout).unwrap(), 3, 1).unwrap();
        // What a reader sees: headers, locations, patches and the parsed
        // fragments (bytes past the last fragment are scratch space).
        let dump = |ev: Vec<Ev>| {
            ev.iter()
                .map(|e| match e {
                    Ev::Chunk { header, location, payload } => std::format!(
                        "{header:?} {location:?} {:?}",
                        fragments(payload, header.packets, false)
                    ),
                    Ev::Patch(p) => std::format!("{p:?}"),
                })
                .collect::<Vec<_>>()
        };
        let scraped = |s: Option<(Packets, Vec<u8>)>| {
            s.map(|(p, payload)| (p, fragments(&payload, p, true)))
        };
        for s in &steps {
            match s {
                Step::Packet(bytes) => {
                    let ob = b.write_packet(|p| p.raw(bytes));
                    // Writer A encodes every other packet in place, in
                    // 8-byte words (the last one padded with garbage past the
                    // packet) or byte by byte; longer ones wrap around the
                    // window and must be refused. It falls back to a padded
                    // scratch buffer.
                    let in_place = bytes.len() % 2 == 0
                        && a.write_small_packet_in_place(|c| {
                            if bytes.len() % 4 == 0 {
                                for &byte in bytes.iter() {
                                    c.byte(byte);
                                }
                            } else {
                                for part in bytes.chunks(8) {
                                    let mut word = [0xEE; 8];
                                    word[..part.len()].copy_from_slice(part);
                                    c.word(u64::from_le_bytes(word), part.len());
                                }
                            }
                            true
                        });
                    if in_place {
                        proptest::prop_assert!(bytes.len() <= 127);
                        proptest::prop_assert_eq!(ob, PacketOutcome::Written);
                    } else {
                        let mut scratch = std::vec![0xEEu8; bytes.len().max(PADDED_COPY_LEN)];
                        scratch[..bytes.len()].copy_from_slice(bytes);
                        let oa = a.write_encoded_packet_in(&scratch, bytes.len());
                        proptest::prop_assert_eq!(oa, ob);
                    }
                }
                Step::Flush => {
                    a.flush();
                    b.flush();
                }
                Step::Drain => {
                    proptest::prop_assert_eq!(dump(drain(&mut ra)), dump(drain(&mut rb)));
                }
            }
            // (Scraping every step is too slow under miri.)
            if !cfg!(miri) {
                proptest::prop_assert_eq!(
                    scraped(a.enc.sink().snapshot()),
                    scraped(b.enc.sink().snapshot())
                );
            }
        }
        a.flush();
        b.flush();
        proptest::prop_assert_eq!(dump(drain(&mut ra)), dump(drain(&mut rb)));
        proptest::prop_assert_eq!(a.stats(), b.stats());
    }
}

#[test]
fn in_place_packets_wait_for_a_general_one_and_stop_at_1022_fragments() {
    let mut storage = Box::new(RegionStorage::<8192, 16>::new());
    let handles = storage.init(&config()).unwrap();
    let mut rx = RegionReader::attach(&handles).unwrap();
    let arbiter = RegionArbiter::new(&handles, PageLayout::Div1).unwrap();
    let mut w: TraceWriter<_> = TraceWriter::new(arbiter, 1, 1).unwrap();
    fn fast<'a>(w: &mut TraceWriter<'a, RegionArbiter<'a>>, v: u8) -> bool {
        w.write_small_packet_in_place(|c| {
            c.byte(0x40);
            c.byte(v);
            true
        })
    }
    fn general<'a>(w: &mut TraceWriter<'a, RegionArbiter<'a>>, v: u8) {
        assert_eq!(w.write_encoded_packet(&[0x40, v]), PacketOutcome::Written);
    }
    // No chunk yet, then the sequence's first packet goes first.
    assert!(!fast(&mut w, 0));
    general(&mut w, 0);
    assert!(fast(&mut w, 1));
    // A packet left open (a leaked handle) is finished by the next general
    // packet: refused until then.
    core::mem::forget(w.new_packet());
    assert!(!fast(&mut w, 2));
    general(&mut w, 2);
    assert!(fast(&mut w, 3));
    // A loss goes on the next packet: refused until a general one took it.
    assert_eq!(
        w.write_encoded_packet_in(&[0x40], 2),
        PacketOutcome::Dropped(DropReason::PacketTooLong)
    );
    assert!(!fast(&mut w, 4));
    general(&mut w, 4);
    // 3-byte fragments: the count's budget (about a kilobyte) is spent and
    // worked out again a few times; the chunk's 1022nd fragment is the
    // last one the fast path writes.
    let mut written = 0;
    while fast(&mut w, 5) {
        written += 1;
    }
    assert_eq!(written, 1022 - 6);
    general(&mut w, 6);
    assert!(fast(&mut w, 7));
    w.flush();
    let stats = w.stats();
    assert_eq!((stats.packets_written, stats.packets_dropped()), (1024, 1));
    let ev = drain(&mut rx);
    assert_eq!(ev.len(), 2);
    let (h0, p0) = chunk(&ev[0]);
    assert_eq!(h0.packets, packets(1023, 0));
    // 1022 fragments and the pad; the leaked packet's is empty, which
    // readers skip as padding.
    let f0 = data_fragments(p0, h0.packets);
    assert_eq!(f0.len(), 1021);
    assert_eq!(
        f0[..6],
        [
            [&FIRST[..], &[0x40, 0]].concat(),
            std::vec![0x40, 1],
            std::vec![0x40, 2],
            std::vec![0x40, 3],
            std::vec![0xD0, 0x02, 0x01, 0x40, 4],
            std::vec![0x40, 5],
        ]
    );
    assert!(f0[5..].iter().all(|f| f[..] == [0x40, 5]));
    let (h1, p1) = chunk(&ev[1]);
    assert_eq!(h1.packets, packets(3, 0));
    assert_eq!(data_fragments(p1, h1.packets), [[0x40, 6], [0x40, 7]]);
}

#[test]
fn in_place_writer_counts_the_packets_of_committed_chunks() {
    let mut storage = Box::new(RegionStorage::<8192, 16>::new());
    let handles = storage.init(&config()).unwrap();
    let mut rx = RegionReader::attach(&handles).unwrap();
    let arbiter = RegionArbiter::new(&handles, PageLayout::Div4).unwrap();
    let mut w = InPlaceWriter::new(arbiter, 1, 1).unwrap();
    for i in 0..3u64 {
        assert_eq!(w.write(|p| p.uint(8, i)), PacketOutcome::Written);
    }
    assert_eq!(w.stats().packets_written, 3);
    w.flush();
    assert_eq!(
        w.stats().packets_written,
        3,
        "after the chunk was committed"
    );
    for i in 0..2u64 {
        assert_eq!(w.write(|p| p.uint(8, i)), PacketOutcome::Written);
    }
    w.flush();
    let stats = w.stats();
    assert_eq!((stats.packets_written, stats.chunks_committed), (5, 2));
    let read: usize = drain(&mut rx)
        .iter()
        .map(|ev| {
            let (h, p) = chunk(ev);
            data_fragments(p, h.packets).len()
        })
        .sum();
    assert_eq!(read, 5);
}

#[test]
fn in_place_fast_path_waits_for_a_packet_after_a_hold_or_a_loss() {
    let mut storage = Box::new(RegionStorage::<8192, 16>::new());
    let handles = storage.init(&config()).unwrap();
    let arbiter = RegionArbiter::new(&handles, PageLayout::Div4).unwrap();
    let mut w = InPlaceWriter::new(arbiter, 1, 1).unwrap();
    fn fast<'a>(w: &mut InPlaceWriter<'a, RegionArbiter<'a>>) -> bool {
        w.write_fast(|p| p.uint(8, 1))
    }
    // No chunk yet, then the sequence's first packet goes first.
    assert!(!fast(&mut w));
    assert_eq!(w.write(|p| p.uint(8, 0)), PacketOutcome::Written);
    assert!(fast(&mut w));
    // Held: refused; released: refused until the next packet `write_dyn`
    // writes, which sets the limit again.
    w.hold_fast_path(true);
    assert!(!fast(&mut w));
    w.hold_fast_path(false);
    assert!(!fast(&mut w));
    assert_eq!(w.write(|p| p.uint(8, 0)), PacketOutcome::Written);
    assert!(fast(&mut w));
    // A loss goes on the next packet: refused until `write_dyn` wrote it.
    w.count_dropped(DropReason::PacketTooLong);
    assert!(!fast(&mut w));
    assert!(w.loss_pending());
    assert_eq!(w.write(|p| p.uint(8, 0)), PacketOutcome::Written);
    assert!(!w.loss_pending());
    assert!(fast(&mut w));
    assert_eq!(w.stats().packets_written, 6);
    // Three by the fast path, three by `write_dyn`.
    assert_eq!(w.fast_packets(), 3);
}
