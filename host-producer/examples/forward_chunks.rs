//! Forwarding chunks written elsewhere ([`ChunkForwarder`]): a simulated
//! firmware writes track events with shmtrace-abi's `TraceWriter` into its
//! own shared memory (4 KiB pages split in seven 584-byte chunks), stamped
//! on its own clock (sequence-scoped clock 65, nanoseconds since it
//! "booted"); every chunk and patch it commits is forwarded into the
//! sessions that enabled the data source, with a clock snapshot relating
//! clock 65 to BOOTTIME injected before the first packet, so the service
//! and a trace processor place the events on the host's timeline.
//!
//! ```text
//! PERFETTO_PRODUCER_SOCK_NAME=/tmp/perfetto-producer \
//!     cargo run -p shmtrace-producer --example forward_chunks -- --iterations 100
//! ```
//!
//! Enable the data source `shmtrace.forwarded` (or `--data-source NAME`) in
//! a session. Per iteration: a slice `work` (begin and end), an instant
//! `tick` with an int annotation `i`, and every `--large-every` iterations
//! an instant `large` with a string annotation `blob` of `--large-bytes`
//! bytes, a packet spanning several chunks with patches.
//!
//! Reports JSON lines on stdout: `{"event":"enabled"}` once a session
//! started it, then `{"event":"done","emitted":{...},"forward":{...}}`
//! (what it wrote, in the interop checker's vocabulary, the forwarder's
//! counters, and the time writing and forwarding took); it exits once no session has it enabled (or
//! after `--linger-s`).

use std::cell::RefCell;
use std::time::{Duration, Instant};

use shmtrace_abi::layout::{ChunkHeaderRepr, PageLayout, PageSize};
use shmtrace_abi::proto::{encode_to_slice, Message, Sink};
use shmtrace_abi::smb::{Smb, SmbStorage, WritableChunk};
use shmtrace_abi::writer::{BufferId, ChunkArbiter, PatchGroup, PatchesDeferred, TraceWriter};
use shmtrace_producer::{
    ChunkForwarder, DataSourceOptions, ForwardPatch, ForwardedSequence, NoopHandler, ProducerConfig,
};

/// The simulated firmware's absolute clock (sequence-scoped).
const FW_CLOCK: u32 = 65;
const BOOTTIME: u32 = 6;

// TracePacket / TrackEvent / DebugAnnotation / ClockSnapshot field numbers.
const PACKET_TIMESTAMP: u32 = 8;
const PACKET_TIMESTAMP_CLOCK_ID: u32 = 58;
const PACKET_TRACK_EVENT: u32 = 11;
const PACKET_CLOCK_SNAPSHOT: u32 = 6;
const EVENT_TYPE: u32 = 9;
const EVENT_NAME: u32 = 23;
const EVENT_CATEGORIES: u32 = 22;
const EVENT_ANNOTATIONS: u32 = 4;
const ANNOTATION_NAME: u32 = 10;
const ANNOTATION_INT: u32 = 4;
const ANNOTATION_STRING: u32 = 6;
const SNAPSHOT_CLOCKS: u32 = 1;
const CLOCK_ID: u32 = 1;
const CLOCK_TIMESTAMP: u32 = 2;
const TYPE_SLICE_BEGIN: i32 = 1;
const TYPE_SLICE_END: i32 = 2;
const TYPE_INSTANT: i32 = 3;

/// What the firmware committed, in order.
enum Committed {
    Chunk(Vec<u8>),
    Patches(u32, Vec<ForwardPatch>, bool),
}

/// The firmware's arbiter: a private SMB whose committed chunks are copied
/// out (and freed) at once, as a debug probe or a ring reader would.
struct FirmwareArbiter<'s> {
    smb: &'s Smb<'s>,
    out: &'s RefCell<Vec<Committed>>,
}

