//! Getting the trace out: `ReadBuffers` streams and `write_into_file`.
//!
//! Both produce the same packets in the same order (upstream's
//! `TracingServiceImpl::ReadBuffers`, src/tracing/service/tracing_service_impl.cc): the
//! service's own packets first (clock snapshots, config, UUID, sync marker,
//! provenance, system info, lifecycle events), then the producers' packets
//! buffer by buffer — each validated and followed by its trusted appendix —
//! and, once everything was read, `read_tracing_buffers_completed` and the
//! trace stats when due.
//!
//! Memory stays bounded however large the buffers are: a `ReadBuffers`
//! stream is produced one reply (at most [`READ_REPLY_LIMIT`] bytes) at a
//! time, when the shell asks for it, and a file is written in
//! [`FILE_BATCH`]-byte batches.
//!
//! When the config asks for deflate, each batch — [`COMPRESS_BATCH`] bytes
//! of a stream, or one [`FILE_BATCH`] of a file — is sent or written as one
//! `compressed_packets` packet instead (see the compress module); the
//! packets inside are the same bytes in the same order.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::Write;

use bytes::Bytes;
use shmtrace_abi::proto::wire::{tag, varint_len, WireType, MAX_VARINT_LEN};
use shmtrace_abi::trace::{tag1, trace_packet};

use super::compress::{self, Deflater, COMPRESS_SLICE_SIZE};
use super::filter::SessionFilter;
use super::packets;
use super::relay::{self, RelayClient};
use super::session::{Lifecycle, ProducerIdentity, Session, SessionState};
use super::{BufferId, ConnId, Output, ReplyBody, SessionId, TracingService};
use crate::ipc::PendingReply;
use crate::protos::wire::{put_tag, put_varint, WireType as Wt};
use crate::protos::ReadBuffersResponse;
use crate::service::buffer::{Packet, ReadMode, ReadStatus, TraceBuffer};
use crate::service::env::Environment;
use crate::service::trusted::TrustedFields;
use crate::service::validator::validate;

/// Largest `ReadBuffers` reply, with upstream's per-slice overhead
/// estimate: a new reply starts when the slices so far, plus the next one,
/// plus 16 bytes would pass 128 KiB - 64 (`ConsumerIPCService::RemoteConsumer::OnTraceData`,
/// src/tracing/ipc/service/consumer_ipc_service.cc).
pub const READ_REPLY_LIMIT: usize = 128 * 1024 - 64;
const SLICE_OVERHEAD: usize = 16;

/// Bytes written to a `write_into_file` file at once (upstream's
/// `kWriteIntoFileChunkSize`, src/tracing/service/tracing_service_impl.h);
/// with compression, the uncompressed bytes of each compressed packet
/// written.
pub const FILE_BATCH: usize = 1024 * 1024;

/// With compression, the uncompressed bytes each compressed packet of a
/// `ReadBuffers` stream holds (at least; the read stops after the packet
/// that reaches it): one reply's worth, the batch an uncompressed read
/// reads at once.
pub const COMPRESS_BATCH: usize = READ_REPLY_LIMIT;

/// Where a read is in a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Service packets before the producers' packets.
    Preamble,
    /// Producer packets of buffer `i`.
    Buffer(usize),
    /// Service packets after everything was read.
    Trailer,
    /// Nothing left.
    Done,
}

/// A `ReadBuffers` stream in progress.
#[derive(Debug)]
pub struct ReadStream {
    to: PendingReply,
    stage: Stage,
    /// The slices read but not yet sent.
    batch: Batch,
}

/// Packet slices read, in order.
#[derive(Debug, Default)]
struct Batch {
    /// Bytes of the slices.
    arena: Vec<u8>,
    /// The slices: `(start, end)` in `arena`, and whether each is the last
    /// slice of its packet.
    pending: VecDeque<(usize, usize, bool)>,
    /// A packet the filter found malformed is kept as an empty packet (in
    /// a batch to compress, as upstream's compressor writes the packet it
    /// has no slices of), not left out (a `ReadBuffers` reply sends no
    /// slice of it).
    keep_failed: bool,
}

impl Batch {
    fn push(&mut self, bytes: &[u8], last: bool) {
        let start = self.arena.len();
        self.arena.extend_from_slice(bytes);
        self.pending.push_back((start, self.arena.len(), last));
    }

