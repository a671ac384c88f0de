//! Chunk forwarding ([`crate::ChunkForwarder`]) against the loopback
//! service: chunks written by an abi `TraceWriter` over a private SMB (as
//! a firmware would) are forwarded, and the service side reassembles,
//! patches and decodes them.

use std::cell::RefCell;

use prost::Message as _;
use shmtrace_abi::layout::{ChunkFlags, ChunkHeaderRepr, PageLayout, PageSize};
use shmtrace_abi::proto::{encode_to_slice, Message, Sink};
use shmtrace_abi::smb::{Smb, SmbStorage, WritableChunk};
use shmtrace_abi::writer::{BufferId, ChunkArbiter, PatchGroup, PatchesDeferred, TraceWriter};

use super::loopback::{serial, Loopback};
use crate::connection::outbox::Outgoing;
use crate::runtime::runtime;
use crate::test_schema as ts;
use crate::{
    ChunkForwarder, DataSourceConfig, DataSourceHandler, DataSourceOptions, ForwardError,
    ForwardPatch, InstanceArgs, NoopHandler,
};

/// What a source writer committed, in order.
#[derive(Debug, Clone)]
enum SourceEvent {
    Chunk(Vec<u8>),
    Patches {
        chunk_id: u32,
        patches: Vec<ForwardPatch>,
        has_more: bool,
    },
}

/// A `ChunkArbiter` over a private SMB that records every committed chunk
/// (copied out and freed at once) and patch group.
struct Recorder<'s> {
    smb: &'s Smb<'s>,
    layout: PageLayout,
    events: &'s RefCell<Vec<SourceEvent>>,
}

impl<'s> ChunkArbiter<'s> for Recorder<'s> {
    fn acquire_chunk(&mut self, header: ChunkHeaderRepr) -> Option<WritableChunk<'s>> {
        self.smb
            .try_acquire_any_chunk_for_writing(0, self.layout, header)
            .ok()
    }

    fn commit_chunk(&mut self, chunk: WritableChunk<'s>, _target: BufferId) {
        let loc = chunk.release_as_complete().unwrap();
        let r = self
            .smb
            .try_acquire_chunk_for_reading(loc.page, loc.chunk)
            .unwrap();
        let mut buf = vec![0u8; r.chunk_size()];
        let n = r.copy_out(&mut buf).unwrap().len;
        buf.truncate(n);
        r.release_as_free().unwrap();
        self.events.borrow_mut().push(SourceEvent::Chunk(buf));
    }

    fn send_patches(&mut self, group: &PatchGroup<'_>) -> Result<(), PatchesDeferred> {
        self.events.borrow_mut().push(SourceEvent::Patches {
            chunk_id: group.chunk_id,
            patches: group
                .patches()
                .map(|p| ForwardPatch {
                    offset: u32::from(p.offset),
                    data: p.data,
                })
                .collect(),
            has_more: group.has_more,
        });
        Ok(())
    }

    fn flush(&mut self) {}
}

type SourceWriter<'s> = TraceWriter<'s, Recorder<'s>>;

/// Runs `f` with a writer over a private 64 KiB SMB of `page_size` pages
/// split with `layout`; returns what it committed.
fn source_events(
    page_size: usize,
    layout: PageLayout,
    f: impl FnOnce(&mut SourceWriter<'_>),
) -> Vec<SourceEvent> {
    let mut storage = Box::new(SmbStorage::<{ 64 * 1024 }>::new());
    let smb = Smb::new(&mut storage, PageSize::new(page_size).unwrap()).unwrap();
    let events = RefCell::new(Vec::new());
    {
        let arbiter = Recorder {
            smb: &smb,
            layout,
            events: &events,
        };
        let mut w = TraceWriter::new(arbiter, 7, 1).unwrap();
        f(&mut w);
        w.flush();
    }
    events.into_inner()
}

/// Packet `i`: `timestamp = i` and, for a big one, `for_testing` holding a
/// nested message (field 1: `len` bytes of `i`): nested, so a chunk
/// boundary inside it leaves a size field to patch.
fn write_packet<S: Sink>(p: &mut Message<'_, S>, i: u64, len: usize) {
    p.uint64(8, i);
    if len > 0 {
        p.nested(900, |n| n.bytes(1, &vec![i as u8; len]));
    }
}

/// What [`write_packet`] wrote in `for_testing`.
fn nested_body(i: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len + 8];
    let n = encode_to_slice(&mut buf, |m| m.bytes(1, &vec![i as u8; len])).unwrap();
    buf.truncate(n);
    buf
}