impl<'s> ChunkArbiter<'s> for FirmwareArbiter<'s> {
    fn acquire_chunk(&mut self, header: ChunkHeaderRepr) -> Option<WritableChunk<'s>> {
        self.smb
            .try_acquire_any_chunk_for_writing(0, PageLayout::Div7, header)
            .ok()
    }

    fn commit_chunk(&mut self, chunk: WritableChunk<'s>, _target: BufferId) {
        let Ok(loc) = chunk.release_as_complete() else {
            return;
        };
        let Ok(r) = self.smb.try_acquire_chunk_for_reading(loc.page, loc.chunk) else {
            return;
        };
        let mut buf = vec![0u8; r.chunk_size()];
        if let Ok(copied) = r.copy_out(&mut buf) {
            buf.truncate(copied.len);
            self.out.borrow_mut().push(Committed::Chunk(buf));
        }
        let _ = r.release_as_free();
    }

    fn send_patches(&mut self, group: &PatchGroup<'_>) -> Result<(), PatchesDeferred> {
        let patches = group
            .patches()
            .map(|p| ForwardPatch {
                offset: u32::from(p.offset),
                data: p.data,
            })
            .collect();
        self.out
            .borrow_mut()
            .push(Committed::Patches(group.chunk_id, patches, group.has_more));
        Ok(())
    }

    fn flush(&mut self) {}
}

struct Args {
    data_source: String,
    iterations: u64,
    large_every: u64,
    large_bytes: usize,
    linger: Duration,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        data_source: "shmtrace.forwarded".into(),
        iterations: 50,
        large_every: 10,
        large_bytes: 3000,
        linger: Duration::from_secs(30),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--data-source" => args.data_source = value()?,
            "--iterations" => args.iterations = number(value()?)?,
            "--large-every" => args.large_every = number(value()?)?.max(1),
            "--large-bytes" => args.large_bytes = number(value()?)? as usize,
            "--linger-s" => args.linger = Duration::from_secs(number(value()?)?),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(args)
}

fn boottime_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// `clock_snapshot { {FW_CLOCK, fw}, {BOOTTIME, boot} }`.
fn clock_snapshot(fw: u64, boot: u64) -> Vec<u8> {
    let mut buf = [0u8; 64];
    let n = encode_to_slice(&mut buf, |p| {
        p.nested(PACKET_CLOCK_SNAPSHOT, |s| {
            for (id, ts) in [(FW_CLOCK, fw), (BOOTTIME, boot)] {
                s.nested(SNAPSHOT_CLOCKS, |c| {
                    c.uint32(CLOCK_ID, id);
                    c.uint64(CLOCK_TIMESTAMP, ts);
                });
            }
        });
    })
    .expect("a clock snapshot fits 64 bytes");
    buf[..n].to_vec()
}

