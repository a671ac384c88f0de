//! The service on real UNIX sockets: the epoll shell, SCM_RIGHTS for the
//! SMB, socket permissions, clean shutdown. Peers are this project's IPC
//! client; the SMB is written with the ABI's `TraceWriter`.

use std::cell::RefCell;
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use shmtrace_abi::layout::{ChunkHeaderRepr, PageLayout, PageSize};
use shmtrace_abi::smb::{Smb, WritableChunk};
use shmtrace_abi::trace::trace_packet;
use shmtrace_abi::writer::{ChunkArbiter, PatchGroup, PatchesDeferred, TraceWriter};
use shmtrace_service::ipc::shm::{Adoption, SharedMemory};
use shmtrace_service::ipc::{Client, SocketAddress};
use shmtrace_service::protos::commit_data_request::{chunk_to_patch, ChunkToPatch, ChunksToMove};
use shmtrace_service::protos::get_async_command_response::Cmd;
use shmtrace_service::protos::wire::{Fields, Value};
use shmtrace_service::protos::{
    self, consumer_port, producer_port, trace_config, ConsumerPort, ProducerPort,
};
use shmtrace_service::service::shell::{self, ShellConfig};

const WAIT: Option<Duration> = Some(Duration::from_secs(10));

struct Running {
    stop: UnixStream,
    thread: JoinHandle<Result<(), shell::ShellError>>,
    producer: SocketAddress,
    consumer: SocketAddress,
}

impl Running {
    fn start(cfg: ShellConfig) -> Self {
        Self::start_with(cfg, shell::ConnectionLimits::for_this_process())
    }

    fn start_with(cfg: ShellConfig, limits: shell::ConnectionLimits) -> Self {
        let (stop_read, stop) = UnixStream::pair().unwrap();
        let (producer, consumer) = (cfg.producer_sockets[0].clone(), cfg.consumer_socket.clone());
        let bound = shell::Shell::bind(&cfg)
            .expect("bind")
            .with_connection_limits(limits);
        let thread = std::thread::spawn(move || {
            let core = shmtrace_service::service::core::TracingService::new(
                shell::system_service_config(),
                Box::new(shmtrace_service::service::env::SystemEnvironment),
            );
            bound.run(core, Some(stop_read.as_fd()))
        });
        Self {
            stop,
            thread,
            producer,
            consumer,
        }
    }

    fn abstract_sockets() -> Self {
        Self::abstract_sockets_with(shell::ConnectionLimits::for_this_process())
    }

    fn abstract_sockets_with(limits: shell::ConnectionLimits) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let id = format!("shmtrace-test-{}-{n}", std::process::id());
        Self::start_with(
            ShellConfig {
                producer_sockets: vec![SocketAddress::parse(&format!("@{id}-p")).unwrap()],
                consumer_socket: SocketAddress::parse(&format!("@{id}-c")).unwrap(),
                consumer_group: None,
                listen_any: false,
                relay_endpoint: false,
            },
            limits,
        )
    }

    fn stop(mut self) {
        std::io::Write::write_all(&mut self.stop, &[0]).unwrap();
        self.thread.join().expect("no panic").expect("clean exit");
    }
}

struct Arbiter<'s> {
    smb: &'s Smb<'s>,
    log: Rc<RefCell<protos::CommitDataRequest>>,
}

