//! Deterministic simulations of the service core: scripted producers and
//! consumers, a fake clock, no sockets. Producers write real chunks with the
//! ABI's `TraceWriter` into the memfd SMB the service sent them.

use std::cell::RefCell;
use std::os::fd::OwnedFd;
use std::rc::Rc;

use bytes::Bytes;
use prost::Message as _;
use shmtrace_abi::layout::{ChunkHeaderRepr, PageLayout, PageSize};
use shmtrace_abi::smb::{Smb, WritableChunk};
use shmtrace_abi::writer::{ChunkArbiter, PatchGroup, PatchesDeferred, TraceWriter};

use super::*;
use crate::ipc::rpc::ServiceRequest;
use crate::ipc::shm::{Adoption, SharedMemory};
use crate::ipc::Call;
use crate::protos::commit_data_request::{chunk_to_patch, ChunkToPatch, ChunksToMove};
use crate::protos::get_async_command_response::Cmd;
use crate::protos::wire::{Fields, Value};
use crate::protos::{
    consumer_port, producer_port, trace_config, DataSourceDescriptor, TraceConfig,
};
use crate::service::env::FakeEnvironment;

mod clone;
mod compress;
mod emulation;
mod filter;
mod relay;
mod triggers;

const PRODUCER_UID: u32 = 1000;
const PRODUCER_PID: i32 = 4242;

/// A service with a fake clock, and what it sent.
struct Sim {
    svc: TracingService,
    env: FakeEnvironment,
    next_request: u64,
    sent: Vec<Output>,
}

/// One reply, as the peer would see it.
#[derive(Debug)]
struct Got {
    body: ReplyBody,
    has_more: bool,
    fd: Option<OwnedFd>,
}

fn creds(uid: u32, pid: i32) -> PeerCredentials {
    PeerCredentials { pid, uid, gid: uid }
}

impl Sim {
    fn new() -> Self {
        let env = FakeEnvironment::new(1_000_000_000);
        let svc = TracingService::new(ServiceConfig::new(0), Box::new(env.clone()));
        Self {
            svc,
            env,
            next_request: 1,
            sent: Vec::new(),
        }
    }

    fn pump(&mut self) {
        while let Some(o) = self.svc.poll_output() {
            self.sent.push(o);
        }
    }

    /// A call with the next request id, as the host would decode it.
    fn next_call<R: ServiceRequest>(&mut self, request: R, fd: Option<OwnedFd>) -> (u64, Call<R>) {
        let id = self.next_request;
        self.next_request += 1;
        (id, Call::new(request, 1, id, fd))
    }

    fn producer_call(
        &mut self,
        conn: ConnId,
        request: producer_port::Request,
        fd: Option<OwnedFd>,
    ) -> u64 {
        let (id, call) = self.next_call(request, fd);
        self.svc.on_producer_call(conn, call);
        self.pump();
        id
    }

    fn consumer_call(
        &mut self,
        conn: ConnId,
        request: consumer_port::Request,
        fd: Option<OwnedFd>,
    ) -> u64 {
        let (id, call) = self.next_call(request, fd);
        self.svc.on_consumer_call(conn, call);
        self.pump();
        id
    }

    /// Takes every reply sent to `conn` for request `id`.
    fn replies(&mut self, conn: ConnId, id: u64) -> Vec<Got> {
        let mut got = Vec::new();
        let mut keep = Vec::new();
        for o in self.sent.drain(..) {
            match o {
                Output::Reply {
                    conn: c,
                    to,
                    body,
                    has_more,
                    fd,
                } if c == conn && to.request_id() == id => got.push(Got { body, has_more, fd }),
                other => keep.push(other),
            }
        }
        self.sent = keep;
        got
    }

    fn reply_ok<M: prost::Message + Default>(&mut self, conn: ConnId, id: u64) -> M {
        let got = self.replies(conn, id);
        assert_eq!(got.len(), 1, "expected one reply to request {id}: {got:?}");
        match &got[0].body {
            ReplyBody::Ok(b) => M::decode(b.clone()).expect("reply decodes"),
            ReplyBody::Err => panic!("request {id} failed"),
        }
    }

    fn advance(&mut self, ms: u64) {
        self.env.advance_ms(ms);
        self.svc.on_timeout();
        self.pump();
    }

    /// The connections the core closed since the last call, and why.
    fn disconnects(&mut self) -> Vec<(ConnId, PeerFault)> {
        let mut v = Vec::new();
        for o in std::mem::take(&mut self.sent) {
            match o {
                Output::Disconnect { conn, reason } => v.push((conn, reason)),
                other => self.sent.push(other),
            }
        }
        v
    }
}

/// A scripted producer.
struct TestProducer {
    conn: ConnId,
    commands: u64,
    /// Its mapping of the SMB (its views borrow it mutably); under shmem
    /// emulation, its private buffer.
    smb: Option<RefCell<SharedMemory>>,
    /// Connected with shmem emulation: commits chunk bytes inline.
    emulated: bool,
    /// How it maps the SMB: as our producer does (`ByProducer`: every
    /// page allocated and its header written), or as the service maps a
    /// producer's (`ByService`: pages allocated only as they are touched).
    adoption: Adoption,
}

impl TestProducer {
    fn connect(sim: &mut Sim, name: &str, descriptors: &[DataSourceDescriptor]) -> Self {
        Self::connect_as(sim, name, descriptors, PRODUCER_UID, true)
    }

    fn connect_as(
        sim: &mut Sim,
        name: &str,
        descriptors: &[DataSourceDescriptor],
        uid: u32,
        scraping: bool,
    ) -> Self {
        let conn = sim.svc.connect_producer(creds(uid, PRODUCER_PID));
        let mode = if scraping { 1 } else { 2 };
        let init = crate::protos::InitializeConnectionRequest {
            producer_name: Some(name.into()),
            smb_scraping_mode: Some(mode),
            ..Default::default()
        };
        let id = sim.producer_call(
            conn,
            producer_port::Request::InitializeConnection(init),
            None,
        );
        let _: crate::protos::InitializeConnectionResponse = sim.reply_ok(conn, id);
        let commands = sim.producer_call(
            conn,
            producer_port::Request::GetAsyncCommand(Default::default()),
            None,
        );
        for d in descriptors {
            let req = crate::protos::RegisterDataSourceRequest {
                data_source_descriptor: Some(d.clone()),
            };
            let id = sim.producer_call(conn, producer_port::Request::RegisterDataSource(req), None);
            let _: crate::protos::RegisterDataSourceResponse = sim.reply_ok(conn, id);
        }
        Self {
            conn,
            commands,
            smb: None,
            emulated: false,
            adoption: Adoption::ByProducer,
        }
    }

    /// A producer on a transport without descriptor passing (TCP): the
    /// service answers with shmem emulation.
    fn connect_emulated(sim: &mut Sim, name: &str, descriptors: &[DataSourceDescriptor]) -> Self {
        Self::connect_emulated_as(sim, name, descriptors, true, None)
    }

    /// `identity`: a relay announced the producer (before its first call).
    fn connect_emulated_as(
        sim: &mut Sim,
        name: &str,
        descriptors: &[DataSourceDescriptor],
        scraping: bool,
        identity: Option<RemoteIdentity>,
    ) -> Self {
        let conn = sim.svc.connect_emulated_producer(REMOTE_PEER);
        if let Some(identity) = identity {
            sim.svc.set_peer_identity(conn, identity);
        }
        let init = crate::protos::InitializeConnectionRequest {
            producer_name: Some(name.into()),
            smb_scraping_mode: Some(if scraping { 1 } else { 2 }),
            ..Default::default()
        };
        let id = sim.producer_call(
            conn,
            producer_port::Request::InitializeConnection(init),
            None,
        );
        let resp: crate::protos::InitializeConnectionResponse = sim.reply_ok(conn, id);
        assert_eq!(resp.use_shmem_emulation, Some(true));
        assert_eq!(resp.using_shmem_provided_by_producer, Some(false));
        let commands = sim.producer_call(
            conn,
            producer_port::Request::GetAsyncCommand(Default::default()),
            None,
        );
        for d in descriptors {
            let req = crate::protos::RegisterDataSourceRequest {
                data_source_descriptor: Some(d.clone()),
            };
            let id = sim.producer_call(conn, producer_port::Request::RegisterDataSource(req), None);
            let _: crate::protos::RegisterDataSourceResponse = sim.reply_ok(conn, id);
        }
        Self {
            conn,
            commands,
            smb: None,
            emulated: true,
            adoption: Adoption::ByProducer,
        }
    }

    /// The commands received since the last call; maps the SMB on
    /// SetupTracing.
    fn commands(&mut self, sim: &mut Sim) -> Vec<Cmd> {
        let mut out = Vec::new();
        for got in sim.replies(self.conn, self.commands) {
            assert!(got.has_more, "the command stream never ends");
            let ReplyBody::Ok(b) = got.body else {
                panic!("command stream failed")
            };
            let cmd = crate::protos::GetAsyncCommandResponse::decode(b)
                .expect("command")
                .cmd
                .expect("cmd");
            if let Cmd::SetupTracing(s) = &cmd {
                let page = s.shared_buffer_page_size_kb.unwrap_or(4) * 1024;
                let shm = if self.emulated {
                    assert!(got.fd.is_none(), "no SMB under shmem emulation");
                    // Upstream's emulated producers keep a private 1 MiB.
                    SharedMemory::heap(1 << 20, PageSize::new(page as usize).unwrap())
                        .expect("private buffer")
                } else {
                    let fd = got.fd.expect("SetupTracing carries the SMB");
                    let page = PageSize::new(page as usize).unwrap();
                    SharedMemory::adopt(fd, page, self.adoption).expect("the SMB maps")
                };
                self.smb = Some(RefCell::new(shm));
            } else {
                assert!(got.fd.is_none());
            }
            out.push(cmd);
        }
        out
    }

    fn call(&self, sim: &mut Sim, req: producer_port::Request) -> u64 {
        sim.producer_call(self.conn, req, None)
    }

    fn register_writer(&self, sim: &mut Sim, writer: u32, buffer: u16) {
        let req = crate::protos::RegisterTraceWriterRequest {
            trace_writer_id: Some(writer),
            target_buffer: Some(u32::from(buffer)),
        };
        let id = self.call(sim, producer_port::Request::RegisterTraceWriter(req));
        let _: crate::protos::RegisterTraceWriterResponse = sim.reply_ok(self.conn, id);
    }