    /// Adds the packet made of `slices` (from the session's buffer
    /// `buffer`, or the service's own): as it is, or as `filter` leaves it
    /// (if the filter found it malformed: nothing, as upstream sends a
    /// packet with no slices, or an empty packet with `keep_failed`).
    fn packet<'a>(
        &mut self,
        filter: Option<(&mut SessionFilter, &dyn Environment)>,
        slices: impl Iterator<Item = &'a [u8]>,
        buffer: Option<usize>,
    ) {
        match filter {
            None => {
                let mut slices = slices.peekable();
                while let Some(s) = slices.next() {
                    self.push(s, slices.peek().is_none());
                }
            }
            Some((f, clock)) => match f.packet(slices, buffer, clock) {
                Some(out) => self.push(out, true),
                None if self.keep_failed => self.push(&[], true),
                None => {}
            },
        }
    }

    /// Compresses the whole batch into `to`'s slices: one
    /// `compressed_packets` packet, its preamble a slice of its own and its
    /// data cut into [`COMPRESS_SLICE_SIZE`] slices (as upstream's
    /// `ZlibPacketCompressor::Finish`, src/tracing/service/zlib_compressor.cc).
    fn deflate_into(self, to: &mut Batch) {
        let mut deflater = Deflater::new();
        let mut first = 0;
        let mut len = 0;
        for (i, &(start, end, last)) in self.pending.iter().enumerate() {
            len += end - start;
            if last {
                let slices = self.pending.range(first..=i);
                let bytes = slices.map(|&(s, e, _)| self.arena.get(s..e).unwrap_or(&[]));
                deflater.packet(bytes, len);
                first = i + 1;
                len = 0;
            }
        }
        let packet = deflater.finish();
        to.push(&packet.preamble, false);
        let mut chunks = packet.data.chunks(COMPRESS_SLICE_SIZE).peekable();
        while let Some(chunk) = chunks.next() {
            to.push(chunk, chunks.peek().is_none());
        }
    }
}

/// Field numbers of `ReadBuffersResponse` and its `Slice`.
mod field {
    /// `ReadBuffersResponse.slices` (repeated `Slice`).
    pub const SLICES: u32 = 2;
    /// `Slice.data` (bytes).
    pub const DATA: u32 = 1;
    /// `Slice.last_slice_for_packet` (bool).
    pub const LAST_SLICE_FOR_PACKET: u32 = 2;
}

/// Appends `ReadBuffersResponse.slices` entry `{data, last_slice_for_packet}`
/// (field order and encoding as upstream's: the entry's length is known up
/// front, so the data is copied once).
fn encode_slice(out: &mut Vec<u8>, data: &[u8], last: bool) {
    let data_len = data.len() as u64;
    let inner = varint_len(u64::from(tag(field::DATA, WireType::LengthDelimited)))
        + varint_len(data_len)
        + data.len()
        + varint_len(u64::from(tag(
            field::LAST_SLICE_FOR_PACKET,
            WireType::Varint,
        )))
        + 1;
    put_tag(out, field::SLICES, Wt::LengthDelimited);
    put_varint(out, inner as u64);
    put_tag(out, field::DATA, Wt::LengthDelimited);
    put_varint(out, data_len);
    out.extend_from_slice(data);
    put_tag(out, field::LAST_SLICE_FOR_PACKET, Wt::Varint);
    out.push(u8::from(last));
}

impl TracingService {
    /// `ConsumerPort.ReadBuffers`: starts a stream, produced by
    /// [`poll_read_reply`](Self::poll_read_reply).
    pub(super) fn read_buffers(&mut self, conn: ConnId, to: PendingReply) {
        let session = self.consumer(conn).and_then(|c| c.session);
        let readable = session
            .and_then(|s| self.sessions.get(&s))
            .filter(|s| s.file.is_none() && !s.triggers.waiting());
        let Some(sid) = readable.map(|s| s.id) else {
            // No session, a write_into_file one, or one whose triggers have
            // not fired yet (it has no data, not even service packets): one
            // empty reply.
            self.reply(conn, &to, &ReadBuffersResponse::default(), false);
            return;
        };
        self.begin_reads(sid);
        if let Some(c) = self.consumer_mut(conn) {
            if let Some(old) = c.read.replace(ReadStream {
                to,
                stage: Stage::Preamble,
                batch: Batch::default(),
            }) {
                // A new ReadBuffers ends the previous stream.
                self.out.push_back(Output::Reply {
                    conn,
                    to: old.to,
                    body: ReplyBody::Ok(Bytes::new()),
                    has_more: false,
                    fd: None,
                });
            }
        }
    }