/// One track event on the firmware clock.
fn event<S: Sink>(
    p: &mut Message<'_, S>,
    fw_ns: u64,
    kind: i32,
    name: Option<&str>,
    annotate: impl FnOnce(&mut Message<'_, S>),
) {
    p.uint64(PACKET_TIMESTAMP, fw_ns);
    p.uint32(PACKET_TIMESTAMP_CLOCK_ID, FW_CLOCK);
    p.nested(PACKET_TRACK_EVENT, |e| {
        e.enumeration(EVENT_TYPE, kind);
        if let Some(name) = name {
            e.string(EVENT_NAME, name);
            e.string(EVENT_CATEGORIES, "fw");
        }
        annotate(e);
    });
}

#[derive(Default)]
struct Emitted {
    slice_begin: u64,
    slice_end: u64,
    instant: u64,
    large: u64,
    large_bytes: u64,
    arg_int: u64,
    arg_string: u64,
}

fn forward(seq: &mut ForwardedSequence, out: &RefCell<Vec<Committed>>) {
    for c in out.borrow_mut().drain(..) {
        match c {
            Committed::Chunk(bytes) => {
                if let Err(e) = seq.forward_chunk(&bytes) {
                    eprintln!("forward_chunks: chunk not forwarded: {e}");
                }
            }
            Committed::Patches(chunk, patches, more) => {
                seq.forward_patches(chunk, &patches, more);
            }
        }
    }
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("forward_chunks: {e}");
            std::process::exit(2);
        }
    };
    shmtrace_producer::init(ProducerConfig::default()).expect("start the producer");
    let forwarder =
        ChunkForwarder::register(&args.data_source, DataSourceOptions::default(), NoopHandler)
            .expect("register the data source");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !forwarder.is_enabled() {
        if Instant::now() >= deadline {
            eprintln!("forward_chunks: no session enabled {}", args.data_source);
            std::process::exit(1);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("{{\"event\":\"enabled\"}}");

    // The firmware: booted 1 ms ago on its own clock.
    let booted = boottime_ns() - 1_000_000;
    let fw_now = || boottime_ns() - booted;
    let mut storage = Box::new(SmbStorage::<{ 16 * 1024 }>::new());
    let smb = Smb::new(&mut storage, PageSize::new(4096).expect("4 KiB pages"))
        .expect("the firmware's SMB");
    let out = RefCell::new(Vec::new());
    let mut emitted = Emitted::default();
    let mut seq = forwarder.new_sequence();
    let started = Instant::now();
    {
        let arbiter = FirmwareArbiter {
            smb: &smb,
            out: &out,
        };
        let mut fw = TraceWriter::<_>::new(arbiter, 1, 0).expect("writer id 1");
        // What a bridge measures: firmware time `fw` is host boot time
        // `booted + fw`.
        let fw0 = fw_now();
        seq.set_injected_packet(&clock_snapshot(fw0, booted + fw0))
            .expect("a short packet");
        let blob = "b".repeat(args.large_bytes);
        for i in 0..args.iterations {
            let t = fw_now();
            let _ = fw.write_packet(|p| event(p, t, TYPE_SLICE_BEGIN, Some("work"), |_| {}));
            let _ = fw.write_packet(|p| {
                event(p, t + 1, TYPE_INSTANT, Some("tick"), |e| {
                    e.nested(EVENT_ANNOTATIONS, |a| {
                        a.string(ANNOTATION_NAME, "i");
                        a.int64(ANNOTATION_INT, i as i64);
                    });
                })
            });
            emitted.slice_begin += 1;
            emitted.instant += 1;
            emitted.arg_int += 1;
            if i % args.large_every == 0 {
                let _ = fw.write_packet(|p| {
                    event(p, t + 2, TYPE_INSTANT, Some("large"), |e| {
                        e.nested(EVENT_ANNOTATIONS, |a| {
                            a.string(ANNOTATION_NAME, "blob");
                            a.string(ANNOTATION_STRING, &blob);
                        });
                    })
                });
                emitted.instant += 1;
                emitted.large += 1;
                emitted.large_bytes += blob.len() as u64;
                emitted.arg_string += 1;
            }
            let _ = fw.write_packet(|p| event(p, t + 3, TYPE_SLICE_END, None, |_| {}));
            emitted.slice_end += 1;
            forward(&mut seq, &out);
        }
        fw.flush();
        let stats = fw.stats();
        if stats.packets_dropped() > 0 {
            eprintln!("forward_chunks: the firmware dropped packets: {stats:?}");
        }
    }
    forward(&mut seq, &out);
    forwarder.flush();
    let elapsed_us = started.elapsed().as_micros();
    let s = forwarder.stats();
    println!(
        "{{\"event\":\"done\",\"emitted\":{{\"slice_begin\":{},\"slice_end\":{},\"instant\":{},\
         \"large\":{},\"large_bytes\":{},\"arg_int\":{},\"arg_string\":{}}},\
         \"forward\":{{\"chunks_received\":{},\"chunks_forwarded\":{},\"patches_forwarded\":{},\
         \"patches_dropped\":{},\"packets_injected\":{},\"chunks_dropped\":{}}},\
         \"elapsed_us\":{elapsed_us}}}",
        emitted.slice_begin,
        emitted.slice_end,
        emitted.instant,
        emitted.large,
        emitted.large_bytes,
        emitted.arg_int,
        emitted.arg_string,
        s.chunks_received,
        s.chunks_forwarded,
        s.patches_forwarded,
        s.patches_dropped,
        s.packets_injected,
        s.chunks_no_session
            + s.chunks_invalid
            + s.chunks_too_big
            + s.chunks_no_room
            + s.chunks_no_writer_id
            + s.chunks_lost,
    );
    let deadline = Instant::now() + args.linger;
    while forwarder.is_enabled() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(seq);
    if let Some(p) = shmtrace_producer::Producer::get() {
        p.shutdown();
    }
}
