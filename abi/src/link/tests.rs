//! The services against a fake host: control words written as a host
//! writes them, and a byte pipe decoded with the frame decoder.

use std::boxed::Box;
use std::cell::Cell;
use std::collections::VecDeque;
use std::vec;
use std::vec::Vec;

use super::*;
use crate::frame::{kind, Frame, FrameDecoder, FrameEncoder, FrameStats};
use crate::layout::{Packets, PageLayout};
use crate::region::{
    ReaderError, Record, RegionArbiter, RegionConfig, RegionHandles, RegionReader, RegionStorage,
};
use crate::writer::{PacketOutcome, TraceWriter};

type Storage = RegionStorage<8192, 16>;

fn storage() -> Box<Storage> {
    Box::new(Storage::new())
}

fn config(stream_mode: bool) -> RegionConfig<'static> {
    RegionConfig {
        producer: "board",
        boot_id: 5,
        stream_mode,
        trace_enabled: false,
        ..RegionConfig::new("fw.track_event")
    }
}

fn writer<'m>(handles: &RegionHandles<'m>, id: u16) -> TraceWriter<'m, RegionArbiter<'m>> {
    TraceWriter::new(
        RegionArbiter::new(handles, PageLayout::Div4).unwrap(),
        id,
        0,
    )
    .unwrap()
}

/// One small packet (TracePacket.timestamp). A chunk holding `n` finished
/// packets says `n + 1` in its `packets` (the writer counts the empty
/// fragment that follows, for a scraper).
fn event<'a>(w: &mut TraceWriter<'a, RegionArbiter<'a>>, ts: u64) {
    assert_eq!(w.write_packet(|p| p.uint64(8, ts)), PacketOutcome::Written);
}

// ------------------------------------------------------------------ attach

#[test]
fn attach_flushes_once_per_request_then_acknowledges() {
    let mut s = storage();
    let handles = s.init(&config(false)).unwrap();
    let host = handles.control;
    handles.control.set_trace_enabled(true);
    let mut w = writer(&handles, 1);
    let mut link = AttachService::new(&handles);
    let mut reader = RegionReader::attach(&handles).unwrap();
    let mut buf = vec![0u8; reader.chunk_buffer_len()];

    event(&mut w, 100);
    assert_eq!(link.poll(|| w.flush(), || 0u64), Served::default());
    assert!(
        reader.poll(&mut buf).unwrap().is_none(),
        "no request, no flush: the writer still holds its chunk"
    );

    let id = host.request_flush();
    let acked_before_flush = Cell::new(None);
    let served = link.poll(
        || {
            acked_before_flush.set(Some(host.flush_ack()));
            w.flush();
        },
        || 0u64,
    );
    assert_eq!(
        served,
        Served {
            flushed: true,
            synced: false
        }
    );
    assert_eq!(
        acked_before_flush.get(),
        Some(0),
        "acknowledged after the flush"
    );
    assert_eq!(host.flush_ack(), id);
    let Some(Record::Chunk(c)) = reader.poll(&mut buf).unwrap() else {
        panic!("the flushed chunk is in the ring")
    };
    assert_eq!((c.header.writer_id, c.header.packets.count()), (1, 2));

    let mut calls = 0;
    for _ in 0..3 {
        link.poll(|| calls += 1, || 0u64);
    }
    assert_eq!(calls, 0, "a request is served once");
    host.request_flush();
    host.request_flush();
    link.poll(|| calls += 1, || 0u64);
    assert_eq!(
        (calls, host.flush_ack()),
        (1, id + 2),
        "requests made between two polls are served by one flush"
    );
}

#[test]
fn attach_answers_each_sync_nonce_once_with_the_clock_read_then() {
    let mut s = storage();
    let handles = s.init(&config(false)).unwrap();
    let host = handles.control;
    let mut link = AttachService::new(&handles);
    let reads = Cell::new(0u64);
    let clock = || {
        reads.set(reads.get() + 1);
        reads.get() * 1_000
    };

    link.poll(|| {}, clock);
    assert_eq!(reads.get(), 0, "no request: the clock is not read");
    host.request_sync(7);
    assert!(link.poll(|| {}, clock).synced);
    assert_eq!(host.sync_response(), Some((7, 1_000)));
    assert!(!link.poll(|| {}, clock).synced);
    host.request_sync(8);
    assert!(link.poll(|| {}, clock).synced);
    assert_eq!(host.sync_response(), Some((8, 2_000)));
    assert_eq!(reads.get(), 2);
    assert_eq!(host.counters().heartbeat, 4, "each poll beats");
}

