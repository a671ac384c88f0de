//! Frame format v1: exact bytes, round trips through any split, and a
//! decoder that survives and counts every corruption.

use proptest::prelude::*;
use shmtrace_abi::frame::{
    kind, DecoderStats, Frame, FrameDecoder, FrameEncoder, FrameStats, Hello,
};
use shmtrace_abi::region::{Name, PatchSlot};

/// CRC-32/ISO-HDLC, bit by bit (an independent reference).
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn collect(
    enc: &mut FrameEncoder,
    f: impl FnOnce(&mut FrameEncoder, &mut dyn FnMut(&[u8])),
) -> Vec<u8> {
    let mut out = Vec::new();
    f(enc, &mut |b: &[u8]| out.extend_from_slice(b));
    out
}

#[test]
fn reference_crc_matches_the_check_value() {
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
}

#[test]
fn frames_have_the_documented_bytes() {
    let mut enc = FrameEncoder::new();
    let clock = collect(&mut enc, |e, s| {
        e.clock(0x0102_0304_0506_0708, 9, &mut |b| s(b))
    });
    let mut expected = vec![
        0xD5, 0x7A, 0x04, 0x00, // magic, CLOCK, flags
        0x00, 0x00, 0x00, 0x00, // seq 0
        0x0C, 0x00, 0x00, 0x00, // len 12
        0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, // ns
        0x09, 0x00, 0x00, 0x00, // nonce
    ];
    let crc = crc32(&expected);
    expected.extend_from_slice(&crc.to_le_bytes());
    assert_eq!(clock, expected);

    let hello = Hello {
        version: 1,
        boot_id: 2,
        clock_id: 65,
        page_size: 4096,
        flags: 0,
        data_source: Name::new("ds").unwrap(),
        producer: Name::new("").unwrap(),
    };
    let bytes = collect(&mut enc, |e, s| e.hello(&hello, &mut |b| s(b)));
    #[rustfmt::skip]
    let body = [
        0xD5, 0x7A, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x18, 0x00, 0x00, 0x00, // seq 1, len 24
        0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x41, 0x00, 0x00, 0x00,
        0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x02, b'd', b's', 0x00,
    ];
    assert_eq!(&bytes[..body.len()], &body);
    assert_eq!(&bytes[body.len()..], &crc32(&body).to_le_bytes());

    let patch = PatchSlot {
        writer_id: 0x0201,
        chunk_id: 0x0605_0403,
        has_more: true,
        offset: 0x0807,
        data: [1, 2, 3, 4],
    };
    let bytes = collect(&mut enc, |e, s| e.patch(&patch, &mut |b| s(b)));
    assert_eq!(&bytes[2..12], &[0x03, 0, 2, 0, 0, 0, 16, 0, 0, 0]);
    assert_eq!(
        &bytes[12..28],
        &[1, 2, 1, 0, 3, 4, 5, 6, 7, 8, 0, 0, 1, 2, 3, 4]
    );

    let mut buf = [0u8; 20];
    assert_eq!(
        enc.encode_to_slice(kind::SYNC, &[&7u32.to_le_bytes()], &mut buf),
        Ok(20)
    );
    assert_eq!(&buf[..12], &[0xD5, 0x7A, 0x85, 0, 3, 0, 0, 0, 4, 0, 0, 0]);
    assert!(enc
        .encode_to_slice(kind::SYNC, &[&[0; 4]], &mut buf[..19])
        .is_err());
    assert_eq!(enc.next_seq(), 4, "a refused frame takes no number");
}

/// A frame as the tests model it.
#[derive(Debug, Clone, PartialEq)]
enum Model {
    Hello(u32, String, String),
    Chunk(Vec<u8>),
    Patch(PatchSlot),
    Clock(u64, u32),
    Stats([u32; 4]),
    Enable,
    Disable,
    Clear,
    Flush(u32),
    Sync(u32),
}

fn model() -> impl Strategy<Value = Model> {
    let name = "[a-z.]{1,20}";
    prop_oneof![
        1 => (any::<u32>(), name, "[a-z]{0,10}").prop_map(|(b, d, p)| Model::Hello(b, d, p)),
        6 => proptest::collection::vec(any::<u8>(), 8..600).prop_map(Model::Chunk),
        3 => (any::<u16>(), any::<u32>(), any::<bool>(), any::<u16>(), any::<[u8; 4]>()).prop_map(
            |(writer_id, chunk_id, has_more, offset, data)| Model::Patch(PatchSlot { writer_id, chunk_id, has_more, offset, data })
        ),
        1 => (any::<u64>(), any::<u32>()).prop_map(|(t, n)| Model::Clock(t, n)),
        1 => any::<[u32; 4]>().prop_map(Model::Stats),
        1 => Just(Model::Enable),
        1 => Just(Model::Disable),
        1 => Just(Model::Clear),
        1 => any::<u32>().prop_map(Model::Flush),
        1 => any::<u32>().prop_map(Model::Sync),
    ]
}

