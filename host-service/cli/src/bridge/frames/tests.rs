//! The frame decoder against frames written with abi's encoder, whole, cut
//! anywhere, and broken.

use shmtrace_abi::frame::{kind, FrameEncoder, FrameStats, Hello as HelloFrame};
use shmtrace_abi::layout::PageSize;
use shmtrace_abi::region::{Name, PatchSlot};

use super::*;
use crate::bridge::PatchGroup;

fn hello(boot_id: u32) -> HelloFrame {
    HelloFrame {
        version: frame::VERSION,
        boot_id,
        clock_id: 65,
        page_size: PageSize::DEFAULT.get() as u32,
        flags: 0,
        data_source: Name::new("fw.events").unwrap(),
        producer: Name::new("mcu").unwrap(),
    }
}

fn patch(chunk_id: u32, offset: u16, has_more: bool) -> PatchSlot {
    PatchSlot {
        writer_id: 2,
        chunk_id,
        has_more,
        offset,
        data: [1, 2, 3, 4],
    }
}

/// A chunk of writer 2: header + one 3-byte fragment.
fn chunk(chunk_id: u32) -> Vec<u8> {
    let mut c = chunk_id.to_le_bytes().to_vec();
    c.extend_from_slice(&[2, 0, 1, 0, 2, 0x40, 0x64]);
    c
}

/// HELLO, a chunk, a two-patch group split over two frames, an unsolicited
/// clock, an answer to sync 9, stats.
fn stream(enc: &mut FrameEncoder) -> Vec<u8> {
    let mut wire = Vec::new();
    let sink = &mut |b: &[u8]| wire.extend_from_slice(b);
    enc.hello(&hello(7), sink);
    enc.chunk(&chunk(0), sink);
    enc.patch(&patch(0, 4, true), sink);
    enc.patch(&patch(0, 8, false), sink);
    enc.clock(1_000, 0, sink);
    enc.clock(2_000, 9, sink);
    enc.stats(
        &FrameStats {
            packets_dropped: 3,
            ring_overflows: 1,
            chunks_lost: 0,
            frames_dropped: 2,
        },
        sink,
    );
    wire
}

fn drain(d: &mut FrameStreamDecoder) -> Vec<FirmwareEvent> {
    std::iter::from_fn(|| d.next_event()).collect()
}

fn loss(d: &FrameStreamDecoder, name: &str) -> u64 {
    d.loss()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map_or_else(|| panic!("no counter {name}"), |(_, v)| v)
}

fn expected_events(baud_transfer_ns: u64) -> Vec<FirmwareEvent> {
    vec![
        FirmwareEvent::Hello(Hello {
            boot_id: 7,
            data_source: "fw.events".into(),
            producer: "mcu".into(),
            clock_id: 65,
        }),
        FirmwareEvent::Chunk(chunk(0)),
        FirmwareEvent::Patches(PatchGroup {
            writer_id: 2,
            chunk_id: 0,
            has_more: false,
            patches: vec![ForwardPatchAt(4).into(), ForwardPatchAt(8).into()],
        }),
        FirmwareEvent::Clock(ClockSample {
            firmware_ns: 1_000,
            nonce: None,
            transfer_ns: baud_transfer_ns,
        }),
        FirmwareEvent::Clock(ClockSample {
            firmware_ns: 2_000,
            nonce: Some(9),
            transfer_ns: baud_transfer_ns,
        }),
        FirmwareEvent::Stats(vec![
            ("packets_dropped".into(), 3),
            ("ring_overflows".into(), 1),
            ("chunks_lost".into(), 0),
            ("frames_dropped".into(), 2),
        ]),
    ]
}

struct ForwardPatchAt(u32);

impl From<ForwardPatchAt> for crate::bridge::ForwardPatch {
    fn from(p: ForwardPatchAt) -> Self {
        crate::bridge::ForwardPatch {
            offset: p.0,
            data: [1, 2, 3, 4],
        }
    }
}

#[test]
fn every_frame_type_decodes_whole_and_cut_at_every_byte() {
    let wire = stream(&mut FrameEncoder::new());
    let mut whole = FrameStreamDecoder::new(None);
    whole.push(&wire);
    assert_eq!(drain(&mut whole), expected_events(0));
    let mut bytewise = FrameStreamDecoder::new(None);
    let mut got = Vec::new();
    for b in &wire {
        bytewise.push(std::slice::from_ref(b));
        got.extend(drain(&mut bytewise));
    }
    assert_eq!(got, expected_events(0));
    assert!(
        bytewise.loss().iter().all(|(_, v)| *v == 0),
        "{:?}",
        bytewise.loss()
    );
    assert_eq!(bytewise.counters()[0], ("frames", 7));
}