    /// Consumers with a `ReadBuffers` stream waiting for its next reply.
    pub fn pending_reads(&self) -> Vec<ConnId> {
        let mut v: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, e)| matches!(e, super::Endpoint::Consumer(c) if c.read.is_some()))
            .map(|(&id, _)| id)
            .collect();
        v.sort_unstable();
        v
    }

    fn begin_reads(&mut self, sid: SessionId) {
        let Some(s) = self.sessions.get(&sid) else {
            return;
        };
        // A clone's buffers get nothing more: read them out like a stopped
        // session's.
        let mode = if matches!(
            s.state,
            SessionState::Disabled | SessionState::ClonedReadOnly
        ) {
            ReadMode::Drain
        } else {
            ReadMode::Live
        };
        for b in &s.buffers {
            if let Some((_, buf)) = self.buffers.get_mut(b) {
                buf.begin_read(mode);
            }
        }
    }

    /// The next reply of `conn`'s `ReadBuffers` stream (`None` if it has
    /// none). Call it while the connection can take more data.
    pub fn poll_read_reply(&mut self, conn: ConnId) -> Option<Output> {
        let mut stream = self.consumer_mut(conn)?.read.take()?;
        let sid = self.consumer(conn).and_then(|c| c.session);
        let deflate = sid
            .and_then(|s| self.sessions.get(&s))
            .is_some_and(|s| compress::wants_deflate(&s.config));
        let mut out = Vec::with_capacity(READ_REPLY_LIMIT.min(64 * 1024));
        loop {
            let batch = &mut stream.batch;
            while let Some(&(start, end, last)) = batch.pending.front() {
                if out.len() + (end - start) + SLICE_OVERHEAD > READ_REPLY_LIMIT && !out.is_empty()
                {
                    break;
                }
                batch.pending.pop_front();
                encode_slice(&mut out, batch.arena.get(start..end).unwrap_or(&[]), last);
            }
            if batch.pending.is_empty() {
                batch.arena.clear();
            }
            if out.len() >= READ_REPLY_LIMIT / 2
                || !batch.pending.is_empty()
                || stream.stage == Stage::Done
            {
                break;
            }
            match sid {
                Some(sid) if deflate => self.read_compressed(sid, &mut stream),
                Some(sid) => self.read_more(
                    sid,
                    &mut stream.stage,
                    &mut stream.batch,
                    READ_REPLY_LIMIT - out.len(),
                ),
                None => stream.stage = Stage::Done,
            }
        }
        let has_more = stream.stage != Stage::Done || !stream.batch.pending.is_empty();
        let body = ReplyBody::Ok(Bytes::from(out));
        let to = stream.to.clone();
        if has_more {
            if let Some(c) = self.consumer_mut(conn) {
                c.read = Some(stream);
            }
        }
        if to.drop_reply() {
            return if has_more {
                self.poll_read_reply(conn)
            } else {
                None
            };
        }
        Some(Output::Reply {
            conn,
            to,
            body,
            has_more,
            fd: None,
        })
    }

    /// Reads a batch of about [`COMPRESS_BATCH`] bytes of `sid` and adds
    /// it to the stream as one compressed packet (none if the batch is
    /// empty).
    fn read_compressed(&mut self, sid: SessionId, stream: &mut ReadStream) {
        let mut plain = Batch {
            keep_failed: true,
            ..Batch::default()
        };
        while plain.arena.len() < COMPRESS_BATCH && stream.stage != Stage::Done {
            let budget = COMPRESS_BATCH - plain.arena.len();
            self.read_more(sid, &mut stream.stage, &mut plain, budget);
        }
        if !plain.pending.is_empty() {
            plain.deflate_into(&mut stream.batch);
        }
    }

    /// Reads about `budget` more bytes of `sid` into `batch`, moving
    /// `stage` on.
    fn read_more(&mut self, sid: SessionId, stage: &mut Stage, batch: &mut Batch, budget: usize) {
        let uid = self.cfg.uid;
        let env = &*self.env;
        match *stage {
            Stage::Preamble => {
                let now = self.now();
                let info = self.cfg.system_info.clone();
                let Some(s) = self.sessions.get_mut(&sid) else {
                    *stage = Stage::Done;
                    return;
                };
                for p in preamble(s, &self.buffers, &self.relays, uid, now, &info) {
                    batch.packet(
                        s.filter.as_mut().map(|f| (f, env)),
                        std::iter::once(&p[..]),
                        None,
                    );
                }
                *stage = Stage::Buffer(0);
            }
            Stage::Buffer(i) => {
                let Some(s) = self.sessions.get_mut(&sid) else {
                    *stage = Stage::Done;
                    return;
                };
                let Some(&id) = s.buffers.get(i) else {
                    *stage = Stage::Trailer;
                    return;
                };
                let Some((_, buf)) = self.buffers.get_mut(&id) else {
                    *stage = Stage::Buffer(i + 1);
                    return;
                };
                let status = buf.read(budget, |p| {
                    if let Some(appendix) = admit(s, p) {
                        let slices = p.slices().chain(std::iter::once(appendix.as_bytes()));
                        batch.packet(s.filter.as_mut().map(|f| (f, env)), slices, Some(i));
                    }
                });
                if status == ReadStatus::Done {
                    *stage = Stage::Buffer(i + 1);
                }
            }
            Stage::Trailer => {
                let now = self.now();
                if let Some(s) = self.sessions.get_mut(&sid) {
                    if let Some(p) = read_completed(s, uid, now) {
                        batch.packet(
                            s.filter.as_mut().map(|f| (f, env)),
                            std::iter::once(&p[..]),
                            None,
                        );
                    }
                }
                if let Some(p) = self.stats_if_due(sid) {
                    batch.push(&p, true);
                }
                *stage = Stage::Done;
            }
            Stage::Done => {}
        }
    }

    /// Writes everything readable of a `write_into_file` session to its
    /// file; `last` is the final drain at the end of the session.
    pub(super) fn drain_to_file(&mut self, sid: SessionId, last: bool) {
        let uid = self.cfg.uid;
        let now = self.now();
        let info = self.cfg.system_info.clone();
        let env = &*self.env;
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        if s.triggers.waiting() {
            return;
        }
        let Some(mut sink) = s.file.take() else {
            return;
        };
        if sink.closed {
            s.file = Some(sink);
            return;
        }
        let mode = if last {
            ReadMode::Drain
        } else {
            ReadMode::Live
        };
        let deflate = compress::wants_deflate(&s.config);
        let mut w = FileWriter {
            sink: &mut sink,
            batch: Vec::with_capacity(FILE_BATCH),
            deflater: deflate.then(Deflater::new),
            full: false,
            error: None,
        };
        for p in preamble(s, &self.buffers, &self.relays, uid, now, &info) {
            w.filtered(
                s.filter.as_mut().map(|f| (f, env)),
                std::iter::once(&p[..]),
                p.len(),
                None,
            );
        }
        let buffers = s.buffers.clone();
        for (i, id) in buffers.iter().enumerate() {
            let Some((_, buf)) = self.buffers.get_mut(id) else {
                continue;
            };
            buf.begin_read(mode);
            loop {
                let status = buf.read(FILE_BATCH, |p| {
                    if let Some(appendix) = admit(s, p) {
                        let a = appendix.as_bytes();
                        let slices = p.slices().chain(std::iter::once(a));
                        w.filtered(
                            s.filter.as_mut().map(|f| (f, env)),
                            slices,
                            p.len() + a.len(),
                            Some(i),
                        );
                    }
                });
                // `packet` writes each full batch: one compressed packet
                // holds what one write reads, service packets included,
                // like upstream's `ReadBuffers` batches.
                if w.stopped() || status == ReadStatus::Done {
                    break;
                }
            }
            if w.stopped() {
                break;
            }
        }
        // Like upstream, every write that read the buffers to their end
        // closes with `read_tracing_buffers_completed` (and the stats when
        // due): the trace processor's safe points for sorting.
        if !w.stopped() {
            if let Some(p) = read_completed(s, uid, now) {
                w.filtered(
                    s.filter.as_mut().map(|f| (f, env)),
                    std::iter::once(&p[..]),
                    p.len(),
                    None,
                );
            }
            // The stats last, counting what the filter did so far.
            if let Some(p) = self.stats_if_due(sid) {
                w.packet(std::iter::once(&p[..]), p.len());
            }
        }
        w.write_batch();
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        let (full, error) = (w.full, w.error.take());
        if let Some(e) = &error {
            log::warn!("session {sid}: writing the trace file failed: {e}");
            s.error = Some(format!("writing the trace file failed: {e}"));
        }
        let stop = error.is_some() || full;
        if last || stop {
            if let Err(e) = sink.file.start_sync() {
                log::warn!("session {sid}: could not start the trace file's fdatasync: {e}");
            }
            sink.closed = true;
        }
        s.file = Some(sink);
        if stop && !last {
            let why = if full {
                "reached max_file_size_bytes"
            } else {
                "could not be written"
            };
            log::info!("session {sid}: the trace file {why}; stopping the session");
            self.disable_tracing(sid, false);
        }
    }
}

