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

use prost::Message;
use shmtrace_abi::layout::{
    ChunkFlags, ChunkHeaderRepr, Packets, PageLayout, PageSize, CHUNK_HEADER_SIZE,
};

use super::buffer::{ChunkCommit, CommitOutcome, FillPolicy, ReadMode, ReadStatus, TraceBuffer};
use super::core::{ConnId, Output, ReplyBody, ServiceConfig, TracingService, MAX_EMULATED_CHUNK};
use super::env::FakeEnvironment;
use super::trusted::TrustedFields;
use super::validator::{validate, InvalidPacket, RESERVED_FIELDS};
use crate::ipc::shm::{Adoption, SharedMemory};
use crate::ipc::{Call, PeerCredentials};
use crate::protos::commit_data_request::{chunk_to_patch, ChunkToPatch, ChunksToMove};
use crate::protos::get_async_command_response::Cmd;
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
    fn is_empty(&self) -> bool {
        self.0.is_empty()
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
    assert!(!p.is_empty());
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
            let data: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 17;
                    seed ^= seed << 5;
                    seed as u8
                })
                .collect();
            trace_buffer_ops(&data);
            packet_validator(&data);
            smb_commit(&data);
        }
    }
}