#[test]
fn a_serial_link_puts_a_clock_frame_on_the_wire_for_its_length() {
    let mut d = FrameStreamDecoder::new(Some(115_200));
    d.push(&stream(&mut FrameEncoder::new()));
    // 28 bytes x 10 bits at 115200 bit/s.
    let ns = 28 * 10 * 1_000_000_000 / 115_200;
    assert_eq!(ns, 2_430_555);
    assert_eq!(drain(&mut d), expected_events(ns));
}

#[test]
fn requests_become_host_frames_and_a_flush_waits_for_its_barrier() {
    let mut d = FrameStreamDecoder::new(None);
    let mut out = Vec::new();
    for r in [
        Request::Enable(true),
        Request::Clear,
        Request::Sync(5),
        Request::Flush,
        Request::Enable(false),
    ] {
        assert!(d.encode_request(r, &mut out));
    }
    // Decode what was sent with abi's decoder: the frames and arguments.
    let mut check = shmtrace_abi::frame::FrameDecoder::new(vec![0u8; 256]);
    let mut sent = Vec::new();
    let mut input = &out[..];
    while !input.is_empty() {
        let (used, f) = check.push(input);
        input = &input[used..];
        if let Some(f) = f {
            let arg = match f.parse().unwrap() {
                Frame::Sync(n) | Frame::Flush(n) => Some(n),
                _ => None,
            };
            sent.push((f.kind, arg));
        }
    }
    let barrier = sent[4].1.unwrap();
    assert_eq!(
        sent,
        [
            (kind::ENABLE, None),
            (kind::CLEAR, None),
            (kind::SYNC, Some(5)),
            (kind::FLUSH, Some(1)),
            (kind::SYNC, Some(barrier)),
            (kind::DISABLE, None)
        ]
    );
    assert_ne!(barrier & BARRIER_BIT, 0, "never one of the clock's nonces");
    assert!(d.flush_pending());
    // A clock answer to another nonce does not end it; the barrier's does,
    // and is no clock sample.
    let mut enc = FrameEncoder::new();
    let mut wire = Vec::new();
    enc.clock(10, 5, &mut |b: &[u8]| wire.extend_from_slice(b));
    d.push(&wire);
    assert!(d.flush_pending());
    wire.clear();
    enc.clock(11, barrier, &mut |b: &[u8]| wire.extend_from_slice(b));
    d.push(&wire);
    assert!(!d.flush_pending());
    let events = drain(&mut d);
    assert_eq!(events.len(), 1, "{events:?}");
    // A flush given up on is counted; its late answer is dropped.
    assert!(d.encode_request(Request::Flush, &mut out));
    d.give_up_flush();
    assert!(!d.flush_pending());
    assert!(d.counters().contains(&("flush_timeouts", 1)));
    wire.clear();
    enc.clock(12, barrier.wrapping_add(1), &mut |b: &[u8]| {
        wire.extend_from_slice(b)
    });
    d.push(&wire);
    assert_eq!(drain(&mut d), []);
}

/// A flush given up on is not over for the firmware: it obeys its
/// commands in order, so until the barrier's answer comes it is still
/// sending what the flush committed, and a SYNC sent meanwhile waits
/// behind it. (Under load a booting firmware answered its quieting
/// flush's barrier a second after it was sent, 0.6 s after the bridge
/// gave up on it; the eight clock requests sent meanwhile came back with
/// bounds of 0.5 s, and the session got the flush's pre-session chunks.)
#[test]
fn a_flush_given_up_on_is_unanswered_until_its_barrier_comes() {
    let mut d = FrameStreamDecoder::new(None);
    assert!(!d.flush_unanswered());
    let mut out = Vec::new();
    assert!(d.encode_request(Request::Flush, &mut out));
    let first = d.state.barrier.unwrap();
    assert!(d.flush_pending() && d.flush_unanswered());
    d.give_up_flush();
    assert!(!d.flush_pending());
    assert!(d.flush_unanswered(), "the firmware is still at it");
    // A second flush: only its own barrier's answer ends it.
    assert!(d.encode_request(Request::Flush, &mut out));
    let second = d.state.barrier.unwrap();
    let mut enc = FrameEncoder::new();
    let mut wire = Vec::new();
    for (t, nonce) in [(10, 7), (11, first)] {
        enc.clock(t, nonce, &mut |b: &[u8]| wire.extend_from_slice(b));
    }
    d.push(&wire);
    assert!(d.flush_unanswered());
    wire.clear();
    enc.clock(12, second, &mut |b: &[u8]| wire.extend_from_slice(b));
    d.push(&wire);
    assert!(!d.flush_pending() && !d.flush_unanswered());
    // Neither barrier answer is a clock sample; the clock's answer is.
    let events = drain(&mut d);
    assert_eq!(events.len(), 1, "{events:?}");
}