    fn commit(&self, sim: &mut Sim, req: crate::protos::CommitDataRequest) -> u64 {
        self.call(sim, producer_port::Request::CommitData(req))
    }

    /// Writes packets with a real TraceWriter and returns the CommitData
    /// it would send.
    fn write(
        &self,
        writer_id: u16,
        buffer: u16,
        packets: &[&[u8]],
        flush: bool,
    ) -> crate::protos::CommitDataRequest {
        let shm = self.smb.as_ref().expect("SMB set up").borrow();
        let (mut w, log) = Arbiter::writer(shm.smb(), writer_id, buffer, self.emulated);
        for p in packets {
            // Big payloads go in a nested message, whose size field is
            // patched when it spans chunks.
            let outcome = if p.len() > 1000 {
                w.write_packet(|m| m.nested(900, |n| n.raw(p)))
            } else {
                w.write_packet(|m| m.bytes(900, p))
            };
            assert_eq!(outcome, shmtrace_abi::writer::PacketOutcome::Written);
        }
        if flush {
            w.flush();
        }
        drop(w);
        let req = log.borrow().clone();
        req
    }
}

struct Arbiter<'s> {
    smb: &'s Smb<'s>,
    log: Rc<RefCell<crate::protos::CommitDataRequest>>,
    /// Shmem emulation: commits copy the whole chunk into the request and
    /// free it.
    inline: bool,
}

impl<'s> Arbiter<'s> {
    /// A writer on `smb`, and the log of the CommitData it sends.
    fn writer(
        smb: &'s Smb<'s>,
        writer_id: u16,
        buffer: u16,
        inline: bool,
    ) -> (
        TraceWriter<'s, Self>,
        Rc<RefCell<crate::protos::CommitDataRequest>>,
    ) {
        let log = Rc::new(RefCell::new(crate::protos::CommitDataRequest::default()));
        let arb = Arbiter {
            smb,
            log: log.clone(),
            inline,
        };
        (
            TraceWriter::new(arb, writer_id, buffer).expect("writer"),
            log,
        )
    }
}

impl<'s> ChunkArbiter<'s> for Arbiter<'s> {
    fn acquire_chunk(&mut self, header: ChunkHeaderRepr) -> Option<WritableChunk<'s>> {
        self.smb
            .try_acquire_any_chunk_for_writing(0, PageLayout::Div1, header)
            .ok()
    }
    fn commit_chunk(&mut self, chunk: WritableChunk<'s>, target_buffer: u16) {
        let loc = chunk.release_as_complete().expect("release");
        let data = self.inline.then(|| {
            let readable = self
                .smb
                .try_acquire_chunk_for_reading(loc.page, loc.chunk)
                .expect("our own complete chunk");
            let mut bytes = vec![0; readable.chunk_size()];
            let copied = readable.copy_out(&mut bytes).expect("copy");
            readable.release_as_free().expect("free");
            bytes.truncate(copied.len);
            Bytes::from(bytes)
        });
        self.log.borrow_mut().chunks_to_move.push(ChunksToMove {
            page: Some(loc.page as u32),
            chunk: Some(loc.chunk as u32),
            target_buffer: Some(u32::from(target_buffer)),
            data,
            ..Default::default()
        });
    }
    fn send_patches(&mut self, group: &PatchGroup<'_>) -> Result<(), PatchesDeferred> {
        self.log.borrow_mut().chunks_to_patch.push(ChunkToPatch {
            target_buffer: Some(u32::from(group.target_buffer)),
            writer_id: Some(u32::from(group.writer_id)),
            chunk_id: Some(group.chunk_id),
            patches: group
                .patches()
                .map(|p| chunk_to_patch::Patch {
                    offset: Some(u32::from(p.offset)),
                    data: Some(Bytes::copy_from_slice(&p.data)),
                })
                .collect(),
            has_more_patches: Some(group.has_more),
        });
        Ok(())
    }
    fn flush(&mut self) {}
}

fn descriptor(name: &str, notify_start: bool, notify_stop: bool) -> DataSourceDescriptor {
    DataSourceDescriptor {
        name: Some(name.into()),
        will_notify_on_start: Some(notify_start),
        will_notify_on_stop: Some(notify_stop),
        handles_incremental_state_clear: Some(true),
        ..Default::default()
    }
}

fn config(ds: &str, size_kb: u32, tweak: impl FnOnce(&mut TraceConfig)) -> Bytes {
    let dsc = crate::protos::DataSourceConfig {
        name: Some(ds.into()),
        target_buffer: Some(0),
        ..Default::default()
    };
    let mut cfg = TraceConfig {
        buffers: vec![trace_config::BufferConfig {
            size_kb: Some(size_kb),
            ..Default::default()
        }],
        data_sources: vec![trace_config::DataSource {
            config: Some(crate::protos::to_raw(&dsc)),
            ..Default::default()
        }],
        ..Default::default()
    };
    tweak(&mut cfg);
    crate::protos::to_raw(&cfg)
}

struct TestConsumer {
    conn: ConnId,
    enable: u64,
}

impl TestConsumer {
    fn enable(sim: &mut Sim, cfg: Bytes) -> Self {
        Self::enable_with(sim, cfg, None, 2000)
    }

    fn enable_with(sim: &mut Sim, cfg: Bytes, fd: Option<OwnedFd>, uid: u32) -> Self {
        let conn = sim.svc.connect_consumer(creds(uid, 77));
        let req = crate::protos::EnableTracingRequest {
            trace_config: Some(cfg),
            attach_notification_only: None,
        };
        let enable = sim.consumer_call(conn, consumer_port::Request::EnableTracing(req), fd);
        Self { conn, enable }
    }

    fn call(&self, sim: &mut Sim, req: consumer_port::Request) -> u64 {
        sim.consumer_call(self.conn, req, None)
    }

    /// Enables a session with `cfg` on a new consumer, which the service
    /// refuses: the refusal, typed (validation run again for the same
    /// consumer), checked to be what the consumer read in
    /// `EnableTracingResponse.error`.
    fn refused(sim: &mut Sim, cfg: Bytes) -> ConfigError {
        let c = Self::enable(sim, cfg.clone());
        let sent = c
            .enabled_reply(sim)
            .expect("answered at once")
            .error
            .expect("refused");
        let error = match sim.svc.validate(&cfg, c.conn, 2000, false) {
            Err(e) => e,
            Ok(_) => panic!("refused with {sent:?}, yet the config validates"),
        };
        assert_eq!(sent, error.to_string());
        error
    }

    /// The EnableTracing reply, if sent.
    fn enabled_reply(&self, sim: &mut Sim) -> Option<crate::protos::EnableTracingResponse> {
        let got = sim.replies(self.conn, self.enable);
        assert!(got.len() <= 1);
        got.into_iter().next().map(|g| match g.body {
            ReplyBody::Ok(b) => crate::protos::EnableTracingResponse::decode(b).expect("decodes"),
            ReplyBody::Err => panic!("EnableTracing rejected"),
        })
    }

    /// Stops the session and reads it: the packets, and the trace stats of
    /// the last one.
    fn stop_and_read(&self, sim: &mut Sim) -> (Vec<Vec<u8>>, crate::protos::TraceStats) {
        self.call(
            sim,
            consumer_port::Request::DisableTracing(Default::default()),
        );
        let packets = self.read(sim);
        let last = packets.last().expect("packets");
        let stats = field(last, 35).expect("trace_stats last").unwrap_err();
        let stats = crate::protos::TraceStats::decode(&stats[..]).expect("stats decode");
        (packets, stats)
    }

    /// Reads the buffers: every packet, reassembled from its slices.
    fn read(&self, sim: &mut Sim) -> Vec<Vec<u8>> {
        let id = self.call(sim, consumer_port::Request::ReadBuffers(Default::default()));
        let mut packets = Vec::new();
        let mut cur = Vec::new();
        let mut replies = sim.replies(self.conn, id);
        while let Some(out) = sim.svc.poll_read_reply(self.conn) {
            let Output::Reply { body, has_more, .. } = out else {
                panic!("not a reply")
            };
            replies.push(Got {
                body,
                has_more,
                fd: None,
            });
        }
        assert!(!replies.is_empty());
        for (i, r) in replies.iter().enumerate() {
            assert_eq!(
                r.has_more,
                i + 1 < replies.len(),
                "only the last reply ends the stream"
            );
            let ReplyBody::Ok(b) = &r.body else {
                panic!("ReadBuffers failed")
            };
            let resp = crate::protos::ReadBuffersResponse::decode(b.clone()).expect("decodes");
            for s in resp.slices {
                cur.extend_from_slice(s.data.as_deref().unwrap_or(&[]));
                if s.last_slice_for_packet == Some(true) {
                    packets.push(std::mem::take(&mut cur));
                }
            }
        }
        assert!(cur.is_empty(), "a packet without its last slice");
        packets
    }
}

/// A sim with producer "prod" (data source `ds` described by `desc`) and a
/// consumer that enabled `cfg`; the producer's first commands.
fn session_with(
    desc: DataSourceDescriptor,
    cfg: Bytes,
) -> (Sim, TestProducer, TestConsumer, Vec<Cmd>) {
    let mut sim = Sim::new();
    let mut p = TestProducer::connect(&mut sim, "prod", &[desc]);
    let c = TestConsumer::enable(&mut sim, cfg);
    let cmds = p.commands(&mut sim);
    (sim, p, c, cmds)
}

/// Producers `a` and `b` with data source "ds", and a session of one
/// 256 KiB buffer using it; the buffer's id.
fn two_producers(a: &str, b: &str) -> (Sim, TestProducer, TestProducer, TestConsumer, u16) {
    let mut sim = Sim::new();
    let mut pa = TestProducer::connect(&mut sim, a, &[descriptor("ds", false, false)]);
    let mut pb = TestProducer::connect(&mut sim, b, &[descriptor("ds", false, false)]);
    let c = TestConsumer::enable(&mut sim, config("ds", 256, |_| {}));
    let buffer = setup_tracing_buffer(&pa.commands(&mut sim));
    pb.commands(&mut sim);
    (sim, pa, pb, c, buffer)
}