impl<'s> ChunkArbiter<'s> for Arbiter<'s> {
    fn acquire_chunk(&mut self, header: ChunkHeaderRepr) -> Option<WritableChunk<'s>> {
        self.smb
            .try_acquire_any_chunk_for_writing(0, PageLayout::Div1, header)
            .ok()
    }
    fn commit_chunk(&mut self, chunk: WritableChunk<'s>, target_buffer: u16) {
        let loc = chunk.release_as_complete().expect("release");
        self.log.borrow_mut().chunks_to_move.push(ChunksToMove {
            page: Some(loc.page as u32),
            chunk: Some(loc.chunk as u32),
            target_buffer: Some(u32::from(target_buffer)),
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

fn track_config(size_kb: u32) -> Bytes {
    let dsc = protos::DataSourceConfig {
        name: Some("ds".into()),
        target_buffer: Some(0),
        ..Default::default()
    };
    let cfg = protos::TraceConfig {
        buffers: vec![trace_config::BufferConfig {
            size_kb: Some(size_kb),
            ..Default::default()
        }],
        data_sources: vec![trace_config::DataSource {
            config: Some(protos::to_raw(&dsc)),
            ..Default::default()
        }],
        ..Default::default()
    };
    protos::to_raw(&cfg)
}

/// Reads a whole ReadBuffers stream into packets.
fn read_packets(consumer: &shmtrace_service::ipc::Binding<ConsumerPort>) -> Vec<Vec<u8>> {
    let mut call = consumer
        .start::<consumer_port::ReadBuffers>(&Default::default(), None)
        .unwrap();
    let mut packets = Vec::new();
    let mut cur = Vec::new();
    while let Some(reply) = call.next(WAIT) {
        let reply = reply.expect("ReadBuffers reply");
        for s in reply.message.slices {
            cur.extend_from_slice(s.data.as_deref().unwrap_or(&[]));
            if s.last_slice_for_packet == Some(true) {
                packets.push(std::mem::take(&mut cur));
            }
        }
    }
    packets
}

/// `for_testing` (the test payload) of a packet.
fn payload(packet: &[u8]) -> Option<Vec<u8>> {
    Fields::new(packet)
        .map(|f| f.expect("a well-formed packet"))
        .filter(|f| f.number == trace_packet::FOR_TESTING)
        .filter_map(|f| match f.value {
            Value::LengthDelimited(b) => Some(b.to_vec()),
            _ => None,
        })
        .last()
}

#[test]
fn a_session_over_real_sockets() {
    let running = Running::abstract_sockets();
    // Producer: connect, initialize, command stream, data source.
    let pclient = Client::connect(&running.producer).expect("producer connects");
    let producer = pclient.bind::<ProducerPort>().expect("ProducerPort");
    let init = protos::InitializeConnectionRequest {
        producer_name: Some("p".into()),
        ..Default::default()
    };
    let resp = producer
        .call::<producer_port::InitializeConnection>(&init)
        .expect("init");
    assert_eq!(resp.direct_smb_patching_supported, Some(true));
    let mut commands = producer
        .start::<producer_port::GetAsyncCommand>(&Default::default(), None)
        .unwrap();
    let reg = protos::RegisterDataSourceRequest {
        data_source_descriptor: Some(protos::DataSourceDescriptor {
            name: Some("ds".into()),
            ..Default::default()
        }),
    };
    producer
        .call::<producer_port::RegisterDataSource>(&reg)
        .expect("register");

    // Consumer: enable.
    let cclient = Client::connect(&running.consumer).expect("consumer connects");
    let consumer = cclient.bind::<ConsumerPort>().expect("ConsumerPort");
    let enable = protos::EnableTracingRequest {
        trace_config: Some(track_config(8192)),
        attach_notification_only: None,
    };
    let enabled = consumer
        .start::<consumer_port::EnableTracing>(&enable, None)
        .unwrap();

    // SetupTracing carries the SMB over SCM_RIGHTS.
    let setup = commands.next(WAIT).unwrap().unwrap();
    let Some(Cmd::SetupTracing(s)) = setup.message.cmd else {
        panic!("{:?}", setup.message)
    };
    let page = PageSize::new(s.shared_buffer_page_size_kb.unwrap() as usize * 1024).unwrap();
    let shm =
        SharedMemory::adopt(setup.fd.expect("the SMB fd"), page, Adoption::ByProducer).unwrap();
    assert_eq!(shm.len(), 256 * 1024, "upstream's default SMB size");
    let setup_ds = commands.next(WAIT).unwrap().unwrap();
    let Some(Cmd::SetupDataSource(ds)) = setup_ds.message.cmd else {
        panic!()
    };
    let cfg = protos::DataSourceConfig::decode(ds.config.unwrap()).unwrap();
    let buffer = cfg.target_buffer.unwrap() as u16;
    assert!(matches!(
        commands.next(WAIT).unwrap().unwrap().message.cmd,
        Some(Cmd::StartDataSource(_))
    ));

    // Write 2000 packets, some spanning chunks, and commit them.
    let expected: Vec<Vec<u8>> = (0..2000u32)
        .map(|i| vec![(i % 251) as u8; (i as usize * 7) % 3000 + 1])
        .collect();
    let log = Rc::new(RefCell::new(protos::CommitDataRequest::default()));
    {
        let mut w: TraceWriter<'_, _> = TraceWriter::new(
            Arbiter {
                smb: shm.smb(),
                log: log.clone(),
            },
            1,
            buffer,
        )
        .unwrap();
        for (i, p) in expected.iter().enumerate() {
            let _ = w.write_packet(|m| m.bytes(trace_packet::FOR_TESTING, p));
            if i % 50 == 49 {
                w.flush();
                let req = std::mem::take(&mut *log.borrow_mut());
                producer
                    .call::<producer_port::CommitData>(&req)
                    .expect("commit");
            }
        }
    }
    let id = consumer.call::<consumer_port::DisableTracing>(&Default::default());
    assert!(id.is_ok());
    let done = enabled.wait().expect("EnableTracing answered at stop");
    assert_eq!(done.message.error, None);
    let packets = read_packets(&consumer);
    let got: Vec<Vec<u8>> = packets.iter().filter_map(|p| payload(p)).collect();
    assert_eq!(got.len(), expected.len());
    assert!(got == expected, "every packet, in order");
    // The clock snapshot of the real clocks, in upstream's order; on x86-64
    // it ends with the TSC (ticks), so TSC-stamped packets can be converted.
    let snap = packets
        .iter()
        .find_map(|p| match protos::TracePacket::decode(&p[..]).ok()?.data {
            Some(protos::trace_packet::Data::ClockSnapshot(s)) => Some(s),
            _ => None,
        })
        .expect("a clock snapshot");
    let ids: Vec<u32> = snap.clocks.iter().filter_map(|c| c.clock_id).collect();
    let mut expect = vec![6, 2, 4, 1, 3, 5];
    if cfg!(target_arch = "x86_64") {
        expect.push(9);
    }
    assert_eq!(ids, expect);
    assert!(snap
        .clocks
        .iter()
        .all(|c| c.timestamp.is_some_and(|t| t > 0)));
    drop(pclient);
    drop(cclient);
    running.stop();
}

#[test]
fn socket_permissions_and_clean_shutdown() {
    let dir = tempfile_dir();
    let p = dir.join("producer.sock");
    let c = dir.join("consumer.sock");
    let running = Running::start(ShellConfig {
        producer_sockets: vec![SocketAddress::Path(p.clone())],
        consumer_socket: SocketAddress::Path(c.clone()),
        consumer_group: None,
        listen_any: false,
        relay_endpoint: false,
    });
    let mode =
        |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&p), 0o666, "any process may produce");
    assert_eq!(mode(&c), 0o600, "only the owner may consume");
    // A client that sends garbage is dropped; the service goes on.
    let mut bad = UnixStream::connect(&p).unwrap();
    std::io::Write::write_all(&mut bad, &[0xFF, 0xFF, 0xFF, 0x7F, 1, 2, 3]).unwrap();
    let client = Client::connect(&running.consumer).unwrap();
    let consumer = client.bind::<ConsumerPort>().unwrap();
    let caps = consumer
        .call::<consumer_port::QueryCapabilities>(&Default::default())
        .unwrap();
    assert_eq!(
        caps.capabilities.unwrap().has_query_capabilities,
        Some(true)
    );
    drop(client);
    running.stop();
    assert!(
        !p.exists() && !c.exists(),
        "socket files removed on shutdown"
    );
    let _ = std::fs::remove_dir(&dir);
}