/// A firmware that restarts while a flush waits never answers that
/// flush's barrier: the new boot is busy with nothing, so its clock may
/// be asked for at once (before: no clock request for the new boot until
/// the old barrier's answer was given up on, 2 s, and its chunks, held
/// for a clock sample, went without one). The flush itself still waits,
/// so the restart reaches its sessions first.
#[test]
fn a_restart_leaves_no_flush_unanswered() {
    let mut d = FrameStreamDecoder::new(None);
    let mut enc = FrameEncoder::new();
    d.push(&stream(&mut enc));
    let mut out = Vec::new();
    assert!(d.encode_request(Request::Flush, &mut out));
    assert!(d.flush_pending() && d.flush_unanswered());
    let mut restarted = FrameEncoder::new();
    let mut wire = Vec::new();
    restarted.hello(&hello(8), &mut |b: &[u8]| wire.extend_from_slice(b));
    d.push(&wire);
    assert!(!d.flush_unanswered(), "the new boot answers no old barrier");
    assert!(d.flush_pending(), "the flush waits until it is given up");
    let events = drain(&mut d);
    assert!(
        events.iter().any(|e| matches!(e, FirmwareEvent::Reset)),
        "{events:?}"
    );
}

#[test]
fn broken_input_is_counted_and_the_good_frames_still_come_through() {
    let mut enc = FrameEncoder::new();
    let good = stream(&mut enc);
    let mut wire = b"boot log: firmware v1\r\n".to_vec();
    wire.extend_from_slice(&good);
    // A frame with a bad CRC.
    let mut bad = Vec::new();
    enc.chunk(&chunk(1), &mut |b: &[u8]| bad.extend_from_slice(b));
    let at = bad.len() - 6;
    bad[at] ^= 0xFF;
    wire.extend_from_slice(&bad);
    // A duplicate (seq of the HELLO-following chunk again).
    let mut dup = Vec::new();
    let mut replay = FrameEncoder::new();
    replay.encode(kind::STATS, &[&[0u8; 16]], &mut |_: &[u8]| {});
    replay.chunk(&chunk(0), &mut |b: &[u8]| dup.extend_from_slice(b));
    wire.extend_from_slice(&dup);
    // A frame that is lost (never sent): a gap of one.
    enc.chunk(&chunk(2), &mut |_: &[u8]| {});
    // A header announcing 1 MiB.
    let mut huge = frame::MAGIC.to_vec();
    huge.extend_from_slice(&[kind::CHUNK, 0]);
    huge.extend_from_slice(&enc.next_seq().to_le_bytes());
    huge.extend_from_slice(&(1u32 << 20).to_le_bytes());
    wire.extend_from_slice(&huge);
    // An unknown type, a host command, then a good chunk.
    enc.encode(0x42, &[b"future"], &mut |b: &[u8]| {
        wire.extend_from_slice(b)
    });
    enc.command(kind::CLEAR, &mut |b: &[u8]| wire.extend_from_slice(b));
    enc.chunk(&chunk(3), &mut |b: &[u8]| wire.extend_from_slice(b));
    // A frame cut by the end of the stream.
    let mut cut = Vec::new();
    enc.chunk(&chunk(4), &mut |b: &[u8]| cut.extend_from_slice(b));
    wire.extend_from_slice(&cut[..cut.len() - 3]);

    let mut d = FrameStreamDecoder::new(None);
    for piece in wire.chunks(7) {
        d.push(piece);
    }
    d.finish();
    let events = drain(&mut d);
    assert_eq!(events[..6], expected_events(0)[..]);
    assert_eq!(events[6..], [FirmwareEvent::Chunk(chunk(3))]);
    assert_eq!(loss(&d, "bad_crc"), 1);
    assert_eq!(loss(&d, "duplicates"), 1);
    assert_eq!(loss(&d, "oversized"), 1);
    assert_eq!(loss(&d, "truncated"), 1);
    assert_eq!(loss(&d, "unusable_frames"), 1);
    assert_eq!(loss(&d, "host_frames"), 1);
    // The bad-CRC chunk(1) and the lost chunk(2) (the oversized header
    // reused the next frame's seq).
    assert_eq!(loss(&d, "frames_lost"), 2);
    assert!(loss(&d, "garbage_bytes") >= 23);
}