/// Producer "prod" and a `write_into_file` session (256 KiB buffer, 100 ms
/// period, tweaked by `tweak`) writing into a memfd; the buffer's id.
fn file_session(
    tweak: impl FnOnce(&mut TraceConfig),
) -> (Sim, TestProducer, TestConsumer, OwnedFd, u16) {
    let mut sim = Sim::new();
    let mut p = TestProducer::connect(&mut sim, "prod", &[descriptor("ds", false, false)]);
    let file = rustix::fs::memfd_create("trace", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    let cfg = config("ds", 256, |cfg| {
        cfg.write_into_file = Some(true);
        cfg.file_write_period_ms = Some(100);
        tweak(cfg);
    });
    let c = TestConsumer::enable_with(&mut sim, cfg, Some(file.try_clone().unwrap()), 2000);
    let buffer = setup_tracing_buffer(&p.commands(&mut sim));
    (sim, p, c, file, buffer)
}

/// The top-level fields of a packet: `(field, varint value or bytes)`
/// (fixed-width fields are left out).
fn fields(packet: &[u8]) -> Vec<(u32, Result<u64, Vec<u8>>)> {
    Fields::new(packet)
        .filter_map(|f| {
            let f = f.expect("a well-formed packet");
            match f.value {
                Value::Varint(v) => Some((f.number, Ok(v))),
                Value::LengthDelimited(b) => Some((f.number, Err(b.to_vec()))),
                Value::Fixed64(_) | Value::Fixed32(_) => None,
                Value::Group(_) => panic!("a group in field {}", f.number),
            }
        })
        .collect()
}

fn field(packet: &[u8], number: u32) -> Option<Result<u64, Vec<u8>>> {
    fields(packet)
        .into_iter()
        .rev()
        .find(|(f, _)| *f == number)
        .map(|(_, v)| v)
}

/// The last `trace_stats` of a read.
fn stats_of(packets: &[Vec<u8>]) -> crate::protos::TraceStats {
    let raw = packets
        .iter()
        .rev()
        .find_map(|p| field(p, 35))
        .expect("trace_stats")
        .unwrap_err();
    crate::protos::TraceStats::decode(&raw[..]).unwrap()
}

/// The config of a read's `trace_config` packet (field 33).
fn trace_config_in(packets: &[Vec<u8>]) -> TraceConfig {
    let raw = packets
        .iter()
        .find_map(|p| field(p, 33))
        .expect("a trace_config packet")
        .unwrap_err();
    TraceConfig::decode(&raw[..]).expect("the config decodes")
}

/// The producer packets (those with the test payload field 900).
fn payloads(packets: &[Vec<u8>]) -> Vec<Vec<u8>> {
    packets
        .iter()
        .filter_map(|p| field(p, 900).and_then(|v| v.err()))
        .collect()
}

fn setup_tracing_buffer(cmds: &[Cmd]) -> u16 {
    cmds.iter()
        .find_map(|c| match c {
            Cmd::SetupDataSource(s) => {
                let cfg =
                    crate::protos::DataSourceConfig::decode(s.config.clone().unwrap()).unwrap();
                Some(cfg.target_buffer.unwrap() as u16)
            }
            _ => None,
        })
        .expect("a SetupDataSource")
}

#[test]
fn a_whole_session_from_enable_to_read() {
    // SetupTracing (with the SMB), SetupDataSource, StartDataSource.
    let (mut sim, mut p, c, cmds) = session_with(
        descriptor("track_event", true, false),
        config("track_event", 1024, |_| {}),
    );
    assert!(matches!(cmds[0], Cmd::SetupTracing(ref s) if s.shared_buffer_page_size_kb == Some(4)));
    let buffer = setup_tracing_buffer(&cmds);
    let Cmd::SetupDataSource(setup) = &cmds[1] else {
        panic!("{cmds:?}")
    };
    let Cmd::StartDataSource(start) = &cmds[2] else {
        panic!("{cmds:?}")
    };
    assert_eq!(setup.new_instance_id, start.new_instance_id);
    let cfg = crate::protos::DataSourceConfig::decode(setup.config.clone().unwrap()).unwrap();
    assert_eq!(cfg.name.as_deref(), Some("track_event"));
    assert_eq!(cfg.tracing_session_id, Some(1));
    assert_eq!(cfg.stop_timeout_ms, Some(5000));
    let id = p.call(
        &mut sim,
        producer_port::Request::NotifyDataSourceStarted(
            crate::protos::NotifyDataSourceStartedRequest {
                data_source_id: setup.new_instance_id,
            },
        ),
    );
    let _: crate::protos::NotifyDataSourceStartedResponse = sim.reply_ok(p.conn, id);
    p.register_writer(&mut sim, 1, buffer);

    // Two small packets and one of 10 KB that spans three chunks (with
    // patches).
    let big = vec![0xAB; 10_000];
    let req = p.write(1, buffer, &[b"first", b"second", &big], true);
    assert!(req.chunks_to_move.len() >= 3);
    let id = p.commit(&mut sim, req);
    let _: crate::protos::CommitDataResponse = sim.reply_ok(p.conn, id);

    let id = c.call(
        &mut sim,
        consumer_port::Request::DisableTracing(Default::default()),
    );
    let _: crate::protos::DisableTracingResponse = sim.reply_ok(c.conn, id);
    assert!(matches!(p.commands(&mut sim)[..], [Cmd::StopDataSource(_)]));
    let resp = c.enabled_reply(&mut sim).expect("answered at stop");
    assert_eq!(
        resp.state,
        Some(crate::protos::enable_tracing_response::State::Disabled(
            true
        ))
    );
    assert_eq!(resp.error, None);

    let packets = c.read(&mut sim);
    let got = payloads(&packets);
    assert_eq!(got.len(), 3);
    assert_eq!((&got[0][..], &got[1][..]), (&b"first"[..], &b"second"[..]));
    assert!(got[2] == big, "the big packet, reassembled and patched");
    // Producer packets carry the trusted appendix: uid, sequence 2, pid.
    for pkt in packets.iter().filter(|p| field(p, 900).is_some()) {
        assert_eq!(field(pkt, 3), Some(Ok(u64::from(PRODUCER_UID))));
        assert_eq!(field(pkt, 10), Some(Ok(2)));
        assert_eq!(field(pkt, 79), Some(Ok(PRODUCER_PID as u64)));
        assert_eq!(field(pkt, 42), None, "no loss");
    }
    // Service packets in upstream order.
    let kinds: Vec<u32> = packets
        .iter()
        .take_while(|p| field(p, 900).is_none())
        .map(|p| {
            fields(p)
                .iter()
                .map(|(f, _)| *f)
                .find(|f| ![3, 8, 10, 58].contains(f))
                .unwrap_or(0)
        })
        .collect();
    assert_eq!(&kinds[..6], &[6, 33, 89, 6, 36, 124][..], "{kinds:?}");
    assert!(kinds.contains(&45) && kinds.contains(&69));
    let last = packets.last().unwrap();
    assert!(field(last, 35).is_some(), "trace_stats at the end");
    let stats =
        crate::protos::TraceStats::decode(&field(last, 35).unwrap().unwrap_err()[..]).unwrap();
    let b = &stats.buffer_stats[0];
    assert_eq!(b.chunks_written, b.chunks_read);
    assert_eq!(b.readaheads_succeeded, Some(1));
    assert!(b.patches_succeeded.unwrap() >= 1);
    for pkt in packets.iter().filter(|p| field(p, 900).is_none()) {
        assert_eq!(
            field(pkt, 10),
            Some(Ok(1)),
            "service packets are sequence 1"
        );
    }
}

#[test]
fn flush_without_an_ack_times_out() {
    let (mut sim, mut p, c, _) =
        session_with(descriptor("ds", false, false), config("ds", 64, |_| {}));
    let req = crate::protos::FlushRequest {
        timeout_ms: Some(1000),
        flags: Some(4),
    };
    let id = c.call(&mut sim, consumer_port::Request::Flush(req));
    let cmds = p.commands(&mut sim);
    let Cmd::Flush(f) = &cmds[0] else {
        panic!("{cmds:?}")
    };
    assert_eq!(f.flags, Some(4));
    assert_eq!(f.data_source_ids.len(), 1);
    sim.advance(999);
    assert!(sim.replies(c.conn, id).is_empty());
    sim.advance(1);
    let got = sim.replies(c.conn, id);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body, ReplyBody::Err);
    let id = c.call(
        &mut sim,
        consumer_port::Request::GetTraceStats(Default::default()),
    );
    let stats: crate::protos::GetTraceStatsResponse = sim.reply_ok(c.conn, id);
    let stats = stats.trace_stats.unwrap();
    assert_eq!(
        (stats.flushes_requested, stats.flushes_failed),
        (Some(1), Some(1))
    );
}

#[test]
fn flush_acks_are_cumulative() {
    let (mut sim, mut p, c, _) =
        session_with(descriptor("ds", false, false), config("ds", 64, |_| {}));
    let a = c.call(&mut sim, consumer_port::Request::Flush(Default::default()));
    let b = c.call(&mut sim, consumer_port::Request::Flush(Default::default()));
    let ids: Vec<u64> = p
        .commands(&mut sim)
        .iter()
        .filter_map(|c| match c {
            Cmd::Flush(f) => f.request_id,
            _ => None,
        })
        .collect();
    assert_eq!(ids.len(), 2);
    // One ack for the second flush answers both.
    let req = crate::protos::CommitDataRequest {
        flush_request_id: Some(ids[1]),
        ..Default::default()
    };
    p.commit(&mut sim, req);
    let _: crate::protos::FlushResponse = sim.reply_ok(c.conn, a);
    let _: crate::protos::FlushResponse = sim.reply_ok(c.conn, b);
}

#[test]
fn stop_waits_for_data_sources_that_notify() {
    let (mut sim, mut p, c, _) = session_with(
        descriptor("ds", false, true),
        config("ds", 64, |cfg| cfg.data_source_stop_timeout_ms = Some(3000)),
    );
    c.call(
        &mut sim,
        consumer_port::Request::DisableTracing(Default::default()),
    );
    let cmds = p.commands(&mut sim);
    let Cmd::StopDataSource(stop) = &cmds[0] else {
        panic!("{cmds:?}")
    };
    sim.advance(1000);
    assert!(c.enabled_reply(&mut sim).is_none(), "waits for the ack");
    p.call(
        &mut sim,
        producer_port::Request::NotifyDataSourceStopped(
            crate::protos::NotifyDataSourceStoppedRequest {
                data_source_id: stop.instance_id,
            },
        ),
    );
    assert!(c.enabled_reply(&mut sim).is_some());

    // Without the ack: the stop timeout ends the wait.
    let (mut sim, _producer, c, _) = session_with(
        descriptor("ds", false, true),
        config("ds", 64, |cfg| cfg.data_source_stop_timeout_ms = Some(3000)),
    );
    c.call(
        &mut sim,
        consumer_port::Request::DisableTracing(Default::default()),
    );
    sim.advance(2999);
    assert!(c.enabled_reply(&mut sim).is_none());
    sim.advance(1);
    assert!(c.enabled_reply(&mut sim).is_some());
    assert_eq!(
        sim.svc
            .session_states()
            .values()
            .copied()
            .collect::<Vec<_>>(),
        [session::SessionState::Disabled]
    );
}