fn tempfile_dir() -> std::path::PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "shmtrace-shell-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// A hostile producer sends a 3 KB frame one byte and one fd per `sendmsg`:
/// the service (in this process) holds at most one of those fds at a time,
/// answers the frame when it completes, and keeps serving.
#[test]
fn a_producer_sending_an_fd_per_byte_parks_at_most_one() {
    use std::io::Read;
    let running = Running::abstract_sockets();
    let mut sock = shmtrace_service::ipc::socket::connect(&running.producer).expect("connects");
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut frame = shmtrace_service::ipc::frame::bind_service_frame(1, "ProducerPort");
    frame.data_for_testing = vec![vec![0x5a; 3000].into()];
    let mut bytes = Vec::new();
    shmtrace_service::ipc::frame::encode_frame(&frame, &mut bytes).unwrap();
    let null = std::fs::File::open("/dev/null").unwrap();
    let before = open_fds();
    let mut peak = before;
    for (i, byte) in bytes.iter().enumerate() {
        let sent = shmtrace_service::ipc::socket::send_with_fd(
            &sock,
            std::slice::from_ref(byte),
            Some(null.as_fd()),
        );
        assert_eq!(sent.unwrap(), 1);
        if i % 64 == 0 {
            peak = peak.max(open_fds());
        }
    }
    // The BindService reply proves every byte (and fd) was received.
    let mut len = [0u8; 4];
    sock.read_exact(&mut len).expect("a BindService reply");
    let mut reply = vec![0; u32::from_le_bytes(len) as usize];
    sock.read_exact(&mut reply).unwrap();
    let reply = protos::IpcFrame::decode(&reply[..]).unwrap();
    assert_eq!(reply.request_id, Some(1));
    // Other tests of this binary run in parallel threads: allow slack, far
    // below the 3000 fds sent.
    peak = peak.max(open_fds());
    assert!(peak < before + 64, "fd table grew from {before} to {peak}");
    drop(sock);
    running.stop();
}