#[test]
fn a_gap_or_a_new_hello_ends_a_patch_group() {
    let mut enc = FrameEncoder::new();
    let mut wire = Vec::new();
    let sink = &mut |b: &[u8]| wire.extend_from_slice(b);
    enc.hello(&hello(1), sink);
    enc.patch(&patch(3, 0, true), sink);
    enc.patch(&patch(3, 4, true), &mut |_: &[u8]| {}); // lost
    enc.patch(&patch(3, 8, false), sink);
    enc.patch(&patch(4, 0, true), sink);
    let mut again = FrameEncoder::new();
    again.hello(&hello(2), sink);
    let mut d = FrameStreamDecoder::new(None);
    d.push(&wire);
    let groups: Vec<_> = drain(&mut d)
        .into_iter()
        .filter_map(|e| match e {
            FirmwareEvent::Patches(g) => Some((g.chunk_id, g.has_more, g.patches.len())),
            FirmwareEvent::Hello(_) | FirmwareEvent::Reset => None,
            other => panic!("{other:?}"),
        })
        .collect();
    // The group of chunk 3 ends at the gap, with has_more; the rest of it
    // follows as a group of its own; chunk 4's open group goes before the
    // new boot's hello, still has_more.
    assert_eq!(groups, [(3, true, 1), (3, false, 1), (4, true, 1)]);
    assert_eq!(loss(&d, "frames_lost"), 1);
}

