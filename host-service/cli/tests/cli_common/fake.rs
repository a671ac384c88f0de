//! A scripted ConsumerPort service on a private socket, built on the IPC
//! layer's host side: what `shmtrace record` and `shmtrace query` talk to
//! in these tests. It logs every call it receives, keeps what the consumer
//! sent, and serves a given list of packets through ReadBuffers (or writes
//! them into the descriptor EnableTracing passed, for write_into_file).

#![allow(dead_code)]

use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use shmtrace_service::ipc::host::{Call, HostConnection, PendingReply, ServiceTable};
use shmtrace_service::ipc::socket::{self, Listener, Received, SocketAddress};
use shmtrace_service::protos::consumer_port::Request;
use shmtrace_service::protos::observable_events::{
    CloneTriggerHit, DataSourceInstanceStateChange, Type,
};
use shmtrace_service::protos::read_buffers_response::Slice;
use shmtrace_service::protos::trace_stats::BufferStats;
use shmtrace_service::protos::tracing_service_state::{self, DataSource, Producer, TracingSession};
use shmtrace_service::protos::{
    self, ConsumerPort, DataSourceDescriptor, DisableTracingResponse, EnableTracingResponse,
    FlushResponse, FreeBuffersResponse, GetTraceStatsResponse, ObservableEvents,
    ObserveEventsResponse, QueryServiceStateResponse, ReadBuffersResponse, TraceStats,
    TracingServiceState, TrackEventCategory, TrackEventDescriptor,
};

/// What the fake does.
#[derive(Debug, Clone, Default)]
pub struct Script {
    /// Packets ReadBuffers returns (or that go into the write_into_file fd).
    pub packets: Vec<Vec<u8>>,
    /// `(producer, data source)` registered with the service.
    pub registered: Vec<(String, String)>,
    /// Announced through ObserveEvents as started, right after
    /// EnableTracing.
    pub started: Vec<(String, String)>,
    /// The service ends the session by itself this long after
    /// EnableTracing (as on `duration_ms`).
    pub end_after: Option<Duration>,
    /// Refuse EnableTracing with this error.
    pub refuse: Option<String>,
    /// Fail the Flush.
    pub fail_flush: bool,
    /// Sessions listed by QueryServiceState.
    pub sessions: Vec<TracingSession>,
    /// A CLONE_SNAPSHOT trigger (`snap0`, `snap1`, ...) is announced
    /// through ObserveEvents this long after EnableTracing, one for each.
    pub clone_triggers: Vec<Duration>,
    /// CloneSession is answered this long after it came.
    pub clone_delay: Duration,
    /// The first CloneSession calls are refused, with these errors.
    pub clone_errors: Vec<String>,
}

/// The session id the fake gives its session (in CLONE_SNAPSHOT hits).
pub const SESSION_ID: u64 = 7;

/// The pseudo-call logged when a CloneSession is answered.
pub const CLONE_ANSWERED: &str = "CloneSession answered";

/// What the fake saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Method names, in order.
    pub calls: Vec<String>,
    /// The serialized TraceConfig of EnableTracing.
    pub config: Option<Vec<u8>>,
    /// Whether EnableTracing came with a descriptor.
    pub got_fd: bool,
    /// Connections accepted.
    pub connections: usize,
    /// The CloneSession requests, in order.
    pub clones: Vec<protos::CloneSessionRequest>,
}