/// Source: small packet 0, 1500-byte packet 1 (spans three 584-byte
/// chunks, with patches), small packet 2.
fn spanning_source() -> Vec<SourceEvent> {
    source_events(4096, PageLayout::Div7, |w| {
        for (i, len) in [(0, 0), (1, 1500), (2, 0)] {
            let _ = w.write_packet(|p| write_packet(p, i, len));
        }
    })
}

fn start(id: u64, name: &str, buffer: u32) {
    let config = DataSourceConfig {
        name: name.into(),
        target_buffer: buffer,
        ..Default::default()
    };
    assert!(runtime().setup_data_source(id, config));
    runtime().start_data_source(id);
}

/// The chunks of `source`, which must hold nothing else (no patches).
fn chunks_only(source: &[SourceEvent]) -> Vec<Vec<u8>> {
    source
        .iter()
        .map(|e| match e {
            SourceEvent::Chunk(c) => c.clone(),
            other => panic!("{other:?}"),
        })
        .collect()
}

fn forward_all(seq: &mut crate::ForwardedSequence, events: &[SourceEvent]) {
    for e in events {
        match e {
            SourceEvent::Chunk(c) => {
                seq.forward_chunk(c).unwrap();
            }
            SourceEvent::Patches {
                chunk_id,
                patches,
                has_more,
            } => {
                seq.forward_patches(*chunk_id, patches, *has_more);
            }
        }
    }
}

fn decoded(lb: &Loopback) -> Vec<(u32, Vec<ts::TracePacket>)> {
    lb.sequences()
        .into_iter()
        .map(|(w, s)| {
            assert_eq!((s.dropped, s.gaps), (0, 0), "writer {w}: {s:?}");
            let packets = s
                .packets
                .iter()
                .map(|b| ts::TracePacket::decode(&b[..]).unwrap())
                .collect();
            (w, packets)
        })
        .collect()
}

/// A clock snapshot packet, as a bridge injects one.
fn snapshot(fw: u64) -> Vec<u8> {
    let mut buf = [0u8; 64];
    let n = encode_to_slice(&mut buf, |p| {
        p.nested(6, |s| {
            s.nested(1, |c| {
                c.uint32(1, 65);
                c.uint64(2, fw);
            });
            s.nested(1, |c| {
                c.uint32(1, 6);
                c.uint64(2, fw + 1000);
            });
        });
    })
    .unwrap();
    buf[..n].to_vec()
}

/// Each packet as `snap <firmware time>` (a [`snapshot`]), `data <i>` (a
/// [`write_packet`]) or `?` (the start packet).
fn kinds(packets: &[ts::TracePacket]) -> Vec<String> {
    packets
        .iter()
        .map(|p| match (&p.clock_snapshot, p.timestamp) {
            (Some(s), _) => format!("snap {}", s.clocks[0].timestamp.unwrap()),
            (None, Some(t)) => format!("data {t}"),
            _ => "?".into(),
        })
        .collect()
}

fn registered_writers(lb: &Loopback) -> Vec<(u32, u32)> {
    lb.received()
        .messages
        .iter()
        .filter_map(|m| match m {
            Outgoing::RegisterTraceWriter {
                writer_id,
                target_buffer,
            } => Some((*writer_id, *target_buffer)),
            _ => None,
        })
        .collect()
}