#[test]
fn tcp_producer_sockets_are_loopback_unless_allowed_and_consumers_stay_unix() {
    use shmtrace_service::service::shell::{Shell, ShellError};
    let id = format!("shmtrace-tcp-{}", std::process::id());
    let cfg = |producer: &str, consumer: &str, listen_any| ShellConfig {
        producer_sockets: vec![SocketAddress::parse(producer).unwrap()],
        consumer_socket: SocketAddress::parse(consumer).unwrap(),
        consumer_group: None,
        listen_any,
        relay_endpoint: false,
    };
    let consumer = format!("@{id}-c");
    for open in ["0.0.0.0:0", "[::]:0", "vsock://4294967295:0"] {
        let err = Shell::bind(&cfg(open, &consumer, false)).unwrap_err();
        assert!(matches!(err, ShellError::NotLoopback(_)), "{open}: {err}");
        assert!(err.to_string().contains("--listen-any"), "{err}");
    }
    // Asked for explicitly, an open TCP socket binds.
    assert!(Shell::bind(&cfg("0.0.0.0:0", &consumer, true)).is_ok());
    let err = Shell::bind(&cfg("127.0.0.1:0", "127.0.0.1:0", false)).unwrap_err();
    assert!(matches!(err, ShellError::ConsumerNotUnix(_)), "{err}");
    assert!(Shell::bind(&cfg("127.0.0.1:0", &consumer, false)).is_ok());
}

