//! The producer against a broken or hostile service: a fake service on a
//! real socket ([`FakeService`], driven step by step by each test) sends
//! one bad thing after another while an application thread ([`App`])
//! emits events all along. Each test checks that the application thread
//! runs on, whether the producer dropped the connection (or, for harmless
//! oddities, kept it), and what it reports; the connection thread is the
//! real one ([`run_connections`]) with shortened limits.

use std::io::{Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message as _;
use rustix::fs::{MemfdFlags, SealFlags};
use shmtrace_abi::layout::PageSizeError;
use shmtrace_ipc::frame::FrameError;
use shmtrace_ipc::frame::{encode_frame, invoke_method_reply_frame};
use shmtrace_ipc::host::{HostConnection, PendingReply, ServiceTable};
use shmtrace_ipc::protos::get_async_command_response::{self as gac, Cmd};
use shmtrace_ipc::protos::{self as pb, producer_port::Request, ProducerPort};
use shmtrace_ipc::shm::ShmError;
use shmtrace_ipc::socket::{recv_into, send_queued, Listener, Received, SocketAddress, Stream};
use shmtrace_ipc::{ClientError, ProtocolError};

use super::loopback::serial;
use crate::connection::{run_connections, Limits, Status, FAIL_WATCHDOG_SPAWNS};
use crate::error::ConnectError;
use crate::{trace_event, trace_instant, track_event, Category, ProducerConfig};

static H_APP: Category = Category::new("hostile.app");

/// Short limits, so that the tests that reach them stay cheap.
const LIMITS: Limits = Limits {
    handshake: Duration::from_millis(1200),
    send_stall: Duration::from_millis(400),
};

/// Bound of every wait that should end much sooner.
const PATIENCE: Duration = Duration::from_secs(10);

fn wait_until(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    true
}

/// A service socket the test drives by hand.
pub(super) struct FakeService {
    listener: Listener,
    address: SocketAddress,
}

impl FakeService {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "@shmtrace-hostile-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let address = SocketAddress::parse(&name).unwrap();
        let listener = Listener::bind(&address).unwrap();
        listener.set_nonblocking(true).unwrap();
        FakeService { listener, address }
    }

    /// A service listening on TCP (`127.0.0.1`, a free port): no
    /// descriptor can travel to the producer.
    fn tcp() -> Self {
        let listener = Listener::bind(&SocketAddress::parse("127.0.0.1:0").unwrap()).unwrap();
        let port = listener.local_port().unwrap();
        listener.set_nonblocking(true).unwrap();
        let address = SocketAddress::parse(&format!("127.0.0.1:{port}")).unwrap();
        FakeService { listener, address }
    }

    /// The producer's next connection, if it comes before `deadline`.
    fn accept_before(&self, deadline: Instant) -> Option<Peer> {
        while Instant::now() < deadline {
            match self.listener.accept_stream() {
                Ok(stream) => return Some(Peer::new(stream)),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(2))
                }
                Err(e) => panic!("accept: {e}"),
            }
        }
        None
    }

    /// The producer's next connection.
    fn accept(&self) -> Peer {
        let deadline = Instant::now() + PATIENCE;
        loop {
            match self.listener.accept_stream() {
                Ok(stream) => return Peer::new(stream),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(Instant::now() < deadline, "the producer did not connect");
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => panic!("accept: {e}"),
            }
        }
    }
}

/// The service end of one connection.
pub(super) struct Peer {
    stream: UnixStream,
    conn: HostConnection<Request>,
    /// The InitializeConnection call, until answered.
    init: Option<PendingReply>,
    /// The GetAsyncCommand stream.
    commands: Option<PendingReply>,
    /// Every call received, in order.
    pub(super) calls: Vec<Request>,
    /// Whether each call asked for no reply (`drop_reply`), in order.
    pub(super) drop_replies: Vec<bool>,
    /// The producer closed the connection.
    closed: bool,
}

