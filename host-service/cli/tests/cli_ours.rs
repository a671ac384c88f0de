//! `shmtrace query` and `shmtrace record` against our own service
//! (`shmtrace serve`), as against the real one in the interop suite.

mod cli_common;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use cli_common::*;

/// `shmtrace serve` on private sockets; killed when dropped.
struct Serve(Child);

impl Serve {
    fn start(dir: &TempDir) -> (Self, String) {
        let consumer = dir.path("c.sock");
        let child = shmtrace()
            .args(["serve", "--log-level", "warn", "--producer-socket"])
            .arg(dir.path("p.sock"))
            .arg("--consumer-socket")
            .arg(&consumer)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn shmtrace serve");
        let serve = Serve(child);
        let consumer = consumer.display().to_string();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !Path::new(&consumer).exists() {
            assert!(Instant::now() < deadline, "shmtrace serve did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        (serve, consumer)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn query_and_record_against_our_service() {
    let dir = TempDir::new("ours");
    let (_serve, socket) = Serve::start(&dir);

    let out = run(&["query", "--json", "--socket", &socket]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let state: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        state["version"]
            .as_str()
            .unwrap()
            .starts_with("Perfetto v59.0 (shmtrace "),
        "{state}"
    );
    assert_eq!(state["producers"].as_array().unwrap().len(), 0);

    // Nobody registered track_event: the session still runs, and says so.
    let trace = dir.path("t.pftrace");
    let out = run(&[
        "record",
        "--socket",
        &socket,
        "-t",
        "500ms",
        "-o",
        trace.to_str().unwrap(),
        "--progress",
        "none",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("track_event: no producer registered it"),
        "{stderr}"
    );
    assert!(
        stderr.contains("ended by the service after the configured 500 ms"),
        "{stderr}"
    );
    // The service's own packets make a sound trace.
    let (code, a) = inspect(&[&trace]);
    assert_eq!(code, 0, "{}", problems(&a));
    assert_eq!(a["packets_by_kind"]["trace_config"]["packets"], 1);
    assert_eq!(a["session"]["config"]["duration_ms"], 500);
    assert!(a["stats"].is_object());
}

/// `shmtrace record` against `socket` with `args`; the exit status and
/// what it printed on stderr.
fn record(socket: &str, args: &[&str]) -> (Option<i32>, String) {
    record_showing("none", socket, args)
}

/// [`record`] with `--progress progress`.
fn record_showing(progress: &str, socket: &str, args: &[&str]) -> (Option<i32>, String) {
    let out = shmtrace()
        .args(["record", "--socket", socket, "--progress", progress])
        .args(args)
        .output()
        .expect("run shmtrace record");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `shmtrace record` against `socket` with `args` exits with `code`,
/// saying `said` on stderr.
fn record_says(socket: &str, args: &[&str], code: i32, said: &str) {
    let (got, stderr) = record(socket, args);
    assert_eq!(got, Some(code), "{stderr}");
    assert!(stderr.contains(said), "{stderr}");
}

/// The sessions `shmtrace query --json` lists.
fn sessions(socket: &str) -> Vec<serde_json::Value> {
    let out = run(&["query", "--json", "--socket", socket]);
    let state: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    state["sessions"].as_array().unwrap().clone()
}

/// `--detach KEY` leaves the session running in the service;
/// `--attach KEY --stop` takes it back, stops and reads it. A key is taken
/// once, and read once.
#[test]
fn detach_then_attach_and_stop() {
    let dir = TempDir::new("detach");
    let (_serve, socket) = Serve::start(&dir);

    let (code, stderr) = record(&socket, &["-t", "60s", "--detach", "nightly"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_contains_all(
        &stderr,
        &[
            "Detached: the session runs on in the service under the key \"nightly\"",
            "shmtrace record --attach nightly -o FILE",
        ],
    );
    // The session outlives the command that started it.
    let listed = sessions(&socket);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["state"], "STARTED");
    assert_eq!(listed[0]["duration_ms"], 60_000);

    // The key is in use.
    let (code, stderr) = record(&socket, &["-t", "60s", "--detach", "nightly"]);
    assert_eq!(code, Some(5), "{stderr}");
    assert!(stderr.contains("already detached under it"), "{stderr}");
    assert_eq!(sessions(&socket).len(), 1);

    let trace = dir.path("attached.pftrace");
    let out = trace.to_str().unwrap();
    let (code, stderr) = record(&socket, &["--attach", "nightly", "--stop", "-o", out]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_contains_all(
        &stderr,
        &[
            "stopped by --stop (flushed)",
            "Wrote ",
            "attached.pftrace",
            // Producers before the attach were not seen: no claim that
            // none registered.
            "track_event: no producer has it now (this record attached",
        ],
    );
    let (code, a) = inspect(&[&trace]);
    assert_eq!(code, 0, "{}", problems(&a));
    // The session's own config, started by the first command.
    assert_eq!(a["session"]["config"]["duration_ms"], 60_000);
    assert!(sessions(&socket).is_empty());

    // Nothing is detached under the key any more: no file is left behind.
    let again = dir.path("again.pftrace");
    record_says(
        &socket,
        &["--attach", "nightly", "-o", again.to_str().unwrap()],
        5,
        "no session of yours detached under the key \"nightly\"",
    );
    assert!(!again.exists());
}

/// `--clone ID` and `--clone-by-name NAME` write a snapshot of a running
/// session (detached here), which runs on; a session that does not exist
/// or a conflicting flag is refused, leaving no file.
#[test]
fn clone_snapshots_a_running_session() {
    let dir = TempDir::new("clone");
    let (_serve, socket) = Serve::start(&dir);
    let (code, stderr) = record(&socket, &["-t", "60s", "--detach", "flight"]);
    assert_eq!(code, Some(0), "{stderr}");
    let id = sessions(&socket)[0]["id"].as_u64().unwrap();

    let snap = dir.path("snap.pftrace");
    let (code, stderr) = record(
        &socket,
        &["--clone", &id.to_string(), "-o", snap.to_str().unwrap()],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert_contains_all(
        &stderr,
        &[
            "a snapshot of the running session, which runs on (flushed)",
            "Wrote ",
            "snap.pftrace",
        ],
    );
    let (code, a) = inspect(&[&snap]);
    assert_eq!(code, 0, "{}", problems(&a));
    assert_eq!(a["session"]["config"]["duration_ms"], 60_000);
    let events = a["session"]["service_events"].to_string();
    assert!(
        events.contains("clone_started") && events.contains("buffer_cloned"),
        "{events}"
    );
    // The session runs on; the snapshot was freed.
    let listed = sessions(&socket);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["state"], "STARTED");

    let missing = dir.path("missing.pftrace");
    let (code, stderr) = record(
        &socket,
        &["--clone-by-name", "flight", "-o", missing.to_str().unwrap()],
    );
    assert_eq!(code, Some(5), "{stderr}");
    assert!(
        stderr.contains(
            "could not clone the session named \"flight\": Tracing session not found \
             (`shmtrace query` lists the sessions)"
        ),
        "{stderr}"
    );
    assert!(!missing.exists(), "no file left behind");
    let (code, stderr) = record(&socket, &["--clone", "1", "-t", "1s"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}

/// Without --stop, `--attach` waits for the session to end on its own.
/// With --write-into-file the service writes the file given at --detach.
#[test]
fn attach_waits_for_the_end_and_write_into_file_goes_to_the_detach_file() {
    let dir = TempDir::new("attachwait");
    let (_serve, socket) = Serve::start(&dir);
    let streamed = dir.path("streamed.pftrace");
    let (code, stderr) = record(
        &socket,
        &[
            "-t",
            "2s",
            "--write-into-file",
            "-o",
            streamed.to_str().unwrap(),
            "--detach",
            "k",
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("the service writes the trace into"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "Take it back with `shmtrace record --attach k` (add --stop to end it at once; no \
             -o: the trace stays in {})",
            streamed.display()
        )),
        "{stderr}"
    );
    // The service holds the file it writes: attaching into it is refused,
    // saying who writes it.
    record_says(
        &socket,
        &["--attach", "k", "-o", streamed.to_str().unwrap()],
        2,
        "or by the service for a session started with --write-into-file",
    );
    let ignored = dir.path("ignored.pftrace");
    let (code, stderr) = record(&socket, &["--attach", "k", "-o", ignored.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("the service wrote its trace into the file given at --detach"),
        "{stderr}"
    );
    assert!(!ignored.exists());
    let (code, a) = inspect(&[&streamed]);
    assert_eq!(code, 0, "{}", problems(&a));
    assert_eq!(a["session"]["config"]["duration_ms"], 2000);
    assert_eq!(a["session"]["config"]["write_into_file"], true);

    // Usage errors, before anything starts.
    let (code, stderr) = record(&socket, &["--detach", "x", "-o", "somewhere.pftrace"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("read by `--attach KEY -o FILE`"),
        "{stderr}"
    );
    let (code, stderr) = record(&socket, &["--stop"]);
    assert_eq!(code, Some(2), "{stderr}");
    let (code, stderr) = record(&socket, &["--attach", "k", "-t", "1s"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(sessions(&socket).is_empty());
}

/// `shmtrace trigger` ends a STOP_TRACING session early: the service
/// acknowledges it, `record` returns long before the trigger timeout, and
/// the trace holds the trigger packet.
#[test]
fn trigger_stops_a_stop_tracing_session() {
    let dir = TempDir::new("trigger");
    let (_serve, socket) = Serve::start(&dir);
    let producer_socket = dir.path("p.sock").display().to_string();
    let config = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/stop_on_trigger.txtpb"
    );
    let trace = dir.path("triggered.pftrace");
    let started = Instant::now();
    let trace_arg = trace.display().to_string();
    let record_args = [
        "record",
        "--socket",
        &socket,
        "--progress",
        "none",
        "--txt",
        "-c",
        config,
        "-o",
        &trace_arg,
    ];
    let mut recorder = shmtrace()
        .args(record_args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn shmtrace record");
    let deadline = Instant::now() + Duration::from_secs(20);
    while sessions(&socket).is_empty() {
        assert!(Instant::now() < deadline, "the session did not start");
        std::thread::sleep(Duration::from_millis(20));
    }

    let out = run(&["trigger", "go", "unlisted", "--socket", &producer_socket]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("sent 2 triggers"), "{stderr}");

    let status = recorder.wait().expect("record ends");
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut recorder.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "ended by the trigger, not the 60 s timeout"
    );
    let (code, a) = inspect(&[&trace]);
    assert_eq!(code, 0, "{}", problems(&a));
    assert_eq!(a["session"]["triggers"], serde_json::json!(["go"]));
    let file = std::fs::File::open(&trace).unwrap();
    let packets: Vec<shmtrace_service::protos::TracePacket> =
        shmtrace_cli::trace_file::PacketReader::new(file)
            .map(|p| prost::Message::decode(p.unwrap().bytes.as_slice()).unwrap())
            .collect();
    let trigger = packets
        .iter()
        .find_map(|p| match &p.data {
            Some(shmtrace_service::protos::trace_packet::Data::Trigger(t)) => Some(t),
            _ => None,
        })
        .expect("a trigger packet");
    assert_eq!(trigger.trigger_name.as_deref(), Some("go"));
    assert_eq!(trigger.producer_name.as_deref(), Some("shmtrace-trigger"));
    assert_eq!(trigger.stop_delay_ms, Some(100));
    assert_eq!(
        trigger.trusted_producer_uid,
        Some(rustix::process::getuid().as_raw() as i32)
    );
}

/// A START_TRACING session says it waits for its trigger, not that it
/// traces; if none comes, the summary says the registered data source did
/// not start for that reason, not for a producer name filter.
#[test]
fn a_start_tracing_session_without_its_trigger_says_so() {
    use shmtrace_cli::consumer::{next, CALL_TIMEOUT};
    use shmtrace_ipc::protos::{producer_port, DataSourceDescriptor, RegisterDataSourceRequest};

    let dir = TempDir::new("starttrigger");
    let (_serve, socket) = Serve::start(&dir);
    // A producer with track_event, connected while the session runs.
    let (_client, port) = connect_producer(&dir.path("p.sock"), "app");
    let mut register = port
        .start::<producer_port::RegisterDataSource>(
            &RegisterDataSourceRequest {
                data_source_descriptor: Some(DataSourceDescriptor {
                    name: Some("track_event".into()),
                    ..Default::default()
                }),
            },
            None,
        )
        .unwrap();
    next(&mut register, Some(CALL_TIMEOUT)).unwrap();

    let config = dir.path("start.pbtxt");
    std::fs::write(
        &config,
        "buffers { size_kb: 1024 }\n\
         data_sources { config { name: \"track_event\" } }\n\
         trigger_config { trigger_mode: START_TRACING trigger_timeout_ms: 300 \
         triggers { name: \"go\" } }\n",
    )
    .unwrap();
    let trace = dir.path("t.pftrace").display().to_string();
    let config = config.display().to_string();
    let (code, stderr) = record_showing("plain", &socket, &["--txt", "-c", &config, "-o", &trace]);
    assert_eq!(code, Some(0), "{stderr}");
    for said in [
        "shmtrace: waiting for a START_TRACING trigger; press Ctrl-C to stop",
        "no START_TRACING trigger came within trigger_timeout_ms",
        "track_event: registered; not started, as no START_TRACING trigger came",
    ] {
        assert!(stderr.contains(said), "{said:?}: {stderr}");
    }
}

/// Without a service, `shmtrace trigger` says so and exits with 3.
#[test]
fn trigger_without_a_service_fails_clearly() {
    let dir = TempDir::new("notrigger");
    let missing = dir.path("absent.sock").display().to_string();
    let out = run(&["trigger", "go", "--socket", &missing]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.starts_with(
            "shmtrace: error: cannot connect to the tracing service's producer socket at "
        ) && stderr.contains("absent.sock")
            && stderr.contains("PERFETTO_PRODUCER_SOCK_NAME"),
        "{stderr}"
    );
}

#[test]
fn a_second_service_on_live_sockets_is_refused_and_the_first_runs_on() {
    let dir = TempDir::new("twice");
    let (_serve, socket) = Serve::start(&dir);
    let out = shmtrace()
        .args(["serve", "--producer-socket"])
        .arg(dir.path("p.sock"))
        .arg("--consumer-socket")
        .arg(&socket)
        .output()
        .expect("run a second shmtrace serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("p.sock: a live service is listening on this socket"),
        "{stderr}"
    );
    // Both socket files are still there, and the first service answers.
    assert!(dir.path("p.sock").exists() && Path::new(&socket).exists());
    let out = run(&["query", "--json", "--socket", &socket]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `shmtrace record` into `out` on `socket`, with its stderr captured.
fn start_record(socket: &str, out: &Path) -> Child {
    shmtrace()
        .args(["record", "--progress", "none", "--socket", socket, "-o"])
        .arg(out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn shmtrace record")
}

fn signal(child: &Child, signal: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_child(child);
    rustix::process::kill_process(pid, signal).expect("kill");
}

/// Waits until `record` has truncated its output and is tracing.
fn wait_until_tracing(out: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::metadata(out).map_or(true, |m| m.len() != 0) {
        assert!(Instant::now() < deadline, "record did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
}

#[test]
fn a_service_dying_mid_session_leaves_no_empty_trace() {
    let dir = TempDir::new("died");
    let (mut serve, socket) = Serve::start(&dir);
    let out = dir.path("t.pftrace");
    std::fs::write(&out, b"an older file").unwrap();
    let record = start_record(&socket, &out);
    wait_until_tracing(&out);
    serve.0.kill().unwrap();
    let result = record.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(result.status.code(), Some(5), "{stderr}");
    assert!(stderr.contains("disconnected from the service"), "{stderr}");
    assert!(!out.exists(), "an empty trace file was left behind");
}

#[test]
fn a_second_ctrl_c_aborts_and_removes_the_incomplete_trace() {
    let dir = TempDir::new("abort");
    let (serve, socket) = Serve::start(&dir);
    let out = dir.path("t.pftrace");
    let record = start_record(&socket, &out);
    wait_until_tracing(&out);
    // A frozen service: the clean stop after the first Ctrl-C hangs in
    // its flush, and only the second one ends the process.
    signal(&serve.0, rustix::process::Signal::STOP);
    signal(&record, rustix::process::Signal::INT);
    std::thread::sleep(Duration::from_millis(300));
    signal(&record, rustix::process::Signal::INT);
    let result = record.wait_with_output().unwrap();
    signal(&serve.0, rustix::process::Signal::CONT);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(result.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("aborted; removed the incomplete trace"),
        "{stderr}"
    );
    assert!(!out.exists(), "the incomplete trace was left behind");
}

/// A producer socket other machines could reach, without --listen-any, is
/// a config error (exit 2), said before anything listens.
#[test]
fn serve_refuses_a_reachable_socket_as_a_config_error() {
    let dir = TempDir::new("listenany");
    let out = shmtrace()
        .args(["serve", "--log-level", "warn", "--producer-socket"])
        .arg("0.0.0.0:0")
        .arg("--consumer-socket")
        .arg(dir.path("c.sock"))
        .stdin(Stdio::null())
        .output()
        .expect("run shmtrace serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("reachable from other machines") && stderr.contains("--listen-any"),
        "{stderr}"
    );
}

/// A relay listening on TCP is a usage error (exit 2), as serve's
/// non-UNIX consumer socket is, not an unreachable service (3); so is one
/// forwarding to a UNIX socket, over which no service takes a machine's
/// identity (its producers would pass for the central machine's).
#[test]
fn relay_refuses_a_tcp_listen_socket_and_a_unix_central_one_as_usage_errors() {
    let dir = TempDir::new("relaysockets");
    let listen = dir.path("relay.sock").display().to_string();
    for (to, listen, said) in [
        (
            "127.0.0.1:9",
            "127.0.0.1:0",
            "on a UNIX socket (a path or @name), not 127.0.0.1:0",
        ),
        (
            "/run/central.sock",
            listen.as_str(),
            "TCP or vsock producer socket (HOST:PORT, [IPV6]:PORT or vsock://CID:PORT), not \
             /run/central.sock",
        ),
    ] {
        let out = shmtrace()
            .args([
                "relay",
                "--log-level",
                "warn",
                "--to",
                to,
                "--listen",
                listen,
                // One let through stops at once, not holding up the test.
                "--exit-on-stdin-eof",
            ])
            .stdin(Stdio::null())
            .output()
            .expect("run shmtrace relay");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(said), "{stderr}");
    }
    assert!(!dir.path("relay.sock").exists(), "nothing listened");
}

/// A producer named `name` connected to `producer_socket`, its
/// `InitializeConnection` answered: the client (which holds the connection)
/// and its `ProducerPort`.
fn connect_producer(
    producer_socket: &Path,
    name: &str,
) -> (
    shmtrace_ipc::Client,
    shmtrace_ipc::Binding<shmtrace_ipc::protos::ProducerPort>,
) {
    use shmtrace_cli::consumer::{bind, next, CALL_TIMEOUT};
    use shmtrace_ipc::protos::{producer_port, InitializeConnectionRequest, ProducerPort};
    use shmtrace_ipc::socket::SocketAddress;

    let address = SocketAddress::Path(producer_socket.to_path_buf());
    let (client, port) = bind::<ProducerPort>(&address, |a, e| panic!("{a}: {e}")).unwrap();
    let mut init = port
        .start::<producer_port::InitializeConnection>(
            &InitializeConnectionRequest {
                producer_name: Some(name.into()),
                ..Default::default()
            },
            None,
        )
        .unwrap();
    next(&mut init, Some(CALL_TIMEOUT)).unwrap();
    (client, port)
}

/// A producer of `serve` at `producer_socket` commits a chunk the service
/// refuses (4 bytes inline: shorter than a chunk header), which raises the
/// service-wide `chunks_discarded` by 1; returns once the service
/// acknowledged it.
fn commit_a_refused_chunk(producer_socket: &Path) {
    use shmtrace_cli::consumer::{next, CALL_TIMEOUT};
    use shmtrace_ipc::protos::commit_data_request::ChunksToMove;
    use shmtrace_ipc::protos::{producer_port, CommitDataRequest};

    let (_client, port) = connect_producer(producer_socket, "refused");
    let mut commit = port
        .start::<producer_port::CommitData>(
            &CommitDataRequest {
                chunks_to_move: vec![ChunksToMove {
                    data: Some(vec![0; 4].into()),
                    ..Default::default()
                }],
                ..Default::default()
            },
            None,
        )
        .unwrap();
    next(&mut commit, Some(CALL_TIMEOUT)).unwrap();
}

/// `chunks_discarded` is the service's since it started, over every
/// session (as upstream's): a record whose session lost nothing says "no
/// loss" even after an earlier producer had a chunk refused, and counts
/// only what was refused while it ran; `inspect` shows the trace's
/// statistic and says whose count it is.
#[test]
fn service_wide_refusals_before_the_session_are_not_its_loss() {
    let dir = TempDir::new("service-wide");
    let (_serve, socket) = Serve::start(&dir);
    commit_a_refused_chunk(&dir.path("p.sock"));
    let trace = dir.path("t.pftrace");
    let out = shmtrace()
        .args([
            "record",
            "--socket",
            &socket,
            "--progress",
            "json",
            "-t",
            "300ms",
            "-o",
        ])
        .arg(&trace)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let done = events.last().unwrap();
    assert_eq!(done["event"], "done", "{events:?}");
    assert_eq!(done["summary"]["losses"], serde_json::json!([]), "{done}");
    for progress in events.iter().filter(|e| e["event"] == "progress") {
        assert_eq!(progress["losses"], serde_json::json!({}), "{progress}");
    }
    let (code, analysis) = inspect(&[&trace]);
    assert_eq!(code, 0);
    let stats = analysis["loss"]["stats"].to_string();
    assert!(
        stats.contains("service: chunks_discarded") && stats.contains("since it started"),
        "{stats}"
    );

    // One refused while the next session runs is its loss.
    let record = start_record(&socket, &trace);
    wait_until_tracing(&trace);
    commit_a_refused_chunk(&dir.path("p.sock"));
    signal(&record, rustix::process::Signal::INT);
    let result = record.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(result.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(
            "data loss     service: chunks_discarded = 1 during this session (2 since the \
             service started)"
        ),
        "{stderr}"
    );
}

/// The consumer commands pointed at the producer socket (and `trigger` at
/// the consumer socket) fail with exit 3 saying a service listens there,
/// on its other socket, not asking whether the service runs.
#[test]
fn the_wrong_socket_of_a_running_service_is_named_as_such() {
    let dir = TempDir::new("wrong-socket");
    let (_serve, consumer) = Serve::start(&dir);
    let producer = dir.path("p.sock").display().to_string();
    for args in [
        vec!["query", "--socket", &producer],
        vec!["record", "-t", "1s", "-o", "-", "--socket", &producer],
    ] {
        let out = run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {stderr}");
        assert!(
            stderr.contains(
                "A service listens there, but not for consumers: is it its producer socket?"
            ),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("Is the service running"), "{stderr}");
    }
    let out = run(&["trigger", "x", "--socket", &consumer]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr
            .contains("A service listens there, but not for producers: is it its consumer socket?"),
        "{stderr}"
    );
}

/// Standard output is no place for what the service writes itself (a
/// write_into_file trace: a pipe whose reader stops would stop the
/// service) nor for a snapshot: both are usage errors, said before
/// connecting.
#[test]
fn write_into_file_and_snapshots_refuse_standard_output() {
    for (args, said) in [
        (
            &["record", "--write-into-file", "-t", "1s", "-o", "-"][..],
            "write_into_file needs a file",
        ),
        (
            &["record", "--clone", "1", "-o", "-"][..],
            "a snapshot goes into a file",
        ),
        (
            &["record", "--clone-by-name", "flight", "-o", "-"][..],
            "a snapshot goes into a file",
        ),
    ] {
        let out = shmtrace()
            .args(args)
            .args(["--socket", "/nonexistent/shmtrace-consumer.sock"])
            .stdin(Stdio::null())
            .output()
            .expect("run shmtrace record");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(said), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: wrote a trace");
    }
}