#[test]
fn duration_flushes_then_stops() {
    let (mut sim, mut p, c, _) = session_with(
        descriptor("ds", false, false),
        config("ds", 64, |cfg| cfg.duration_ms = Some(2000)),
    );
    sim.advance(2000);
    let cmds = p.commands(&mut sim);
    let Some(Cmd::Flush(f)) = cmds.first() else {
        panic!("{cmds:?}")
    };
    assert_eq!(f.flags, Some(0x12), "reason trace stop, initiator traced");
    assert!(c.enabled_reply(&mut sim).is_none());
    p.commit(
        &mut sim,
        crate::protos::CommitDataRequest {
            flush_request_id: f.request_id,
            ..Default::default()
        },
    );
    assert!(matches!(p.commands(&mut sim)[..], [Cmd::StopDataSource(_)]));
    assert!(c.enabled_reply(&mut sim).is_some());
}

/// The `service_event` packets of `packets` that name data sources:
/// `(field, [(producer, data source)])`, field 7 for slow starts and 8 for
/// slow last flushes.
fn slow_data_source_events(packets: &[Vec<u8>]) -> Vec<(u32, Vec<(String, String)>)> {
    use crate::protos::trace_packet::Data;
    use crate::protos::tracing_service_event::EventType as E;
    packets
        .iter()
        .filter_map(
            |p| match crate::protos::TracePacket::decode(&p[..]).ok()?.data? {
                Data::ServiceEvent(e) => Some(e),
                _ => None,
            },
        )
        .filter_map(|e| match e.event_type? {
            E::SlowStartingDataSources(d) => Some((7, d)),
            E::LastFlushSlowDataSources(d) => Some((8, d)),
            _ => None,
        })
        .map(|(field, d)| {
            let names = d.data_source.into_iter();
            let names = names.map(|s| (s.producer_name.unwrap(), s.data_source_name.unwrap()));
            (field, names.collect())
        })
        .collect()
}

/// A stop's flush that times out names the data sources it waited for
/// (`last_flush_slow_data_sources`), as upstream's `OnFlushTimeout`; a
/// consumer's flush that times out does not.
#[test]
fn a_stop_flush_that_times_out_names_the_slow_data_sources() {
    let (mut sim, mut p, c, _) = session_with(
        descriptor("ds", false, false),
        config("ds", 64, |cfg| {
            cfg.duration_ms = Some(2000);
            cfg.flush_timeout_ms = Some(500);
        }),
    );
    let req = crate::protos::FlushRequest {
        timeout_ms: Some(100),
        flags: None,
    };
    c.call(&mut sim, consumer_port::Request::Flush(req));
    sim.advance(100);
    sim.advance(1900);
    assert!(matches!(
        p.commands(&mut sim)[..],
        [Cmd::Flush(_), Cmd::Flush(_)]
    ));
    sim.advance(499);
    assert!(c.enabled_reply(&mut sim).is_none());
    sim.advance(1);
    assert!(
        c.enabled_reply(&mut sim).is_some(),
        "stopped after the timeout"
    );
    let packets = c.read(&mut sim);
    assert_eq!(
        slow_data_source_events(&packets),
        [(8, vec![("prod".to_owned(), "ds".to_owned())])]
    );
    // Emitted once.
    assert!(slow_data_source_events(&c.read(&mut sim)).is_empty());
}

/// A data source not started 20 s after the start is named in a
/// `slow_starting_data_sources` event (upstream's
/// `OnAllDataSourceStartedTimeout`); once all started, none.
#[test]
fn data_sources_slow_to_start_are_named() {
    let (mut sim, _p, c, _) = session_with(descriptor("ds", true, false), config("ds", 64, |_| {}));
    sim.advance(19_999);
    assert!(slow_data_source_events(&c.read(&mut sim)).is_empty());
    sim.advance(1);
    assert_eq!(
        slow_data_source_events(&c.read(&mut sim)),
        [(7, vec![("prod".to_owned(), "ds".to_owned())])]
    );
    let (mut sim, _p, c, _) =
        session_with(descriptor("ds", false, false), config("ds", 64, |_| {}));
    sim.advance(20_000);
    assert!(slow_data_source_events(&c.read(&mut sim)).is_empty());
}

#[test]
fn unsupported_configs_and_calls_answer_with_clear_errors() {
    let mut sim = Sim::new();
    // Bad buffer index.
    let error = TestConsumer::refused(&mut sim, config("ds", 64, |cfg| cfg.buffers.clear()));
    assert!(
        matches!(
            &error,
            ConfigError::NoSuchBuffer { data_source, index: 0, buffers: 0 } if data_source == "ds"
        ),
        "{error:?}"
    );
    // unique_session_name.
    let named = |cfg: &mut TraceConfig| cfg.unique_session_name = Some("x".into());
    let first = TestConsumer::enable(&mut sim, config("ds", 64, named));
    assert!(first.enabled_reply(&mut sim).is_none());
    let error = TestConsumer::refused(&mut sim, config("ds", 64, named));
    assert!(
        matches!(&error, ConfigError::SessionNameTaken(name) if name == "x"),
        "{error:?}"
    );
    // CloneSession without a session to clone says why it fails.
    let id = first.call(
        &mut sim,
        consumer_port::Request::CloneSession(Default::default()),
    );
    let resp: crate::protos::CloneSessionResponse = sim.reply_ok(first.conn, id);
    assert_eq!(resp.success, Some(false));
    assert_eq!(resp.error.as_deref(), Some("Tracing session not found"));
    let id = first.call(
        &mut sim,
        consumer_port::Request::QueryCapabilities(Default::default()),
    );
    let caps: crate::protos::QueryCapabilitiesResponse = sim.reply_ok(first.conn, id);
    assert_eq!(caps.capabilities.unwrap().has_clone_session, Some(true));
}

/// `session_semaphores`: a session is refused while more running sessions
/// hold one of its semaphores than the smallest `max_other_session_count`
/// allows; stopped sessions and other names do not count.
#[test]
fn session_semaphores_limit_concurrent_sessions() {
    use crate::protos::trace_config::SessionSemaphore;
    let with = |sems: &[(&str, u64)]| {
        let sems: Vec<SessionSemaphore> = sems
            .iter()
            .map(|&(name, max)| SessionSemaphore {
                name: Some(name.into()),
                max_other_session_count: Some(max),
            })
            .collect();
        config("ds", 64, move |cfg| cfg.session_semaphores = sems)
    };
    let mut sim = Sim::new();
    // "a" allows one other session; "b" none.
    let first = TestConsumer::enable(&mut sim, with(&[("a", 1), ("b", 0)]));
    assert!(first.enabled_reply(&mut sim).is_none());
    let second = TestConsumer::enable(&mut sim, with(&[("a", 5)]));
    assert!(second.enabled_reply(&mut sim).is_none());
    // Two hold "a" now, over the holders' smallest limit (1).
    let error = TestConsumer::refused(&mut sim, with(&[("a", 5)]));
    assert_eq!(
        error.to_string(),
        "Semaphore \"a\" exceeds maximum allowed other session count (2 > min(5, 1))"
    );
    let error = TestConsumer::refused(&mut sim, with(&[("b", 3)]));
    assert!(
        matches!(&error, ConfigError::SemaphoreTaken { name, holders: 1, mine: 3, smallest: 0 } if name == "b"),
        "{error:?}"
    );
    // Another name, or none, is free.
    let other = TestConsumer::enable(&mut sim, with(&[("c", 0)]));
    assert!(other.enabled_reply(&mut sim).is_none());
    // A stopped session holds nothing.
    first.call(
        &mut sim,
        consumer_port::Request::DisableTracing(Default::default()),
    );
    assert!(first.enabled_reply(&mut sim).is_some());
    let again = TestConsumer::enable(&mut sim, with(&[("b", 0), ("a", 1)]));
    assert!(again.enabled_reply(&mut sim).is_none());
}

#[test]
fn lockdown_refuses_other_uids() {
    let mut sim = Sim::new();
    let c = TestConsumer::enable(
        &mut sim,
        config("ds", 64, |cfg| cfg.lockdown_mode = Some(2)),
    );
    assert!(c.enabled_reply(&mut sim).is_none());
    let conn = sim.svc.connect_producer(creds(PRODUCER_UID, 1));
    let id = sim.producer_call(
        conn,
        producer_port::Request::InitializeConnection(Default::default()),
        None,
    );
    assert_eq!(sim.replies(conn, id)[0].body, ReplyBody::Err);
    // The service's own uid is admitted.
    let ok = TestProducer::connect_as(&mut sim, "root", &[], 0, true);
    let id = ok.call(&mut sim, producer_port::Request::Sync(Default::default()));
    let _: crate::protos::SyncResponse = sim.reply_ok(ok.conn, id);
}

#[test]
fn calls_before_initialize_and_twice_are_refused() {
    let mut sim = Sim::new();
    let conn = sim.svc.connect_producer(creds(1, 1));
    let id = sim.producer_call(conn, producer_port::Request::Sync(Default::default()), None);
    assert_eq!(sim.replies(conn, id)[0].body, ReplyBody::Err);
    let p = TestProducer::connect(&mut sim, "p", &[]);
    let id = p.call(
        &mut sim,
        producer_port::Request::InitializeConnection(Default::default()),
    );
    assert_eq!(sim.replies(p.conn, id)[0].body, ReplyBody::Err);
}