#[test]
fn forwarded_chunks_reach_the_session_whole_with_their_patches() {
    let _s = serial();
    let source = spanning_source();
    let chunks = source
        .iter()
        .filter(|e| matches!(e, SourceEvent::Chunk(_)))
        .count();
    let patch_groups = source
        .iter()
        .filter(|e| matches!(e, SourceEvent::Patches { .. }))
        .count();
    assert!(chunks >= 3 && patch_groups >= 1, "{source:?}");
    for emulated in [false, true] {
        let lb = Loopback::new(64 * 1024, PageLayout::Div1, emulated);
        let name = format!("test.fw.whole.{emulated}");
        let fw =
            ChunkForwarder::register(&name, DataSourceOptions::default(), NoopHandler).unwrap();
        start(301, &name, 5);
        let mut seq = fw.new_sequence();
        seq.set_injected_packet(&snapshot(500)).unwrap();
        forward_all(&mut seq, &source);
        lb.drain();
        let seqs = decoded(&lb);
        assert_eq!(seqs.len(), 1);
        let (writer, packets) = &seqs[0];
        assert_eq!(registered_writers(&lb), [(*writer, 5)]);
        assert_eq!(lb.received().chunk_targets[writer], 5);
        // The start packet: the injected snapshot, first on the sequence.
        assert_eq!(packets.len(), 4, "{packets:?}");
        assert_eq!(packets[0].first_packet_on_sequence, Some(true));
        let clocks = &packets[0].clock_snapshot.as_ref().unwrap().clocks;
        assert_eq!(
            clocks
                .iter()
                .map(|c| (c.clock_id.unwrap(), c.timestamp.unwrap()))
                .collect::<Vec<_>>(),
            [(65, 500), (6, 1500)]
        );
        // Then the source's packets, the spanning one patched whole.
        assert_eq!(packets[1].first_packet_on_sequence, Some(true));
        let stamps: Vec<_> = packets[1..].iter().map(|p| p.timestamp).collect();
        assert_eq!(stamps, [Some(0), Some(1), Some(2)]);
        assert_eq!(
            packets[2].for_testing.as_deref(),
            Some(&nested_body(1, 1500)[..])
        );
        let stats = fw.stats();
        assert_eq!(stats.chunks_forwarded, chunks as u64);
        assert_eq!(stats.packets_injected, 1);
        assert_eq!(stats.patches_dropped, 0);
        assert!(stats.patches_forwarded >= 1);
        assert_eq!(lb.received().patches_applied, patch_groups);
        runtime().stop_data_source(301);
        lb.shutdown();
    }
}

#[test]
fn chunks_without_a_session_are_dropped_and_counted() {
    let _s = serial();
    let lb = Loopback::new(64 * 1024, PageLayout::Div1, false);
    let fw = ChunkForwarder::register(
        "test.fw.nosession",
        DataSourceOptions::default(),
        NoopHandler,
    )
    .unwrap();
    let source = spanning_source();
    let mut seq = fw.new_sequence();
    let SourceEvent::Chunk(first) = &source[0] else {
        panic!()
    };
    assert_eq!(seq.forward_chunk(first), Err(ForwardError::NoSession));
    assert_eq!(
        seq.forward_chunk(&[1, 2, 3]),
        Err(ForwardError::Invalid(
            shmtrace_abi::reader::ChunkError::HeaderTruncated { len: 3 }
        ))
    );
    let stats = fw.stats();
    assert_eq!(
        (
            stats.chunks_received,
            stats.chunks_no_session,
            stats.chunks_invalid
        ),
        (2, 1, 1)
    );
    lb.drain();
    assert!(lb.sequences().is_empty());
    lb.shutdown();
}

#[test]
fn a_session_starting_mid_packet_gets_whole_packets_only() {
    let _s = serial();
    let lb = Loopback::new(64 * 1024, PageLayout::Div1, false);
    let fw = ChunkForwarder::register(
        "test.fw.midpacket",
        DataSourceOptions::default(),
        NoopHandler,
    )
    .unwrap();
    let source = spanning_source();
    let mut seq = fw.new_sequence();
    // The first chunk (packet 0 and the start of packet 1) goes before the
    // session starts.
    let SourceEvent::Chunk(first) = &source[0] else {
        panic!()
    };
    assert_eq!(seq.forward_chunk(first), Err(ForwardError::NoSession));
    start(302, "test.fw.midpacket", 2);
    forward_all(&mut seq, &source[1..]);
    lb.drain();
    let seqs = decoded(&lb);
    let (_, packets) = &seqs[0];
    // Start packet, then packet 2: the pieces of packet 1 are dropped.
    let stamps: Vec<_> = packets.iter().map(|p| p.timestamp).collect();
    assert_eq!(stamps, [None, Some(2)], "{packets:?}");
    assert_eq!(packets[0].first_packet_on_sequence, Some(true));
    let stats = fw.stats();
    assert!(stats.orphan_fragments_dropped >= 2, "{stats:?}");
    assert!(stats.chunks_skipped >= 1, "{stats:?}");
    assert!(stats.patches_dropped >= 1, "{stats:?}");
    runtime().stop_data_source(302);
    lb.shutdown();
}

