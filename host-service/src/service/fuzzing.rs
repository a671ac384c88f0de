//! Fuzz entry points for the service (see `fuzz/`): each takes arbitrary
//! bytes, drives one part of the service with them, and panics only if an
//! invariant breaks. Hidden from the docs; also runnable from tests.
//!
//! * [`trace_buffer_ops`]: a script of commits (well-formed and garbage;
//!   private copies and [`commit_in_place`]), scrapes, patches, writer and
//!   producer life-cycle events and reads,
//!   against a small buffer. Invariants: nothing panics, every packet read
//!   is non-empty and made of bytes that were committed, and after a final
//!   drain every chunk stored is accounted as read or overwritten.
//! * [`smb_commit`]: a service core with two producers on SMBs and two on
//!   shmem emulation (as over TCP); the input scribbles over one SMB
//!   producer's SMB (headers, page bitmaps, payloads) between `CommitData`
//!   requests, makes one emulated producer commit arbitrary inline chunks
//!   (any size, header, target, `chunk_incomplete`), flushes (with
//!   scraping) and reads. Invariants: nothing panics, only the hostile
//!   producers may be cut off, the honest producers' packets (SMB and
//!   inline) come out exactly.
//! * [`packet_validator`]: the streaming validator against a plain
//!   reference parser, over arbitrary slicings; an accepted packet with the
//!   trusted appendix reads back the appended values.
//! * [`session_calls`]: consumers, producers and relays making arbitrary
//!   calls on one service core (raw request bytes for every method, and
//!   generated configs and requests that name each other's sessions,
//!   instances, flushes and triggers), time passing and connections closing
//!   at any point. Invariants: nothing panics, nothing is sent to a closed
//!   connection, ReadBuffers replies decode.
//! * [`trace_filter`]: a trace filter built from arbitrary bytecode words
//!   (checksummed, so most load), overlay and string rules, run on an
//!   arbitrary packet. Invariants: nothing panics; a filtered packet is no
//!   longer than the input, parses, and holds only fields the filter
//!   keeps; a malformed one leaves nothing.

use prost::Message;
use shmtrace_abi::layout::{
    ChunkFlags, ChunkHeaderRepr, Packets, PageLayout, PageSize, CHUNK_HEADER_SIZE,
};

use super::buffer::{ChunkCommit, CommitOutcome, FillPolicy, ReadMode, ReadStatus, TraceBuffer};
use super::core::{ConnId, Output, ReplyBody, ServiceConfig, TracingService, MAX_EMULATED_CHUNK};
use super::env::FakeEnvironment;
use super::trusted::TrustedFields;
use super::validator::{validate, InvalidPacket, RESERVED_FIELDS};
use crate::ipc::rpc::ServiceRequest;
use crate::ipc::shm::{Adoption, SharedMemory};
use crate::ipc::{Call, PeerCredentials};
use crate::protos::commit_data_request::{chunk_to_patch, ChunkToPatch, ChunksToMove};
use crate::protos::get_async_command_response::Cmd;
use crate::protos::wire::put_varint;
use crate::protos::{
    self, consumer_port, producer_port, trace_config, CommitDataRequest, DataSourceConfig,
    DataSourceDescriptor, EnableTracingRequest, FlushRequest, GetAsyncCommandResponse,
    InitializeConnectionRequest, ReadBuffersResponse, RegisterDataSourceRequest,
    RegisterTraceWriterRequest, TraceConfig,
};
use shmtrace_abi::proto::wire::{read_varint, VarintError, WireType};
use shmtrace_abi::trace::tag2;

/// A byte reader that never fails (zeros once exhausted).
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a.to_vec()
    }
    /// Up to `max - 1` bytes, as many as the next byte says.
    fn sized(&mut self, max: u8) -> Vec<u8> {
        let n = usize::from(self.u8() % max);
        self.bytes(n)
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// A number below `n` (`n` > 0).
    fn u32_below(&mut self, n: u32) -> u32 {
        u32::from(self.u8()) % n
    }
}

/// Commits `c` the way the service moves a chunk out of an SMB: a
/// reservation of `chunk_size` bytes (at least header and payload) is filled
/// with the header, the payload and garbage after it, then parsed in place.
/// Falls back to [`TraceBuffer::commit`] where the buffer gives no
/// reservation, as the service does.
pub fn commit_in_place(
    buf: &mut TraceBuffer,
    c: &ChunkCommit<'_>,
    chunk_size: usize,
) -> CommitOutcome {
    let chunk_size = chunk_size.max(CHUNK_HEADER_SIZE + c.payload.len());
    let Some(mut r) = buf.reserve(chunk_size) else {
        return buf.commit(c);
    };
    let header = ChunkHeaderRepr {
        chunk_id: c.chunk_id,
        writer_id: c.writer,
        packets: c.packets,
    };
    let dst = r.chunk_mut();
    assert_eq!(dst.len(), chunk_size, "a reservation is the chunk's size");
    let (head, rest) = dst.split_at_mut(CHUNK_HEADER_SIZE);
    head.copy_from_slice(&header.to_bytes());
    let (payload, tail) = rest.split_at_mut(c.payload.len());
    payload.copy_from_slice(c.payload);
    tail.fill(0xEE);
    r.commit(c.producer, c.complete)
}

/// Builds a payload of `n` well-formed fragments (1-byte sizes) from input.
fn fragments(input: &mut Input<'_>, n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..n {
        let len = usize::from(input.u8() % 40);
        out.push(len as u8);
        out.extend(input.bytes(len));
    }
    out
}

/// See the module docs.
pub fn trace_buffer_ops(data: &[u8]) {
    let mut input = Input(data);
    let policy = if input.u8() & 1 == 0 {
        FillPolicy::RingBuffer
    } else {
        FillPolicy::Discard
    };
    let size = TraceBuffer::MIN_SIZE + usize::from(input.u16() % 8192);
    let Ok(mut buf) = TraceBuffer::new(size, policy) else {
        return;
    };
    let mut committed = Vec::new();
    while !input.is_empty() {
        let producer = u16::from(input.u8() % 3);
        let writer = u16::from(input.u8() % 3) + 1;
        match input.u8() % 8 {
            0..=2 => {
                let chunk_id =
                    u32::from(input.u8() % 16).wrapping_sub(u32::from(input.u8() % 2) * 8);
                let count = input.u8() % 6;
                let flags = input.u8() & 0x7;
                let payload = if input.u8() % 4 == 0 {
                    {
                        let n = usize::from(input.u8());
                        input.bytes(n)
                    }
                } else {
                    fragments(&mut input, usize::from(count))
                };
                let packets = Packets::new(u16::from(count), ChunkFlags::from_bits_retain(flags))
                    .unwrap_or(Packets::EMPTY);
                let how = input.u8();
                let c = ChunkCommit {
                    producer,
                    writer,
                    chunk_id,
                    packets,
                    payload: &payload,
                    complete: how % 4 != 0,
                };
                if how & 4 == 0 {
                    buf.commit(&c);
                    committed.push(payload);
                } else {
                    // As from an SMB, in a chunk of up to 255 more bytes
                    // (which commit_in_place fills with 0xEE: part of the
                    // chunk, as the unwritten rest of an SMB chunk is).
                    let slack = usize::from(input.u8());
                    commit_in_place(&mut buf, &c, CHUNK_HEADER_SIZE + payload.len() + slack);
                    let mut whole = payload;
                    whole.resize(whole.len() + slack, 0xEE);
                    committed.push(whole);
                }
            }
            3 => {
                let chunk_id = u32::from(input.u8() % 16);
                let patch = input.bytes(4);
                let offset = u32::from(input.u8());
                buf.patch(
                    producer,
                    writer,
                    chunk_id,
                    &[(offset, &patch)],
                    input.u8() & 1 == 0,
                );
            }
            4 => buf.writer_unregistered(producer, writer),
            5 => buf.producer_gone(producer),
            _ => {
                let mode = if input.u8() & 1 == 0 {
                    ReadMode::Live
                } else {
                    ReadMode::Drain
                };
                let budget = usize::from(input.u16());
                buf.begin_read(mode);
                while buf.read(budget, |p| check_packet(p, &committed)) == ReadStatus::More {}
            }
        }
    }
    buf.begin_read(ReadMode::Drain);
    while buf.read(usize::MAX, |p| check_packet(p, &committed)) == ReadStatus::More {}
    let s = buf.stats();
    assert_eq!(
        s.chunks_written,
        s.chunks_read + s.chunks_overwritten,
        "{s:?}"
    );
}