impl Peer {
    fn new(stream: Stream) -> Self {
        // The test drives it with std's blocking reads and timeouts, which
        // any stream socket serves (a TCP one included).
        let stream = UnixStream::from(OwnedFd::from(stream));
        stream.set_nonblocking(false).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_millis(5)))
            .unwrap();
        Peer {
            stream,
            conn: HostConnection::new(Arc::new(ServiceTable::from(ProducerPort)), None),
            init: None,
            commands: None,
            calls: Vec::new(),
            drop_replies: Vec::new(),
            closed: false,
        }
    }

    /// Reads what the producer sent (waiting a few ms at most), answers
    /// binds, records calls.
    fn pump(&mut self) {
        if self.closed {
            std::thread::sleep(Duration::from_millis(2));
            return;
        }
        match recv_into(&self.stream, self.conn.decoder()) {
            Ok(Received::Data(_) | Received::WouldBlock) => {}
            Ok(Received::Closed) | Err(_) => self.closed = true,
        }
        while let Ok(Some(call)) = self.conn.poll_call() {
            match &call.request {
                Request::InitializeConnection(_) => self.init = Some(call.reply.clone()),
                Request::GetAsyncCommand(_) => self.commands = Some(call.reply.clone()),
                _ => {}
            }
            self.drop_replies.push(call.reply.drop_reply());
            self.calls.push(call.request);
        }
        self.send();
    }

    fn send(&mut self) {
        if send_queued(&self.stream, self.conn.out()).is_err() {
            self.closed = true;
        }
    }

    /// Pumps until `cond` holds; `false` if it did not in time.
    pub(super) fn until(&mut self, mut cond: impl FnMut(&Peer) -> bool) -> bool {
        let deadline = Instant::now() + PATIENCE;
        while !cond(self) {
            if Instant::now() >= deadline {
                return false;
            }
            self.pump();
        }
        true
    }

    /// Answers InitializeConnection with `reply`, waits for the command
    /// stream.
    pub(super) fn handshake(&mut self, reply: pb::InitializeConnectionResponse) {
        assert!(self.until(|p| p.init.is_some()), "no InitializeConnection");
        let to = self.init.take().unwrap();
        self.conn.resolve(to, &reply).unwrap();
        self.send();
        assert!(self.until(|p| p.commands.is_some()), "no GetAsyncCommand");
    }

    fn stream_id(&self) -> u64 {
        self.commands.as_ref().expect("command stream").request_id()
    }

    /// Sends one command, with `fd`, on the stream.
    fn command(&mut self, cmd: Cmd, fd: Option<OwnedFd>) {
        let to = self.commands.clone().expect("command stream");
        let msg = pb::GetAsyncCommandResponse { cmd: Some(cmd) };
        self.conn.reply(&to, Ok(&msg), true, fd).unwrap();
        self.send();
    }

    /// Sends a reply frame to request `request_id` carrying `payload`
    /// as is.
    fn raw_reply(&mut self, request_id: u64, payload: &[u8], has_more: bool) {
        let frame =
            invoke_method_reply_frame(request_id, Ok(Bytes::copy_from_slice(payload)), has_more);
        let mut bytes = Vec::new();
        encode_frame(&frame, &mut bytes).unwrap();
        self.raw(&bytes);
    }

    fn raw(&mut self, bytes: &[u8]) {
        let _ = self.stream.write_all(bytes);
    }

    /// Waits until the producer closes the connection.
    fn closed_by_producer(&mut self) -> bool {
        self.until(|p| p.closed)
    }

    fn started(&self, id: u64) -> bool {
        self.calls.iter().any(
            |c| matches!(c, Request::NotifyDataSourceStarted(n) if n.data_source_id == Some(id)),
        )
    }

    fn stopped(&self, id: u64) -> bool {
        self.calls.iter().any(
            |c| matches!(c, Request::NotifyDataSourceStopped(n) if n.data_source_id == Some(id)),
        )
    }

    fn flush_acked(&self, id: u64) -> bool {
        self.calls
            .iter()
            .any(|c| matches!(c, Request::CommitData(c) if c.flush_request_id == Some(id)))
    }

    /// The highest flush id acknowledged (each ack covers every flush up
    /// to its id).
    fn flushes_acked(&self) -> u64 {
        self.calls
            .iter()
            .filter_map(|c| match c {
                Request::CommitData(c) => c.flush_request_id,
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    fn chunks_committed(&self) -> usize {
        self.calls
            .iter()
            .map(|c| match c {
                Request::CommitData(c) => c.chunks_to_move.len(),
                _ => 0,
            })
            .sum()
    }

    /// A healthy start: handshake, SMB `smb` (4 KiB pages), track_event
    /// instance 1 started.
    fn trace(&mut self, smb: OwnedFd) {
        self.handshake(Default::default());
        self.command(setup_tracing(4), Some(smb));
        self.command(start(1, track_event_config()), None);
        assert!(self.until(|p| p.started(1)));
    }

    /// A flush round trip: the connection works.
    fn flushes(&mut self, request_id: u64) -> bool {
        self.command(flush(&[], request_id), None);
        self.until(|p| p.flush_acked(request_id))
    }
}

fn setup_tracing(page_kb: u32) -> Cmd {
    Cmd::SetupTracing(gac::SetupTracing {
        shared_buffer_page_size_kb: Some(page_kb),
        shm_key_windows: None,
    })
}

fn track_event_config() -> Bytes {
    Bytes::from(
        pb::DataSourceConfig {
            name: Some(crate::TRACK_EVENT_DATA_SOURCE.into()),
            target_buffer: Some(1),
            ..Default::default()
        }
        .encode_to_vec(),
    )
}

fn start(id: u64, config: Bytes) -> Cmd {
    Cmd::StartDataSource(gac::StartDataSource {
        new_instance_id: Some(id),
        config: Some(config),
    })
}

fn flush(ids: &[u64], request_id: u64) -> Cmd {
    Cmd::Flush(gac::Flush {
        data_source_ids: ids.to_vec(),
        request_id: Some(request_id),
        flags: None,
    })
}

/// A memfd of `len` bytes created with `flags`.
fn memfd(flags: MemfdFlags, len: u64) -> OwnedFd {
    let fd = rustix::fs::memfd_create("hostile", MemfdFlags::CLOEXEC | flags).unwrap();
    rustix::fs::ftruncate(&fd, len).unwrap();
    fd
}

/// A memfd sealed as both services seal it.
fn sealed_memfd(len: u64) -> OwnedFd {
    let fd = memfd(MemfdFlags::ALLOW_SEALING, len);
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
        .unwrap();
    fd
}

/// A fake service, the producer connected to it, and the connection's
/// service end.
pub(super) fn connect() -> (FakeService, Connection, Peer) {
    let service = FakeService::new();
    let conn = Connection::start(&service);
    let peer = service.accept();
    (service, conn, peer)
}

/// As [`connect`], but the producer's sends may stall for [`PATIENCE`]:
/// for services that stop reading on purpose for a while.
fn connect_patient() -> (FakeService, Connection, Peer) {
    let service = FakeService::new();
    let limits = Limits {
        send_stall: PATIENCE,
        ..LIMITS
    };
    let conn = Connection::start_with(&service, limits);
    let peer = service.accept();
    (service, conn, peer)
}

/// The producer's connection thread against a fake service.
pub(super) struct Connection {
    status: Arc<Status>,
    thread: Option<JoinHandle<()>>,
}

impl Connection {
    fn start(service: &FakeService) -> Self {
        Self::start_with(service, LIMITS)
    }

    fn start_with(service: &FakeService, limits: Limits) -> Self {
        track_event::register_categories(&[&H_APP]);
        let status = Arc::new(Status::new());
        let (s, address) = (status.clone(), service.address.clone());
        let thread = std::thread::spawn(move || {
            let config = ProducerConfig {
                name: "hostile-test".into(),
                ..ProducerConfig::default()
            };
            run_connections(&config, &address, &s, limits);
        });
        Connection {
            status,
            thread: Some(thread),
        }
    }

    fn errors(&self) -> u64 {
        self.status.errors.load(Ordering::Relaxed)
    }

    /// Waits until `n` connections ended or failed to open; the last
    /// reason.
    fn ended(&self, errors: u64) -> Arc<ConnectError> {
        assert!(
            wait_until(|| self.status.last_error().is_some()
                && !self.status.is_connected()
                && self.errors() >= errors),
            "the connection was not dropped: {:?}",
            self.status.last_error()
        );
        self.status.last_error().unwrap()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // As `Producer::shutdown`: must return promptly whatever the
        // service does.
        self.status.stop.store(true, Ordering::Release);
        let t = self.thread.take().unwrap();
        let stopped = wait_until(|| t.is_finished());
        if !std::thread::panicking() {
            assert!(stopped, "the connection thread did not stop");
            t.join().expect("the connection thread panicked");
        }
    }
}

/// An application thread emitting events all along.
struct App {
    stop: Arc<AtomicBool>,
    events: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl App {
    /// Emits events with a `payload`-byte annotation, pausing `pause`
    /// between them.
    fn start(payload: usize, pause: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let events = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, events) = (stop.clone(), events.clone());
            std::thread::spawn(move || {
                let text = "x".repeat(payload);
                while !stop.load(Ordering::Relaxed) {
                    trace_instant!(H_APP, "tick");
                    {
                        let _s = trace_event!(H_APP, "work", "text" => text.as_str());
                    }
                    events.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(pause);
                }
            })
        };
        App {
            stop,
            events,
            thread: Some(thread),
        }
    }

    /// Asserts the thread goes on emitting.
    fn keeps_running(&self) {
        let before = self.events.load(Ordering::Relaxed);
        assert!(
            wait_until(|| self.events.load(Ordering::Relaxed) >= before + 20),
            "the application thread stopped"
        );
    }

    fn finish(mut self) {
        self.keeps_running();
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .unwrap()
            .join()
            .expect("the application thread panicked");
    }
}

impl Drop for App {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

const APP_PAUSE: Duration = Duration::from_micros(200);

#[test]
fn an_smb_the_service_could_shrink_is_sealed_before_it_is_mapped() {
    let _s = serial();
    let (_service, conn, mut peer) = connect();
    // Sealable, but the service did not seal it and keeps a descriptor.
    let fd = memfd(MemfdFlags::ALLOW_SEALING, 256 * 1024);
    let theirs = fd.try_clone().unwrap();
    peer.trace(fd);
    assert!(H_APP.is_enabled());
    let app = App::start(16, APP_PAUSE);
    app.keeps_running();
    // Shrinking it now would make the application's next write to the
    // mapping a SIGBUS (which would end this test binary).
    let shrunk = rustix::fs::ftruncate(&theirs, 0);
    app.keeps_running();
    assert_eq!(
        shrunk,
        Err(rustix::io::Errno::PERM),
        "the producer sealed it"
    );
    // The connection is healthy: chunks arrive, flushes are acknowledged.
    assert!(peer.flushes(7));
    assert!(peer.chunks_committed() > 0);
    assert_eq!(conn.errors(), 0);
    assert!(conn.status.is_connected());
    app.finish();
}

#[test]
fn an_unusable_smb_costs_the_connection_only() {
    let _s = serial();
    let app = App::start(16, APP_PAUSE);
    type Check = fn(&ConnectError) -> bool;
    let dir = || OwnedFd::from(std::fs::File::open(std::env::temp_dir()).unwrap());
    let socket = || OwnedFd::from(UnixStream::pair().unwrap().0);
    let cases: Vec<(&str, u32, Option<OwnedFd>, Check)> = vec![
        ("no fd", 4, None, |e| matches!(e, ConnectError::NoSmb)),
        (
            "a memfd that cannot be sealed",
            4,
            Some(memfd(MemfdFlags::empty(), 256 * 1024)),
            |e| matches!(e, ConnectError::Smb(ShmError::CannotSeal(_))),
        ),
        ("a socket", 4, Some(socket()), |e| {
            matches!(e, ConnectError::Smb(ShmError::NotMemfd(_)))
        }),
        ("a directory", 4, Some(dir()), |e| {
            matches!(e, ConnectError::Smb(ShmError::NotMemfd(_)))
        }),
        ("an empty memfd", 4, Some(sealed_memfd(0)), |e| {
            matches!(e, ConnectError::Smb(ShmError::InvalidSize { size: 0, .. }))
        }),
        (
            "a size not a multiple of the page",
            4,
            Some(sealed_memfd(5000)),
            |e| {
                matches!(
                    e,
                    ConnectError::Smb(ShmError::InvalidSize { size: 5000, .. })
                )
            },
        ),
        ("page size 0", 0, Some(sealed_memfd(65536)), |e| {
            matches!(
                e,
                ConnectError::Smb(ShmError::PageSize(PageSizeError::TooSmall(0)))
            )
        }),
        ("page size 3 KiB", 3, Some(sealed_memfd(65536)), |e| {
            matches!(
                e,
                ConnectError::Smb(ShmError::PageSize(PageSizeError::TooSmall(3072)))
            )
        }),
        (
            "page size u32::MAX KiB",
            u32::MAX,
            Some(sealed_memfd(65536)),
            |e| {
                matches!(
                    e,
                    ConnectError::Smb(ShmError::PageSize(PageSizeError::TooLarge(_)))
                )
            },
        ),
    ];
    for (what, page_kb, fd, check) in cases {
        let service = FakeService::new();
        let conn = Connection::start(&service);
        let mut peer = service.accept();
        peer.handshake(Default::default());
        peer.command(setup_tracing(page_kb), fd);
        assert!(peer.closed_by_producer(), "{what}: connection kept");
        let error = conn.ended(1);
        assert!(check(&error), "{what}: {error}");
        assert_eq!(conn.errors(), 1, "{what}");
        assert!(!H_APP.is_enabled());
        app.keeps_running();
    }
    // A second SetupTracing on one connection (upstream's producer aborts).
    let (_service, conn, mut peer) = connect();
    peer.trace(sealed_memfd(65536));
    app.keeps_running();
    peer.command(setup_tracing(4), Some(sealed_memfd(65536)));
    assert!(peer.closed_by_producer());
    assert!(matches!(*conn.ended(1), ConnectError::SetupTracingTwice));
    assert!(!H_APP.is_enabled(), "tracing is off with the connection");
    app.finish();
}

#[test]
fn a_handshake_the_service_never_completes_times_out() {
    let _s = serial();
    let app = App::start(16, APP_PAUSE);
    let (service, conn, mut peer) = connect();
    // Binds are answered, InitializeConnection never is.
    assert!(peer.until(|p| p.init.is_some()));
    let started = Instant::now();
    assert!(peer.closed_by_producer());
    assert!(started.elapsed() < LIMITS.handshake + Duration::from_secs(2));
    let error = conn.ended(1);
    assert!(
        matches!(*error, ConnectError::HandshakeTimeout(t) if t == LIMITS.handshake),
        "{error}"
    );
    app.keeps_running();
    drop(conn);
    drop(service);
    // Stopping the producer while its handshake waits on such a service
    // does not wait for the time limit: with a limit far beyond any
    // scheduling delay, the connection thread stops long before it (a
    // shutdown that waited for the watchdog would take all of it).
    const FAR: Duration = Duration::from_secs(600);
    let service = FakeService::new();
    let conn = Connection::start_with(
        &service,
        Limits {
            handshake: FAR,
            ..LIMITS
        },
    );
    let mut peer = service.accept();
    assert!(peer.until(|p| p.init.is_some()));
    conn.status.stop.store(true, Ordering::Release);
    let stopped = wait_until(|| conn.thread.as_ref().unwrap().is_finished());
    assert!(stopped, "the stop waits for the handshake's time limit");
    assert!(peer.closed_by_producer());
    drop(conn);
    app.finish();
}

#[test]
fn a_handshake_whose_watchdog_cannot_start_is_not_attempted() {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            FAIL_WATCHDOG_SPAWNS.store(0, Ordering::Release);
        }
    }
    let _s = serial();
    let _reset = Reset;
    FAIL_WATCHDOG_SPAWNS.store(1, Ordering::Release);
    let (service, conn, mut first) = connect();
    // No time limit for the handshake: closed before it began (nothing
    // was called), the failure counted.
    assert!(first.closed_by_producer(), "a handshake without a watchdog");
    assert!(first.calls.is_empty(), "{:?}", first.calls);
    assert!(matches!(*conn.ended(1), ConnectError::Thread));
    assert_eq!(conn.errors(), 1);
    // The next attempt has its watchdog, and connects.
    let mut next = service.accept();
    next.handshake(Default::default());
    assert!(wait_until(|| conn.status.is_connected()));
    assert_eq!(conn.status.connections.load(Ordering::Relaxed), 1);
    assert_eq!(FAIL_WATCHDOG_SPAWNS.load(Ordering::Acquire), 0);
}

