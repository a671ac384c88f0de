//! Service throughput benchmarks.
//!
//! * `commit/*`: bytes per second moved from a producer's SMB into a trace
//!   buffer through the whole `CommitData` path of the service core (chunk
//!   acquire-for-reading, copy, free, authorization, fragment scan, store),
//!   64 full chunks of a 4 KiB page per request. `commit/memcpy` copies the same bytes
//!   with `copy_from_slice` into a ring of the same size, in the same run:
//!   the ceiling.
//! * `buffer/*`: the trace buffer alone (`TraceBuffer::commit` of copied
//!   chunks), same reference.
//! * `read/*`: bytes per second of packets returned through `ReadBuffers`
//!   (reassembly, validation, trusted appendix, reply encoding).
//!
//! Producer-side work (writing and publishing the chunks) happens in the
//! untimed setup of each batch.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use shmtrace_abi::layout::{ChunkFlags, ChunkHeaderRepr, Packets, PageLayout, PageSize};
use shmtrace_abi::proto::wire::WireType;
use shmtrace_abi::trace::{tag2, trace_packet};
use shmtrace_service::ipc::shm::{Adoption, SharedMemory};
use shmtrace_service::ipc::{Call, PeerCredentials};
use shmtrace_service::protos::commit_data_request::ChunksToMove;
use shmtrace_service::protos::get_async_command_response::Cmd;
use shmtrace_service::protos::{self, consumer_port, producer_port, trace_config};
use shmtrace_service::service::buffer::{
    ChunkCommit, FillPolicy, ReadMode, ReadStatus, TraceBuffer,
};
use shmtrace_service::service::core::{ConnId, Output, ReplyBody, ServiceConfig, TracingService};
use shmtrace_service::service::env::SystemEnvironment;

const CHUNKS: usize = 64;
const CHUNK: usize = 4088;
const PAYLOAD: usize = CHUNK - 8;
const PACKET: usize = 120;

/// A full chunk payload: 33 packets of 120 bytes (1-byte sizes), then
/// padding.
fn payload() -> (Vec<u8>, u16) {
    let mut p = Vec::with_capacity(PAYLOAD);
    let mut count = 0;
    while p.len() + 1 + PACKET <= PAYLOAD {
        p.push(PACKET as u8);
        // A valid TracePacket: field 900 (bytes) with 117 bytes.
        p.extend_from_slice(&tag2(trace_packet::FOR_TESTING, WireType::LengthDelimited));
        p.push(117);
        p.extend((0..117).map(|i| i as u8));
        count += 1;
    }
    p.resize(PAYLOAD, 0);
    (p, count)
}

struct World {
    svc: TracingService,
    producer: ConnId,
    consumer: ConnId,
    smb: SharedMemory,
    buffer: u32,
    next: u64,
}

impl World {
    fn new(buffer_kb: u32) -> Self {
        let cfg = ServiceConfig::new(0);
        let mut svc = TracingService::new(cfg, Box::new(SystemEnvironment));
        let creds = PeerCredentials {
            pid: 1,
            uid: 0,
            gid: 0,
        };
        let producer = svc.connect_producer(creds);
        let consumer = svc.connect_consumer(creds);
        let mut w = Self {
            svc,
            producer,
            consumer,
            smb: SharedMemory::heap(4096, PageSize::DEFAULT).unwrap(),
            buffer: 0,
            next: 1,
        };
        let init = protos::InitializeConnectionRequest {
            shared_memory_size_hint_bytes: Some(1024 * 1024),
            ..Default::default()
        };
        w.producer_call(producer_port::Request::InitializeConnection(init));
        w.producer_call(producer_port::Request::GetAsyncCommand(Default::default()));
        let desc = protos::DataSourceDescriptor {
            name: Some("ds".into()),
            ..Default::default()
        };
        let reg = protos::RegisterDataSourceRequest {
            data_source_descriptor: Some(desc),
        };
        w.producer_call(producer_port::Request::RegisterDataSource(reg));
        let dsc = protos::DataSourceConfig {
            name: Some("ds".into()),
            ..Default::default()
        };
        let cfg = protos::TraceConfig {
            buffers: vec![trace_config::BufferConfig {
                size_kb: Some(buffer_kb),
                ..Default::default()
            }],
            data_sources: vec![trace_config::DataSource {
                config: Some(protos::to_raw(&dsc)),
                ..Default::default()
            }],
            ..Default::default()
        };
        let enable = protos::EnableTracingRequest {
            trace_config: Some(protos::to_raw(&cfg)),
            attach_notification_only: None,
        };
        w.consumer_call(consumer_port::Request::EnableTracing(enable));
        while let Some(o) = w.svc.poll_output() {
            let Output::Reply {
                body: ReplyBody::Ok(b),
                fd,
                ..
            } = o
            else {
                continue;
            };
            let Ok(resp) = <protos::GetAsyncCommandResponse as prost::Message>::decode(b) else {
                continue;
            };
            match resp.cmd {
                Some(Cmd::SetupTracing(_)) => {
                    w.smb =
                        SharedMemory::adopt(fd.unwrap(), PageSize::DEFAULT, Adoption::ByProducer)
                            .unwrap()
                }
                Some(Cmd::SetupDataSource(s)) => {
                    let c = <protos::DataSourceConfig as prost::Message>::decode(s.config.unwrap())
                        .unwrap();
                    w.buffer = c.target_buffer.unwrap();
                }
                _ => {}
            }
        }
        w
    }