/// Every slice of a packet read must be a substring of some committed
/// payload (patches aside: a patch can change bytes, so only slices of
/// chunks never patched could be checked exactly; lengths are checked).
fn check_packet(p: &super::buffer::Packet<'_>, committed: &[Vec<u8>]) {
    // An empty packet is a loss mark, which has a loss.
    assert!(!p.is_empty() || !p.loss.is_empty());
    assert_eq!(p.slices().map(<[u8]>::len).sum::<usize>(), p.len());
    for s in p.slices() {
        assert!(
            committed.iter().any(|c| c.len() >= s.len()),
            "a slice longer than any chunk"
        );
    }
}

/// Reference top-level parse: `Ok(fields)` (with varint values) or the
/// first error; reserved fields are errors if `producer` is set.
fn reference(bytes: &[u8], producer: bool) -> Result<Vec<(u32, u64)>, InvalidPacket> {
    let mut i = 0;
    let mut out = Vec::new();
    let varint = |i: &mut usize| -> Result<u64, InvalidPacket> {
        let (v, n) = read_varint(bytes.get(*i..).unwrap_or(&[])).map_err(|e| match e {
            VarintError::Truncated => InvalidPacket::Truncated,
            VarintError::TooLong => InvalidPacket::VarintTooLong,
        })?;
        *i += n;
        Ok(v)
    };
    while i < bytes.len() {
        let tag = varint(&mut i)?;
        let field = tag >> 3;
        if field == 0 || field >= 1 << 29 {
            return Err(InvalidPacket::InvalidFieldNumber);
        }
        let field = field as u32;
        if producer && RESERVED_FIELDS.contains(&field) {
            return Err(InvalidPacket::ReservedField(field));
        }
        let value = match tag & 7 {
            0 => varint(&mut i)?,
            1 => {
                i += 8;
                0
            }
            5 => {
                i += 4;
                0
            }
            2 => {
                let len = varint(&mut i)?;
                if len > super::validator::MAX_FIELD_LEN {
                    return Err(InvalidPacket::FieldTooLong { field, len });
                }
                i = i.saturating_add(len as usize);
                0
            }
            w => {
                return Err(InvalidPacket::InvalidWireType {
                    field,
                    wire_type: w as u8,
                })
            }
        };
        if i > bytes.len() {
            return Err(InvalidPacket::Truncated);
        }
        out.push((field, value));
    }
    Ok(out)
}

/// See the module docs.
pub fn packet_validator(data: &[u8]) {
    let Some((&cuts, packet)) = data.split_first() else {
        return;
    };
    let expected = reference(packet, true);
    // Slice at positions derived from the first byte.
    let mut slices = Vec::new();
    let mut start = 0;
    let step = usize::from(cuts % 7) + 1;
    while start < packet.len() {
        let end = (start + step).min(packet.len());
        slices.push(&packet[start..end]);
        start = end;
    }
    assert_eq!(
        validate(slices.iter().copied()),
        expected.as_ref().map(|_| ()).map_err(|e| *e)
    );
    if expected.is_ok() {
        let trusted = TrustedFields {
            uid: 1234,
            sequence_id: 7,
            pid: Some(99),
            machine_id: 0,
            previous_packet_dropped: 3,
        };
        let appendix = trusted.encode();
        let mut whole = packet.to_vec();
        whole.extend_from_slice(appendix.as_bytes());
        let fields = reference(&whole, false).expect("packet + appendix parses");
        let last = |f: u32| fields.iter().rev().find(|(n, _)| *n == f).map(|&(_, v)| v);
        assert_eq!(last(3), Some(1234));
        assert_eq!(last(10), Some(7));
        assert_eq!(last(79), Some(99));
        assert_eq!(last(42), Some(3));
    }
}

/// The tag of the one field (bytes) of the honest SMB producer's packets
/// in [`smb_commit`]: a field no schema names, which the validator lets
/// through.
const SMB_PACKET_TAG: [u8; 2] = tag2(905, WireType::LengthDelimited);
/// [`SMB_PACKET_TAG`] for the honest emulated producer's packets.
const INLINE_PACKET_TAG: [u8; 2] = tag2(906, WireType::LengthDelimited);