/// The service with a TCP producer socket on a free loopback port (the
/// relay port too if `relay_endpoint`), and a connection to it.
fn tcp_service(name: &str, relay_endpoint: bool) -> (Running, UnixStream) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let id = format!("shmtrace-{name}-{}", std::process::id());
    let producer = SocketAddress::parse(&format!("127.0.0.1:{port}")).unwrap();
    let running = Running::start(ShellConfig {
        producer_sockets: vec![producer.clone()],
        consumer_socket: SocketAddress::parse(&format!("@{id}-c")).unwrap(),
        consumer_group: None,
        listen_any: false,
        relay_endpoint,
    });
    let stream = shmtrace_service::ipc::socket::connect_stream(&producer).unwrap();
    // The blocking client takes a UnixStream; it only sends and receives
    // with sendmsg/recvmsg, which a TCP socket serves the same way.
    (
        running,
        UnixStream::from(std::os::fd::OwnedFd::from(stream)),
    )
}

#[test]
fn a_producer_on_tcp_is_told_to_emulate_shared_memory() {
    use shmtrace_service::protos::InitializeConnectionRequest;
    let (running, stream) = tcp_service("tcpemu", false);
    let client = Client::from_stream(stream).unwrap();
    let port = client.bind::<ProducerPort>().unwrap();
    let resp = port
        .call::<producer_port::InitializeConnection>(&InitializeConnectionRequest {
            producer_name: Some("over-tcp".into()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(resp.use_shmem_emulation, Some(true));
    assert_eq!(resp.using_shmem_provided_by_producer, Some(false));
    drop(port);
    drop(client);
    running.stop();
}

#[test]
fn relays_find_the_relay_port_on_tcp_only_when_it_is_enabled() {
    use shmtrace_service::ipc::frame::{encode_frame, set_peer_identity_frame};
    use shmtrace_service::ipc::PeerIdentity;
    use shmtrace_service::protos::{relay_port, sync_clock_request, RelayPort, SyncClockRequest};
    use std::io::Write;
    for enabled in [true, false] {
        let (running, mut stream) = tcp_service(&format!("relayport-{enabled}"), enabled);
        // What a relay sends first on each of its connections.
        let mut hello = Vec::new();
        let identity = PeerIdentity {
            pid: 1,
            uid: 0,
            machine_id_hint: "vm".into(),
            machine_name: "vm".into(),
        };
        encode_frame(&set_peer_identity_frame(&identity), &mut hello).unwrap();
        stream.write_all(&hello).unwrap();
        let client = Client::from_stream(stream).unwrap();
        // The producer port is service 1 either way; the relay port, when
        // enabled, service 2 with upstream's two methods.
        let producer_port = client.bind::<ProducerPort>().unwrap();
        assert_eq!(producer_port.binding().service_id(), 1);
        if !enabled {
            assert!(client.bind::<RelayPort>().is_err());
            drop((producer_port, client));
            running.stop();
            continue;
        }
        let relay = client.bind::<RelayPort>().unwrap();
        assert_eq!(relay.binding().service_id(), 2);
        assert_eq!(relay.binding().method_id("InitRelay"), Some(1));
        assert_eq!(relay.binding().method_id("SyncClock"), Some(2));
        let ping = SyncClockRequest {
            phase: Some(sync_clock_request::Phase::Ping as i32),
            clocks: vec![sync_clock_request::Clock {
                clock_id: Some(6),
                timestamp: Some(1),
            }],
        };
        relay.call::<relay_port::SyncClock>(&ping).unwrap();
        // Too many clocks: the service drops this relay's connection.
        let flood = SyncClockRequest {
            clocks: vec![ping.clocks[0]; 17],
            ..ping
        };
        assert!(relay.call::<relay_port::SyncClock>(&flood).is_err());
        drop((producer_port, relay, client));
        running.stop();
    }
}

/// A raw connection to `address` (abstract UNIX socket), with a timeout.
fn raw_connect(address: &SocketAddress) -> UnixStream {
    let SocketAddress::Abstract(name) = address else {
        panic!("abstract socket expected: {address}");
    };
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name).unwrap();
    let s = UnixStream::connect_addr(&addr).unwrap();
    s.set_read_timeout(WAIT).unwrap();
    s
}

/// One frame's payload read from `s` (`None`: end of file).
fn read_frame(s: &mut UnixStream) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut header = [0; 4];
    match s.read(&mut header[..1]) {
        Ok(0) => return None,
        Ok(_) => {}
        Err(e) => panic!("read: {e}"),
    }
    s.read_exact(&mut header[1..]).unwrap();
    let mut payload = vec![0; u32::from_le_bytes(header) as usize];
    s.read_exact(&mut payload).unwrap();
    Some(payload)
}

fn frame_bytes(frame: &protos::IpcFrame) -> Vec<u8> {
    let mut out = Vec::new();
    shmtrace_service::ipc::frame::encode_frame(frame, &mut out).unwrap();
    out
}

/// Binds `service` on a raw connection and waits for the reply.
fn raw_bind(address: &SocketAddress, service: &str) -> UnixStream {
    use std::io::Write;
    let mut s = raw_connect(address);
    s.write_all(&frame_bytes(
        &shmtrace_service::ipc::frame::bind_service_frame(1, service),
    ))
    .unwrap();
    assert!(read_frame(&mut s).is_some(), "bind reply");
    s
}

#[test]
fn connections_over_the_limit_are_closed_and_consumers_keep_their_own() {
    let running = Running::abstract_sockets_with(shell::ConnectionLimits {
        producers: 3,
        consumers: 2,
    });
    let producers: Vec<UnixStream> = (0..3)
        .map(|_| raw_bind(&running.producer, "ProducerPort"))
        .collect();
    // The fourth producer is accepted and closed: it reads end of file
    // (it used to wait in the listen queue for ever).
    let mut extra = raw_connect(&running.producer);
    assert_eq!(read_frame(&mut extra), None);
    // Consumers have places of their own.
    let consumer = Client::connect(&running.consumer).unwrap();
    let port = consumer.bind::<ConsumerPort>().unwrap();
    let state = port
        .call::<consumer_port::QueryServiceState>(&Default::default())
        .expect("query");
    assert!(state.service_state.is_some());
    let _second = raw_bind(&running.consumer, "ConsumerPort");
    let mut third = raw_connect(&running.consumer);
    assert_eq!(read_frame(&mut third), None);
    // A place freed is a place for the next producer.
    drop(producers);
    let _again = raw_bind(&running.producer, "ProducerPort");
    running.stop();
}

#[test]
fn a_consumer_that_never_reads_its_replies_is_not_read_either() {
    use std::io::{ErrorKind, Write};
    let running = Running::abstract_sockets();
    let mut s = raw_bind(&running.consumer, "ConsumerPort");
    // QueryCapabilities (method 13), 10 000 calls per write.
    let call = frame_bytes(&shmtrace_service::ipc::frame::invoke_method_frame(
        2,
        1,
        13,
        Bytes::new(),
        false,
    ));
    let batch = call.repeat(10_000);
    s.set_nonblocking(true).unwrap();
    let (mut sent, mut calls) = (0usize, 0usize);
    let mut stalled_since = std::time::Instant::now();
    // The service used to read (and queue the replies to) all of them.
    while sent < (64 << 20) && stalled_since.elapsed() < Duration::from_secs(2) {
        match s.write(&batch[sent % batch.len()..]) {
            Ok(n) => {
                sent += n;
                calls = sent / call.len();
                stalled_since = std::time::Instant::now();
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("write: {e}"),
        }
    }
    assert!(
        sent < 16 << 20,
        "the service took {sent} bytes of calls without their replies being read"
    );
    // Once the consumer reads, every call is answered.
    s.set_nonblocking(false).unwrap();
    if sent % call.len() != 0 {
        s.write_all(&call[sent % call.len()..]).unwrap();
        calls += 1;
    }
    for i in 0..calls {
        assert!(read_frame(&mut s).is_some(), "reply {i} of {calls}");
    }
    running.stop();
}