/// A firmware that restarts starts its frames again at seq 0 with a HELLO,
/// whose boot_id may repeat (its RAM zeroed by the reset): a reset, so the
/// new run never continues the old run's sequences. A HELLO later in a run
/// (seq > 0) is not.
#[test]
fn a_hello_at_seq_0_after_frames_is_a_restart_even_with_the_same_boot_id() {
    let mut wire = Vec::new();
    let sink = &mut |b: &[u8]| wire.extend_from_slice(b);
    let mut first = FrameEncoder::new();
    first.hello(&hello(1), sink);
    first.chunk(&chunk(0), sink);
    first.hello(&hello(1), sink); // seq 2: the same run
    let mut second = FrameEncoder::new();
    second.hello(&hello(1), sink);
    second.chunk(&chunk(0), sink);
    let mut d = FrameStreamDecoder::new(None);
    d.push(&wire);
    let kinds: Vec<_> = drain(&mut d)
        .into_iter()
        .map(|e| match e {
            FirmwareEvent::Hello(h) => format!("hello {}", h.boot_id),
            FirmwareEvent::Chunk(c) => format!("chunk {}", c[0]),
            FirmwareEvent::Reset => "reset".into(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        ["hello 1", "chunk 0", "hello 1", "reset", "hello 1", "chunk 0"]
    );
    assert_eq!(loss(&d, "duplicates"), 0);
}

fn counter(d: &FrameStreamDecoder, name: &str) -> u64 {
    d.counters()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map_or_else(|| panic!("no counter {name}"), |(_, v)| v)
}

/// A board reset mid-frame: the old boot's last chunk frame is cut, the
/// new boot's HELLO follows. The cut frame is counted as a bad CRC and as
/// cut by the restart; a bad frame with a good one after it, before the
/// restart, is not cut by it.
#[test]
fn a_restart_right_after_a_cut_frame_is_counted() {
    let mut wire = Vec::new();
    let mut old = FrameEncoder::new();
    let mut sink = |b: &[u8]| wire.extend_from_slice(b);
    old.hello(&hello(1), &mut sink);
    old.chunk(&chunk(0), &mut sink);
    let mut cut = Vec::new();
    old.chunk(&chunk(1), &mut |b: &[u8]| cut.extend_from_slice(b));
    wire.extend_from_slice(&cut[..cut.len() - 6]);
    let mut new = FrameEncoder::new();
    new.hello(&hello(1), &mut |b: &[u8]| wire.extend_from_slice(b));
    new.chunk(&chunk(0), &mut |b: &[u8]| wire.extend_from_slice(b));
    let mut d = FrameStreamDecoder::new(None);
    d.push(&wire);
    let events = drain(&mut d);
    assert!(matches!(events[2], FirmwareEvent::Reset), "{events:?}");
    assert_eq!(events.len(), 5, "{events:?}");
    assert_eq!(loss(&d, "bad_crc"), 1);
    assert_eq!(counter(&d, "cut_by_restart"), 1);

    // Cut, then a good frame of the old boot, then the restart.
    let mut wire = Vec::new();
    let mut old = FrameEncoder::new();
    old.hello(&hello(1), &mut |b: &[u8]| wire.extend_from_slice(b));
    wire.extend_from_slice(&cut[..cut.len() - 6]);
    old.clock(5, 0, &mut |b: &[u8]| wire.extend_from_slice(b));
    let mut new = FrameEncoder::new();
    new.hello(&hello(1), &mut |b: &[u8]| wire.extend_from_slice(b));
    let mut d = FrameStreamDecoder::new(None);
    d.push(&wire);
    assert!(drain(&mut d).contains(&FirmwareEvent::Reset));
    assert_eq!(loss(&d, "bad_crc"), 1);
    assert_eq!(counter(&d, "cut_by_restart"), 0);
}

/// The stream ends inside a frame (a file cut short, a TCP peer gone
/// mid-frame): the cut frame is counted as truncated and as cut by the
/// end; a stream that ends after a good frame, even with a bad one before
/// it, is not cut by its end.
#[test]
fn an_end_of_the_stream_inside_a_frame_is_counted() {
    let mut enc = FrameEncoder::new();
    let mut wire = Vec::new();
    enc.hello(&hello(1), &mut |b: &[u8]| wire.extend_from_slice(b));
    enc.chunk(&chunk(0), &mut |b: &[u8]| wire.extend_from_slice(b));
    let mut cut = Vec::new();
    enc.chunk(&chunk(1), &mut |b: &[u8]| cut.extend_from_slice(b));
    let whole = wire.clone();

    wire.extend_from_slice(&cut[..cut.len() - 6]);
    let mut d = FrameStreamDecoder::new(None);
    d.push(&wire);
    assert_eq!(counter(&d, "cut_by_end"), 0, "not before the end");
    d.finish();
    assert_eq!(drain(&mut d).len(), 2);
    assert_eq!(loss(&d, "truncated"), 1);
    assert_eq!(counter(&d, "cut_by_end"), 1);

    // A cut frame, then a good one, then the end.
    let mut wire = whole.clone();
    wire.extend_from_slice(&cut[..cut.len() - 6]);
    enc.clock(5, 0, &mut |b: &[u8]| wire.extend_from_slice(b));
    let mut d = FrameStreamDecoder::new(None);
    d.push(&wire);
    d.finish();
    assert!(drain(&mut d).contains(&FirmwareEvent::Clock(ClockSample {
        firmware_ns: 5,
        nonce: None,
        transfer_ns: 0
    })));
    assert_eq!(loss(&d, "bad_crc"), 1);
    assert_eq!(counter(&d, "cut_by_end"), 0);

    // A whole stream.
    let mut d = FrameStreamDecoder::new(None);
    d.push(&whole);
    d.finish();
    assert_eq!(counter(&d, "cut_by_end"), 0);
}

#[test]
fn arbitrary_bytes_never_panic_and_memory_stays_bounded() {
    use proptest::prelude::*;
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 64,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &proptest::collection::vec(
                prop_oneof![
                    any::<u8>(),
                    Just(frame::MAGIC[0]),
                    Just(frame::MAGIC[1]),
                    Just(kind::PATCH),
                ],
                0..4096,
            ),
            |bytes| {
                let mut d = FrameStreamDecoder::new(Some(9600));
                for piece in bytes.chunks(13) {
                    d.push(piece);
                    let _ = drain(&mut d);
                }
                d.finish();
                let _ = drain(&mut d);
                prop_assert!(d.state.events.is_empty());
                Ok(())
            },
        )
        .unwrap();
}