// ------------------------------------------------------------------ stream

/// The firmware's end of a serial line: what it sent, what the host sent.
#[derive(Default)]
struct Pipe {
    tx: Vec<u8>,
    rx: VecDeque<u8>,
}

impl ByteIo for Pipe {
    fn write(&mut self, bytes: &[u8]) {
        self.tx.extend_from_slice(bytes);
    }

    fn read(&mut self) -> Option<u8> {
        self.rx.pop_front()
    }
}

/// The host: decodes what the firmware sent, encodes commands.
struct Host {
    decoder: FrameDecoder<Vec<u8>>,
    encoder: FrameEncoder,
    read: usize,
}

/// A decoded frame, owned.
#[derive(Debug, Clone, PartialEq)]
enum Got {
    Hello {
        seq: u32,
        boot_id: u32,
        page_size: u32,
        data_source: std::string::String,
        producer: std::string::String,
    },
    Chunk {
        writer: u16,
        chunk_id: u32,
        packets: u16,
    },
    Patch {
        chunk_id: u32,
        has_more: bool,
    },
    Clock {
        ns: u64,
        nonce: u32,
    },
    Stats(FrameStats),
}

impl Host {
    fn new() -> Self {
        Host {
            decoder: FrameDecoder::new(vec![0u8; 4096 + 16]),
            encoder: FrameEncoder::new(),
            read: 0,
        }
    }

    /// The frames the firmware sent since the last call.
    fn frames(&mut self, pipe: &Pipe) -> Vec<Got> {
        let mut got = Vec::new();
        let mut input = &pipe.tx[self.read..];
        self.read = pipe.tx.len();
        while !input.is_empty() {
            let (used, frame) = self.decoder.push(input);
            input = &input[used..];
            let Some(raw) = frame else { continue };
            got.push(match raw.parse().unwrap() {
                Frame::Hello(h) => Got::Hello {
                    seq: raw.seq,
                    boot_id: h.boot_id,
                    page_size: h.page_size,
                    data_source: h.data_source.as_str().into(),
                    producer: h.producer.as_str().into(),
                },
                Frame::Chunk(b) => Got::Chunk {
                    writer: u16::from_le_bytes([b[4], b[5]]),
                    chunk_id: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                    packets: Packets::from_bits(u16::from_le_bytes([b[6], b[7]])).count(),
                },
                Frame::Patch(p) => {
                    assert_eq!(p.len(), 1);
                    let p = p.iter().next().unwrap();
                    Got::Patch {
                        chunk_id: p.chunk_id,
                        has_more: p.has_more,
                    }
                }
                Frame::Clock { firmware_ns, nonce } => Got::Clock {
                    ns: firmware_ns,
                    nonce,
                },
                Frame::Stats(s) => Got::Stats(s),
                other => panic!("a firmware sent a host frame: {other:?}"),
            });
        }
        let s = self.decoder.stats();
        assert_eq!(
            (s.garbage_bytes, s.bad_crc, s.lost, s.duplicates),
            (0, 0, 0, 0),
            "a clean stream"
        );
        got
    }

    fn command(&mut self, pipe: &mut Pipe, kind: u8) {
        let rx = &mut pipe.rx;
        self.encoder.command(kind, &mut |b: &[u8]| rx.extend(b));
    }

    fn command_u32(&mut self, pipe: &mut Pipe, kind: u8, value: u32) {
        let rx = &mut pipe.rx;
        self.encoder
            .command_u32(kind, value, &mut |b: &[u8]| rx.extend(b));
    }
}

fn stats(packets_dropped: u32) -> Got {
    Got::Stats(FrameStats {
        packets_dropped,
        ..FrameStats::default()
    })
}