fn encode(frames: &[Model]) -> (Vec<u8>, Vec<usize>) {
    let mut enc = FrameEncoder::new();
    let mut out = Vec::new();
    let mut starts = Vec::new();
    for m in frames {
        starts.push(out.len());
        let mut sink = |b: &[u8]| out.extend_from_slice(b);
        match m {
            Model::Hello(boot, ds, p) => enc.hello(
                &Hello {
                    version: 1,
                    boot_id: *boot,
                    clock_id: 65,
                    page_size: 4096,
                    flags: 0,
                    data_source: Name::new(ds).unwrap(),
                    producer: Name::new(p).unwrap(),
                },
                &mut sink,
            ),
            Model::Chunk(b) => enc.chunk(b, &mut sink),
            Model::Patch(p) => enc.patch(p, &mut sink),
            Model::Clock(t, n) => enc.clock(*t, *n, &mut sink),
            Model::Stats(s) => enc.stats(
                &FrameStats {
                    packets_dropped: s[0],
                    ring_overflows: s[1],
                    chunks_lost: s[2],
                    frames_dropped: s[3],
                },
                &mut sink,
            ),
            Model::Enable => enc.command(kind::ENABLE, &mut sink),
            Model::Disable => enc.command(kind::DISABLE, &mut sink),
            Model::Clear => enc.command(kind::CLEAR, &mut sink),
            Model::Flush(v) => enc.command_u32(kind::FLUSH, *v, &mut sink),
            Model::Sync(v) => enc.command_u32(kind::SYNC, *v, &mut sink),
        }
    }
    (out, starts)
}

fn to_model(f: &Frame<'_>) -> Model {
    match *f {
        Frame::Hello(h) => Model::Hello(
            h.boot_id,
            h.data_source.as_str().into(),
            h.producer.as_str().into(),
        ),
        Frame::Chunk(b) => Model::Chunk(b.to_vec()),
        Frame::Patch(p) => {
            assert_eq!(p.len(), 1);
            Model::Patch(p.iter().next().unwrap())
        }
        Frame::Clock { firmware_ns, nonce } => Model::Clock(firmware_ns, nonce),
        Frame::Stats(s) => Model::Stats([
            s.packets_dropped,
            s.ring_overflows,
            s.chunks_lost,
            s.frames_dropped,
        ]),
        Frame::Enable => Model::Enable,
        Frame::Disable => Model::Disable,
        Frame::Clear => Model::Clear,
        Frame::Flush(v) => Model::Flush(v),
        Frame::Sync(v) => Model::Sync(v),
    }
}

/// Decodes `bytes` fed in pieces cut at `cuts`; returns (seq, frame) pairs.
fn decode(bytes: &[u8], cuts: &[usize], buf_len: usize) -> (Vec<(u32, Model)>, DecoderStats) {
    let mut dec = FrameDecoder::new(vec![0u8; buf_len]);
    let mut out = Vec::new();
    let mut at = 0;
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.push(bytes.len());
    points.sort_unstable();
    for end in points {
        let mut input = &bytes[at..end.max(at)];
        at = end.max(at);
        while !input.is_empty() {
            let (used, frame) = dec.push(input);
            assert!(used <= input.len());
            input = &input[used..];
            if let Some(f) = frame {
                let parsed = f.parse().expect("a frame with a good CRC parses");
                out.push((f.seq, to_model(&parsed)));
            } else {
                assert!(input.is_empty(), "no frame and input left");
            }
        }
    }
    while let Some(f) = dec.finish() {
        out.push((
            f.seq,
            to_model(&f.parse().expect("a frame with a good CRC parses")),
        ));
    }
    (out, dec.stats())
}