/// The tag of `Trace.packet`, which precedes each packet in a file (and in
/// a compressed batch).
pub(super) const PACKET_TAG: u8 = tag1(
    trace_packet::TRACE_PACKET_IN_TRACE,
    WireType::LengthDelimited,
);

/// Batches `Trace.packet` records for a file.
struct FileWriter<'a> {
    sink: &'a mut super::session::FileSink,
    batch: Vec<u8>,
    /// With compression: the batch's packets, compressed as they come
    /// (`batch` then only stages the compressed packet).
    deflater: Option<Deflater>,
    /// `max_file_size_bytes` was reached: nothing more is written.
    full: bool,
    error: Option<std::io::Error>,
}

impl FileWriter<'_> {
    fn stopped(&self) -> bool {
        self.full || self.error.is_some()
    }

    /// Adds the packet made of `slices` (`len` bytes, from the session's
    /// buffer `buffer` or the service's own) as it is, or as `filter`
    /// leaves it: an empty packet if the filter found it malformed, as
    /// upstream's `WriteIntoFile` writes a packet with no slices.
    fn filtered<'b>(
        &mut self,
        filter: Option<(&mut SessionFilter, &dyn Environment)>,
        slices: impl Iterator<Item = &'b [u8]>,
        len: usize,
        buffer: Option<usize>,
    ) {
        if self.stopped() {
            return;
        }
        match filter {
            None => self.packet(slices, len),
            Some((f, clock)) => {
                let out = f.packet(slices, buffer, clock).unwrap_or_default();
                self.packet(std::iter::once(out), out.len());
            }
        }
    }

    /// Adds one packet of `len` bytes as `0x0A varint(len) bytes`, unless
    /// it would cross the size limit.
    /// With compression the packet goes into the compressed batch, and the
    /// size limit is checked on the compressed packet.
    fn packet<'b>(&mut self, slices: impl Iterator<Item = &'b [u8]>, len: usize) {
        if self.stopped() {
            return;
        }
        if let Some(d) = &mut self.deflater {
            d.packet(slices, len);
            if d.input() >= FILE_BATCH {
                self.write_batch();
            }
            return;
        }
        let mut len_varint = [0u8; MAX_VARINT_LEN];
        let n = shmtrace_abi::proto::wire::put_varint(len as u64, &mut len_varint);
        let total = (1 + n + len) as u64;
        if self.sink.max_size > 0
            && self.sink.written + self.batch.len() as u64 + total > self.sink.max_size
        {
            self.full = true;
            return;
        }
        self.batch.push(PACKET_TAG);
        self.batch.extend_from_slice(&len_varint[..n]);
        for s in slices {
            self.batch.extend_from_slice(s);
        }
        if self.batch.len() >= FILE_BATCH {
            self.write_batch();
        }
    }

    /// Writes the batch. With compression, the packets so far become one
    /// compressed packet, dropped (and the file full) if it would cross the
    /// size limit, as upstream's `TracingServiceImpl::WriteIntoFile` drops
    /// the packet that would (src/tracing/service/tracing_service_impl.cc).
    fn write_batch(&mut self) {
        if self.error.is_some() {
            return;
        }
        if let Some(d) = self.deflater.take_if(|d| d.input() > 0) {
            let packet = d.finish();
            self.deflater = Some(Deflater::new());
            let mut len_varint = [0u8; MAX_VARINT_LEN];
            let n = shmtrace_abi::proto::wire::put_varint(packet.len() as u64, &mut len_varint);
            let total = (1 + n + packet.len()) as u64;
            if self.sink.max_size > 0 && self.sink.written + total > self.sink.max_size {
                self.full = true;
                return;
            }
            self.batch.push(PACKET_TAG);
            self.batch.extend_from_slice(&len_varint[..n]);
            self.batch.extend_from_slice(&packet.preamble);
            self.batch.extend_from_slice(&packet.data);
        }
        if self.batch.is_empty() {
            return;
        }
        match self.sink.file.write_all(&self.batch) {
            Ok(()) => self.sink.written += self.batch.len() as u64,
            Err(e) => self.error = Some(e),
        }
        self.batch.clear();
    }
}