#[test]
fn a_lost_chunk_is_marked_on_the_next_packet_of_the_same_lane() {
    let _s = serial();
    let lb = Loopback::new(64 * 1024, PageLayout::Div1, false);
    let fw =
        ChunkForwarder::register("test.fw.gap", DataSourceOptions::default(), NoopHandler).unwrap();
    start(303, "test.fw.gap", 3);
    // Six small packets, one per chunk (each flushed).
    let source = source_events(4096, PageLayout::Div7, |w| {
        for i in 0..6 {
            let _ = w.write_packet(|p| write_packet(p, i, 0));
            w.flush();
        }
    });
    let chunks = chunks_only(&source);
    let mut seq = fw.new_sequence();
    seq.set_injected_packet(&snapshot(5)).unwrap();
    for (i, c) in chunks.iter().enumerate() {
        if i != 3 {
            seq.forward_chunk(c).unwrap();
        }
    }
    lb.drain();
    let seqs = decoded(&lb);
    assert_eq!(seqs.len(), 1, "the same writer goes on");
    let packets = &seqs[0].1;
    let stamps: Vec<_> = packets.iter().map(|p| p.timestamp).collect();
    assert_eq!(
        stamps,
        [None, Some(0), Some(1), Some(2), None, Some(4), Some(5)]
    );
    assert_eq!(packets[0].first_packet_on_sequence, Some(true));
    assert_eq!(packets[4].previous_packet_dropped, Some(1));
    let stats = fw.stats();
    assert_eq!((stats.losses_marked, stats.lanes_restarted), (1, 0));
    runtime().stop_data_source(303);
    lb.shutdown();
}

/// A lane that starts with packets needing incremental state the source
/// set before the session (it saw the session's clear late) marks a loss
/// before them; one that starts at the source's clear marks none.
#[test]
fn a_lane_starting_before_the_sources_clear_marks_a_loss() {
    let _s = serial();
    let lb = Loopback::new(64 * 1024, PageLayout::Div1, false);
    let fw = ChunkForwarder::register("test.fw.state", DataSourceOptions::default(), NoopHandler)
        .unwrap();
    start(306, "test.fw.state", 3);
    // Packet 0 needs the incremental state, packet 1 clears it, packet 2
    // needs it: one per chunk.
    const CLEARED: u64 = 1;
    const NEEDS: u64 = 2;
    let source = source_events(4096, PageLayout::Div7, |w| {
        for (i, flags) in [(0, NEEDS), (1, CLEARED), (2, NEEDS)] {
            let _ = w.write_packet(|p| {
                write_packet(p, i, 0);
                p.uint64(13, flags);
            });
            w.flush();
        }
    });
    let chunks = chunks_only(&source);
    // From the packet that needs the state: a loss before it.
    let mut seq = fw.new_sequence();
    for c in &chunks {
        seq.forward_chunk(c).unwrap();
    }
    // From the clear: no loss.
    let mut from_clear = fw.new_sequence();
    for c in &chunks[1..] {
        from_clear.forward_chunk(c).unwrap();
    }
    lb.drain();
    let seqs = decoded(&lb);
    assert_eq!(seqs.len(), 2);
    let marks = |packets: &[ts::TracePacket]| -> Vec<Option<u64>> {
        packets.iter().map(|p| p.timestamp).collect()
    };
    let (first, second) = (&seqs[0].1, &seqs[1].1);
    // Start packet, the loss mark, then packets 0, 1, 2.
    assert_eq!(marks(first), [None, None, Some(0), Some(1), Some(2)]);
    assert_eq!(first[1].previous_packet_dropped, Some(1));
    assert_eq!(marks(second), [None, Some(1), Some(2)]);
    assert!(second.iter().all(|p| p.previous_packet_dropped.is_none()));
    assert_eq!(fw.stats().losses_marked, 1);
    runtime().stop_data_source(306);
    lb.shutdown();
}