/// A running fake service. Stops when dropped.
pub struct FakeService {
    pub socket: PathBuf,
    pub seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeService {
    /// Starts serving `script` at `socket`.
    pub fn start(socket: &Path, script: Script) -> Self {
        let listener = Listener::bind(&SocketAddress::Path(socket.to_path_buf())).expect("listen");
        listener.set_nonblocking(true).unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (seen, stop) = (Arc::clone(&seen), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut workers = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok(stream) => {
                            seen.lock().unwrap().connections += 1;
                            let (seen, stop, script) =
                                (Arc::clone(&seen), Arc::clone(&stop), script.clone());
                            workers.push(std::thread::spawn(move || {
                                Connection::new(script, seen).serve(stream, &stop)
                            }));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(10)),
                    }
                }
                for w in workers {
                    let _ = w.join();
                }
            })
        };
        FakeService {
            socket: socket.to_path_buf(),
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// The calls seen so far.
    pub fn calls(&self) -> Vec<String> {
        self.seen.lock().unwrap().calls.clone()
    }

    /// Waits until `method` was called (up to 20 s).
    pub fn wait_for(&self, method: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.calls().iter().any(|c| c == method) {
            assert!(
                Instant::now() < deadline,
                "no {method} call; saw {:?}",
                self.calls()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for FakeService {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

struct Connection {
    script: Script,
    seen: Arc<Mutex<Seen>>,
    enable: Option<PendingReply>,
    enabled_at: Option<Instant>,
    fd: Option<OwnedFd>,
    observe: Option<PendingReply>,
    disabled: bool,
    /// CLONE_SNAPSHOT hits announced so far.
    hits_sent: usize,
    /// A CloneSession to answer at a time, and with what.
    clone: Option<(Instant, PendingReply, protos::CloneSessionResponse)>,
}

impl Connection {
    fn new(script: Script, seen: Arc<Mutex<Seen>>) -> Self {
        Connection {
            script,
            seen,
            enable: None,
            enabled_at: None,
            fd: None,
            observe: None,
            disabled: false,
            hits_sent: 0,
            clone: None,
        }
    }

    fn serve(mut self, stream: std::os::unix::net::UnixStream, stop: &AtomicBool) {
        stream
            .set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        let table: ServiceTable<Request> = ConsumerPort.into();
        let mut conn = HostConnection::new(Arc::new(table), None);
        while !stop.load(Ordering::Relaxed) {
            match socket::recv_into(&stream, conn.decoder()) {
                Ok(Received::Data(_)) | Ok(Received::WouldBlock) => {}
                Ok(Received::Closed) | Err(_) => return,
            }
            while let Ok(Some(call)) = conn.poll_call() {
                self.handle(&mut conn, call);
            }
            self.announce_clone_triggers(&mut conn);
            if self
                .clone
                .as_ref()
                .is_some_and(|(at, _, _)| Instant::now() >= *at)
            {
                let (_, reply, response) = self.clone.take().unwrap();
                let _ = conn.resolve(reply, &response);
                self.seen.lock().unwrap().calls.push(CLONE_ANSWERED.into());
            }
            if let (Some(after), Some(at)) = (self.script.end_after, self.enabled_at) {
                if at.elapsed() >= after && !self.disabled {
                    self.stop_session(&mut conn);
                }
            }
            while !conn.out().is_empty() {
                if socket::send_queued(&stream, conn.out()).is_err() {
                    return;
                }
            }
        }
    }

    /// Sends the CLONE_SNAPSHOT hits that are due.
    fn announce_clone_triggers(&mut self, conn: &mut HostConnection<Request>) {
        let (Some(at), Some(observe)) = (self.enabled_at, &self.observe) else {
            return;
        };
        while self.hits_sent < self.script.clone_triggers.len()
            && !self.disabled
            && at.elapsed() >= self.script.clone_triggers[self.hits_sent]
        {
            let events = ObservableEvents {
                clone_trigger_hit: Some(CloneTriggerHit {
                    tracing_session_id: Some(SESSION_ID as i64),
                    trigger_name: Some(format!("snap{}", self.hits_sent)),
                    producer_name: Some("fake-producer".into()),
                    producer_uid: Some(1000),
                    boot_time_ns: Some(123),
                    trigger_delay_ms: Some(0),
                }),
                ..Default::default()
            };
            send_events(conn, observe, events);
            self.hits_sent += 1;
        }
    }

    fn stop_session(&mut self, conn: &mut HostConnection<Request>) {
        self.disabled = true;
        if let Some(mut fd) = self.fd.take().map(File::from) {
            for p in &self.script.packets {
                let mut framed = Vec::new();
                shmtrace_cli::trace_file::write_preamble(&mut framed, p.len()).unwrap();
                framed.extend_from_slice(p);
                fd.write_all(&framed).unwrap();
            }
        }
        if let Some(reply) = self.enable.take() {
            let _ = conn.resolve(
                reply,
                &EnableTracingResponse {
                    state: Some(protos::enable_tracing_response::State::Disabled(true)),
                    error: None,
                },
            );
        }
    }

    fn handle(&mut self, conn: &mut HostConnection<Request>, call: Call<Request>) {
        self.seen
            .lock()
            .unwrap()
            .calls
            .push(call.method.name.to_owned());
        match call.request {
            Request::EnableTracing(req) => {
                {
                    let mut seen = self.seen.lock().unwrap();
                    seen.config = req.trace_config.map(|b| b.to_vec());
                    seen.got_fd = call.fd.is_some();
                }
                if let Some(error) = &self.script.refuse {
                    let _ = conn.resolve(
                        call.reply,
                        &EnableTracingResponse {
                            state: Some(protos::enable_tracing_response::State::Disabled(true)),
                            error: Some(error.clone()),
                        },
                    );
                    return;
                }
                self.fd = call.fd;
                self.enable = Some(call.reply);
                self.enabled_at = Some(Instant::now());
                if let Some(observe) = &self.observe {
                    let events = ObservableEvents {
                        instance_state_changes: self
                            .script
                            .started
                            .iter()
                            .map(|(p, d)| DataSourceInstanceStateChange {
                                producer_name: Some(p.clone()),
                                data_source_name: Some(d.clone()),
                                state: Some(2),
                            })
                            .collect(),
                        all_data_sources_started: Some(true),
                        clone_trigger_hit: None,
                    };
                    send_events(conn, observe, events);
                }
            }
            Request::ObserveEvents(req) => {
                assert!(req
                    .events_to_observe
                    .contains(&(Type::DataSourcesInstances as i32)));
                self.observe = Some(call.reply);
            }
            Request::GetTraceStats(_) => {
                if self.enabled_at.is_none() {
                    return conn.reject(call.reply);
                }
                let stats = TraceStats {
                    buffer_stats: vec![BufferStats {
                        bytes_written: Some(
                            self.script.packets.iter().map(|p| p.len() as u64).sum(),
                        ),
                        ..Default::default()
                    }],
                    ..Default::default()
                };
                let _ = conn.resolve(
                    call.reply,
                    &GetTraceStatsResponse {
                        trace_stats: Some(stats),
                    },
                );
            }
            Request::Flush(_) => {
                if self.script.fail_flush {
                    conn.reject(call.reply);
                } else {
                    let _ = conn.resolve(call.reply, &FlushResponse {});
                }
            }
            Request::DisableTracing(_) => {
                let _ = conn.resolve(call.reply, &DisableTracingResponse {});
                self.stop_session(conn);
            }
            Request::ReadBuffers(_) => {
                // Each packet in three slices, two packets per reply. No
                // session (refused): one empty reply, as Perfetto.
                let packets = if self.enabled_at.is_some() {
                    self.script.packets.as_slice()
                } else {
                    &[]
                };
                let mut replies: Vec<ReadBuffersResponse> = Vec::new();
                for (i, p) in packets.iter().enumerate() {
                    if i % 2 == 0 {
                        replies.push(ReadBuffersResponse::default());
                    }
                    let cut1 = p.len() / 3;
                    let cut2 = 2 * p.len() / 3;
                    let reply = replies.last_mut().unwrap();
                    for (j, part) in [&p[..cut1], &p[cut1..cut2], &p[cut2..]].iter().enumerate() {
                        reply.slices.push(Slice {
                            data: Some(Bytes::copy_from_slice(part)),
                            last_slice_for_packet: Some(j == 2),
                        });
                    }
                }
                if replies.is_empty() {
                    replies.push(ReadBuffersResponse::default());
                }
                let n = replies.len();
                for (i, r) in replies.iter().enumerate() {
                    conn.reply(&call.reply, Ok(r), i + 1 < n, None).unwrap();
                }
            }
            Request::CloneSession(req) => {
                let n = {
                    let mut seen = self.seen.lock().unwrap();
                    seen.clones.push(req);
                    seen.clones.len() - 1
                };
                let response = match self.script.clone_errors.get(n) {
                    Some(error) => protos::CloneSessionResponse {
                        success: Some(false),
                        error: Some(error.clone()),
                        ..Default::default()
                    },
                    None => protos::CloneSessionResponse {
                        success: Some(true),
                        was_write_into_file: Some(false),
                        ..Default::default()
                    },
                };
                self.clone = Some((
                    Instant::now() + self.script.clone_delay,
                    call.reply,
                    response,
                ));
            }
            Request::FreeBuffers(_) => {
                let _ = conn.resolve(call.reply, &FreeBuffersResponse {});
            }
            Request::QueryServiceState(_) => {
                let producers: Vec<String> =
                    self.script.registered.iter().map(|(p, _)| p.clone()).fold(
                        Vec::new(),
                        |mut v, p| {
                            if !v.contains(&p) {
                                v.push(p);
                            }
                            v
                        },
                    );
                let id = |name: &str| producers.iter().position(|p| p == name).unwrap() as i32 + 1;
                // Two parts, which concatenate into one state.
                let first = TracingServiceState {
                    producers: producers
                        .iter()
                        .map(|name| Producer {
                            id: Some(id(name)),
                            name: Some(name.clone()),
                            pid: Some(4000 + id(name)),
                            uid: Some(1000),
                            sdk_version: Some("fake 1.0".into()),
                            ..Default::default()
                        })
                        .collect(),
                    tracing_service_version: Some("fake-service 0.1".into()),
                    ..Default::default()
                };
                let second = TracingServiceState {
                    data_sources: self
                        .script
                        .registered
                        .iter()
                        .map(|(p, d)| DataSource {
                            producer_id: Some(id(p)),
                            ds_descriptor: Some(DataSourceDescriptor {
                                name: Some(d.clone()),
                                will_notify_on_stop: Some(true),
                                track_event_descriptor: (d == "track_event").then(|| {
                                    protos::to_raw(&TrackEventDescriptor {
                                        available_categories: ["gfx", "net"]
                                            .iter()
                                            .map(|c| TrackEventCategory {
                                                name: Some((*c).into()),
                                                ..Default::default()
                                            })
                                            .collect(),
                                    })
                                }),
                                ..Default::default()
                            }),
                        })
                        .collect(),
                    tracing_sessions: self.script.sessions.clone(),
                    supports_tracing_sessions: Some(true),
                    num_sessions: Some(self.script.sessions.len() as i32),
                    num_sessions_started: Some(0),
                    ..Default::default()
                };
                for (state, more) in [(first, true), (second, false)] {
                    let _ = conn.reply(
                        &call.reply,
                        Ok(&QueryServiceStateResponse {
                            service_state: Some(state),
                        }),
                        more,
                        None,
                    );
                }
            }
            _ => conn.reject(call.reply),
        }
    }
}

/// Sends `events` on the ObserveEvents stream `observe`.
fn send_events(
    conn: &mut HostConnection<Request>,
    observe: &PendingReply,
    events: ObservableEvents,
) {
    let _ = conn.reply(
        observe,
        Ok(&ObserveEventsResponse {
            events: Some(events),
        }),
        true,
        None,
    );
}

/// A session entry for [`Script::sessions`].
pub fn session(id: u64, state: &str) -> TracingSession {
    tracing_service_state::TracingSession {
        id: Some(id),
        consumer_uid: Some(1000),
        state: Some(state.into()),
        buffer_size_kb: vec![4096, 1024],
        duration_ms: Some(10_000),
        num_data_sources: Some(2),
        start_realtime_ns: Some(1_795_245_541_000_000_000),
        ..Default::default()
    }
}