#[test]
fn hostile_commits_cost_nothing_but_their_own_data() {
    let (mut sim, good, evil, c, buffer) = two_producers("good", "evil");
    good.register_writer(&mut sim, 1, buffer);
    let req = good.write(1, buffer, &[b"mine"], true);
    // The evil producer: commits for pages that do not exist, chunks that
    // are free, a foreign buffer, garbage emulated chunks, forged patches
    // for the good producer's chunk.
    let mut forged = crate::protos::CommitDataRequest::default();
    for page in [0u32, 63, 64, u32::MAX] {
        forged.chunks_to_move.push(ChunksToMove {
            page: Some(page),
            chunk: Some(0),
            target_buffer: Some(u32::from(buffer)),
            ..Default::default()
        });
    }
    forged.chunks_to_move.push(ChunksToMove {
        target_buffer: Some(9999),
        data: Some(Bytes::from_static(&[1, 2, 3])),
        ..Default::default()
    });
    forged.chunks_to_move.push(ChunksToMove {
        target_buffer: Some(u32::from(buffer)),
        data: Some(Bytes::from(vec![0xFF; 70_000])),
        ..Default::default()
    });
    forged.chunks_to_patch.push(ChunkToPatch {
        target_buffer: Some(u32::from(buffer)),
        writer_id: Some(1),
        chunk_id: Some(0),
        patches: vec![chunk_to_patch::Patch {
            offset: Some(0),
            data: Some(Bytes::from_static(b"EVIL")),
        }],
        has_more_patches: Some(false),
    });
    forged.chunks_to_patch.push(ChunkToPatch {
        target_buffer: Some(u32::from(buffer)),
        writer_id: Some(0),
        ..Default::default()
    });
    let id = good.commit(&mut sim, req);
    let _: crate::protos::CommitDataResponse = sim.reply_ok(good.conn, id);
    let id = evil.commit(&mut sim, forged);
    let _: crate::protos::CommitDataResponse = sim.reply_ok(evil.conn, id);
    // Garbage in the evil producer's whole SMB, then commits of everything.
    forge_chunk(&evil, 5, 7, 0xFFFF, &[0xFF; 64]);
    let mut all = crate::protos::CommitDataRequest::default();
    for page in 0..64 {
        all.chunks_to_move.push(ChunksToMove {
            page: Some(page),
            chunk: Some(0),
            target_buffer: Some(u32::from(buffer)),
            ..Default::default()
        });
    }
    evil.commit(&mut sim, all);
    assert!(sim.disconnects().is_empty());
    let (packets, stats) = c.stop_and_read(&mut sim);
    assert_eq!(payloads(&packets), [b"mine".to_vec()]);
    assert!(stats.chunks_discarded.unwrap() >= 2);
    assert_eq!(stats.patches_discarded, Some(0));
    assert_eq!(
        stats.buffer_stats[0].patches_failed,
        Some(1),
        "the forged patch found no chunk of its own"
    );
}

#[test]
fn producer_disconnect_mid_packet_leaves_whole_packets_only() {
    let (mut sim, p, other, c, buffer) = two_producers("prod", "other");
    p.register_writer(&mut sim, 1, buffer);
    // A whole packet, then one that is still being written (9 KB so far,
    // across chunks) when the producer dies.
    let shm = p.smb.as_ref().unwrap().borrow();
    let (mut w, log) = Arbiter::writer(shm.smb(), 1, buffer, false);
    let _ = w.write_packet(|m| m.bytes(900, b"whole"));
    let mut unfinished = w.new_packet();
    unfinished.nested(900, |n| n.raw(&[7u8; 9000]));
    std::mem::forget(unfinished);
    std::mem::forget(w);
    let req = log.borrow().clone();
    assert!(req.chunks_to_move.len() >= 2);
    p.commit(&mut sim, req);
    let theirs = other.write(1, buffer, &[b"theirs"], true);
    other.commit(&mut sim, theirs);
    sim.svc.disconnect(p.conn);
    sim.pump();
    let (packets, stats) = c.stop_and_read(&mut sim);
    let mut got = payloads(&packets);
    got.sort();
    assert_eq!(got, [b"theirs".to_vec(), b"whole".to_vec()]);
    assert_eq!(stats.buffer_stats[0].readaheads_failed, Some(1));
    // Nothing follows the unfinished packet (patches never came, the rest
    // never committed) on its sequence: its loss comes on a packet of its
    // own (no producer bytes, only the service's trusted fields), right
    // after the whole one. Before, the trace said nothing was lost.
    let sequence = |p: &Vec<u8>| field(p, 10).and_then(Result::ok);
    let whole = packets
        .iter()
        .position(|p| field(p, 900) == Some(Err(b"whole".to_vec())))
        .expect("the whole packet");
    let mark = &packets[whole + 1];
    assert_eq!(sequence(mark), sequence(&packets[whole]));
    use crate::service::buffer::DataLoss;
    // Its first chunk waited for the patch of the size that spans chunks;
    // the chunks after it continue the packet given up on.
    let lost = DataLoss::because(DataLoss::REASSEMBLY_BROKEN_CHAIN)
        | DataLoss::because(DataLoss::ORPHAN_CONTINUATION);
    assert_eq!(field(mark, 42), Some(Ok(u64::from(lost.bits()))));
    let numbers: Vec<u32> = fields(mark).into_iter().map(|(n, _)| n).collect();
    assert!(
        numbers.iter().all(|n| [3, 10, 42, 79, 98].contains(n)),
        "trusted fields only: {numbers:?}"
    );
    let marks = packets
        .iter()
        .filter(|p| field(p, 42).is_some_and(|v| v != Ok(0)))
        .count();
    assert_eq!(marks, 1, "the other producer's sequence is not marked");
}

#[test]
fn write_into_file_streams_a_valid_trace() {
    let (mut sim, p, c, file, buffer) = file_session(|_| {});
    let req = p.write(1, buffer, &[b"early"], true);
    p.commit(&mut sim, req);
    sim.advance(100);
    let size_after_first_drain = rustix::fs::fstat(&file).unwrap().st_size;
    assert!(size_after_first_drain > 0, "periodic drain wrote");
    // ReadBuffers on a file session: a single empty reply.
    assert!(c.read(&mut sim).is_empty());
    let req = p.write(2, buffer, &[b"late"], true);
    p.commit(&mut sim, req);
    c.call(
        &mut sim,
        consumer_port::Request::DisableTracing(Default::default()),
    );
    assert!(c.enabled_reply(&mut sim).is_some());
    let raw = written_packets(&file);
    assert_eq!(payloads(&raw), [b"early".to_vec(), b"late".to_vec()]);
    assert!(field(raw.last().unwrap(), 35).is_some(), "stats at the end");
}

/// What the service wrote into a write_into_file session's `file`: the
/// bytes, decoded as a `Trace`.
fn written_trace(file: &impl std::os::fd::AsRawFd) -> (Vec<u8>, crate::protos::Trace) {
    let bytes = std::fs::read(format!("/proc/self/fd/{}", file.as_raw_fd())).unwrap();
    let trace = crate::protos::Trace::decode(&bytes[..]).expect("a valid Trace");
    (bytes, trace)
}

/// The packets of what the service wrote into `file`, which must be a
/// valid `Trace` of `Trace.packet` records only.
fn written_packets(file: &impl std::os::fd::AsRawFd) -> Vec<Vec<u8>> {
    let (bytes, trace) = written_trace(file);
    let raw: Vec<Vec<u8>> = fields(&bytes)
        .into_iter()
        .map(|(f, v)| {
            assert_eq!(f, 1);
            v.unwrap_err()
        })
        .collect();
    assert_eq!(raw.len(), trace.packet.len());
    raw
}

/// Upstream's periodic writes: each one reads the buffers to their end and
/// closes with a `read_tracing_buffers_completed` service event; the stats
/// go out with the first write after they fall due (at the start, every
/// snapshot interval, at the stop). The system info names the Perfetto
/// version whose behaviour the trace processor may assume (a v54+ service
/// flushes around its periodic writes, so the trace processor does not flag
/// `config_write_into_file_no_flush`).
#[test]
fn every_periodic_write_ends_with_read_completed_and_due_stats() {
    let (mut sim, p, c, file, buffer) = file_session(|_| {});
    for (id, payload) in [b"one", b"two", b"six"].iter().enumerate() {
        let req = p.write(id as u16 + 1, buffer, &[&payload[..]], true);
        p.commit(&mut sim, req);
        sim.advance(100);
    }
    c.call(
        &mut sim,
        consumer_port::Request::DisableTracing(Default::default()),
    );
    assert!(c.enabled_reply(&mut sim).is_some());
    let (_, trace) = written_trace(&file);
    use crate::protos::trace_packet::Data;
    use crate::protos::tracing_service_event::EventType;
    // What each packet is: 'R' read completed, 'S' stats, 'P' a producer
    // packet, '.' anything else.
    let kinds: String = trace
        .packet
        .iter()
        .map(|p| match &p.data {
            Some(Data::ServiceEvent(e)) => match e.event_type {
                Some(EventType::ReadTracingBuffersCompleted(true)) => 'R',
                _ => '.',
            },
            Some(Data::TraceStats(_)) => 'S',
            _ if p.trusted_pid.is_some() => 'P',
            _ => '.',
        })
        .filter(|&k| k != '.')
        .collect();
    // Three periodic writes, each with its packet, the first with the stats
    // due since the start; the final write with the stats of the stop.
    assert_eq!(kinds, "PRSPRPRRS", "{trace:?}");
    let versions: Vec<&str> = trace
        .packet
        .iter()
        .filter_map(|p| match &p.data {
            Some(Data::SystemInfo(i)) => i.tracing_service_version.as_deref(),
            _ => None,
        })
        .collect();
    assert_eq!(
        versions,
        [format!(
            "Perfetto v59.0 (shmtrace {})",
            env!("CARGO_PKG_VERSION")
        )]
    );
}

#[test]
fn max_file_size_stops_the_session() {
    let (mut sim, mut p, c, file, buffer) =
        file_session(|cfg| cfg.max_file_size_bytes = Some(4096));
    let big: Vec<Vec<u8>> = (0..20u8).map(|i| vec![i; 500]).collect();
    let refs: Vec<&[u8]> = big.iter().map(|v| &v[..]).collect();
    let req = p.write(1, buffer, &refs, true);
    p.commit(&mut sim, req);
    sim.advance(100);
    assert!(rustix::fs::fstat(&file).unwrap().st_size <= 4096);
    assert!(matches!(p.commands(&mut sim)[..], [Cmd::StopDataSource(_)]));
    assert!(c.enabled_reply(&mut sim).is_some());
}