#[test]
fn stream_says_hello_at_start_and_each_period_and_sends_what_writers_commit() {
    let mut s = storage();
    let handles = s.init(&config(true)).unwrap();
    handles.control.set_trace_enabled(true);
    let mut pipe = Pipe::default();
    let mut host = Host::new();
    let mut link = StreamService::new(&handles, &mut pipe, [0u8; DEFAULT_CHUNK_BUFFER]).unwrap();
    assert_eq!(
        host.frames(link.io()),
        [Got::Hello {
            seq: 0,
            boot_id: 5,
            page_size: 4096,
            data_source: "fw.track_event".into(),
            producer: "board".into(),
        }]
    );

    let mut w = writer(&handles, 3);
    event(&mut w, 1);
    event(&mut w, 2);
    link.poll(|| panic!("nobody asked"), || 10u64);
    assert_eq!(
        host.frames(link.io()),
        [stats(0)],
        "uncommitted events stay; the first poll sends STATS"
    );
    w.flush();
    handles.control.count_packets_dropped(4);
    link.poll(|| {}, || 20u64);
    assert_eq!(
        host.frames(link.io()),
        [Got::Chunk {
            writer: 3,
            chunk_id: 0,
            packets: 3
        }],
        "committed chunks go at the next poll; STATS waits for its period"
    );
    link.poll(|| {}, || 10 + STATS_PERIOD_NS - 1);
    assert_eq!(host.frames(link.io()), []);
    link.poll(|| {}, || 10 + STATS_PERIOD_NS);
    assert_eq!(
        host.frames(link.io()),
        [
            Got::Hello {
                seq: 3,
                boot_id: 5,
                page_size: 4096,
                data_source: "fw.track_event".into(),
                producer: "board".into(),
            },
            Got::Clock {
                ns: 10 + STATS_PERIOD_NS,
                nonce: 0
            },
            stats(4)
        ],
        "every periodic STATS but the first follows a HELLO, for a host that listens late, \
         and (no host frame came yet) the clock unasked"
    );
    assert_eq!(link.lost(), 0);
}

#[test]
fn stream_clears_and_sends_the_clock_unasked_until_the_host_says_something() {
    let mut s = storage();
    let handles = s.init(&config(true)).unwrap();
    let mut pipe = Pipe::default();
    let mut host = Host::new();
    let mut link = StreamService::new(&handles, &mut pipe, [0u8; DEFAULT_CHUNK_BUFFER]).unwrap();
    host.frames(link.io());
    // The first period is the host's to speak in: STATS alone.
    link.poll(|| {}, || 7);
    assert_eq!(host.frames(link.io()), [stats(0)]);
    assert_eq!(handles.control.clear_request(), 0);
    // A one-way link: HELLO, an unasked CLOCK, STATS and a clear request
    // every period after.
    for (i, t) in [7 + STATS_PERIOD_NS, 7 + 2 * STATS_PERIOD_NS]
        .into_iter()
        .enumerate()
    {
        link.poll(|| {}, || t);
        let frames = host.frames(link.io());
        assert!(
            matches!(frames.as_slice(), [Got::Hello { .. }, Got::Clock { ns, nonce: 0 }, Got::Stats(_)] if *ns == t),
            "period {i}: {frames:?}"
        );
        assert_eq!(handles.control.clear_request(), i as u32 + 1);
    }
    // The host speaks (ENABLE): it asks for the clock and clears when it
    // wants them.
    host.command(link.io(), kind::ENABLE);
    link.poll(|| {}, || 7 + 3 * STATS_PERIOD_NS);
    let frames = host.frames(link.io());
    assert!(
        !frames.iter().any(|f| matches!(f, Got::Clock { .. })),
        "{frames:?}"
    );
    assert!(frames.contains(&stats(0)), "{frames:?}");
    assert_eq!(handles.control.clear_request(), 2);
}