fn cases() -> u32 {
    if cfg!(miri) {
        2
    } else {
        256
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    /// Whatever the split, every frame comes out once, in order, equal.
    #[test]
    fn frames_round_trip_through_any_split(
        frames in proptest::collection::vec(model(), 1..12),
        cuts in proptest::collection::vec(any::<usize>(), 0..20),
        garbage in proptest::collection::vec(any::<u8>(), 0..40),
    ) {
        let (mut bytes, _) = encode(&frames);
        // Garbage before the first frame is skipped (a HELLO-less start).
        let skip = garbage.len();
        let mut stream = garbage.clone();
        stream.append(&mut bytes);
        let (got, stats) = decode(&stream, &cuts, 4096);
        let want: Vec<(u32, Model)> = frames.iter().cloned().enumerate().map(|(i, m)| (i as u32, m)).collect();
        // Random garbage may contain the magic and a fake frame start that
        // swallows nothing but itself: the real frames still all arrive.
        prop_assert_eq!(got, want);
        prop_assert_eq!(stats.frames, frames.len() as u64);
        prop_assert_eq!(stats.duplicates + stats.lost + stats.truncated, 0);
        prop_assert!(stats.garbage_bytes >= skip as u64 || stats.bad_crc + stats.oversized > 0);
    }

    /// One corrupted byte costs exactly the frame it hit, and the loss
    /// shows in the counters; no panic, whatever byte and value.
    #[test]
    fn a_corrupted_byte_costs_one_frame_and_is_counted(
        frames in proptest::collection::vec(model(), 2..10),
        which in any::<usize>(),
        flip in 1u8..=255,
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        let (mut bytes, starts) = encode(&frames);
        let at = which % bytes.len();
        bytes[at] ^= flip;
        let hit = starts.iter().rposition(|&s| s <= at).unwrap();
        let (got, stats) = decode(&bytes, &cuts, 4096);
        let want: Vec<(u32, Model)> = frames.iter().cloned().enumerate()
            .filter(|(i, _)| *i != hit)
            .map(|(i, m)| (i as u32, m)).collect();
        prop_assert_eq!(&got, &want);
        // The loss shows as a bad frame, a gap, or (a broken magic) as
        // skipped bytes; a HELLO right after restarts the numbering.
        let hello_after = frames.get(hit + 1).is_some_and(|m| matches!(m, Model::Hello(..)));
        let counted = stats.bad_crc + stats.oversized + stats.truncated + stats.lost + stats.garbage_bytes;
        prop_assert!(counted >= 1 || hello_after, "{:?}", stats);
    }

    /// Arbitrary bytes: no panic, and every byte accounted for.
    #[test]
    fn arbitrary_bytes_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..2000),
        cuts in proptest::collection::vec(any::<usize>(), 0..10),
        buf_len in 0usize..300,
    ) {
        let (got, stats) = decode(&bytes, &cuts, buf_len);
        prop_assert_eq!(got.len() as u64, stats.frames);
    }
}

#[test]
fn duplicates_gaps_and_oversized_frames_are_counted() {
    let frames: Vec<Model> = (0..5).map(Model::Flush).collect();
    let (bytes, starts) = encode(&frames);
    let frame = |i: usize| &bytes[starts[i]..starts.get(i + 1).copied().unwrap_or(bytes.len())];
    // 0, 1, 1 (duplicate), 0 (out of order), 3 (gap of one), 4.
    let stream: Vec<u8> = [0, 1, 1, 0, 3, 4]
        .iter()
        .flat_map(|&i| frame(i).to_vec())
        .collect();
    let (got, stats) = decode(&stream, &[], 64);
    assert_eq!(
        got.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        [0, 1, 3, 4]
    );
    assert_eq!((stats.duplicates, stats.lost), (2, 1));

    // A chunk larger than the buffer: counted, skipped, the next frame
    // arrives.
    let (big, _) = encode(&[Model::Clear, Model::Chunk(vec![1; 100]), Model::Clear]);
    let (got, stats) = decode(&big, &[], 64);
    assert_eq!(got, [(0, Model::Clear), (2, Model::Clear)]);
    assert_eq!((stats.oversized, stats.lost), (1, 1));

    // Cut off at the end.
    let (got, stats) = decode(&bytes[..bytes.len() - 3], &[], 64);
    assert_eq!(got.len(), 4);
    assert_eq!(stats.truncated, 1);

    // A HELLO restarts the numbering (a rebooted sender).
    let (mut a, _) = encode(&[Model::Clear, Model::Clear, Model::Clear]);
    let (b, _) = encode(&[Model::Hello(1, "x".into(), String::new()), Model::Clear]);
    a.extend_from_slice(&b);
    let (got, stats) = decode(&a, &[], 128);
    assert_eq!(
        got.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        [0, 1, 2, 0, 1]
    );
    assert_eq!(stats.duplicates, 0);

    // The sender's periodic HELLO: frames lost right before it count.
    let hello = || Model::Hello(1, "x".into(), String::new());
    let frames = [
        hello(),
        Model::Clear,
        Model::Clear,
        Model::Clear,
        hello(),
        Model::Clear,
    ];
    let (bytes, starts) = encode(&frames);
    let frame = |i: usize| &bytes[starts[i]..starts.get(i + 1).copied().unwrap_or(bytes.len())];
    let stream: Vec<u8> = [0, 1, 4, 5]
        .iter()
        .flat_map(|&i| frame(i).to_vec())
        .collect();
    let (got, stats) = decode(&stream, &[], 128);
    assert_eq!(
        got.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        [0, 1, 4, 5]
    );
    assert_eq!((stats.lost, stats.duplicates), (2, 0));
}

