//! Writer and SMB micro-benchmarks.
//!
//! * `packet/*`: ns per packet written by a `TraceWriter` (encoding, chunk
//!   bookkeeping, the count store; chunk switches amortized). The service
//!   drains the SMB between timed batches, outside the measurement.
//! * `chunk/*`: ns per chunk for the SMB state machine: producer
//!   acquire + release, and the full cycle including the service's
//!   acquire-for-reading, copy and free.
//! * `proto/*`: the same packets encoded into a plain slice, for reference.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use shmtrace_abi::layout::{ChunkHeaderRepr, Packets, PageLayout, PageSize};
use shmtrace_abi::proto::{encode_to_slice, Message, Sink};
use shmtrace_abi::region::{RegionArbiter, RegionConfig, RegionReader, RegionStorage};
use shmtrace_abi::smb::{Smb, SmbStorage};
use shmtrace_abi::writer::TraceWriter;

const SMB_BYTES: usize = 256 * 1024;
const BATCH: u64 = 2_000;

/// Timestamps around 10^12 ns: 6-byte varints, as for a real boot clock.
const TS_BASE: u64 = 1_000_000_000_000;

/// A 32-byte TracePacket: timestamp (1 + 6 bytes) + a 23-byte string
/// field (2 + 23 bytes).
fn small_packet<S: Sink>(p: &mut Message<'_, S>, ts: u64) {
    p.uint64(8, ts);
    p.string(2, "abcdefghijklmnopqrstuvw");
}

/// A TrackEvent slice-begin packet with interned name/category and one
/// debug annotation.
fn track_event_packet<S: Sink>(p: &mut Message<'_, S>, ts: u64) {
    p.uint64(8, ts);
    p.nested(11, |te| {
        te.enumeration(9, 1); // type = SLICE_BEGIN
        te.uint64(10, 42); // name_iid
        te.uint64(3, 1); // category_iids
        te.uint64(3, 2);
        te.nested(4, |da| {
            da.uint64(1, 7); // name_iid
            da.int64(4, ts as i64 & 0xFFFF); // int_value
        });
    });
    p.uint32(13, 2); // sequence_flags = SEQ_NEEDS_INCREMENTAL_STATE
}

/// Times `$write` through a `TraceWriter` (a macro: the message type
/// borrows the SMB created inside).
macro_rules! bench_writer {
    ($group:expr, $name:expr, $write:path) => {
        $group.bench_function($name, |b| {
            let mut storage = Box::new(RegionStorage::<SMB_BYTES, 128>::new());
            let handles = storage.init(&RegionConfig::new("bench")).unwrap();
            let mut rx = RegionReader::attach(&handles).unwrap();
            let arbiter = RegionArbiter::new(&handles, PageLayout::Div1).unwrap();
            let mut writer: TraceWriter<_> = TraceWriter::new(arbiter, 1, 1).unwrap();
            let mut buf = vec![0u8; 4096];
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut done = 0;
                while done < iters {
                    let n = BATCH.min(iters - done);
                    let start = Instant::now();
                    for i in 0..n {
                        let _ = writer.write_packet(|p| $write(p, black_box(TS_BASE + done + i)));
                    }
                    total += start.elapsed();
                    done += n;
                    while let Some(record) = rx.poll(&mut buf).unwrap() {
                        black_box(record);
                    }
                }
                total
            });
            assert_eq!(writer.stats().packets_dropped(), 0);
        })
    };
}

fn bench_packets(c: &mut Criterion) {
    let mut g = c.benchmark_group("packet");
    bench_writer!(g, "32B", small_packet);
    bench_writer!(g, "track_event", track_event_packet);
    g.finish();
}

fn bench_chunks(c: &mut Criterion) {
    let mut g = c.benchmark_group("chunk");
    let header = ChunkHeaderRepr {
        chunk_id: 0,
        writer_id: 1,
        packets: Packets::EMPTY,
    };
    g.bench_function("acquire_release", |b| {
        let mut storage = Box::new(SmbStorage::<SMB_BYTES>::new());
        let smb = Smb::new(&mut storage, PageSize::DEFAULT).unwrap();
        let mut taken = Vec::with_capacity(64);
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut done = 0;
            let mut page = 0;
            while done < iters {
                let n = 64.min(iters - done);
                let start = Instant::now();
                for _ in 0..n {
                    let chunk = smb
                        .try_acquire_any_chunk_for_writing(page, PageLayout::Div4, header)
                        .unwrap();
                    page = chunk.location().page;
                    taken.push(chunk.release_as_complete().unwrap());
                }
                total += start.elapsed();
                done += n;
                for loc in taken.drain(..) {
                    smb.release_complete_as_free(loc.page, loc.chunk).unwrap();
                }
            }
            total
        });
    });
    g.bench_function("full_cycle", |b| {
        let mut storage = Box::new(SmbStorage::<SMB_BYTES>::new());
        let smb = Smb::new(&mut storage, PageSize::DEFAULT).unwrap();
        let mut buf = vec![0u8; 4096];
        b.iter(|| {
            let chunk = smb
                .try_acquire_any_chunk_for_writing(0, PageLayout::Div4, header)
                .unwrap();
            let loc = chunk.release_as_complete().unwrap();
            let read = smb
                .try_acquire_chunk_for_reading(loc.page, loc.chunk)
                .unwrap();
            black_box(read.copy_out(&mut buf).unwrap());
            read.release_as_free().unwrap();
        });
    });
    g.finish();
}

fn bench_proto(c: &mut Criterion) {
    let mut g = c.benchmark_group("proto");
    let mut buf = [0u8; 256];
    assert_eq!(
        encode_to_slice(&mut buf, |p| small_packet(p, TS_BASE)),
        Ok(32)
    );
    g.bench_function("32B_slice", |b| {
        b.iter(|| encode_to_slice(&mut buf, |p| small_packet(p, black_box(TS_BASE))).unwrap())
    });
    g.bench_function("track_event_slice", |b| {
        b.iter(|| encode_to_slice(&mut buf, |p| track_event_packet(p, black_box(TS_BASE))).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench_packets, bench_chunks, bench_proto);
criterion_main!(benches);