#[test]
fn stream_sends_patches_of_packets_that_span_chunks() {
    let mut s = storage();
    let handles = s.init(&config(true)).unwrap();
    handles.control.set_trace_enabled(true);
    let mut pipe = Pipe::default();
    let mut host = Host::new();
    let mut link = StreamService::new(&handles, &mut pipe, [0u8; DEFAULT_CHUNK_BUFFER]).unwrap();
    let mut w = writer(&handles, 1);
    // 1500 bytes in a nested message: two chunks, the size patched into
    // the first.
    let blob = [7u8; 1500];
    assert_eq!(
        w.write_packet(|p| p.nested(1, |m| m.bytes(2, &blob))),
        PacketOutcome::Written
    );
    w.flush();
    link.poll(|| {}, || 0u64);
    let frames = host.frames(link.io());
    let data: Vec<_> = frames
        .iter()
        .filter(|f| !matches!(f, Got::Hello { .. } | Got::Stats(_) | Got::Clock { .. }))
        .collect();
    assert_eq!(
        data,
        [
            &Got::Chunk {
                writer: 1,
                chunk_id: 0,
                packets: 1
            },
            &Got::Patch {
                chunk_id: 0,
                has_more: false
            },
            &Got::Chunk {
                writer: 1,
                chunk_id: 1,
                packets: 2
            },
        ]
    );
}

#[test]
fn stream_obeys_enable_disable_and_clear() {
    let mut s = storage();
    let handles = s.init(&config(true)).unwrap();
    let control = handles.control;
    let mut pipe = Pipe::default();
    let mut host = Host::new();
    host.command(&mut pipe, kind::ENABLE);
    let mut link = StreamService::new(&handles, &mut pipe, [0u8; DEFAULT_CHUNK_BUFFER]).unwrap();
    assert!(!control.trace_enabled());
    link.poll(|| {}, || 0u64);
    assert!(control.trace_enabled());
    host.command(link.io(), kind::CLEAR);
    host.command(link.io(), kind::CLEAR);
    link.poll(|| {}, || 0u64);
    assert_eq!(control.clear_request(), 2);
    host.command(link.io(), kind::DISABLE);
    link.poll(|| {}, || 0u64);
    assert!(!control.trace_enabled());
    let sent = host.frames(link.io());
    assert!(
        sent.iter()
            .all(|f| matches!(f, Got::Hello { .. } | Got::Stats(_))),
        "commands without an answer: {sent:?}"
    );
}

#[test]
fn stream_flush_sends_its_chunks_before_the_answer_to_a_sync_after_it() {
    let mut s = storage();
    let handles = s.init(&config(true)).unwrap();
    handles.control.set_trace_enabled(true);
    let mut pipe = Pipe::default();
    let mut host = Host::new();
    let mut link = StreamService::new(&handles, &mut pipe, [0u8; DEFAULT_CHUNK_BUFFER]).unwrap();
    let mut a = writer(&handles, 1);
    let mut b = writer(&handles, 2);
    link.poll(|| {}, || 0u64);
    host.frames(link.io());

    event(&mut a, 1);
    event(&mut b, 2);
    // A SYNC alone is answered at once (nothing committed to send).
    host.command_u32(link.io(), kind::SYNC, 11);
    // The bridge's flush barrier.
    host.command_u32(link.io(), kind::FLUSH, 1);
    host.command_u32(link.io(), kind::SYNC, 0x8000_0001);
    let mut flushes = 0;
    let mut t = 100u64;
    link.poll(
        || {
            flushes += 1;
            a.flush();
            b.flush();
        },
        || {
            t += 1;
            t
        },
    );
    assert_eq!(flushes, 1);
    assert_eq!(
        host.frames(link.io()),
        [
            Got::Clock { ns: 101, nonce: 11 },
            Got::Chunk {
                writer: 1,
                chunk_id: 0,
                packets: 2
            },
            Got::Chunk {
                writer: 2,
                chunk_id: 0,
                packets: 2
            },
            stats(0),
            Got::Clock {
                ns: 103,
                nonce: 0x8000_0001
            },
        ],
        "the first clock read at once, the flush's chunks before the second"
    );
}