/// Over TCP no descriptor can travel: the producer keeps a private buffer
/// as its SMB and sends every chunk's bytes (header included) inline, even
/// from a service that does not answer `use_shmem_emulation` (where a UNIX
/// socket without a descriptor would cost the connection, `NoSmb`).
#[test]
fn over_tcp_the_producer_emulates_the_smb_and_commits_chunk_bytes() {
    let _s = serial();
    let service = FakeService::tcp();
    let conn = Connection::start(&service);
    let mut peer = service.accept();
    peer.handshake(Default::default());
    peer.command(setup_tracing(4), None);
    peer.command(start(1, track_event_config()), None);
    assert!(peer.until(|p| p.started(1)));
    let app = App::start(16, APP_PAUSE);
    app.keeps_running();
    assert!(peer.flushes(7), "the flush is acknowledged over TCP");
    let writers: Vec<u32> = peer
        .calls
        .iter()
        .filter_map(|c| match c {
            Request::RegisterTraceWriter(r) => r.trace_writer_id,
            _ => None,
        })
        .collect();
    assert!(!writers.is_empty());
    let mut chunks = 0;
    for c in &peer.calls {
        let Request::CommitData(c) = c else { continue };
        for m in &c.chunks_to_move {
            chunks += 1;
            assert_eq!((m.page, m.chunk), (None, None), "no page reference");
            assert_eq!(m.target_buffer, Some(1));
            assert_eq!(m.chunk_incomplete, None);
            let data = m.data.as_deref().expect("inline chunk bytes");
            // A 4 KiB page of one chunk: the page header (8) off.
            assert_eq!(data.len(), 4096 - 8);
            let header =
                shmtrace_abi::layout::ChunkHeaderRepr::from_bytes(data[..8].try_into().unwrap());
            assert!(writers.contains(&u32::from(header.writer_id)), "{header:?}");
            assert!(header.packets.count() >= 1, "{header:?}");
        }
    }
    assert!(chunks >= 1, "no chunk committed: {:?}", peer.calls);
    assert_eq!(conn.errors(), 0, "{:?}", conn.status.last_error());
    assert!(conn.status.is_connected());
    drop(conn);
    app.finish();
    drop(peer);
}