#[test]
fn observe_events_reports_instance_states() {
    let mut sim = Sim::new();
    let conn = sim.svc.connect_consumer(creds(5, 5));
    let req = crate::protos::ObserveEventsRequest {
        events_to_observe: vec![1, 2],
    };
    let obs = sim.consumer_call(conn, consumer_port::Request::ObserveEvents(req), None);
    let req = crate::protos::EnableTracingRequest {
        trace_config: Some(config("ds", 64, |_| {})),
        attach_notification_only: None,
    };
    sim.consumer_call(conn, consumer_port::Request::EnableTracing(req), None);
    // No instance yet: all (zero) data sources started.
    let mut p = TestProducer::connect(&mut sim, "prod", &[descriptor("ds", true, false)]);
    let cmds = p.commands(&mut sim);
    let Cmd::StartDataSource(start) = &cmds[2] else {
        panic!()
    };
    p.call(
        &mut sim,
        producer_port::Request::NotifyDataSourceStarted(
            crate::protos::NotifyDataSourceStartedRequest {
                data_source_id: start.new_instance_id,
            },
        ),
    );
    let events: Vec<crate::protos::ObservableEvents> = sim
        .replies(conn, obs)
        .into_iter()
        .map(|g| {
            assert!(g.has_more);
            let ReplyBody::Ok(b) = g.body else { panic!() };
            crate::protos::ObserveEventsResponse::decode(b)
                .unwrap()
                .events
                .unwrap()
        })
        .collect();
    assert_eq!(events[0].all_data_sources_started, Some(true));
    let states: Vec<i32> = events[1..]
        .iter()
        .flat_map(|e| e.instance_state_changes.iter().map(|c| c.state.unwrap()))
        .collect();
    assert_eq!(
        states,
        [1, 2],
        "configured (reported as stopped), then started"
    );
    assert_eq!(
        events[1].instance_state_changes[0].producer_name.as_deref(),
        Some("prod")
    );
}

#[test]
fn deferred_start_waits_for_start_tracing_and_clears_incremental_state() {
    let (mut sim, mut p, c, cmds) = session_with(
        descriptor("ds", false, false),
        config("ds", 64, |cfg| {
            cfg.deferred_start = Some(true);
            cfg.incremental_state_config = Some(trace_config::IncrementalStateConfig {
                clear_period_ms: Some(1000),
            });
        }),
    );
    assert!(cmds.iter().all(|c| !matches!(c, Cmd::StartDataSource(_))));
    let id = c.call(
        &mut sim,
        consumer_port::Request::StartTracing(Default::default()),
    );
    let _: crate::protos::StartTracingResponse = sim.reply_ok(c.conn, id);
    assert!(matches!(
        p.commands(&mut sim)[..],
        [Cmd::StartDataSource(_)]
    ));
    sim.advance(1000);
    let cmds = p.commands(&mut sim);
    assert!(
        matches!(&cmds[..], [Cmd::ClearIncrementalState(c)] if c.data_source_ids.len() == 1),
        "{cmds:?}"
    );
}

#[test]
fn detach_and_attach() {
    let mut sim = Sim::new();
    let c = TestConsumer::enable(&mut sim, config("ds", 64, |_| {}));
    let req = crate::protos::DetachRequest {
        key: Some("k".into()),
    };
    let id = c.call(&mut sim, consumer_port::Request::Detach(req));
    let _: crate::protos::DetachResponse = sim.reply_ok(c.conn, id);
    sim.svc.disconnect(c.conn);
    assert_eq!(
        sim.svc.session_states().len(),
        1,
        "a detached session survives its consumer"
    );
    let conn = sim.svc.connect_consumer(creds(2000, 9));
    let req = crate::protos::AttachRequest {
        key: Some("k".into()),
    };
    let id = sim.consumer_call(conn, consumer_port::Request::Attach(req), None);
    let resp: crate::protos::AttachResponse = sim.reply_ok(conn, id);
    let cfg = TraceConfig::decode(resp.trace_config.unwrap()).unwrap();
    assert_eq!(cfg.buffers[0].size_kb, Some(64));
    // Another uid cannot attach.
    let other = sim.svc.connect_consumer(creds(3000, 9));
    let req = crate::protos::AttachRequest {
        key: Some("k".into()),
    };
    let id = sim.consumer_call(other, consumer_port::Request::Attach(req), None);
    assert_eq!(sim.replies(other, id)[0].body, ReplyBody::Err);
}

/// A flush asked, then the session detached and the consumer gone: when
/// the flush times out there is nobody to answer (found by the
/// `service_session_calls` fuzz target: the core sent the reply to the
/// closed connection).
#[test]
fn a_flush_pending_when_its_consumer_detaches_and_leaves_answers_nobody() {
    let (mut sim, mut p, c, _) =
        session_with(descriptor("ds", false, false), config("ds", 64, |_| {}));
    let req = crate::protos::FlushRequest {
        timeout_ms: Some(1000),
        flags: None,
    };
    c.call(&mut sim, consumer_port::Request::Flush(req));
    assert!(matches!(p.commands(&mut sim)[..], [Cmd::Flush(_)]));
    let req = crate::protos::DetachRequest {
        key: Some("k".into()),
    };
    let id = c.call(&mut sim, consumer_port::Request::Detach(req));
    let _: crate::protos::DetachResponse = sim.reply_ok(c.conn, id);
    sim.svc.disconnect(c.conn);
    sim.advance(1000);
    let to_gone: Vec<_> = sim
        .sent
        .iter()
        .filter(|o| matches!(o, Output::Reply { conn, .. } if *conn == c.conn))
        .collect();
    assert!(to_gone.is_empty(), "{to_gone:?}");
    // The flush did end (it failed: no ack), and the session lives on.
    let stats = sim.svc.session_states();
    assert_eq!(stats.len(), 1, "a detached session survives its consumer");
}

#[test]
fn query_service_state_lists_producers_and_sessions() {
    let mut sim = Sim::new();
    TestProducer::connect(&mut sim, "prod", &[descriptor("ds", false, false)]);
    let c = TestConsumer::enable(
        &mut sim,
        config("ds", 64, |cfg| {
            cfg.bugreport_score = Some(10);
            cfg.bugreport_filename = Some("app".into());
        }),
    );
    let id = c.call(
        &mut sim,
        consumer_port::Request::QueryServiceState(Default::default()),
    );
    let resp: crate::protos::QueryServiceStateResponse = sim.reply_ok(c.conn, id);
    let state = resp.service_state.unwrap();
    // What `perfetto --clone-all-for-bugreport` picks sessions by.
    let session = &state.tracing_sessions[0];
    assert_eq!(
        (
            session.bugreport_score,
            session.bugreport_filename.as_deref()
        ),
        (Some(10), Some("app"))
    );
    assert_eq!(state.producers[0].name.as_deref(), Some("prod"));
    assert_eq!(state.producers[0].uid, Some(PRODUCER_UID as i32));
    assert_eq!(
        state.data_sources[0]
            .ds_descriptor
            .as_ref()
            .unwrap()
            .name
            .as_deref(),
        Some("ds")
    );
    assert_eq!(state.tracing_sessions[0].state.as_deref(), Some("STARTED"));
    assert_eq!(state.tracing_sessions[0].num_data_sources, Some(1));
}

#[test]
fn recommit_after_scrape_on_flush() {
    let mut sim = Sim::new();
    let mut p = TestProducer::connect(&mut sim, "prod", &[descriptor("ds", false, false)]);
    let c = TestConsumer::enable(&mut sim, config("ds", 256, |_| {}));
    let buffer = setup_tracing_buffer(&p.commands(&mut sim));
    p.register_writer(&mut sim, 1, buffer);
    // Written but not returned: the chunk stays BeingWritten (inflated
    // count), then a flush completes and the service scrapes it.
    let shm = p.smb.take().unwrap().into_inner();
    let (mut w, log) = Arbiter::writer(shm.smb(), 1, buffer, false);
    let _ = w.write_packet(|m| m.bytes(900, b"scraped"));
    let id = c.call(
        &mut sim,
        consumer_port::Request::Flush(crate::protos::FlushRequest {
            timeout_ms: Some(100),
            flags: None,
        }),
    );
    sim.advance(100);
    assert_eq!(
        sim.replies(c.conn, id)[0].body,
        ReplyBody::Err,
        "no ack: timed out (and scraped)"
    );
    assert_eq!(payloads(&c.read(&mut sim)), [b"scraped".to_vec()]);
    // The real commit of the same chunk later: only the new packet shows.
    let _ = w.write_packet(|m| m.bytes(900, b"after"));
    w.flush();
    drop(w);
    let req = log.borrow().clone();
    p.smb = Some(RefCell::new(shm));
    p.commit(&mut sim, req);
    let (packets, stats) = c.stop_and_read(&mut sim);
    assert_eq!(payloads(&packets), [b"after".to_vec()]);
    assert_eq!(stats.buffer_stats[0].chunks_rewritten, Some(1));
}

/// A flush scrapes a producer's SMB only while one of its registered
/// writers could have chunks copied: once its writers are gone (its threads
/// exited and unregistered them), the SMB is left unread, so the pages the
/// producer never used stay unallocated (reading every page's header would
/// allocate them all; upstream returns early alike). With the writer still
/// registered, the same flush reads every page and takes the open chunk.
#[test]
fn a_flush_leaves_the_smb_of_a_producer_without_writers_unread() {
    for registered in [true, false] {
        let mut sim = Sim::new();
        let mut p = TestProducer::connect(&mut sim, "prod", &[descriptor("ds", false, false)]);
        // Mapped without touching it (the SDK's producer touches pages as
        // its writers take chunks in them).
        p.adoption = Adoption::ByService;
        let c = TestConsumer::enable(&mut sim, config("ds", 256, |_| {}));
        let buffer = setup_tracing_buffer(&p.commands(&mut sim));
        p.register_writer(&mut sim, 1, buffer);
        let shm = p.smb.take().unwrap().into_inner();
        // An open chunk in the first page, never committed.
        let (mut w, _log) = Arbiter::writer(shm.smb(), 1, buffer, false);
        let _ = w.write_packet(|m| m.bytes(900, b"open"));
        if !registered {
            let req = crate::protos::UnregisterTraceWriterRequest {
                trace_writer_id: Some(1),
            };
            let id = p.call(&mut sim, producer_port::Request::UnregisterTraceWriter(req));
            let _: crate::protos::UnregisterTraceWriterResponse = sim.reply_ok(p.conn, id);
        }
        c.call(
            &mut sim,
            consumer_port::Request::Flush(crate::protos::FlushRequest {
                timeout_ms: Some(100),
                flags: None,
            }),
        );
        sim.advance(100);
        let fd = shm.fd().expect("a memfd");
        let size = rustix::fs::fstat(fd).unwrap().st_size as u64;
        let page = shm.page_size().get() as u64;
        assert!(size >= 4 * page, "{size}");
        let first_hole = rustix::fs::seek(fd, rustix::fs::SeekFrom::Hole(0)).unwrap();
        let read = payloads(&c.read(&mut sim));
        if registered {
            assert_eq!(read, [b"open".to_vec()]);
            assert_eq!(first_hole, size, "every page header was read");
        } else {
            assert!(read.is_empty(), "{read:?}");
            assert_eq!(first_hole, page, "only the written page exists");
        }
        drop(w);
    }
}