#[test]
fn stream_commands_split_across_polls_and_mixed_with_garbage_are_found() {
    let mut s = storage();
    let handles = s.init(&config(true)).unwrap();
    let control = handles.control;
    let mut pipe = Pipe::default();
    let mut host = Host::new();
    let mut link = StreamService::new(&handles, &mut pipe, [0u8; DEFAULT_CHUNK_BUFFER]).unwrap();
    link.poll(|| {}, || 0u64);
    host.frames(link.io());

    // Garbage, a frame with a bad CRC, an oversized header, a firmware
    // frame echoed back, then the command.
    let mut enc = FrameEncoder::new();
    let mut bad = Vec::new();
    enc.command(kind::ENABLE, &mut |b: &[u8]| bad.extend_from_slice(b));
    *bad.last_mut().unwrap() ^= 1;
    let mut echo = Vec::new();
    enc.clock(5, 0, &mut |b: &[u8]| echo.extend_from_slice(b));
    let mut wire = Vec::new();
    enc.command_u32(kind::SYNC, 3, &mut |b: &[u8]| wire.extend_from_slice(b));
    let mut input: Vec<u8> = b"\xd5garbage\xd5\x7a".to_vec();
    input.extend_from_slice(&bad);
    input.extend_from_slice(&[0xD5, 0x7A, kind::FLUSH, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
    input.extend_from_slice(&echo);
    input.extend_from_slice(&wire);
    let (first, rest) = input.split_at(input.len() - 7);
    link.io().rx.extend(first);
    link.poll(|| panic!("no FLUSH arrived"), || 50u64);
    assert_eq!(host.frames(link.io()), []);
    assert!(!control.trace_enabled(), "the corrupt ENABLE was skipped");
    link.io().rx.extend(rest);
    link.poll(|| panic!("no FLUSH arrived"), || 60u64);
    assert_eq!(host.frames(link.io()), [Got::Clock { ns: 60, nonce: 3 }]);
}

#[test]
fn stream_poll_takes_a_bounded_amount_of_host_input() {
    let mut s = storage();
    let handles = s.init(&config(true)).unwrap();
    let mut pipe = Pipe::default();
    pipe.rx.extend([0u8; 300]);
    let mut host = Host::new();
    host.command(&mut pipe, kind::ENABLE);
    let mut link = StreamService::new(&handles, &mut pipe, [0u8; DEFAULT_CHUNK_BUFFER]).unwrap();
    link.poll(|| {}, || 0u64);
    assert_eq!(link.io().rx.len(), 300 - 256 + 16);
    assert!(!handles.control.trace_enabled());
    link.poll(|| {}, || 0u64);
    assert!(link.io().rx.is_empty());
    assert!(handles.control.trace_enabled());
}

#[test]
fn stream_refuses_a_shared_ram_region_and_a_short_buffer() {
    let mut s = storage();
    let handles = s.init(&config(false)).unwrap();
    let mut pipe = Pipe::default();
    assert_eq!(
        StreamService::new(&handles, &mut pipe, [0u8; DEFAULT_CHUNK_BUFFER]).err(),
        Some(StreamError::NotStreamMode)
    );
    let mut s = storage();
    let handles = s.init(&config(true)).unwrap();
    assert_eq!(
        StreamService::new(&handles, &mut pipe, [0u8; DEFAULT_CHUNK_BUFFER - 1]).err(),
        Some(StreamError::Reader(ReaderError::BufferTooSmall {
            needed: DEFAULT_CHUNK_BUFFER,
            got: DEFAULT_CHUNK_BUFFER - 1
        }))
    );
    assert!(
        pipe.tx.is_empty(),
        "no HELLO from a service that did not start"
    );
}

#[test]
fn stream_obeys_a_host_that_restarted_its_frame_count() {
    let mut s = storage();
    let handles = s.init(&config(true)).unwrap();
    let mut pipe = Pipe::default();
    let mut link = StreamService::new(&handles, &mut pipe, [0u8; DEFAULT_CHUNK_BUFFER]).unwrap();
    // The first host (a bridge) says three things, at seq 0, 1, 2 ...
    let mut first = Host::new();
    for nonce in 1..=3 {
        first.command_u32(link.io(), kind::SYNC, nonce);
    }
    link.poll(|| {}, || 7u64);
    // ... and is killed; the next one counts from 0 again.
    let mut next = Host::new();
    next.command_u32(link.io(), kind::SYNC, 10);
    next.command_u32(link.io(), kind::SYNC, 11);
    link.poll(|| {}, || 8u64);
    let answers: Vec<(u64, u32)> = first
        .frames(link.io())
        .into_iter()
        .filter_map(|f| match f {
            Got::Clock { ns, nonce } => Some((ns, nonce)),
            _ => None,
        })
        .collect();
    assert_eq!(answers, [(7, 1), (7, 2), (7, 3), (8, 10), (8, 11)]);
}