/// See the module docs.
pub fn smb_commit(data: &[u8]) {
    let mut input = Input(data);
    let mut w = SmbWorld::new();
    let mut expected = Vec::new();
    let mut expected_remote = Vec::new();
    let mut next_chunk = 0u32;
    let mut next_remote_chunk = 0u32;
    while !input.is_empty() {
        match input.u8() % 8 {
            0 => {
                // The honest producer commits a chunk with one packet.
                let n = usize::from(input.u8() % 60) + 1;
                let packet = input.bytes(n);
                let [t0, t1] = SMB_PACKET_TAG;
                let mut payload = vec![packet.len() as u8 + 3, t0, t1];
                payload.push(packet.len() as u8);
                payload.extend_from_slice(&packet);
                let mut whole = vec![t0, t1, packet.len() as u8];
                whole.extend_from_slice(&packet);
                if w.honest_commit(next_chunk, &payload) {
                    expected.push(whole);
                }
                next_chunk += 1;
            }
            1 => {
                // The hostile producer scribbles over its SMB.
                let offset = u64::from(input.u16()) * 4 % w.hostile_len;
                let n = usize::from(input.u8() % 32);
                let bytes = input.bytes(n);
                w.scribble(offset, &bytes);
            }
            2 => {
                // ... and commits whatever is there, with forged patches.
                let n = usize::from(input.u8() % 8);
                let mut req = CommitDataRequest::default();
                for _ in 0..n {
                    req.chunks_to_move.push(ChunksToMove {
                        page: Some(u32::from(input.u8() % 80)),
                        chunk: Some(u32::from(input.u8() % 16)),
                        target_buffer: Some(u32::from(input.u8() % 3)),
                        ..Default::default()
                    });
                }
                req.chunks_to_patch.push(ChunkToPatch {
                    target_buffer: Some(u32::from(w.buffer)),
                    writer_id: Some(u32::from(input.u8() % 3)),
                    chunk_id: Some(u32::from(input.u8() % 8)),
                    patches: vec![chunk_to_patch::Patch {
                        offset: Some(u32::from(input.u8())),
                        data: Some(input.bytes(4).into()),
                    }],
                    has_more_patches: Some(false),
                });
                w.call_hostile(producer_port::Request::CommitData(req));
            }
            3 => w.call_hostile(producer_port::Request::RegisterTraceWriter(
                RegisterTraceWriterRequest {
                    trace_writer_id: Some(u32::from(input.u8() % 3)),
                    target_buffer: Some(u32::from(w.buffer)),
                },
            )),
            4 => w.flush_and_scrape(),
            5 => {
                // The honest emulated producer commits a one-packet chunk
                // inline.
                let n = usize::from(input.u8() % 60) + 1;
                let packet = input.bytes(n);
                let mut chunk = one_fragment_header(next_remote_chunk).to_vec();
                let [t0, t1] = INLINE_PACKET_TAG;
                chunk.extend_from_slice(&[packet.len() as u8 + 3, t0, t1]);
                chunk.push(packet.len() as u8);
                chunk.extend_from_slice(&packet);
                let mut whole = vec![t0, t1, packet.len() as u8];
                whole.extend_from_slice(&packet);
                expected_remote.push(whole);
                next_remote_chunk += 1;
                w.commit_inline(w.remote, vec![(w.buffer.into(), chunk, false)]);
            }
            6 => {
                // The hostile emulated producer commits arbitrary inline
                // chunks: any size (the edges of what a chunk header can
                // say among them), header, target and completeness.
                let n = usize::from(input.u8() % 4) + 1;
                let mut chunks = Vec::new();
                for _ in 0..n {
                    let len = match input.u8() % 8 {
                        0 => MAX_EMULATED_CHUNK + usize::from(input.u8() % 3),
                        1 => usize::from(input.u8() % 9),
                        _ => usize::from(input.u16() % 600),
                    };
                    let mut data = input.bytes(len);
                    data.resize(len, 0xA5);
                    let target = u32::from(input.u8() % 3);
                    let incomplete = input.u8() & 1 == 1;
                    chunks.push((target, data, incomplete));
                }
                w.commit_inline(w.remote_hostile, chunks);
            }
            _ => w.read(),
        }
    }
    w.stop();
    w.read();
    // Every packet of the honest producer, in order, byte for byte.
    let got: Vec<&Vec<u8>> = w
        .read_packets
        .iter()
        .filter(|p| p.first() == Some(&0xCA))
        .collect();
    assert_eq!(got.len(), expected.len(), "honest packets lost or invented");
    for (g, e) in got.iter().zip(&expected) {
        assert!(g.starts_with(e), "an honest packet changed");
    }
    // Every packet of the honest emulated producer (told apart by its
    // trusted uid, which no producer can forge), in order, byte for byte.
    let got: Vec<&Vec<u8>> = w
        .read_packets
        .iter()
        .filter(|p| trusted_uid(p) == Some(u64::from(REMOTE_UID)))
        .collect();
    assert_eq!(
        got.len(),
        expected_remote.len(),
        "honest inline packets lost or invented"
    );
    for (g, e) in got.iter().zip(&expected_remote) {
        assert!(g.starts_with(e), "an honest inline packet changed");
    }
}

/// The uid of the honest emulated producer.
const REMOTE_UID: u32 = 7;

/// The last `trusted_uid` (field 3) of a packet read back.
fn trusted_uid(packet: &[u8]) -> Option<u64> {
    crate::protos::wire::Fields::new(packet)
        .filter_map(Result::ok)
        .filter(|f| f.number == 3)
        .filter_map(|f| match f.value {
            crate::protos::wire::Value::Varint(v) => Some(v),
            _ => None,
        })
        .last()
}

/// The header of chunk `chunk_id` of writer 1 holding one fragment.
fn one_fragment_header(chunk_id: u32) -> [u8; CHUNK_HEADER_SIZE] {
    ChunkHeaderRepr {
        chunk_id,
        writer_id: 1,
        packets: Packets::new(1, ChunkFlags::EMPTY).unwrap_or(Packets::from_bits(1)),
    }
    .to_bytes()
}

/// A service core with an honest and a hostile producer sharing a session.
struct SmbWorld {
    svc: TracingService,
    env: FakeEnvironment,
    next_request: u64,
    honest: ConnId,
    hostile: ConnId,
    /// An honest producer on shmem emulation.
    remote: ConnId,
    /// A hostile producer on shmem emulation.
    remote_hostile: ConnId,
    consumer: ConnId,
    honest_smb: SharedMemory,
    hostile_fd: std::os::fd::OwnedFd,
    hostile_len: u64,
    buffer: u16,
    read_packets: Vec<Vec<u8>>,
    partial: Vec<u8>,
}

impl SmbWorld {
    fn new() -> Self {
        let env = FakeEnvironment::new(1);
        let svc = TracingService::new(ServiceConfig::new(0), Box::new(env.clone()));
        let mut w = Self {
            svc,
            env,
            next_request: 1,
            honest: ConnId(0),
            hostile: ConnId(0),
            remote: ConnId(0),
            remote_hostile: ConnId(0),
            consumer: ConnId(0),
            honest_smb: SharedMemory::heap(64 * 1024, PageSize::DEFAULT).expect("memory"),
            hostile_fd: rustix::fs::memfd_create("unused", rustix::fs::MemfdFlags::CLOEXEC)
                .expect("memfd"),
            hostile_len: 1,
            buffer: 0,
            read_packets: Vec::new(),
            partial: Vec::new(),
        };
        let creds = PeerCredentials {
            pid: 1,
            uid: 1,
            gid: 1,
        };
        for (hostile, emulated) in [(false, false), (true, false), (false, true), (true, true)] {
            let conn = if emulated {
                let uid = if hostile { REMOTE_UID + 1 } else { REMOTE_UID };
                w.svc.connect_emulated_producer(PeerCredentials {
                    pid: 0,
                    uid,
                    gid: 0,
                })
            } else {
                w.svc.connect_producer(creds)
            };
            let init = InitializeConnectionRequest {
                producer_name: Some(if hostile { "hostile" } else { "honest" }.into()),
                shared_memory_size_hint_bytes: Some(64 * 1024),
                smb_scraping_mode: Some(1),
                ..Default::default()
            };
            w.call(
                conn,
                CallKind::Producer(producer_port::Request::InitializeConnection(init)),
            );
            w.call(
                conn,
                CallKind::Producer(producer_port::Request::GetAsyncCommand(Default::default())),
            );
            let desc = DataSourceDescriptor {
                name: Some("ds".into()),
                ..Default::default()
            };
            let reg = RegisterDataSourceRequest {
                data_source_descriptor: Some(desc),
            };
            w.call(
                conn,
                CallKind::Producer(producer_port::Request::RegisterDataSource(reg)),
            );
            match (hostile, emulated) {
                (false, false) => w.honest = conn,
                (true, false) => w.hostile = conn,
                (false, true) => w.remote = conn,
                (true, true) => w.remote_hostile = conn,
            }
        }
        w.consumer = w.svc.connect_consumer(creds);
        let dsc = DataSourceConfig {
            name: Some("ds".into()),
            ..Default::default()
        };
        let cfg = TraceConfig {
            buffers: vec![trace_config::BufferConfig {
                size_kb: Some(1024),
                ..Default::default()
            }],
            data_sources: vec![trace_config::DataSource {
                config: Some(protos::to_raw(&dsc)),
                ..Default::default()
            }],
            ..Default::default()
        };
        let enable = EnableTracingRequest {
            trace_config: Some(protos::to_raw(&cfg)),
            attach_notification_only: None,
        };
        w.call(
            w.consumer,
            CallKind::Consumer(consumer_port::Request::EnableTracing(enable)),
        );
        // Map both SMBs from the SetupTracing replies.
        while let Some(o) = w.svc.poll_output() {
            let Output::Reply {
                conn,
                body: ReplyBody::Ok(b),
                fd,
                ..
            } = o
            else {
                continue;
            };
            let Ok(resp) = GetAsyncCommandResponse::decode(b) else {
                continue;
            };
            match resp.cmd {
                Some(Cmd::SetupTracing(_)) if conn == w.remote || conn == w.remote_hostile => {
                    assert!(fd.is_none(), "no SMB under shmem emulation");
                }
                Some(Cmd::SetupTracing(_)) => {
                    let fd = fd.expect("SetupTracing carries the SMB");
                    if conn == w.honest {
                        w.honest_smb =
                            SharedMemory::adopt(fd, PageSize::DEFAULT, Adoption::ByProducer)
                                .expect("maps");
                    } else {
                        w.hostile_len = rustix::fs::fstat(&fd)
                            .map(|s| s.st_size as u64)
                            .unwrap_or(1)
                            .max(1);
                        w.hostile_fd = fd;
                    }
                }
                Some(Cmd::SetupDataSource(s)) => {
                    let cfg =
                        DataSourceConfig::decode(s.config.unwrap_or_default()).unwrap_or_default();
                    w.buffer = cfg.target_buffer.unwrap_or(0) as u16;
                }
                _ => {}
            }
        }
        let reg = RegisterTraceWriterRequest {
            trace_writer_id: Some(1),
            target_buffer: Some(u32::from(w.buffer)),
        };
        for conn in [w.honest, w.remote] {
            w.call(
                conn,
                CallKind::Producer(producer_port::Request::RegisterTraceWriter(reg)),
            );
        }
        w
    }