#[test]
fn a_loss_marked_at_the_end_is_one_more_chunk_of_the_same_lane() {
    let _s = serial();
    let lb = Loopback::new(64 * 1024, PageLayout::Div1, false);
    let fw =
        ChunkForwarder::register("test.fw.end", DataSourceOptions::default(), NoopHandler).unwrap();
    start(309, "test.fw.end", 3);
    let source = source_events(4096, PageLayout::Div7, |w| {
        for i in 0..2 {
            let _ = w.write_packet(|p| write_packet(p, i, 0));
            w.flush();
        }
    });
    let mut seq = fw.new_sequence();
    forward_all(&mut seq, &source);
    assert_eq!(seq.mark_loss(Some(310)), 0, "another instance's lanes only");
    assert_eq!(seq.mark_loss(Some(309)), 1);
    lb.drain();
    // One writer, its chunk ids contiguous (`decoded` checks: no gap), the
    // mark its last packet.
    let seqs = decoded(&lb);
    assert_eq!(seqs.len(), 1, "the same writer goes on");
    let packets = &seqs[0].1;
    let stamps: Vec<_> = packets.iter().map(|p| p.timestamp).collect();
    assert_eq!(stamps, [None, Some(0), Some(1), None]);
    assert_eq!(packets[3].previous_packet_dropped, Some(1));
    assert_eq!(fw.stats().losses_marked, 1);
    runtime().stop_data_source(309);
    lb.shutdown();
}

#[test]
fn a_loss_that_leaves_a_packet_open_starts_a_new_writer() {
    let _s = serial();
    let lb = Loopback::new(64 * 1024, PageLayout::Div1, false);
    let fw = ChunkForwarder::register(
        "test.fw.gap.open",
        DataSourceOptions::default(),
        NoopHandler,
    )
    .unwrap();
    start(308, "test.fw.gap.open", 3);
    // Chunks: [p0, p1 begins] [p1 goes on] [p1 ends, p2]: the middle one
    // is lost, so p1 can never be completed.
    let source = spanning_source();
    let mut seq = fw.new_sequence();
    let mut chunk = 0;
    for e in &source {
        if let SourceEvent::Chunk(c) = e {
            chunk += 1;
            if chunk == 2 {
                continue;
            }
            seq.forward_chunk(c).unwrap();
        } else {
            forward_all(&mut seq, std::slice::from_ref(e));
        }
    }
    assert_eq!(chunk, 3);
    lb.drain();
    let seqs = lb.sequences();
    assert_eq!(seqs.len(), 2, "a new writer");
    let packets: Vec<Vec<ts::TracePacket>> = seqs
        .values()
        .map(|s| {
            s.packets
                .iter()
                .map(|b| ts::TracePacket::decode(&b[..]).unwrap())
                .collect()
        })
        .collect();
    // The old writer: its start and p0 (p1 never completes there).
    let stamps = |p: &[ts::TracePacket]| p.iter().map(|p| p.timestamp).collect::<Vec<_>>();
    assert_eq!(stamps(&packets[0]), [None, Some(0)]);
    // The new one: start, loss mark, p2.
    assert_eq!(stamps(&packets[1]), [None, None, Some(2)]);
    assert_eq!(packets[1][0].first_packet_on_sequence, Some(true));
    assert_eq!(packets[1][1].previous_packet_dropped, Some(1));
    let writers = registered_writers(&lb);
    assert_eq!(writers.len(), 2);
    assert!(lb.received().messages.iter().any(|m| matches!(
        m,
        Outgoing::UnregisterTraceWriter { writer_id } if *writer_id == writers[0].0
    )));
    let stats = fw.stats();
    assert_eq!((stats.losses_marked, stats.lanes_restarted), (1, 1));
    runtime().stop_data_source(308);
    lb.shutdown();
}