/// Validates a producer packet read from the session's buffers; `None` if
/// the validator rejects it, else the trusted appendix to send after its
/// slices.
fn admit(s: &mut Session, p: &Packet<'_>) -> Option<crate::service::trusted::Appendix> {
    if let Err(e) = validate(p.slices()) {
        log::debug!(
            "dropping an invalid packet of producer {} writer {}: {e}",
            p.producer,
            p.writer
        );
        s.invalid_packets += 1;
        return None;
    }
    // Packets come in runs of one sequence: remember the last one looked up.
    let key = (p.producer, p.writer);
    let (who, sequence_id) = match &s.last_sequence {
        Some((k, who, id)) if *k == key => (who.clone(), *id),
        _ => {
            let who = s
                .identities
                .get(&p.producer)
                .cloned()
                .unwrap_or(ProducerIdentity {
                    uid: u32::MAX,
                    pid: 0,
                    machine_id: 0,
                });
            let id = s.sequence_id(p.producer, p.writer);
            s.last_sequence = Some((key, who.clone(), id));
            (who, id)
        }
    };
    let (uid, pid, machine_id) = (who.uid, who.pid, who.machine_id);
    let trusted = TrustedFields {
        uid: uid as i32,
        sequence_id,
        pid: (pid > 0).then_some(pid),
        machine_id,
        previous_packet_dropped: p.loss.bits(),
    };
    Some(trusted.encode())
}