#[test]
fn producer_name_filters_choose_the_producers() {
    let mut sim = Sim::new();
    let mut a = TestProducer::connect(
        &mut sim,
        "com.example.app",
        &[descriptor("ds", false, false)],
    );
    let mut b = TestProducer::connect(&mut sim, "other", &[descriptor("ds", false, false)]);
    let mut c = TestProducer::connect(
        &mut sim,
        "com.example.svc",
        &[descriptor("ds", false, false)],
    );
    TestConsumer::enable(
        &mut sim,
        config("ds", 64, |cfg| {
            cfg.data_sources[0].producer_name_filter = vec!["com.example.app".into()];
            cfg.data_sources[0].producer_name_regex_filter = vec![r"com\.example\.s.*".into()];
        }),
    );
    assert!(a
        .commands(&mut sim)
        .iter()
        .any(|c| matches!(c, Cmd::StartDataSource(_))));
    assert!(
        b.commands(&mut sim).is_empty(),
        "filtered out: nothing, not even the SMB"
    );
    assert!(c
        .commands(&mut sim)
        .iter()
        .any(|c| matches!(c, Cmd::StartDataSource(_))));
    // A regex must match the whole name.
    let mut d = TestProducer::connect(
        &mut sim,
        "xcom.example.svc",
        &[descriptor("ds", false, false)],
    );
    assert!(d.commands(&mut sim).is_empty());
}

#[test]
fn change_trace_config_widens_producer_name_filters_only() {
    let mut sim = Sim::new();
    let ds = || descriptor("ds", false, false);
    let mut a = TestProducer::connect(&mut sim, "app", &[ds()]);
    let mut b = TestProducer::connect(&mut sim, "svc", &[ds()]);
    let filtered = |names: Vec<&str>, regexes: Vec<&str>, duration: u32| {
        config("ds", 64, move |cfg| {
            cfg.duration_ms = Some(duration);
            cfg.data_sources[0].producer_name_filter =
                names.iter().map(|n| n.to_string()).collect();
            cfg.data_sources[0].producer_name_regex_filter =
                regexes.iter().map(|r| r.to_string()).collect();
        })
    };
    let c = TestConsumer::enable(&mut sim, filtered(vec!["app"], vec![], 60_000));
    assert!(a
        .commands(&mut sim)
        .iter()
        .any(|c| matches!(c, Cmd::StartDataSource(_))));
    assert!(b.commands(&mut sim).is_empty());
    let change = |sim: &mut Sim, cfg: Bytes| {
        let req = crate::protos::ChangeTraceConfigRequest {
            trace_config: Some(cfg),
        };
        let id = c.call(sim, consumer_port::Request::ChangeTraceConfig(req));
        sim.replies(c.conn, id).pop().expect("a reply").body
    };
    // A bad regex changes nothing and fails the call.
    assert!(matches!(
        change(&mut sim, filtered(vec![], vec!["("], 60_000)),
        ReplyBody::Err
    ));
    assert!(b.commands(&mut sim).is_empty());
    // Widened (and a duration change, which is ignored): "svc" is set up
    // and started; "app" keeps its one instance.
    let body = change(&mut sim, filtered(vec!["app"], vec!["s.c"], 1000));
    let ReplyBody::Ok(b_reply) = body else {
        panic!("ChangeTraceConfig failed")
    };
    crate::protos::ChangeTraceConfigResponse::decode(b_reply).unwrap();
    let cmds = b.commands(&mut sim);
    assert!(
        matches!(
            cmds[..],
            [
                Cmd::SetupTracing(_),
                Cmd::SetupDataSource(_),
                Cmd::StartDataSource(_)
            ]
        ),
        "{cmds:?}"
    );
    assert!(a.commands(&mut sim).is_empty(), "already set up");
    sim.advance(1000);
    assert!(
        a.commands(&mut sim).is_empty(),
        "the duration did not change"
    );
    // Narrowing stops nothing and sets nothing up.
    change(&mut sim, filtered(vec!["nobody"], vec![], 60_000));
    let late = TestProducer::connect(&mut sim, "svc2", &[ds()]).commands(&mut sim);
    assert!(late.is_empty(), "filtered out by the new filter");
    assert!(a.commands(&mut sim).is_empty() && b.commands(&mut sim).is_empty());
}

#[test]
fn data_sources_write_into_their_own_buffers() {
    let mut sim = Sim::new();
    let mut p = TestProducer::connect(
        &mut sim,
        "prod",
        &[
            descriptor("first", false, false),
            descriptor("second", false, false),
        ],
    );
    let ds = |name: &str, buffer: u32| trace_config::DataSource {
        config: Some(crate::protos::to_raw(&crate::protos::DataSourceConfig {
            name: Some(name.into()),
            target_buffer: Some(buffer),
            ..Default::default()
        })),
        ..Default::default()
    };
    let cfg = TraceConfig {
        buffers: vec![
            trace_config::BufferConfig {
                size_kb: Some(64),
                ..Default::default()
            },
            trace_config::BufferConfig {
                size_kb: Some(64),
                ..Default::default()
            },
        ],
        data_sources: vec![ds("first", 0), ds("second", 1)],
        ..Default::default()
    };
    let c = TestConsumer::enable(&mut sim, crate::protos::to_raw(&cfg));
    let cmds = p.commands(&mut sim);
    let buffers: Vec<u16> = cmds
        .iter()
        .filter_map(|c| match c {
            Cmd::SetupDataSource(s) => {
                let cfg =
                    crate::protos::DataSourceConfig::decode(s.config.clone().unwrap()).unwrap();
                Some(cfg.target_buffer.unwrap() as u16)
            }
            _ => None,
        })
        .collect();
    assert_eq!(buffers.len(), 2);
    assert_ne!(buffers[0], buffers[1]);
    let req = p.write(1, buffers[0], &[b"into the first"], true);
    p.commit(&mut sim, req);
    let req = p.write(2, buffers[1], &[b"into the second"], true);
    p.commit(&mut sim, req);
    // A writer may not commit into a buffer of no session it serves.
    let mut req = p.write(3, buffers[1], &[b"nowhere"], true);
    for c in &mut req.chunks_to_move {
        c.target_buffer = Some(999);
    }
    p.commit(&mut sim, req);
    let (packets, stats) = c.stop_and_read(&mut sim);
    assert_eq!(
        payloads(&packets),
        [b"into the first".to_vec(), b"into the second".to_vec()]
    );
    assert_eq!(stats.buffer_stats.len(), 2);
    assert_eq!(stats.buffer_stats[0].chunks_written, Some(1));
    assert_eq!(stats.buffer_stats[1].chunks_written, Some(1));
    assert_eq!(stats.chunks_discarded, Some(1));
    // Provenance and writer stats name each sequence's buffer, under the
    // sequence ids its packets carry.
    let seq_of = |payload: &[u8]| {
        let packet = packets
            .iter()
            .find(|p| field(p, 900).and_then(|v| v.err()).as_deref() == Some(payload))
            .expect("packet");
        field(packet, 10).and_then(|v| v.ok()).expect("sequence id")
    };
    let (first, second) = (seq_of(b"into the first"), seq_of(b"into the second"));
    assert_ne!(first, second);
    let provenance = packets
        .iter()
        .find_map(|p| field(p, 124).and_then(|v| v.err()))
        .expect("trace_provenance");
    let provenance = crate::protos::TraceProvenance::decode(&provenance[..]).unwrap();
    let listed: Vec<Vec<(Option<u32>, Option<i32>)>> = provenance
        .buffers
        .iter()
        .map(|b| b.sequences.iter().map(|s| (s.id, s.producer_id)).collect())
        .collect();
    let producer = listed.first().and_then(|b| b.first()).and_then(|s| s.1);
    assert!(producer.is_some_and(|p| p > 0), "{listed:?}");
    assert_eq!(
        listed,
        [
            vec![(Some(first as u32), producer)],
            vec![(Some(second as u32), producer)]
        ]
    );
    assert_eq!(
        stats.chunk_payload_histogram_def,
        [8, 32, 128, 512, 1024, 2048, 4096, 8192, 12288, 16384]
    );
    let writers: Vec<(Option<u64>, Option<u32>)> = stats
        .writer_stats
        .iter()
        .map(|w| (w.sequence_id, w.buffer))
        .collect();
    assert_eq!(writers, [(Some(first), Some(0)), (Some(second), Some(1))]);
    let sums: Vec<i64> = stats
        .writer_stats
        .iter()
        .map(|w| {
            // One small chunk each, in the (8, 32] bucket.
            assert_eq!(w.chunk_payload_histogram_counts.len(), 11);
            assert_eq!(w.chunk_payload_histogram_counts[1], 1, "{w:?}");
            assert_eq!(w.chunk_payload_histogram_counts.iter().sum::<u64>(), 1);
            assert_eq!(w.chunk_payload_histogram_sum.len(), 11);
            w.chunk_payload_histogram_sum[1]
        })
        .collect();
    assert!(sums[0] > 17, "at least the 17-byte packet: {sums:?}");
    assert_eq!(sums[1], sums[0] + 1, "one byte more payload");
}