#[test]
fn injections_are_appended_or_prepended_with_patches_shifted() {
    let _s = serial();
    let lb = Loopback::new(64 * 1024, PageLayout::Div1, false);
    let fw = ChunkForwarder::register("test.fw.inject", DataSourceOptions::default(), NoopHandler)
        .unwrap();
    start(304, "test.fw.inject", 4);
    // Chunk A: packet 0 (flushed). B: packet 1, then the start of the
    // 1500-byte packet 2 (its nested size field left for a patch). C: the
    // middle of packet 2. D: its end, and packet 3.
    let source = source_events(4096, PageLayout::Div7, |w| {
        let _ = w.write_packet(|p| write_packet(p, 0, 0));
        w.flush();
        for (i, len) in [(1, 0), (2, 1500), (3, 0)] {
            let _ = w.write_packet(|p| write_packet(p, i, len));
        }
    });
    let chunks = source
        .iter()
        .filter(|e| matches!(e, SourceEvent::Chunk(_)))
        .count();
    assert_eq!(chunks, 4, "{source:?}");
    let mut seq = fw.new_sequence();
    let mut chunk = 0;
    for e in &source {
        if let SourceEvent::Chunk(_) = e {
            // Due before B (prepended: B's last packet goes on) and again
            // before C (which both continues and goes on: it waits for D,
            // whose last packet is whole: appended).
            if chunk == 1 || chunk == 2 {
                seq.set_injected_packet(&snapshot(7 + chunk)).unwrap();
            }
            chunk += 1;
        }
        forward_all(&mut seq, std::slice::from_ref(e));
    }
    lb.drain();
    let seqs = decoded(&lb);
    let (_, packets) = &seqs[0];
    let kinds = kinds(packets);
    assert_eq!(
        kinds,
        ["?", "data 0", "snap 8", "data 1", "data 2", "data 3", "snap 9"],
        "{packets:?}"
    );
    // B's patches were shifted past the prepended packet: packet 2 whole.
    assert_eq!(
        packets[4].for_testing.as_deref(),
        Some(&nested_body(2, 1500)[..])
    );
    let stats = fw.stats();
    assert_eq!(stats.packets_injected, 3);
    assert!(stats.patches_forwarded >= 1);
    assert_eq!(stats.patches_dropped, 0);
    assert!(lb.received().patches_applied >= 1);
    runtime().stop_data_source(304);
    lb.shutdown();
}

/// An injection due before a chunk that continues a packet and leaves
/// another open goes between its first fragment and the packet after it,
/// with the patches of the bytes after it shifted: a sequence whose
/// packets always span chunks still gets it.
#[test]
fn an_injection_goes_after_the_first_fragment_of_a_chunk_open_at_both_ends() {
    let _s = serial();
    let lb = Loopback::new(64 * 1024, PageLayout::Div1, false);
    let fw = ChunkForwarder::register("test.fw.middle", DataSourceOptions::default(), NoopHandler)
        .unwrap();
    start(310, "test.fw.middle", 4);
    // 584-byte chunks. A: the start of the 800-byte packet 0. B: its end,
    // packet 1, the start of the 1500-byte packet 2 (its nested size field
    // left for a patch). C, D: the rest of packet 2 and packet 3.
    let source = source_events(4096, PageLayout::Div7, |w| {
        for (i, len) in [(0, 800), (1, 0), (2, 1500), (3, 0)] {
            let _ = w.write_packet(|p| write_packet(p, i, len));
        }
    });
    let mut seq = fw.new_sequence();
    let mut chunk = 0;
    for e in &source {
        if let SourceEvent::Chunk(c) = e {
            if chunk == 1 {
                let header = ChunkHeaderRepr::from_bytes(c[..8].try_into().unwrap());
                let flags = header.packets.flags();
                assert!(
                    flags.contains(ChunkFlags::FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK)
                        && flags.contains(ChunkFlags::LAST_PACKET_CONTINUES_ON_NEXT_CHUNK)
                        && header.packets.count() == 3,
                    "chunk B: {header:?}"
                );
                seq.set_injected_packet(&snapshot(11)).unwrap();
            }
            chunk += 1;
        }
        forward_all(&mut seq, std::slice::from_ref(e));
    }
    lb.drain();
    let seqs = decoded(&lb);
    let (_, packets) = &seqs[0];
    let kinds = kinds(packets);
    assert_eq!(
        kinds,
        ["?", "data 0", "snap 11", "data 1", "data 2", "data 3"],
        "{packets:?}"
    );
    // Packets 0 and 2 whole: B's patch for packet 2 went past the snapshot.
    assert_eq!(
        packets[1].for_testing.as_deref(),
        Some(&nested_body(0, 800)[..])
    );
    assert_eq!(
        packets[4].for_testing.as_deref(),
        Some(&nested_body(2, 1500)[..])
    );
    let stats = fw.stats();
    assert_eq!(
        stats.packets_injected, 2,
        "the start packet and the snapshot"
    );
    assert!(stats.patches_forwarded >= 1);
    assert_eq!(stats.patches_dropped, 0);
    runtime().stop_data_source(310);
    lb.shutdown();
}