#[test]
fn a_service_that_stops_reading_costs_its_connection() {
    let _s = serial();
    let (_service, conn, mut peer) = connect();
    // Emulation: chunks travel in CommitData, so the socket fills fast.
    peer.handshake(pb::InitializeConnectionResponse {
        use_shmem_emulation: Some(true),
        ..Default::default()
    });
    peer.command(setup_tracing(4), None);
    peer.command(start(1, track_event_config()), None);
    assert!(peer.until(|p| p.started(1)));
    assert!(peer.flushes(3), "emulated commits arrive");
    // The service stops reading; the application writes on.
    let app = App::start(2000, Duration::ZERO);
    let error = conn.ended(1);
    assert!(
        matches!(*error, ConnectError::SendStalled(t) if t == LIMITS.send_stall),
        "{error}"
    );
    assert!(!H_APP.is_enabled());
    app.keeps_running();
    drop(conn);
    app.finish();
    drop(peer);
}

#[test]
fn malformed_frames_and_replies_cost_the_connection() {
    let _s = serial();
    let app = App::start(16, APP_PAUSE);
    type Check = fn(&ConnectError) -> bool;
    type Send = fn(&mut Peer);
    // What the service does, how the producer names it, and whether it is
    // the service's fault (counted, logged as a warning) or an ordinary end.
    let cases: Vec<(&str, Send, Check, bool)> = vec![
        (
            "a frame over the size limit",
            |p| p.raw(&(1u32 << 20).to_le_bytes()),
            |e| {
                matches!(
                    e,
                    ConnectError::Ipc(ClientError::Protocol(ProtocolError::Frame(
                        FrameError::TooLarge { len: 0x10_0000 }
                    )))
                )
            },
            true,
        ),
        (
            "a frame that is not an IPCFrame",
            |p| p.raw(&[6, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
            |e| {
                matches!(
                    e,
                    ConnectError::Ipc(ClientError::Protocol(ProtocolError::Frame(
                        FrameError::Malformed(_)
                    )))
                )
            },
            true,
        ),
        (
            "a connection closed mid-frame",
            |p| {
                p.raw(&[100, 0, 0, 0, 0x08, 1]);
                let _ = p.stream.shutdown(std::net::Shutdown::Both);
            },
            |e| {
                matches!(
                    e,
                    ConnectError::Ipc(ClientError::Protocol(ProtocolError::ClosedMidFrame {
                        buffered: 6
                    }))
                )
            },
            true,
        ),
        (
            "a command that does not decode",
            |p| p.raw_reply(p.stream_id(), &[0x0A, 0x7F, 0x01], true),
            |e| matches!(e, ConnectError::Ipc(ClientError::MalformedReply(_))),
            true,
        ),
        (
            "the command stream rejected",
            |p| {
                let to = p.commands.clone().unwrap();
                p.conn.reject(to);
                p.send();
            },
            |e| matches!(e, ConnectError::Ipc(ClientError::Rpc(_))),
            true,
        ),
        (
            "the command stream ended",
            |p| p.raw_reply(p.stream_id(), &[], false),
            |e| matches!(e, ConnectError::CommandStreamEnded),
            false,
        ),
        (
            "the connection closed",
            |p| {
                let _ = p.stream.shutdown(std::net::Shutdown::Both);
            },
            |e| matches!(e, ConnectError::Ipc(ClientError::Disconnected)),
            false,
        ),
    ];
    for (what, send, check, fault) in cases {
        let service = FakeService::new();
        let conn = Connection::start(&service);
        let mut peer = service.accept();
        peer.trace(sealed_memfd(65536));
        send(&mut peer);
        let error = conn.ended(u64::from(fault));
        assert!(check(&error), "{what}: {error}");
        assert_eq!(error.is_ordinary(), !fault, "{what}: {error}");
        assert_eq!(conn.errors(), u64::from(fault), "{what}: {error}");
        assert!(!H_APP.is_enabled(), "{what}");
        app.keeps_running();
    }
    app.finish();
}

#[test]
fn odd_but_harmless_input_leaves_the_connection_up() {
    let _s = serial();
    let (_service, conn, mut peer) = connect();
    peer.trace(sealed_memfd(256 * 1024));
    let app = App::start(16, APP_PAUSE);
    // An empty frame; a reply to a request never made; a command this
    // producer does not know (a newer service's: an unknown field, so no
    // command at all).
    peer.raw(&[0, 0, 0, 0]);
    peer.raw_reply(9999, &[], true);
    let stream = peer.stream_id();
    peer.raw_reply(stream, &[0xF8, 0x06, 0x01], true);
    // A config that does not decode: not set up, still acknowledged.
    peer.command(start(2, Bytes::from_static(&[0x0A, 0xFF])), None);
    // Commands for instances that do not exist, and commands carrying a
    // descriptor they have no use for: the producer closes it (its peer
    // end then reads end-of-file).
    let (stray, stray_peer) = UnixStream::pair().unwrap();
    peer.command(
        Cmd::StopDataSource(gac::StopDataSource {
            instance_id: Some(404),
        }),
        Some(stray.into()),
    );
    let (stray2, stray2_peer) = UnixStream::pair().unwrap();
    peer.command(start(1, track_event_config()), Some(stray2.into()));
    // More instances than there are slots (8): the rest are refused.
    for id in 100..112 {
        peer.command(start(id, track_event_config()), None);
    }
    assert!(peer.until(|p| p.started(2) && p.stopped(404) && p.started(111)));
    for end in [stray_peer, stray2_peer] {
        end.set_read_timeout(Some(PATIENCE)).unwrap();
        assert_eq!(
            (&end).read(&mut [0]).unwrap(),
            0,
            "the producer kept the fd"
        );
    }
    // Id lists as long as a frame allows.
    let ids: Vec<u64> = (0..30_000).collect();
    peer.command(
        Cmd::ClearIncrementalState(gac::ClearIncrementalState {
            data_source_ids: ids.clone(),
        }),
        None,
    );
    peer.command(flush(&ids, 5), None);
    assert!(peer.until(|p| p.flush_acked(5)));
    app.keeps_running();
    for id in (100..112).chain([1]) {
        peer.command(
            Cmd::StopDataSource(gac::StopDataSource {
                instance_id: Some(id),
            }),
            None,
        );
    }
    assert!(peer.until(|p| p.stopped(1)));
    assert!(!H_APP.is_enabled());
    assert!(peer.flushes(6));
    assert!(peer.chunks_committed() > 0);
    assert_eq!(conn.errors(), 0);
    assert!(conn.status.is_connected() && conn.status.last_error().is_none());
    app.finish();
}

#[test]
fn a_bad_service_is_retried_and_a_good_one_traces() {
    let _s = serial();
    let app = App::start(16, APP_PAUSE);
    let (service, conn, mut bad) = connect();
    bad.handshake(Default::default());
    bad.command(setup_tracing(4), Some(memfd(MemfdFlags::empty(), 65536)));
    assert!(bad.closed_by_producer());
    assert!(matches!(
        *conn.ended(1),
        ConnectError::Smb(ShmError::CannotSeal(_))
    ));
    // The same socket now behaves: the producer comes back by itself.
    let mut good = service.accept();
    good.trace(sealed_memfd(256 * 1024));
    assert!(H_APP.is_enabled());
    app.keeps_running();
    assert!(good.flushes(9));
    assert!(
        good.chunks_committed() > 0,
        "the application's events arrive"
    );
    assert_eq!(conn.status.connections.load(Ordering::Relaxed), 2);
    assert_eq!(conn.errors(), 1);
    app.finish();
}

#[test]
fn a_service_scribbling_over_the_smb_loses_chunks_not_the_program() {
    let _s = serial();
    let (_service, conn, mut peer) = connect();
    let fd = sealed_memfd(64 * 1024);
    let theirs = fd.try_clone().unwrap();
    peer.trace(fd);
    let app = App::start(200, APP_PAUSE);
    app.keeps_running();
    // Random bytes at random places, page headers (the chunks' states and
    // the page layout) first of all, while the application writes.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let lost_before = crate::stats().chunks_lost;
    let until = Instant::now() + Duration::from_millis(300);
    for n in 0u64.. {
        if Instant::now() >= until {
            break;
        }
        let page = next() % 16 * 4096;
        let offset = if n % 4 != 0 {
            page
        } else {
            page + next() % 4096
        };
        let bytes = next().to_le_bytes();
        let len = (64 * 1024 - offset).min(8) as usize;
        rustix::io::pwrite(&theirs, &bytes[..len], offset).unwrap();
        if n % 256 == 0 {
            peer.pump();
        }
    }
    app.keeps_running();
    // The socket side is unaffected: the connection still answers.
    assert!(peer.flushes(11));
    assert_eq!(conn.errors(), 0);
    assert!(
        crate::stats().chunks_lost > lost_before,
        "chunks whose state the service overwrote are counted as lost"
    );
    app.finish();
}

/// `bytes` with a length-delimited field `field` of `len` bytes appended.
fn with_field(mut bytes: Vec<u8>, field: u32, len: usize) -> Vec<u8> {
    use shmtrace_ipc::protos::wire::{put_tag, put_varint, WireType};
    put_tag(&mut bytes, field, WireType::LengthDelimited);
    put_varint(&mut bytes, len as u64);
    bytes.resize(bytes.len() + len, b'g');
    bytes
}

/// `DataSourceOptions` whose descriptor carries a `len`-byte
/// `gpu_counter_descriptor` (field 5).
fn descriptor_of(len: usize) -> crate::DataSourceOptions {
    crate::DataSourceOptions {
        extra_descriptor_fields: with_field(Vec::new(), 5, len),
        ..Default::default()
    }
}

/// `DataSourceOptions` whose descriptor is too large for one IPC frame (a
/// 200 KiB `gpu_counter_descriptor`).
fn oversized_descriptor() -> crate::DataSourceOptions {
    descriptor_of(200 * 1024)
}

fn registered(peer: &Peer, name: &str) -> bool {
    peer.calls.iter().any(|c| {
        matches!(c, Request::RegisterDataSource(r)
            if r.data_source_descriptor.as_ref().and_then(|d| d.name.as_deref()) == Some(name))
    })
}

#[test]
fn a_message_too_large_for_a_frame_is_skipped_not_fatal() {
    let _s = serial();
    // One registered before the connection (queued when it opens), one
    // while it runs; a small one after each.
    let register = |when: &str| {
        let huge = format!("hostile.huge.{when}");
        let small = format!("hostile.small.{when}");
        let huge =
            crate::DataSource::register_with(&huge, oversized_descriptor(), crate::NoopHandler);
        (
            huge.unwrap(),
            crate::DataSource::register(&small, crate::NoopHandler).unwrap(),
        )
    };
    let _before = register("before");
    let (_service, conn, mut peer) = connect();
    peer.trace(sealed_memfd(64 * 1024));
    let _during = register("during");
    assert!(peer.until(|p| registered(p, "hostile.small.during")));
    assert!(peer.flushes(12), "the sender goes on");
    assert!(registered(&peer, "hostile.small.before"));
    assert!(!registered(&peer, "hostile.huge.before") && !registered(&peer, "hostile.huge.during"));
    assert_eq!(conn.errors(), 0);
    assert!(conn.status.is_connected() && conn.status.last_error().is_none());
}

#[test]
fn a_service_failing_every_connection_is_retried_with_a_growing_backoff() {
    let _s = serial();
    let service = FakeService::new();
    let conn = Connection::start(&service);
    // Each connection is dropped at once (SetupTracing without an SMB).
    // Retries 250 ms, then 500 ms later: at most 3 connections in 1.1 s
    // (a retry every 250 ms would make 5).
    let deadline = Instant::now() + Duration::from_millis(1100);
    let mut connections = 0;
    while let Some(mut peer) = service.accept_before(deadline) {
        connections += 1;
        peer.handshake(Default::default());
        peer.command(setup_tracing(4), None);
        assert!(peer.closed_by_producer());
    }
    assert!((1..=3).contains(&connections), "{connections} connections");
    // The peer sees the close before the producer records why: wait for
    // the record, then count.
    assert!(matches!(*conn.ended(connections), ConnectError::NoSmb));
    assert_eq!(conn.errors(), connections);
}

/// Holds `on_start` until opened: a data source whose start is slow, so
/// the command thread falls behind the command stream.
#[derive(Default)]
struct Gate {
    state: std::sync::Mutex<(bool, bool)>,
    changed: std::sync::Condvar,
}

impl Gate {
    fn set(&self, entered: bool, open: bool) {
        let mut s = self.state.lock().unwrap();
        s.0 |= entered;
        s.1 |= open;
        self.changed.notify_all();
    }

    fn wait(&self, until: impl Fn(&(bool, bool)) -> bool) -> bool {
        let s = self.state.lock().unwrap();
        let (s, _) = self
            .changed
            .wait_timeout_while(s, PATIENCE, |s| !until(s))
            .unwrap();
        until(&s)
    }
}

struct SlowStart(Arc<Gate>);

impl crate::DataSourceHandler for SlowStart {
    fn on_start(&self, _args: &crate::InstanceArgs<'_>) {
        self.0.set(true, false);
        self.0.wait(|s| s.1);
    }
}

/// Opens the gate however the test ends.
struct Opens(Arc<Gate>);

impl Drop for Opens {
    fn drop(&mut self) {
        self.0.set(false, true);
    }
}

/// Descriptors of this process that are memfds named `name`.
fn memfds_named(name: &str) -> usize {
    let link = format!("/memfd:{name} ");
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with(&link))
        .count()
}

#[test]
fn a_flood_of_commands_the_producer_cannot_keep_up_with_stops_at_the_socket() {
    const FLOOD: u64 = 2000;
    const NAME: &str = "hostile-flood";
    // A service's sends that make no progress this long are blocked (a
    // producer that reads unblocks them within microseconds).
    const STALL: Duration = Duration::from_millis(200);
    let _s = serial();
    let gate = Arc::new(Gate::default());
    let _open = Opens(gate.clone());
    let _slow = crate::DataSource::register("hostile.slow", SlowStart(gate.clone())).unwrap();
    let (_service, conn, mut peer) = connect();
    peer.trace(sealed_memfd(64 * 1024));
    let slow = pb::DataSourceConfig {
        name: Some("hostile.slow".into()),
        ..Default::default()
    };
    peer.command(start(2, Bytes::from(slow.encode_to_vec())), None);
    assert!(gate.wait(|s| s.0), "the slow start did not begin");
    // The command thread is stuck in on_start; the service floods it with
    // commands, each carrying a descriptor (a memfd named NAME).
    let to = peer.commands.clone().unwrap();
    let queue = |peer: &mut Peer, i: u64| {
        let cmd = Cmd::StopDataSource(gac::StopDataSource {
            instance_id: Some(1000 + i),
        });
        let msg = pb::GetAsyncCommandResponse { cmd: Some(cmd) };
        let fd = rustix::fs::memfd_create(NAME, MemfdFlags::CLOEXEC).unwrap();
        peer.conn.reply(&to, Ok(&msg), true, Some(fd)).unwrap();
    };
    peer.stream.set_nonblocking(true).unwrap();
    let mut stalled_at = None;
    'flood: for i in 0..FLOOD {
        queue(&mut peer, i);
        let mut since = Instant::now();
        while !peer.conn.out().is_empty() {
            if send_queued(&peer.stream, peer.conn.out()).unwrap() > 0 {
                since = Instant::now();
            } else if since.elapsed() >= STALL {
                stalled_at = Some(i);
                break 'flood;
            } else {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    // The producer stopped reading: the service's sends block, and the
    // process holds no more of the descriptors than the producer's reply
    // queue, the one its reader is delivering, one parked with a frame
    // still decoding and the one not yet sent (those in the socket are the
    // kernel's). With an unbounded queue: all of them (the sends never
    // block).
    let stalled_at = stalled_at.expect("the producer read the whole flood into memory");
    let held = memfds_named(NAME);
    assert!(
        held <= shmtrace_ipc::connection::REPLY_QUEUE_DEPTH + 3,
        "{held} descriptors held after {stalled_at} commands"
    );
    // The slow start ends: the producer works through the flood (every
    // command acknowledged, every descriptor closed) and stays connected.
    drop(_open);
    let mut next = stalled_at + 1;
    let deadline = Instant::now() + PATIENCE;
    while !(next == FLOOD && peer.stopped(1000 + FLOOD - 1)) {
        assert!(
            Instant::now() < deadline,
            "the flood was not worked through"
        );
        if peer.conn.out().is_empty() && next < FLOOD {
            queue(&mut peer, next);
            next += 1;
        }
        peer.pump();
    }
    peer.stream.set_nonblocking(false).unwrap();
    assert!((0..FLOOD).all(|i| peer.stopped(1000 + i)));
    assert!(peer.started(2));
    assert!(wait_until(|| memfds_named(NAME) == 0), "descriptors kept");
    assert!(peer.flushes(13));
    assert_eq!(conn.errors(), 0);
    assert!(conn.status.is_connected() && conn.status.last_error().is_none());
}

/// Registrations the service answers with more commands than the IPC
/// client queues for one call, each answer sent whole (blocking) before the
/// service reads on, while the registrations fill the producer's socket:
/// the producer must be reading commands while it registers. (When the
/// handshake sent the registrations itself, neither side read: the
/// watchdog dropped the connection, on every retry.)
#[test]
fn registrations_answered_by_a_burst_of_commands_do_not_stall_the_connection() {
    /// Data sources, each registered with a DESCRIPTOR-byte descriptor:
    /// together several times what a socket holds.
    const SOURCES: u64 = 40;
    const DESCRIPTOR: usize = 16 * 1024;
    /// Padding of each Setup/Start config: the commands the producer does
    /// not read fill the service's socket soon.
    const CONFIG: usize = 16 * 1024;
    const FIRST_ID: u64 = 7000;
    let _s = serial();
    let name = |k: u64| format!("hostile.burst.{k}");
    let _sources: Vec<_> = (0..SOURCES)
        .map(|k| {
            crate::DataSource::register_with(
                &name(k),
                descriptor_of(DESCRIPTOR),
                crate::NoopHandler,
            )
            .unwrap()
        })
        .collect();
    // Stalled sends may last as long as they need (what is tested is the
    // handshake, and that no side stalls for good).
    let (_service, conn, mut peer) = connect_patient();
    peer.stream.set_write_timeout(Some(PATIENCE)).unwrap();
    peer.handshake(Default::default());
    peer.command(setup_tracing(4), Some(sealed_memfd(64 * 1024)));
    let to = peer.commands.clone().unwrap();
    let config = |k: u64| {
        let c = pb::DataSourceConfig {
            name: Some(name(k)),
            target_buffer: Some(1),
            ..Default::default()
        };
        // An unknown field: padding the producer skips.
        Bytes::from(with_field(c.encode_to_vec(), 9999, CONFIG))
    };
    let mut scanned = 0;
    let mut commands = 0;
    let mut answered = std::collections::HashSet::new();
    let deadline = Instant::now() + PATIENCE;
    while !(answered.len() == SOURCES as usize && (0..SOURCES).all(|k| peer.started(FIRST_ID + k)))
    {
        assert!(
            Instant::now() < deadline && !peer.closed,
            "stalled: {} of {SOURCES} registrations answered, {commands} commands sent; {:?}",
            answered.len(),
            conn.status.last_error()
        );
        peer.pump();
        // Every registration read: SetupDataSource, StartDataSource,
        // ClearIncrementalState and three Flushes, queued and then sent
        // whole before reading on.
        for call in &peer.calls[scanned..] {
            let Request::RegisterDataSource(r) = call else {
                continue;
            };
            let n = r
                .data_source_descriptor
                .as_ref()
                .and_then(|d| d.name.clone());
            let Some(k) = n.and_then(|n| n.strip_prefix("hostile.burst.")?.parse::<u64>().ok())
            else {
                continue;
            };
            assert!(answered.insert(k), "{} registered twice", name(k));
            let id = FIRST_ID + k;
            for cmd in [
                Cmd::SetupDataSource(gac::SetupDataSource {
                    new_instance_id: Some(id),
                    config: Some(config(k)),
                }),
                start(id, config(k)),
                Cmd::ClearIncrementalState(gac::ClearIncrementalState {
                    data_source_ids: vec![id],
                }),
                flush(&[id], 4 * id),
                flush(&[id], 4 * id + 1),
                flush(&[], 4 * id + 2),
            ] {
                let msg = pb::GetAsyncCommandResponse { cmd: Some(cmd) };
                peer.conn.reply(&to, Ok(&msg), true, None).unwrap();
                commands += 1;
            }
        }
        scanned = peer.calls.len();
        peer.send();
    }
    assert!(commands > shmtrace_ipc::connection::REPLY_QUEUE_DEPTH);
    // A flush ack acknowledges every flush up to its id.
    let last = 4 * (FIRST_ID + SOURCES - 1) + 2;
    assert!(peer.until(|p| p.flushes_acked() == last));
    assert_eq!(conn.status.connections.load(Ordering::Relaxed), 1);
    assert_eq!(conn.errors(), 0);
    assert!(conn.status.is_connected() && conn.status.last_error().is_none());
}

/// Sends `n` commands made by `cmd` as fast as the socket takes them,
/// without reading, sampling the producer's backlog after each: where the
/// producer held the service back (its sends make no progress while its
/// outbox is over the cap), if it did, and the largest backlog seen. A
/// producer merely slow to read (descheduled) is waited for.
fn flood_without_reading(
    peer: &mut Peer,
    n: u64,
    mut cmd: impl FnMut(u64) -> Cmd,
) -> (Option<u64>, usize) {
    use crate::connection::outbox::BACKLOG_CAP;
    // Sends that make no progress this long are blocked (a producer that
    // reads unblocks them within microseconds).
    const STALL: Duration = Duration::from_millis(300);
    let to = peer.commands.clone().unwrap();
    let outbox = crate::runtime::runtime().outbox();
    let mut peak = 0;
    peer.stream.set_nonblocking(true).unwrap();
    for i in 0..n {
        let msg = pb::GetAsyncCommandResponse { cmd: Some(cmd(i)) };
        peer.conn.reply(&to, Ok(&msg), true, None).unwrap();
        let mut since = Instant::now();
        while !peer.conn.out().is_empty() {
            // Fails only after no progress for that long: a slow machine
            // takes longer over the whole flood, not over one send.
            assert!(
                since.elapsed() < PATIENCE,
                "the producer neither read nor held back"
            );
            let backlog = outbox.backlog();
            peak = peak.max(backlog);
            if send_queued(&peer.stream, peer.conn.out()).unwrap() > 0 {
                since = Instant::now();
            } else if since.elapsed() >= STALL && backlog > BACKLOG_CAP {
                peer.stream.set_nonblocking(false).unwrap();
                return (Some(i), peak);
            } else {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        peak = peak.max(outbox.backlog());
    }
    peer.stream.set_nonblocking(false).unwrap();
    (None, peak)
}

/// A service that floods commands and does not read our socket costs the
/// producer bounded memory: thousands of flushes queue one merged ack;
/// thousands of commands that each need their own answer (a stop, always
/// answered) fill the outbox up to its cap, then the producer stops taking
/// commands and the service's sends block. Once the service reads, every
/// stop is answered, the last flush acknowledged (acknowledging all before
/// it), and the connection is up.
#[test]
fn a_service_flooding_commands_without_reading_costs_bounded_memory() {
    use crate::connection::outbox::BACKLOG_CAP;
    const FLUSHES: u64 = 5000;
    const STOPS: u64 = 3000;
    let _s = serial();
    // The service does not read for as long as it floods.
    let (_service, conn, mut peer) = connect_patient();
    peer.trace(sealed_memfd(64 * 1024));
    assert!(peer.flushes(1));
    let (stalled, peak) = flood_without_reading(&mut peer, FLUSHES, |i| flush(&[], 10 + i));
    assert_eq!(stalled, None, "the producer stopped reading flushes");
    assert!(peak <= 4, "{peak} messages queued for {FLUSHES} flushes");
    assert!(peer.until(|p| p.flushes_acked() == 10 + FLUSHES - 1));

    // Each stop followed by a flush: nothing merges.
    let base = 100_000;
    let stop_or_flush = |i: u64| {
        if i % 2 == 0 {
            Cmd::StopDataSource(gac::StopDataSource {
                instance_id: Some(base + i / 2),
            })
        } else {
            flush(&[], base + i)
        }
    };
    let (stalled, peak) = flood_without_reading(&mut peer, 2 * STOPS, stop_or_flush);
    let stalled = stalled.expect("the producer read the whole flood");
    assert!(
        peak <= BACKLOG_CAP + 4,
        "{peak} messages queued after {stalled} commands"
    );
    // The service reads again, and sends the rest (reading all along: a
    // service blocked on its send while the producer holds its commands
    // back would not read either).
    let to = peer.commands.clone().unwrap();
    peer.stream.set_nonblocking(true).unwrap();
    let mut next = stalled + 1;
    // Fails only after no progress (a command sent, a flush acked) for
    // PATIENCE, however long the whole takes on a slow machine.
    let mut progress = (next, peer.flushes_acked(), Instant::now());
    while !(next == 2 * STOPS && peer.flushes_acked() == base + 2 * STOPS - 1) {
        if (next, peer.flushes_acked()) != (progress.0, progress.1) {
            progress = (next, peer.flushes_acked(), Instant::now());
        }
        assert!(
            progress.2.elapsed() < PATIENCE && !peer.closed,
            "the flood was not worked through: {next} sent, {} acked; {:?}",
            peer.flushes_acked(),
            conn.status.last_error()
        );
        if peer.conn.out().is_empty() && next < 2 * STOPS {
            let msg = pb::GetAsyncCommandResponse {
                cmd: Some(stop_or_flush(next)),
            };
            peer.conn.reply(&to, Ok(&msg), true, None).unwrap();
            next += 1;
        }
        peer.pump();
    }
    peer.stream.set_nonblocking(false).unwrap();
    let stopped: std::collections::HashSet<u64> = peer
        .calls
        .iter()
        .filter_map(|c| match c {
            Request::NotifyDataSourceStopped(n) => n.data_source_id,
            _ => None,
        })
        .collect();
    assert!(
        (0..STOPS).all(|i| stopped.contains(&(base + i))),
        "a stop went unanswered"
    );
    assert!(peer.flushes(base + 2 * STOPS));
    assert_eq!(conn.errors(), 0);
    assert!(conn.status.is_connected() && conn.status.last_error().is_none());
}