/// The service packets before the producers' packets of a read.
fn preamble(
    s: &mut Session,
    buffers: &HashMap<BufferId, (SessionId, TraceBuffer)>,
    relays: &BTreeMap<ConnId, RelayClient>,
    uid: u32,
    now: u64,
    info: &crate::protos::SystemInfo,
) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let builtin = s.builtin();
    let primary = builtin.primary_trace_clock;
    // In time order: a trace processor refuses a snapshot whose trace
    // clock goes back, and the one a START_TRACING trigger took comes
    // before the start's.
    let first_read = s.initial_snapshot.is_some();
    let mut snapshots: Vec<Vec<(u32, u64)>> = s
        .initial_snapshot
        .take()
        .into_iter()
        .chain(std::mem::take(&mut s.snapshots))
        .collect();
    snapshots.sort_by_key(|snap| snap.first().map_or(0, |&(_, t)| t));
    let mut snapshots = snapshots.into_iter();
    if first_read {
        if let Some(snap) = snapshots.next() {
            out.push(packets::clock_snapshot(uid, &snap, primary));
        }
    }
    if !s.preamble_done && !builtin.disable_trace_config.unwrap_or(false) {
        out.push(packets::trace_config(uid, &s.raw_config));
    }
    if !s.preamble_done {
        out.push(packets::trace_uuid(uid, s.uuid));
    }
    for snap in snapshots {
        out.push(packets::clock_snapshot(uid, &snap, primary));
    }
    if s.sync_due || !s.preamble_done {
        s.sync_due = false;
        out.push(packets::sync_marker(uid));
    }
    let triggers = std::mem::take(&mut s.triggers.pending);
    if !builtin.disable_trace_config.unwrap_or(false) {
        // The trigger that made this clone, then those received
        // (upstream: MaybeEmitCloneTrigger, then MaybeEmitReceivedTriggers,
        // both under disable_trace_config).
        if let Some(t) = s.clone_trigger.as_ref().filter(|_| !s.preamble_done) {
            out.push(packets::clone_snapshot_trigger(uid, t));
        }
        out.extend(triggers.iter().map(|t| packets::trigger(uid, t)));
    }
    s.triggers.mark_emitted(triggers);
    if !s.preamble_done {
        // Every writer with data in the buffers so far (upstream lists the
        // writers of its chunk histograms); each gets its sequence id now.
        let mut per_buffer: Vec<Vec<(u32, i32)>> = Vec::with_capacity(s.buffers.len());
        for b in s.buffers.clone() {
            let writers = buffers.get(&b).map(|(_, buf)| buf.writers_seen());
            let mut seqs = Vec::new();
            for (producer, writer) in writers.unwrap_or_default() {
                seqs.push((s.sequence_id(producer, writer), i32::from(producer)));
            }
            per_buffer.push(seqs);
        }
        out.push(packets::provenance(uid, now, per_buffer));
        if !builtin.disable_system_info.unwrap_or(false) {
            out.push(packets::system_info(uid, info));
        }
    }
    s.preamble_done = true;
    // Relayed machines, each once (see the relay module).
    let describe = !builtin.disable_system_info.unwrap_or(false);
    let sync = !builtin.disable_clock_snapshotting.unwrap_or(false);
    for due in relay::machines_due(relays, &s.machines_described, &s.machines_synced) {
        if let Some(info) = due.info.filter(|_| describe) {
            out.push(packets::remote_system_info(uid, due.machine, info));
            s.machines_described.insert(due.machine);
        }
        if let Some(clocks) = due.clocks.filter(|_| sync) {
            out.push(packets::remote_clock_sync(uid, due.machine, clocks));
            s.machines_synced.insert(due.machine);
        }
    }
    if !builtin.disable_service_events.unwrap_or(false) {
        // Lifecycle events, and the slow data sources noted, in time order
        // (upstream: EmitLifecycleEvents).
        let mut events: Vec<(u64, Vec<u8>)> = s
            .events
            .iter()
            .filter(|(_, _, emitted)| !emitted)
            .map(|&(t, e, _)| (t, packets::service_event(uid, t, e)))
            .collect();
        let slow = s.slow_start.iter().map(|e| (e, false));
        let slow = slow.chain(s.last_flush_slow.iter().map(|e| (e, true)));
        events.extend(slow.map(|(e, last)| (e.at, packets::slow_data_sources(uid, e, last))));
        events.sort_by_key(|&(t, _)| t);
        out.extend(events.into_iter().map(|(_, packet)| packet));
    }
    for e in &mut s.events {
        e.2 = true;
    }
    s.slow_start = None;
    s.last_flush_slow.clear();
    out
}

/// The first service packet after everything was read:
/// `read_tracing_buffers_completed`, unless service events are off.
fn read_completed(s: &Session, uid: u32, now: u64) -> Option<Vec<u8>> {
    let off = s.builtin().disable_service_events.unwrap_or(false);
    (!off).then(|| packets::service_event(uid, now, Lifecycle::ReadTracingBuffersCompleted))
}

impl TracingService {
    /// The last service packet of a read that read everything: the
    /// `trace_stats`, when due (asked for, or the session is over). It does
    /// not go through the filter, which counts it as passed (upstream's
    /// `ReadBuffers`, src/tracing/service/tracing_service_impl.cc).
    fn stats_if_due(&mut self, sid: SessionId) -> Option<Vec<u8>> {
        let s = self.sessions.get(&sid)?;
        let over = matches!(
            s.state,
            SessionState::Disabled | SessionState::ClonedReadOnly
        );
        if !s.stats_due && !over {
            return None;
        }
        let stats = self.trace_stats(sid);
        let s = self.sessions.get_mut(&sid)?;
        s.stats_due = false;
        let p = packets::trace_stats(self.cfg.uid, &stats);
        if let Some(f) = &mut s.filter {
            f.passed(p.len());
        }
        Some(p)
    }
}