    fn producer_call(&mut self, request: producer_port::Request) {
        let id = self.next;
        self.next += 1;
        self.svc
            .on_producer_call(self.producer, Call::new(request, 1, id, None));
    }

    fn consumer_call(&mut self, request: consumer_port::Request) {
        let id = self.next;
        self.next += 1;
        self.svc
            .on_consumer_call(self.consumer, Call::new(request, 1, id, None));
    }

    /// Producer side (untimed): fills and publishes `CHUNKS` chunks.
    fn publish(&mut self, payload: &[u8], count: u16, first_id: u32) -> protos::CommitDataRequest {
        let smb = self.smb.smb();
        let mut req = protos::CommitDataRequest::default();
        for i in 0..CHUNKS {
            let header = ChunkHeaderRepr {
                chunk_id: first_id + i as u32,
                writer_id: 1,
                packets: Packets::new(count, ChunkFlags::EMPTY).unwrap(),
            };
            let mut chunk = smb
                .try_acquire_any_chunk_for_writing(0, PageLayout::Div1, header)
                .unwrap();
            chunk.write(0, payload).unwrap();
            let loc = chunk.release_as_complete().unwrap();
            req.chunks_to_move.push(ChunksToMove {
                page: Some(loc.page as u32),
                chunk: Some(loc.chunk as u32),
                target_buffer: Some(self.buffer),
                ..Default::default()
            });
        }
        req
    }

    /// Reads the buffers through ReadBuffers; returns the packet bytes.
    fn read_all(&mut self) -> usize {
        self.consumer_call(consumer_port::Request::ReadBuffers(Default::default()));
        let mut bytes = 0;
        while let Some(o) = self.svc.poll_read_reply(self.consumer) {
            if let Output::Reply {
                body: ReplyBody::Ok(b),
                ..
            } = o
            {
                bytes += b.len();
            }
        }
        bytes
    }
}

fn commit(c: &mut Criterion) {
    let (payload, count) = payload();
    let mut g = c.benchmark_group("commit");
    g.throughput(Throughput::Bytes((CHUNKS * CHUNK) as u64));
    let mut w = World::new(64 * 1024);
    let mut id = 0u32;
    g.bench_function("smb_to_buffer", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                id = id.wrapping_add(CHUNKS as u32);
                let req = w.publish(&payload, count, id);
                let start = Instant::now();
                w.producer_call(producer_port::Request::CommitData(req));
                timed += start.elapsed();
            }
            timed
        })
    });
    let src = vec![7u8; CHUNKS * CHUNK];
    let mut ring = vec![0u8; 64 * 1024 * 1024];
    let mut at = 0;
    g.bench_function("memcpy", |b| {
        b.iter(|| {
            for chunk in src.chunks(CHUNK) {
                if at + CHUNK > ring.len() {
                    at = 0;
                }
                ring[at..at + CHUNK].copy_from_slice(black_box(chunk));
                at += CHUNK;
            }
        })
    });
    g.finish();

    let mut g = c.benchmark_group("buffer");
    g.throughput(Throughput::Bytes((CHUNKS * PAYLOAD) as u64));
    let mut buf = TraceBuffer::new(64 << 20, FillPolicy::RingBuffer).unwrap();
    let packets = Packets::new(count, ChunkFlags::EMPTY).unwrap();
    let mut id = 0u32;
    g.bench_function("commit", |b| {
        b.iter(|| {
            for _ in 0..CHUNKS {
                id = id.wrapping_add(1);
                buf.commit(&ChunkCommit {
                    producer: 1,
                    writer: 1,
                    chunk_id: id,
                    packets,
                    payload: &payload,
                    complete: true,
                });
            }
        })
    });
    g.finish();
}

fn read(c: &mut Criterion) {
    let (payload, count) = payload();
    let mut g = c.benchmark_group("read");
    let packet_bytes = (CHUNKS * usize::from(count) * PACKET) as u64;
    g.throughput(Throughput::Bytes(packet_bytes));
    let mut w = World::new(64 * 1024);
    let mut id = 0u32;
    g.bench_function("read_buffers", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                let req = w.publish(&payload, count, id);
                id = id.wrapping_add(CHUNKS as u32);
                w.producer_call(producer_port::Request::CommitData(req));
                let start = Instant::now();
                let bytes = black_box(w.read_all());
                timed += start.elapsed();
                assert!(bytes as u64 >= packet_bytes, "read {bytes} bytes");
            }
            timed
        })
    });
    let mut buf = TraceBuffer::new(64 << 20, FillPolicy::RingBuffer).unwrap();
    let packets = Packets::new(count, ChunkFlags::EMPTY).unwrap();
    let mut id = 0u32;
    g.bench_function("buffer_read", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                for _ in 0..CHUNKS {
                    id = id.wrapping_add(1);
                    buf.commit(&ChunkCommit {
                        producer: 1,
                        writer: 1,
                        chunk_id: id,
                        packets,
                        payload: &payload,
                        complete: true,
                    });
                }
                let start = Instant::now();
                let mut n = 0;
                buf.begin_read(ReadMode::Live);
                while buf.read(usize::MAX, |p| n += p.len()) == ReadStatus::More {}
                black_box(n);
                timed += start.elapsed();
                assert_eq!(n as u64, packet_bytes);
            }
            timed
        })
    });
    g.finish();
}

criterion_group!(benches, commit, read);
criterion_main!(benches);