    /// `conn` commits `(target, data, incomplete)` chunks inline.
    fn commit_inline(&mut self, conn: ConnId, chunks: Vec<(u32, Vec<u8>, bool)>) {
        let req = CommitDataRequest {
            chunks_to_move: chunks
                .into_iter()
                .map(|(target, data, incomplete)| ChunksToMove {
                    target_buffer: Some(target),
                    data: Some(data.into()),
                    chunk_incomplete: incomplete.then_some(true),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        self.call(
            conn,
            CallKind::Producer(producer_port::Request::CommitData(req)),
        );
        self.drain_outputs();
    }

    fn call(&mut self, conn: ConnId, call: CallKind) {
        let id = self.next_request;
        self.next_request += 1;
        match call {
            CallKind::Producer(request) => self
                .svc
                .on_producer_call(conn, Call::new(request, 1, id, None)),
            CallKind::Consumer(request) => self
                .svc
                .on_consumer_call(conn, Call::new(request, 1, id, None)),
        }
    }

    fn call_hostile(&mut self, request: producer_port::Request) {
        self.call(self.hostile, CallKind::Producer(request));
        self.drain_outputs();
    }

    fn drain_outputs(&mut self) {
        while let Some(o) = self.svc.poll_output() {
            if let Output::Disconnect { conn, .. } = o {
                assert!(
                    conn == self.hostile || conn == self.remote_hostile,
                    "only the hostile producers may be cut off"
                );
                self.svc.disconnect(conn);
            }
        }
    }

    /// Writes one chunk with `payload` (one fragment) and commits it;
    /// `false` if the SMB had no free chunk.
    fn honest_commit(&mut self, chunk_id: u32, payload: &[u8]) -> bool {
        let smb = self.honest_smb.smb();
        let Some(packets) = Packets::new(1, ChunkFlags::EMPTY) else {
            return false;
        };
        let header = ChunkHeaderRepr {
            chunk_id,
            writer_id: 1,
            packets,
        };
        let Ok(mut chunk) = smb.try_acquire_any_chunk_for_writing(0, PageLayout::Div1, header)
        else {
            return false;
        };
        if chunk.write(0, payload).is_err() {
            return false;
        }
        let Ok(loc) = chunk.release_as_complete() else {
            return false;
        };
        let req = CommitDataRequest {
            chunks_to_move: vec![ChunksToMove {
                page: Some(loc.page as u32),
                chunk: Some(loc.chunk as u32),
                target_buffer: Some(u32::from(self.buffer)),
                ..Default::default()
            }],
            ..Default::default()
        };
        self.call(
            self.honest,
            CallKind::Producer(producer_port::Request::CommitData(req)),
        );
        self.drain_outputs();
        true
    }

    fn scribble(&mut self, offset: u64, bytes: &[u8]) {
        let _ = rustix::io::pwrite(&self.hostile_fd, bytes, offset);
    }

    fn flush_and_scrape(&mut self) {
        let req = FlushRequest {
            timeout_ms: Some(10),
            flags: None,
        };
        self.call(
            self.consumer,
            CallKind::Consumer(consumer_port::Request::Flush(req)),
        );
        self.env.advance_ms(10);
        self.svc.on_timeout();
        self.drain_outputs();
    }

    fn stop(&mut self) {
        self.call(
            self.consumer,
            CallKind::Consumer(consumer_port::Request::DisableTracing(Default::default())),
        );
        self.env.advance_ms(10_000);
        self.svc.on_timeout();
        self.drain_outputs();
    }

    fn read(&mut self) {
        self.call(
            self.consumer,
            CallKind::Consumer(consumer_port::Request::ReadBuffers(Default::default())),
        );
        self.drain_outputs();
        while let Some(o) = self.svc.poll_read_reply(self.consumer) {
            let Output::Reply {
                body: ReplyBody::Ok(b),
                ..
            } = o
            else {
                continue;
            };
            let resp = ReadBuffersResponse::decode(b).expect("our own reply decodes");
            for s in resp.slices {
                self.partial
                    .extend_from_slice(s.data.as_deref().unwrap_or(&[]));
                if s.last_slice_for_packet == Some(true) {
                    self.read_packets.push(std::mem::take(&mut self.partial));
                }
            }
        }
    }
}

enum CallKind {
    Producer(producer_port::Request),
    Consumer(consumer_port::Request),
}

/// The peers of [`session_calls`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Peer {
    Consumer,
    Producer,
    Relay,
}

/// Names the generated configs, triggers and producers choose from, so
/// that they meet.
const NAMES: [&str; 4] = ["ds", "track_event", "t1", "p0"];

/// An [`Environment`](super::env::Environment) on the fake clock whose
/// trace files are memory, failing after a set number of bytes: the input
/// must not create files on the fuzzing machine.
#[derive(Clone)]
struct FuzzEnv {
    clock: FakeEnvironment,
    file_room: usize,
}

/// A trace file in memory that takes `room` bytes, then fails.
#[derive(Debug)]
struct MemoryFile {
    room: usize,
    written: Vec<u8>,
}

impl std::io::Write for MemoryFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.room == 0 {
            return Err(std::io::Error::other("the fuzzed disk is full"));
        }
        let n = buf.len().min(self.room);
        self.room -= n;
        self.written.extend_from_slice(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl super::env::TraceFile for MemoryFile {
    fn start_sync(&mut self) -> std::io::Result<()> {
        Ok(())
    }
    fn copy_to(&mut self, dst: &mut dyn super::env::TraceFile) -> std::io::Result<u64> {
        dst.write_all(&self.written)?;
        Ok(self.written.len() as u64)
    }

    /// No descriptor names a file in memory.
    fn is_same_file(&self, _fd: &std::os::fd::OwnedFd) -> bool {
        false
    }
}

impl super::env::Environment for FuzzEnv {
    fn now(&self) -> super::env::Nanos {
        self.clock.now()
    }
    fn clock_snapshot(&self) -> Vec<(u32, u64)> {
        self.clock.clock_snapshot()
    }
    fn random_u64(&self) -> u64 {
        self.clock.random_u64()
    }
    fn open_trace_file(
        &self,
        _target: super::env::FileTarget<'_>,
    ) -> std::io::Result<Box<dyn super::env::TraceFile>> {
        Ok(Box::new(MemoryFile {
            room: self.file_room,
            written: Vec::new(),
        }))
    }
}

/// Consumers (of three uids), producers and relays making arbitrary calls:
/// raw request bytes for any method id, generated configs and requests
/// that name each other's sessions, data sources, instances, flushes and
/// triggers, acknowledgements (or not) of what the service asked, time
/// passing, and connections closing at any point.
///
/// Invariants: nothing panics; nothing is sent to a connection after it
/// closed; every ReadBuffers reply and every producer command decodes; the
/// service's timer never asks to be woken in the past twice in a row.
pub fn session_calls(data: &[u8]) {
    session_calls_reached(data);
}

/// Patterns the [`trace_filter`] target's string rules draw from.
const FILTER_PATTERNS: [&str; 6] = [
    "(.*)",
    r"B\|\d+\|(\w+)=(.*)",
    "(a*)*(b)?",
    r"id=(\d+)",
    "",
    "x(",
];

/// See the module docs.
pub fn trace_filter(data: &[u8]) {
    trace_filter_kept(data);
}

/// [`trace_filter`]: `None` if the filter did not load, else the bytes of
/// the packet it kept (`None` if the packet was malformed).
fn trace_filter_kept(data: &[u8]) -> Option<Option<usize>> {
    use super::core::filter::{bytecode, TraceFilter};
    use crate::protos::trace_config::trace_filter::{StringFilterChain, StringFilterRule};
    let mut input = Input(data);
    // Raw words (one time in eight: the parser's refusals), or messages of
    // rules on small field ids, message 0 keeping `Trace.packet` (1) as a
    // message.
    let raw = |input: &mut Input<'_>, n: usize| -> Vec<u32> {
        (0..n)
            .map(|_| u32::from(input.u16()) << 16 | u32::from(input.u16()))
            .collect()
    };
    let code = if input.u8() % 8 == 0 {
        let n = usize::from(input.u8() % 48);
        raw(&mut input, n)
    } else {
        let messages = u32::from(input.u8() % 4) + 1;
        let mut words = vec![1 << 3 | 3, input.u32_below(messages), 0];
        for _ in 1..messages {
            for _ in 0..input.u8() % 6 {
                let field = u32::from(input.u8() % 40) + 1;
                match input.u8() % 5 {
                    0 => words.push(field << 3 | 1),
                    1 => words.extend([field << 3 | 2, u32::from(input.u8() % 8)]),
                    2 => words.extend([field << 3 | 3, input.u32_below(messages)]),
                    3 => words.push(field << 3 | 4),
                    _ => words.extend([field << 3 | 5, u32::from(input.u8() % 4)]),
                }
            }
            words.push(0);
        }
        words
    };
    let code = bytecode::encode(&code);
    // An overlay of one entry for message 0, or garbage, or none.
    let overlay = match input.u8() % 8 {
        0 => {
            let field = u32::from(input.u8() % 40) + 2;
            let op = [1, 4, 5][usize::from(input.u8() % 3)];
            bytecode::encode(&[0, field << 3 | op, u32::from(input.u8() % 4)])
        }
        1 => input.sized(16),
        _ => Vec::new(),
    };
    let rules = (0..input.u8() % 3)
        .map(|_| StringFilterRule {
            // Policies 1..=5, and the invalid 0 and 6 now and then.
            policy: Some(match input.u8() % 16 {
                0 => 0,
                1 => 6,
                p => i32::from(p % 5) + 1,
            }),
            regex_pattern: Some(FILTER_PATTERNS[usize::from(input.u8()) % 6].to_owned()),
            atrace_payload_starts_with: Some(if input.u8() % 2 == 0 { "" } else { "a" }.into()),
            name: None,
            semantic_type: vec![i32::from(input.u8() % 3)],
        })
        .collect();
    let config = trace_config::TraceFilter {
        bytecode: Some(code.into()),
        bytecode_overlay_v54: Some(overlay.into()),
        string_filter_chain: Some(StringFilterChain { rules }),
        ..Default::default()
    };
    let filter = TraceFilter::new(&config).ok()?;
    // The packet: the rest of the input one time in four, else fields on
    // small ids (varints, fixed32s, and bytes that may or may not parse as
    // a message), wrapped in a message one time in four.
    let mut packet = Vec::new();
    if input.u8() % 4 == 0 {
        packet = input.0.to_vec();
    } else {
        for _ in 0..input.u8() % 8 {
            let field = u64::from(input.u8() % 40) + 1;
            match input.u8() % 3 {
                0 => {
                    put_varint(&mut packet, field << 3);
                    put_varint(&mut packet, u64::from(input.u16()));
                }
                1 => {
                    put_varint(&mut packet, field << 3 | 5);
                    let mut word = input.bytes(4);
                    word.resize(4, 0);
                    packet.extend(word);
                }
                _ => {
                    let mut bytes = input.sized(12);
                    if input.u8() % 4 == 0 {
                        let mut wrapped = vec![0x0a];
                        put_varint(&mut wrapped, bytes.len() as u64);
                        wrapped.append(&mut bytes);
                        bytes = wrapped;
                    }
                    put_varint(&mut packet, field << 3 | 2);
                    put_varint(&mut packet, bytes.len() as u64);
                    packet.extend(bytes);
                }
            }
        }
    }
    let packet = &packet[..];
    let mut out = vec![0xEE];
    if filter.filter(packet, &mut out).is_err() {
        assert!(out.is_empty(), "a malformed packet left output");
        return Some(None);
    }
    assert!(out.len() <= packet.len(), "the output grew");
    let fields = reference(&out, false).expect("the filtered packet parses");
    for (field, _) in fields {
        assert!(filter.keeps_packet_field(field), "field {field} kept");
    }
    Some(Some(out.len()))
}

/// How deep a [`session_calls`] run went: producer commands seen, and
/// producers' packets read back.
#[derive(Debug, Default, Clone, Copy)]
struct Reached {
    instances: u64,
    flushes: u64,
    packets_read: u64,
}

fn session_calls_reached(data: &[u8]) -> Reached {
    let mut input = Input(data);
    let mut w = CallWorld::new(usize::from(input.u16()));
    while !input.is_empty() {
        w.step(&mut input);
    }
    // Wind down: time passes until every timer has fired, then everyone
    // leaves.
    for _ in 0..64 {
        w.env.clock.advance_ms(60_000);
        w.fire_timers();
    }
    while let Some((conn, _)) = w.live.pop() {
        w.svc.disconnect(conn);
        w.drain();
    }
    w.env.clock.advance_ms(3_600_000);
    w.fire_timers();
    assert!(
        w.svc.poll_output().is_none(),
        "output for connections that are all gone"
    );
    w.reached
}

/// The service and its peers, for [`session_calls`].
struct CallWorld {
    svc: TracingService,
    env: FuzzEnv,
    live: Vec<(ConnId, Peer)>,
    next_request: u64,
    /// Instance ids and flush request ids the service sent producers.
    instances: Vec<u64>,
    flushes: Vec<u64>,
    /// Buffer ids the service told producers to write to.
    buffers: Vec<u32>,
    reached: Reached,
}

impl CallWorld {
    fn new(file_room: usize) -> Self {
        let env = FuzzEnv {
            clock: FakeEnvironment::new(1_000_000_000),
            file_room,
        };
        let cfg = ServiceConfig {
            max_buffer_bytes: 4 << 20,
            ..ServiceConfig::new(0)
        };
        Self {
            svc: TracingService::new(cfg, Box::new(env.clone())),
            env,
            live: Vec::new(),
            next_request: 1,
            instances: Vec::new(),
            flushes: Vec::new(),
            buffers: Vec::new(),
            reached: Reached::default(),
        }
    }

    fn pick(&self, input: &mut Input<'_>, kind: Peer) -> Option<ConnId> {
        let of_kind: Vec<ConnId> = self
            .live
            .iter()
            .filter(|(_, k)| *k == kind)
            .map(|&(c, _)| c)
            .collect();
        (!of_kind.is_empty()).then(|| of_kind[usize::from(input.u8()) % of_kind.len()])
    }

    fn step(&mut self, input: &mut Input<'_>) {
        match input.u8() % 12 {
            0 if self.live.len() < 8 => self.connect(input),
            1 if !self.live.is_empty() => {
                let (conn, _) = self.live.remove(usize::from(input.u8()) % self.live.len());
                self.svc.disconnect(conn);
            }
            2 => {
                if let Some(c) = self.pick(input, Peer::Consumer) {
                    let method = u32::from(input.u8() % 17);
                    let args = input.sized(64).into();
                    if let Ok(r) = <consumer_port::Request as ServiceRequest>::decode(method, args)
                    {
                        self.consumer_call(c, r, None);
                    }
                }
            }
            3 => {
                if let Some(c) = self.pick(input, Peer::Producer) {
                    let method = u32::from(input.u8() % 13);
                    let args = input.sized(64).into();
                    if let Ok(r) = <producer_port::Request as ServiceRequest>::decode(method, args)
                    {
                        self.producer_call(c, r);
                    }
                }
            }
            4 => {
                if let Some(c) = self.pick(input, Peer::Relay) {
                    let method = u32::from(input.u8() % 4);
                    let args = input.sized(64).into();
                    if let Ok(r) =
                        <protos::relay_port::Request as ServiceRequest>::decode(method, args)
                    {
                        let id = self.request_id();
                        self.svc.on_relay_call(c, Call::new(r, 1, id, None));
                    }
                }
            }
            5 => {
                if let Some(c) = self.pick(input, Peer::Consumer) {
                    let cfg = generated_config(input);
                    let fd = (input.u8() % 4 == 0).then(|| {
                        rustix::fs::memfd_create("fuzz", rustix::fs::MemfdFlags::CLOEXEC)
                            .expect("memfd")
                    });
                    let r = consumer_port::Request::EnableTracing(EnableTracingRequest {
                        trace_config: Some(protos::to_raw(&cfg)),
                        attach_notification_only: (input.u8() % 8 == 0).then_some(true),
                    });
                    self.consumer_call(c, r, fd);
                }
            }
            6 => {
                if let Some(c) = self.pick(input, Peer::Consumer) {
                    let r = consumer_request(input);
                    self.consumer_call(c, r, None);
                }
            }
            7 | 8 => {
                if let Some(c) = self.pick(input, Peer::Producer) {
                    let r = self.producer_request(input);
                    self.producer_call(c, r);
                }
            }
            9 => {
                let ms = match input.u8() % 4 {
                    0 => u64::from(input.u16()),
                    _ => u64::from(input.u8()),
                };
                self.env.clock.advance_ms(ms);
                self.fire_timers();
            }
            10 => {
                // A consumer reads (or, mostly, the ones already reading
                // pull their next replies).
                if input.u8() % 2 == 0 {
                    if let Some(c) = self.pick(input, Peer::Consumer) {
                        let r = consumer_port::Request::ReadBuffers(Default::default());
                        self.consumer_call(c, r, None);
                        self.drain();
                    }
                }
                for conn in self.svc.pending_reads() {
                    for _ in 0..usize::from(input.u8() % 4) {
                        let Some(o) = self.svc.poll_read_reply(conn) else {
                            break;
                        };
                        if let Output::Reply {
                            body: ReplyBody::Ok(b),
                            ..
                        } = &o
                        {
                            let resp = ReadBuffersResponse::decode(b.clone())
                                .expect("a ReadBuffers reply decodes");
                            let tag = INLINE_PACKET_TAG;
                            self.reached.packets_read += resp
                                .slices
                                .iter()
                                .filter(|s| s.data.as_deref().is_some_and(|d| d.starts_with(&tag)))
                                .count()
                                as u64;
                        }
                        self.check(o);
                    }
                }
            }
            _ => self.fire_timers(),
        }
        self.drain();
    }

    fn connect(&mut self, input: &mut Input<'_>) {
        let uid = u32::from(input.u8() % 3);
        let creds = PeerCredentials {
            pid: 100 + uid as i32,
            uid,
            gid: uid,
        };
        let (conn, peer) = match input.u8() % 4 {
            0 => (self.svc.connect_consumer(creds), Peer::Consumer),
            1 => (self.svc.connect_producer(creds), Peer::Producer),
            2 => (self.svc.connect_emulated_producer(creds), Peer::Producer),
            _ => {
                let conn = self.svc.connect_producer(creds);
                self.svc.set_peer_identity(
                    conn,
                    super::core::RemoteIdentity {
                        pid: 7,
                        uid,
                        machine_id: u32::from(input.u8() % 3),
                        machine_name: NAMES[usize::from(input.u8()) % NAMES.len()].into(),
                    },
                );
                let peer = if input.u8() % 2 == 0 {
                    Peer::Relay
                } else {
                    Peer::Producer
                };
                (conn, peer)
            }
        };
        self.live.push((conn, peer));
        if peer == Peer::Producer && input.u8() % 4 != 0 {
            // Most producers set up as SDKs do; the raw calls cover the
            // rest.
            let name = NAMES[usize::from(input.u8()) % NAMES.len()];
            self.producer_call(
                conn,
                producer_port::Request::InitializeConnection(InitializeConnectionRequest {
                    producer_name: Some(name.into()),
                    ..Default::default()
                }),
            );
            self.producer_call(
                conn,
                producer_port::Request::GetAsyncCommand(Default::default()),
            );
            self.producer_call(
                conn,
                producer_port::Request::RegisterDataSource(RegisterDataSourceRequest {
                    data_source_descriptor: Some(DataSourceDescriptor {
                        name: Some(NAMES[usize::from(input.u8() % 2)].into()),
                        ..Default::default()
                    }),
                }),
            );
        }
    }

    fn request_id(&mut self) -> u64 {
        self.next_request += 1;
        self.next_request
    }

    fn consumer_call(
        &mut self,
        conn: ConnId,
        r: consumer_port::Request,
        fd: Option<std::os::fd::OwnedFd>,
    ) {
        let id = self.request_id();
        self.svc.on_consumer_call(conn, Call::new(r, 1, id, fd));
    }

    fn producer_call(&mut self, conn: ConnId, r: producer_port::Request) {
        let id = self.request_id();
        self.svc.on_producer_call(conn, Call::new(r, 1, id, None));
    }

    /// A producer request that names what the service sent, mostly.
    fn producer_request(&self, input: &mut Input<'_>) -> producer_port::Request {
        use crate::protos::{
            ActivateTriggersRequest, NotifyDataSourceStartedRequest,
            NotifyDataSourceStoppedRequest, UnregisterDataSourceRequest,
        };
        let name = NAMES[usize::from(input.u8()) % NAMES.len()].to_owned();
        let seen = |list: &[u64], input: &mut Input<'_>| match list.len() {
            0 => u64::from(input.u8()),
            n => list[usize::from(input.u8()) % n],
        };
        match input.u8() % 9 {
            0 => producer_port::Request::InitializeConnection(InitializeConnectionRequest {
                producer_name: Some(name),
                shared_memory_size_hint_bytes: Some(u32::from(input.u8()) * 4096),
                shared_memory_page_size_hint_bytes: Some(4096 << (input.u8() % 3)),
                smb_scraping_mode: Some(i32::from(input.u8() % 3)),
                ..Default::default()
            }),
            1 => producer_port::Request::GetAsyncCommand(Default::default()),
            2 => producer_port::Request::RegisterDataSource(RegisterDataSourceRequest {
                data_source_descriptor: Some(DataSourceDescriptor {
                    name: Some(name),
                    will_notify_on_start: Some(input.u8() % 2 == 0),
                    will_notify_on_stop: Some(input.u8() % 2 == 0),
                    handles_incremental_state_clear: Some(input.u8() % 2 == 0),
                    ..Default::default()
                }),
            }),
            3 => producer_port::Request::UnregisterDataSource(UnregisterDataSourceRequest {
                data_source_name: Some(name),
            }),
            4 => producer_port::Request::NotifyDataSourceStarted(NotifyDataSourceStartedRequest {
                data_source_id: Some(seen(&self.instances, input)),
            }),
            5 => producer_port::Request::NotifyDataSourceStopped(NotifyDataSourceStoppedRequest {
                data_source_id: Some(seen(&self.instances, input)),
            }),
            6 => producer_port::Request::CommitData(CommitDataRequest {
                flush_request_id: Some(seen(&self.flushes, input)),
                ..Default::default()
            }),
            7 => producer_port::Request::ActivateTriggers(ActivateTriggersRequest {
                trigger_names: vec![name],
            }),
            _ => {
                // An inline chunk (taken from producers on shmem
                // emulation) of one packet, to buffer 0..=3.
                let packet = input.sized(40);
                let mut chunk = one_fragment_header(u32::from(input.u8())).to_vec();
                let [t0, t1] = INLINE_PACKET_TAG;
                chunk.extend_from_slice(&[packet.len() as u8 + 3, t0, t1, packet.len() as u8]);
                chunk.extend_from_slice(&packet);
                producer_port::Request::CommitData(CommitDataRequest {
                    chunks_to_move: vec![ChunksToMove {
                        target_buffer: Some(match self.buffers.len() {
                            0 => u32::from(input.u8() % 4),
                            n => self.buffers[usize::from(input.u8()) % n],
                        }),
                        data: Some(chunk.into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                })
            }
        }
    }

    fn fire_timers(&mut self) {
        let mut last = None;
        while let Some(due) = self.svc.poll_timeout() {
            if due > self.env.now_ns() {
                break;
            }
            assert_ne!(last, Some(due), "a timer fired and asked for the same time");
            last = Some(due);
            self.svc.on_timeout();
            self.drain();
        }
    }

    fn drain(&mut self) {
        while let Some(o) = self.svc.poll_output() {
            self.check(o);
        }
    }

    fn check(&mut self, o: Output) {
        let (conn, disconnect) = match &o {
            Output::Reply { conn, .. } => (*conn, false),
            Output::Disconnect { conn, .. } => (*conn, true),
        };
        let Some(index) = self.live.iter().position(|&(c, _)| c == conn) else {
            panic!("output for connection {} after it closed: {o:?}", conn.0);
        };
        if disconnect {
            self.live.remove(index);
            self.svc.disconnect(conn);
            return;
        }
        let Output::Reply {
            body: ReplyBody::Ok(body),
            ..
        } = o
        else {
            return;
        };
        if self.live[index].1 == Peer::Consumer {
            return;
        }
        if let Ok(resp) = GetAsyncCommandResponse::decode(body) {
            match resp.cmd {
                Some(Cmd::SetupDataSource(s)) => {
                    self.instances.extend(s.new_instance_id);
                    let cfg = s.config.map(DataSourceConfig::decode);
                    if let Some(Ok(cfg)) = cfg {
                        self.buffers.extend(cfg.target_buffer);
                    }
                }
                Some(Cmd::StartDataSource(s)) => {
                    self.reached.instances += 1;
                    self.instances.extend(s.new_instance_id);
                }
                Some(Cmd::Flush(f)) => {
                    self.reached.flushes += 1;
                    self.flushes.extend(f.request_id);
                }
                _ => {}
            }
            self.instances.truncate(64);
            self.flushes.truncate(64);
            self.buffers.truncate(64);
        }
    }
}

impl FuzzEnv {
    fn now_ns(&self) -> super::env::Nanos {
        super::env::Environment::now(&self.clock)
    }
}

/// A consumer request other than EnableTracing, with names and ids from
/// small sets so that they meet the sessions.
fn consumer_request(input: &mut Input<'_>) -> consumer_port::Request {
    use crate::protos::{
        clone_session_request::Selector, AttachRequest, ChangeTraceConfigRequest,
        CloneSessionRequest, DetachRequest, ObserveEventsRequest,
    };
    let key = NAMES[usize::from(input.u8()) % NAMES.len()].to_owned();
    match input.u8() % 11 {
        0 => consumer_port::Request::DisableTracing(Default::default()),
        1 => consumer_port::Request::ReadBuffers(Default::default()),
        2 => consumer_port::Request::FreeBuffers(Default::default()),
        3 => consumer_port::Request::Flush(FlushRequest {
            timeout_ms: Some(u32::from(input.u8())),
            flags: Some(u64::from(input.u16())),
        }),
        4 => consumer_port::Request::StartTracing(Default::default()),
        5 => consumer_port::Request::Detach(DetachRequest { key: Some(key) }),
        6 => consumer_port::Request::Attach(AttachRequest { key: Some(key) }),
        7 => consumer_port::Request::ObserveEvents(ObserveEventsRequest {
            events_to_observe: (0..input.u8() % 4)
                .map(|_| i32::from(input.u8() % 6))
                .collect(),
        }),
        8 => consumer_port::Request::ChangeTraceConfig(ChangeTraceConfigRequest {
            trace_config: Some(protos::to_raw(&generated_config(input))),
        }),
        9 => consumer_port::Request::CloneSession(CloneSessionRequest {
            selector: Some(if input.u8() % 2 == 0 {
                Selector::SessionId(u64::from(input.u8() % 4))
            } else {
                Selector::UniqueSessionName(key)
            }),
            ..Default::default()
        }),
        _ => consumer_port::Request::QueryServiceState(Default::default()),
    }
}

/// A TraceConfig from small sets of values: sizes, policies, names that
/// the producers register, durations and trigger setups that end within
/// the run.
fn generated_config(input: &mut Input<'_>) -> TraceConfig {
    let name = |input: &mut Input<'_>| NAMES[usize::from(input.u8()) % NAMES.len()].to_owned();
    let small = |input: &mut Input<'_>| [0, 1, 10, 100, 5_000][usize::from(input.u8() % 5)];
    let buffers = (0..(input.u8() % 8).min(3).max(u8::from(input.u8() % 16 != 0)))
        .map(|_| trace_config::BufferConfig {
            size_kb: Some([4, 16, 64, 4, 16, 64, 0, 8192][usize::from(input.u8() % 8)]),
            fill_policy: Some(i32::from(input.u8() % 3)),
            transfer_on_clone: Some(input.u8() % 4 == 0),
            clear_before_clone: Some(input.u8() % 4 == 0),
            ..Default::default()
        })
        .collect();
    let data_sources = (0..input.u8() % 3 + 1)
        .map(|_| {
            let dsc = DataSourceConfig {
                name: Some(NAMES[usize::from(input.u8() % 8).min(3) % 3].to_owned()),
                target_buffer: Some(u32::from(input.u8() % 8).min(3) % 3),
                ..Default::default()
            };
            trace_config::DataSource {
                config: Some(protos::to_raw(&dsc)),
                producer_name_filter: (input.u8() % 4 == 0)
                    .then(|| name(input))
                    .into_iter()
                    .collect(),
                ..Default::default()
            }
        })
        .collect();
    let trigger_config = (input.u8() % 4 == 0).then(|| trace_config::TriggerConfig {
        trigger_mode: Some(i32::from(input.u8() % 8).min(5) % 5),
        use_clone_snapshot_if_available: Some(input.u8() % 8 == 0),
        triggers: (0..input.u8() % 3)
            .map(|_| trace_config::trigger_config::Trigger {
                name: Some(name(input)),
                producer_name_regex: (input.u8() % 3 == 0)
                    .then(|| ["p.*", "(", ""][usize::from(input.u8() % 3)].to_owned()),
                stop_delay_ms: Some(small(input)),
                max_per_24_h: Some(u32::from(input.u8() % 3)),
                skip_probability: Some(f64::from(input.u8() % 3) / 2.0),
            })
            .collect(),
        trigger_timeout_ms: Some(small(input)),
    });
    TraceConfig {
        buffers,
        data_sources,
        duration_ms: Some(small(input)),
        write_into_file: Some(input.u8() % 8 == 0),
        file_write_period_ms: Some(small(input)),
        max_file_size_bytes: Some(u64::from(input.u16())),
        deferred_start: Some(input.u8() % 4 == 0),
        flush_period_ms: Some(small(input)),
        flush_timeout_ms: Some(small(input)),
        data_source_stop_timeout_ms: Some(small(input)),
        bugreport_score: Some(i32::from(input.u8() % 3)),
        unique_session_name: (input.u8() % 2 == 0).then(|| name(input)),
        trigger_config,
        activate_triggers: (input.u8() % 8 == 0)
            .then(|| name(input))
            .into_iter()
            .collect(),
        lockdown_mode: Some(i32::from(input.u8() % 3)),
        compression_type: Some(i32::from(input.u8() % 4 == 0)),
        // Last, so that the choices before it read the same bytes as
        // before filters were supported: a filter that drops timestamps.
        trace_filter: (input.u8() % 4 == 0).then(|| trace_config::TraceFilter {
            bytecode: Some(
                super::core::filter::bytecode::encode(&[
                    1 << 3 | 3,
                    1,
                    0,
                    1 << 3 | 2,
                    7,
                    9 << 3 | 2,
                    (1 << 29) - 10,
                    0,
                ])
                .into(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `len` bytes of a xorshift32 stream from `seed`: the tests' random (and
/// incompressible) inputs.
#[cfg(test)]
pub(crate) fn random_bytes(seed: &mut u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 17;
            *seed ^= *seed << 5;
            *seed as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chunk committed in place is its whole reserved size: the garbage
    /// after the written payload may parse as fragment bytes.
    #[test]
    fn in_place_commits_count_the_whole_chunk_as_committed() {
        let data = [
            64u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 180, 180, 180, 180, 0, 0, 0, 0, 0, 0,
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            64, 64, 64, 64, 3, 122, 255, 0, 255, 255,
        ];
        trace_buffer_ops(&data);
    }

    /// The honest emulated producer's inline chunk comes out (the check
    /// inside `smb_commit` fails if it does not), next to the hostile one's
    /// inline chunk of 65535 + 1 bytes and one of 1 byte.
    #[test]
    fn an_honest_inline_chunk_comes_out_next_to_hostile_ones() {
        let mut data = vec![5, 4, b'i', b'n', b'l', b'i', b'n'];
        data.extend_from_slice(&[6, 1, 0, 1, 2, 0, 1, 1, 2, 1]);
        data.push(7);
        smb_commit(&data);
    }

    #[test]
    fn entry_points_survive_simple_inputs() {
        let mut seed = 0x1234_5678u32;
        for len in [0usize, 1, 7, 64, 300, 2000] {
            let data = random_bytes(&mut seed, len);
            trace_buffer_ops(&data);
            packet_validator(&data);
            smb_commit(&data);
            session_calls(&data);
            trace_filter(&data);
        }
    }

    /// Random inputs make filters that load and packets they keep bytes of
    /// (the generated bytecode is checksummed; a packet `[0x08, n]` is
    /// field 1, which a filter of random words often keeps).
    #[test]
    fn trace_filter_inputs_load_and_keep_fields() {
        let mut seed = 0x0BAD_F00Du32;
        let (mut loaded, mut kept) = (0, 0);
        for _ in 0..3000 {
            let len = 1 + (random_bytes(&mut seed, 1)[0] as usize) % 120;
            if let Some(packet) = trace_filter_kept(&random_bytes(&mut seed, len)) {
                loaded += 1;
                kept += usize::from(packet.is_some_and(|n| n > 0));
            }
        }
        assert!(loaded > 1000, "{loaded} filters loaded");
        assert!(kept > 5, "{kept} packets kept something");
    }

    /// The generated calls reach deep states: over random inputs, sessions
    /// start, producers are told to start data sources, and packets
    /// producers committed are read back.
    #[test]
    fn session_calls_reach_sessions_that_record() {
        let mut seed = 0x9E37_79B9u32;
        let mut reached = Reached::default();
        for _ in 0..300 {
            let r = session_calls_reached(&random_bytes(&mut seed, 1500));
            reached.instances += r.instances;
            reached.flushes += r.flushes;
            reached.packets_read += r.packets_read;
        }
        assert!(reached.instances > 0, "{reached:?}");
        assert!(reached.flushes > 0, "{reached:?}");
        assert!(reached.packets_read > 0, "{reached:?}");
    }
}