/// An injection due before a chunk of whole packets goes before them: the
/// packets of that chunk may be stamped after the time it states.
#[test]
fn an_injection_goes_before_a_chunk_of_whole_packets() {
    let _s = serial();
    let lb = Loopback::new(64 * 1024, PageLayout::Div1, false);
    let fw = ChunkForwarder::register("test.fw.before", DataSourceOptions::default(), NoopHandler)
        .unwrap();
    start(309, "test.fw.before", 4);
    // Three chunks of one whole packet each.
    let source = source_events(4096, PageLayout::Div7, |w| {
        for i in 0..3 {
            let _ = w.write_packet(|p| write_packet(p, i, 0));
            w.flush();
        }
    });
    let mut seq = fw.new_sequence();
    let mut chunk = 0;
    for e in &source {
        if let SourceEvent::Chunk(_) = e {
            if chunk == 1 {
                seq.set_injected_packet(&snapshot(5)).unwrap();
            }
            chunk += 1;
        }
        forward_all(&mut seq, std::slice::from_ref(e));
    }
    assert_eq!(chunk, 3, "{source:?}");
    lb.drain();
    let seqs = decoded(&lb);
    let (_, packets) = &seqs[0];
    let kinds = kinds(packets);
    assert_eq!(
        kinds,
        ["?", "data 0", "snap 5", "data 1", "data 2"],
        "{packets:?}"
    );
    runtime().stop_data_source(309);
    lb.shutdown();
}