#[test]
fn periodic_flushes_follow_flush_period_ms() {
    let mut sim = Sim::new();
    let mut p = TestProducer::connect(&mut sim, "prod", &[descriptor("ds", false, false)]);
    TestConsumer::enable(
        &mut sim,
        config("ds", 64, |cfg| cfg.flush_period_ms = Some(500)),
    );
    p.commands(&mut sim);
    let mut flushes = Vec::new();
    for _ in 0..4 {
        sim.advance(500);
        for c in p.commands(&mut sim) {
            if let Cmd::Flush(f) = c {
                // Reason periodic, initiator traced; acknowledged.
                assert_eq!(f.flags, Some(0x11));
                flushes.push(f.request_id.unwrap());
                p.commit(
                    &mut sim,
                    crate::protos::CommitDataRequest {
                        flush_request_id: f.request_id,
                        ..Default::default()
                    },
                );
            }
        }
    }
    assert_eq!(flushes.len(), 4, "one flush per period");
    assert!(flushes.windows(2).all(|w| w[1] > w[0]));
}

/// Writes a chunk with the given header fields and payload bytes into
/// `p`'s SMB and marks it complete; its location.
fn forge_chunk(
    p: &TestProducer,
    chunk_id: u32,
    writer_id: u16,
    packets: u16,
    bytes: &[u8],
) -> shmtrace_abi::smb::ChunkLocation {
    let shm = p.smb.as_ref().unwrap().borrow();
    let smb = shm.smb();
    let header = ChunkHeaderRepr {
        chunk_id,
        writer_id,
        packets: shmtrace_abi::layout::Packets::from_bits(packets),
    };
    let mut w = smb
        .try_acquire_any_chunk_for_writing(0, PageLayout::Div1, header)
        .unwrap();
    w.write(0, bytes).unwrap();
    w.release_as_complete().unwrap()
}

/// Commits one chunk with writer id 0 (an invalid header) from `p`'s SMB
/// into `buffer`.
fn commit_writer_id_0_chunk(sim: &mut Sim, p: &TestProducer, buffer: u16) {
    let loc = forge_chunk(p, 0, 0, 1, &[3, 0x0A, 1, b'x']);
    let req = crate::protos::CommitDataRequest {
        chunks_to_move: vec![ChunksToMove {
            page: Some(loc.page as u32),
            chunk: Some(loc.chunk as u32),
            target_buffer: Some(u32::from(buffer)),
            ..Default::default()
        }],
        ..Default::default()
    };
    p.commit(sim, req);
}

#[test]
fn a_discarded_chunk_evicts_nothing_and_does_not_wrap_the_buffer() {
    let (mut sim, p, c, cmds) =
        session_with(descriptor("ds", false, false), config("ds", 16, |_| {}));
    let buffer = setup_tracing_buffer(&cmds);
    // ~14.5 KB of unread packets in a 16 KiB ring: a whole 4 KiB chunk no
    // longer fits before the end.
    let packets = vec![[7u8; 900]; 16];
    let refs: Vec<&[u8]> = packets.iter().map(|p| &p[..]).collect();
    let req = p.write(1, buffer, &refs, true);
    p.commit(&mut sim, req);
    commit_writer_id_0_chunk(&mut sim, &p, buffer);
    // Read everything: the reservation path is open again (only read data
    // in the way), and a discarded chunk must still leave no trace.
    assert_eq!(payloads(&c.read(&mut sim)).len(), 16, "nothing evicted");
    commit_writer_id_0_chunk(&mut sim, &p, buffer);
    let req = p.write(2, buffer, &[b"after"], true);
    p.commit(&mut sim, req);
    assert!(sim.disconnects().is_empty());
    let (packets, stats) = c.stop_and_read(&mut sim);
    assert_eq!(payloads(&packets), [b"after".to_vec()]);
    assert_eq!(stats.chunks_discarded, Some(2));
    let b = &stats.buffer_stats[0];
    assert_eq!(b.chunks_overwritten, Some(0));
    assert_eq!(b.write_wrap_count, Some(1), "only the real chunk wrapped");
    assert!(b.padding_bytes_written.unwrap_or(0) > 0);
}

#[test]
fn buffers_over_the_memory_limit_are_refused_with_the_limit() {
    let mut sim = Sim::new();
    assert_eq!(sim.svc.cfg.max_buffer_bytes, 4 << 30);
    // 128 buffers of almost 4 GiB each: each one is valid, all are not.
    let huge = u32::MAX / 1024;
    let cfg = config("ds", huge, |cfg| {
        let one = cfg.buffers[0].clone();
        cfg.buffers = vec![one; 128];
    });
    let error = TestConsumer::refused(&mut sim, cfg);
    assert!(
        matches!(
            error,
            ConfigError::BufferMemory { asked, held: 0, limit }
                if asked == 128 * (u64::from(huge) * 1024) && limit == 4u64 << 30
        ),
        "{error:?}"
    );
    assert!(sim.svc.buffers.is_empty());
    // One over 4 GiB is refused as invalid, saying the per-buffer limit.
    let error = TestConsumer::refused(&mut sim, config("ds", huge + 1, |_| {}));
    assert!(
        matches!(error, ConfigError::BufferSize { index: 0, size_kb } if size_kb == huge + 1),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("size_kb at most 4194303"),
        "{error}"
    );
    // What a live session holds counts: 3 GiB fits, another 2 GiB not.
    let first = TestConsumer::enable(&mut sim, config("ds", 3 << 20, |_| {}));
    assert!(first.enabled_reply(&mut sim).is_none());
    let error = TestConsumer::refused(&mut sim, config("ds", 2 << 20, |_| {}));
    assert!(
        matches!(error, ConfigError::BufferMemory { asked, held, .. }
            if asked == 2u64 << 30 && held == 3u64 << 30),
        "{error:?}"
    );
}

#[test]
fn a_producer_that_never_opens_its_command_stream_is_disconnected() {
    let mut sim = Sim::new();
    // Connected and registered, but no GetAsyncCommand: its commands queue.
    let conn = sim.svc.connect_producer(creds(PRODUCER_UID, PRODUCER_PID));
    let init = crate::protos::InitializeConnectionRequest {
        producer_name: Some("mute".into()),
        ..Default::default()
    };
    let id = sim.producer_call(
        conn,
        producer_port::Request::InitializeConnection(init),
        None,
    );
    let _: crate::protos::InitializeConnectionResponse = sim.reply_ok(conn, id);
    let req = crate::protos::RegisterDataSourceRequest {
        data_source_descriptor: Some(descriptor("ds", false, false)),
    };
    let id = sim.producer_call(conn, producer_port::Request::RegisterDataSource(req), None);
    let _: crate::protos::RegisterDataSourceResponse = sim.reply_ok(conn, id);
    let c = TestConsumer::enable(&mut sim, config("ds", 64, |_| {}));
    // Each flush queues one more command; flushes time out every few
    // hundred so that the session never reaches its pending-flush limit.
    let mut flushes = 0;
    let closed = loop {
        let req = crate::protos::FlushRequest {
            timeout_ms: Some(1),
            ..Default::default()
        };
        c.call(&mut sim, consumer_port::Request::Flush(req));
        flushes += 1;
        if flushes % 500 == 0 {
            sim.advance(2);
        }
        let closed = sim.disconnects();
        if !closed.is_empty() || flushes > 10_000 {
            break closed;
        }
    };
    // SetupTracing, SetupDataSource and StartDataSource, then the flushes,
    // fill the queue of 4096; the next command closes the connection.
    assert_eq!(flushes, 4096 - 3 + 1);
    assert_eq!(closed.len(), 1, "{closed:?}");
    let (closed_conn, fault) = &closed[0];
    assert_eq!(*closed_conn, conn);
    assert!(
        matches!(fault, PeerFault::CommandStreamNeverOpened(_)),
        "{fault:?}"
    );
}

/// Registers `d` for `p`: the error of the response.
fn register(sim: &mut Sim, p: &TestProducer, d: DataSourceDescriptor) -> Option<String> {
    let req = crate::protos::RegisterDataSourceRequest {
        data_source_descriptor: Some(d),
    };
    let id = sim.producer_call(
        p.conn,
        producer_port::Request::RegisterDataSource(req),
        None,
    );
    let resp: crate::protos::RegisterDataSourceResponse = sim.reply_ok(p.conn, id);
    resp.error
}

#[test]
fn a_producer_registers_a_bounded_number_and_size_of_data_sources() {
    use super::producer::{MAX_DATA_SOURCES_PER_PRODUCER, MAX_DESCRIPTOR_BYTES_PER_PRODUCER};
    let mut sim = Sim::new();
    let many = TestProducer::connect(&mut sim, "many", &[]);
    for i in 0..MAX_DATA_SOURCES_PER_PRODUCER {
        let d = descriptor(&format!("ds.{i}"), false, false);
        assert_eq!(register(&mut sim, &many, d), None, "{i}");
    }
    let error = register(&mut sim, &many, descriptor("one.more", false, false));
    assert_eq!(
        error.as_deref(),
        Some("too many data sources: a producer may register at most 1024")
    );
    // Unregistering makes room again.
    let req = crate::protos::UnregisterDataSourceRequest {
        data_source_name: Some("ds.0".into()),
    };
    let id = sim.producer_call(
        many.conn,
        producer_port::Request::UnregisterDataSource(req),
        None,
    );
    let _: crate::protos::UnregisterDataSourceResponse = sim.reply_ok(many.conn, id);
    assert_eq!(
        register(&mut sim, &many, descriptor("one.more", false, false)),
        None
    );

    // Large descriptors: two of 100 000-byte names fit, the third does not;
    // another producer is not affected.
    let large = TestProducer::connect(&mut sim, "large", &[]);
    let big = |c: char| descriptor(&c.to_string().repeat(100_000), false, false);
    assert_eq!(register(&mut sim, &large, big('a')), None);
    assert_eq!(register(&mut sim, &large, big('b')), None);
    let error = register(&mut sim, &large, big('c')).expect("refused");
    assert!(
        error.contains(&format!(
            "over the limit of {MAX_DESCRIPTOR_BYTES_PER_PRODUCER} B per producer"
        )),
        "{error}"
    );
    let other = TestProducer::connect(&mut sim, "other", &[]);
    assert_eq!(register(&mut sim, &other, big('c')), None);

    // What was refused is not registered.
    let c = TestConsumer::enable(&mut sim, config("ds.1", 64, |_| {}));
    let id = c.call(
        &mut sim,
        consumer_port::Request::GetTraceStats(Default::default()),
    );
    let resp: crate::protos::GetTraceStatsResponse = sim.reply_ok(c.conn, id);
    let stats = resp.trace_stats.unwrap();
    assert_eq!(
        stats.data_sources_registered,
        Some(MAX_DATA_SOURCES_PER_PRODUCER as u32 + 2 + 1)
    );
}