#[test]
fn payloads_of_the_wrong_size_are_typed_errors() {
    use shmtrace_abi::frame::FrameError;
    assert_eq!(
        Frame::parse(kind::CLOCK, &[0; 11]),
        Err(FrameError::BadLength {
            kind: kind::CLOCK,
            len: 11
        })
    );
    assert_eq!(
        Frame::parse(kind::PATCH, &[0; 17]),
        Err(FrameError::BadLength {
            kind: kind::PATCH,
            len: 17
        })
    );
    assert_eq!(
        Frame::parse(kind::CHUNK, &[0; 7]),
        Err(FrameError::BadLength {
            kind: kind::CHUNK,
            len: 7
        })
    );
    assert_eq!(Frame::parse(0x42, &[]), Err(FrameError::UnknownType(0x42)));
    assert_eq!(
        Frame::parse(kind::ENABLE, &[1]),
        Err(FrameError::BadLength {
            kind: kind::ENABLE,
            len: 1
        })
    );
    let mut hello = vec![2, 0];
    hello.resize(20, 0);
    assert_eq!(
        Frame::parse(kind::HELLO, &hello),
        Err(FrameError::UnsupportedVersion(2))
    );
    hello[0] = 1;
    hello.extend_from_slice(&[0, 0]);
    assert!(matches!(
        Frame::parse(kind::HELLO, &hello),
        Err(FrameError::BadName(_))
    ));
    hello[20] = 65;
    assert!(matches!(
        Frame::parse(kind::HELLO, &hello),
        Err(FrameError::BadName(_))
    ));
}

/// A sender reset while it sent a chunk: the chunk's length would take in
/// all the new run sends (HELLO, and little more while its tracing is
/// off). The HELLO at seq 0 ends the cut frame as soon as it is whole,
/// byte by byte or at once, without waiting for the end of the stream.
#[test]
fn a_restart_inside_a_frame_ends_it_at_its_hello() {
    let (old, starts) = encode(&[Model::Clear, Model::Chunk(vec![7; 600])]);
    let cut = &old[..starts[1] + 100];
    let hello = Model::Hello(2, "fw".into(), String::new());
    let (new, _) = encode(&[hello.clone(), Model::Clear]);
    let stream = [cut, &new].concat();
    for step in [1, stream.len()] {
        let mut dec = FrameDecoder::new(vec![0u8; 4096]);
        let mut got = Vec::new();
        for piece in stream.chunks(step) {
            let mut input = piece;
            while !input.is_empty() {
                let (used, frame) = dec.push(input);
                input = &input[used..];
                if let Some(f) = frame {
                    got.push((f.seq, to_model(&f.parse().unwrap())));
                }
            }
        }
        // (Bytes taken in behind the HELLO come with the next push, or at
        // the end.)
        assert_eq!(
            got[..2],
            [(0, Model::Clear), (0, hello.clone())],
            "step {step}"
        );
        while let Some(f) = dec.finish() {
            got.push((f.seq, to_model(&f.parse().unwrap())));
        }
        assert_eq!(got[2..], [(1, Model::Clear)], "step {step}");
        let stats = dec.stats();
        assert_eq!((stats.truncated, stats.bad_crc, stats.lost), (1, 0, 0));
        assert_eq!(stats.garbage_bytes, 100, "the cut frame's bytes");
    }
    // A HELLO at seq 0 whole inside a chunk that is whole and good is
    // that chunk's payload.
    let (inner, _) = encode(std::slice::from_ref(&hello));
    let (whole, _) = encode(&[Model::Chunk([vec![1; 8], inner].concat())]);
    let (got, stats) = decode(&whole, &[], 4096);
    assert!(matches!(got[..], [(0, Model::Chunk(_))]), "{got:?}");
    assert_eq!(stats.truncated, 0);
}