struct Calls(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl DataSourceHandler for Calls {
    fn on_stop(&self, a: &InstanceArgs<'_>) {
        self.0
            .lock()
            .unwrap()
            .push(format!("stop {}", a.instance_id));
    }
    fn on_clear_incremental_state(&self, a: &InstanceArgs<'_>) {
        self.0
            .lock()
            .unwrap()
            .push(format!("clear {}", a.instance_id));
    }
}

#[test]
fn two_sessions_get_their_own_lanes_and_a_stop_unregisters_its_own() {
    let _s = serial();
    let lb = Loopback::new(64 * 1024, PageLayout::Div1, false);
    let calls = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let fw = ChunkForwarder::register(
        "test.fw.two",
        DataSourceOptions::default(),
        Calls(calls.clone()),
    )
    .unwrap();
    start(305, "test.fw.two", 8);
    start(306, "test.fw.two", 9);
    assert_eq!(fw.started_instances(), 2);
    let source = spanning_source();
    let mut seq = fw.new_sequence();
    forward_all(&mut seq, &source);
    assert_eq!(seq.lanes(), 2);
    runtime().clear_incremental_state(&[306]);
    runtime().stop_data_source(305);
    assert_eq!(*calls.lock().unwrap(), ["clear 306", "stop 305"]);
    assert_eq!(seq.lanes(), 1);
    lb.drain();
    let writers = registered_writers(&lb);
    assert_eq!(writers.iter().map(|w| w.1).collect::<Vec<_>>(), [8, 9]);
    let msgs = lb.received().messages.clone();
    let unreg = msgs
        .iter()
        .position(|m| matches!(m, Outgoing::UnregisterTraceWriter { writer_id } if *writer_id == writers[0].0))
        .expect("the stopped session's writer is unregistered");
    let stopped = msgs
        .iter()
        .position(|m| matches!(m, Outgoing::DataSourceStopped { instance_id: 305 }))
        .unwrap();
    assert!(unreg < stopped);
    assert!(!msgs.iter().any(
        |m| matches!(m, Outgoing::UnregisterTraceWriter { writer_id } if *writer_id == writers[1].0)
    ));
    let seqs = decoded(&lb);
    assert_eq!(seqs.len(), 2);
    for (_, packets) in &seqs {
        assert_eq!(packets.len(), 4);
    }
    // Dropping the sequence unregisters the remaining lane.
    drop(seq);
    lb.drain();
    assert!(lb.received().messages.iter().any(
        |m| matches!(m, Outgoing::UnregisterTraceWriter { writer_id } if *writer_id == writers[1].0)
    ));
    runtime().stop_data_source(306);
    lb.shutdown();
}

#[test]
fn a_chunk_larger_than_a_page_is_dropped_and_one_that_barely_fits_goes_without_its_injection() {
    let _s = serial();
    let lb = Loopback::new(64 * 1024, PageLayout::Div1, false);
    let fw =
        ChunkForwarder::register("test.fw.big", DataSourceOptions::default(), NoopHandler).unwrap();
    start(307, "test.fw.big", 1);
    // A full 4088-byte chunk (4 KiB page, Div1): fits our 4 KiB pages, but
    // not with a start packet.
    let full = source_events(4096, PageLayout::Div1, |w| {
        let _ = w.write_packet(|p| write_packet(p, 1, 4060));
    });
    let mut seq = fw.new_sequence();
    forward_all(&mut seq, &full[..1]);
    // An 8 KiB page's chunk: too big.
    let big = source_events(8192, PageLayout::Div1, |w| {
        let _ = w.write_packet(|p| write_packet(p, 2, 8000));
    });
    let mut other = fw.new_sequence();
    let SourceEvent::Chunk(c) = &big[0] else {
        panic!()
    };
    assert_eq!(c.len(), 8184);
    assert_eq!(other.forward_chunk(c).unwrap().dropped, 1);
    let stats = fw.stats();
    assert_eq!(
        (
            stats.chunks_forwarded,
            stats.chunks_too_big,
            stats.start_packets_missed
        ),
        (1, 1, 1),
        "{stats:?}"
    );
    runtime().stop_data_source(307);
    lb.shutdown();
}

proptest::proptest! {
    /// Whatever bytes a source sends as chunks and patches: no panic,
    /// every chunk accounted for.
    #[test]
    fn any_chunk_bytes_are_forwarded_or_counted(
        chunks in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600), 1..12),
        patches in proptest::collection::vec((0u32..700, proptest::prelude::any::<[u8; 4]>(), 0u32..12), 0..12),
    ) {
        let _s = serial();
        let lb = Loopback::manual(64 * 1024, PageLayout::Div1);
        let fw = ChunkForwarder::register(
            &format!("test.fw.any.{}", rand_suffix()),
            DataSourceOptions::default(),
            NoopHandler,
        ).unwrap();
        start(400, fw.name(), 1);
        let mut seq = fw.new_sequence();
        for (i, c) in chunks.iter().enumerate() {
            let _ = seq.forward_chunk(c);
            if let Some((offset, data, chunk)) = patches.get(i) {
                seq.forward_patches(*chunk, &[ForwardPatch { offset: *offset, data: *data }], false);
            }
        }
        let s = fw.stats();
        proptest::prop_assert_eq!(s.chunks_received, chunks.len() as u64);
        proptest::prop_assert_eq!(
            s.chunks_forwarded + s.chunks_invalid + s.chunks_skipped + s.chunks_no_room + s.chunks_too_big,
            chunks.len() as u64
        );
        runtime().stop_data_source(400);
        lb.discard();
    }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}
