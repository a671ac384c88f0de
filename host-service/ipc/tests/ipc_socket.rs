//! The IPC layer over real socket pairs: partial and coalesced reads, file
//! descriptors in both directions, hostile input, hang-ups, and many
//! concurrent streaming calls.

mod ipc_common;

use std::io::{Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::AsFd;
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use ipc_common::{memfd, read_fd, serve, End};
use prost::Message;
use shmtrace_ipc::client::{BindError, RpcError};
use shmtrace_ipc::frame::{
    bind_service_frame, encode_frame, invoke_method_frame, FrameDecoder, FrameError,
    MAX_PAYLOAD_LEN,
};
use shmtrace_ipc::host::{HostConnection, HostError, ServiceTable};
use shmtrace_ipc::protos::{
    commit_data_request::ChunksToMove, get_async_command_response as cmd, ipc_frame::Msg,
    producer_port, CommitDataRequest, GetAsyncCommandResponse, InitializeConnectionRequest,
    InitializeConnectionResponse, IpcFrame, ProducerPort, SyncResponse,
};
use shmtrace_ipc::rpc::ServiceRequest;
use shmtrace_ipc::socket::{self, Received, RecvError};
use shmtrace_ipc::{Client, ClientError, ProtocolError};
use std::sync::Arc;

const TIMEOUT: Option<Duration> = Some(Duration::from_secs(30));

fn frame_bytes(frame: &IpcFrame) -> Vec<u8> {
    let mut out = Vec::new();
    encode_frame(frame, &mut out).unwrap();
    out
}

fn commit(i: u32) -> IpcFrame {
    let req = CommitDataRequest {
        chunks_to_move: vec![ChunksToMove {
            page: Some(i),
            chunk: Some(i % 14),
            target_buffer: Some(1),
            ..Default::default()
        }],
        flush_request_id: Some(u64::from(i)),
        ..Default::default()
    };
    invoke_method_frame(u64::from(i) + 10, 1, 4, req.encode_to_vec().into(), true)
}

fn expect_commit(call: shmtrace_ipc::Call<producer_port::Request>, i: u32) {
    assert_eq!(call.reply.request_id(), u64::from(i) + 10);
    assert!(call.reply.drop_reply());
    match call.request {
        producer_port::Request::CommitData(c) => {
            assert_eq!(c.flush_request_id, Some(u64::from(i)));
            assert_eq!(c.chunks_to_move[0].page, Some(i));
        }
        other => panic!("{other:?}"),
    }
}

fn host() -> HostConnection<producer_port::Request> {
    HostConnection::new(Arc::new(ServiceTable::from(ProducerPort)), None)
}

#[test]
fn partial_reads_byte_by_byte() {
    let (mut client, server) = socket::pair().unwrap();
    let mut stream = frame_bytes(&bind_service_frame(1, "ProducerPort"));
    for i in 0..20 {
        stream.extend(frame_bytes(&commit(i)));
    }
    let mut host = host();
    let mut next = 0;
    for byte in &stream {
        client.write_all(&[*byte]).unwrap();
        assert_eq!(
            socket::recv_into(&server, host.decoder()).unwrap(),
            Received::Data(1)
        );
        while let Some(call) = host.poll_call().unwrap() {
            expect_commit(call, next);
            next += 1;
        }
    }
    assert_eq!(next, 20);
    assert_eq!(host.decoder().buffered(), 0);
    // The bind was answered by the host itself.
    let mut replies = FrameDecoder::new();
    let seg = host.out().next_send().unwrap();
    replies.push(seg.bytes, None);
    match replies.next_frame().unwrap().unwrap().frame.msg {
        Some(Msg::MsgBindServiceReply(r)) => {
            assert_eq!((r.success, r.methods.len()), (Some(true), 14))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn many_frames_in_one_read() {
    let (mut client, server) = socket::pair().unwrap();
    let mut stream = Vec::new();
    for i in 0..500 {
        stream.extend(frame_bytes(&commit(i)));
    }
    client.write_all(&stream).unwrap();
    let mut host = host();
    let Received::Data(first) = socket::recv_into(&server, host.decoder()).unwrap() else {
        panic!("no data")
    };
    let mut calls = 0;
    while let Some(call) = host.poll_call().unwrap() {
        expect_commit(call, calls);
        calls += 1;
    }
    assert!(
        calls > 100,
        "one read of {first} bytes decoded {calls} frames"
    );
    while (calls as usize) < 500 {
        socket::recv_into(&server, host.decoder()).unwrap();
        while let Some(call) = host.poll_call().unwrap() {
            expect_commit(call, calls);
            calls += 1;
        }
    }
    assert_eq!(host.decoder().buffered(), 0);
}

#[test]
fn fds_travel_with_their_frames_in_both_directions() {
    let (client_sock, server_sock) = socket::pair().unwrap();
    let server = serve(
        server_sock,
        ServiceTable::from(ProducerPort),
        |conn, call| match call.request {
            producer_port::Request::InitializeConnection(req) => {
                assert_eq!(req.producer_provided_shmem, Some(true));
                assert_eq!(
                    read_fd(call.fd.expect("the producer's shared memory")),
                    b"from the producer"
                );
                let reply = InitializeConnectionResponse {
                    using_shmem_provided_by_producer: Some(true),
                    ..Default::default()
                };
                conn.resolve(call.reply, &reply).unwrap();
            }
            producer_port::Request::GetAsyncCommand(_) => {
                assert!(call.fd.is_none());
                let setup_ds = GetAsyncCommandResponse {
                    cmd: Some(cmd::Cmd::SetupDataSource(cmd::SetupDataSource {
                        new_instance_id: Some(1),
                        config: None,
                    })),
                };
                let setup_tracing = GetAsyncCommandResponse {
                    cmd: Some(cmd::Cmd::SetupTracing(cmd::SetupTracing {
                        shared_buffer_page_size_kb: Some(4),
                        shm_key_windows: None,
                    })),
                };
                let stop = GetAsyncCommandResponse {
                    cmd: Some(cmd::Cmd::StopDataSource(cmd::StopDataSource {
                        instance_id: Some(1),
                    })),
                };
                // Queued together: the fd must land on the middle frame only.
                conn.reply(&call.reply, Ok(&setup_ds), true, None).unwrap();
                conn.reply(
                    &call.reply,
                    Ok(&setup_tracing),
                    true,
                    Some(memfd(b"from the service")),
                )
                .unwrap();
                conn.reply(&call.reply, Ok(&stop), false, None).unwrap();
            }
            other => panic!("{other:?}"),
        },
    );

    let client = Client::from_stream(client_sock).unwrap();
    let port = client.bind::<ProducerPort>().unwrap();
    let init = InitializeConnectionRequest {
        producer_provided_shmem: Some(true),
        ..Default::default()
    };
    let reply = port
        .start::<producer_port::InitializeConnection>(&init, Some(memfd(b"from the producer")))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(reply.message.using_shmem_provided_by_producer, Some(true));
    assert!(reply.fd.is_none());

    let mut stream = port
        .start::<producer_port::GetAsyncCommand>(&Default::default(), None)
        .unwrap();
    let first = stream.next(TIMEOUT).unwrap().unwrap();
    assert!(matches!(
        first.message.cmd,
        Some(cmd::Cmd::SetupDataSource(_))
    ));
    assert!(first.fd.is_none() && first.has_more);
    let second = stream.next(TIMEOUT).unwrap().unwrap();
    assert!(matches!(
        second.message.cmd,
        Some(cmd::Cmd::SetupTracing(_))
    ));
    assert_eq!(
        read_fd(second.fd.expect("the service's shared memory")),
        b"from the service"
    );
    let third = stream.next(TIMEOUT).unwrap().unwrap();
    assert!(third.fd.is_none() && !third.has_more);
    assert!(stream.next(TIMEOUT).is_none(), "the stream ended");

    drop(port);
    drop(client);
    assert!(matches!(server.join().unwrap(), End::Closed));
}

#[test]
fn an_oversized_length_closes_the_connection_without_allocating_it() {
    let (mut client, server_sock) = socket::pair().unwrap();
    let server = serve(server_sock, ServiceTable::from(ProducerPort), |_, call| {
        panic!("{call:?}")
    });
    client
        .write_all(&(MAX_PAYLOAD_LEN as u32 + 1).to_le_bytes())
        .unwrap();
    client.write_all(&[0; 100]).unwrap();
    match server.join().unwrap() {
        End::Protocol(HostError::Frame(FrameError::TooLarge { len })) => {
            assert_eq!(len as usize, MAX_PAYLOAD_LEN + 1)
        }
        other => panic!("{other:?}"),
    }
    // A u32::MAX length is just as harmless.
    let mut host = host();
    host.decoder().push(&u32::MAX.to_le_bytes(), None);
    assert!(matches!(
        host.poll_call(),
        Err(HostError::Frame(FrameError::TooLarge { .. }))
    ));
}

#[test]
fn garbage_closes_the_connection() {
    let (mut client, server_sock) = socket::pair().unwrap();
    let (tx, rx) = mpsc::channel();
    let server = serve(
        server_sock,
        ServiceTable::from(ProducerPort),
        move |_, call| {
            tx.send(call.reply.request_id()).unwrap();
        },
    );
    // A valid frame first: it is served before the garbage is seen.
    client.write_all(&frame_bytes(&commit(1))).unwrap();
    client
        .write_all(&[6, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff])
        .unwrap();
    match server.join().unwrap() {
        End::Protocol(HostError::Frame(FrameError::Malformed(_))) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(rx.try_iter().collect::<Vec<_>>(), [11]);
}

#[test]
fn the_host_survives_a_peer_hanging_up_mid_frame() {
    let (mut client, server_sock) = socket::pair().unwrap();
    let (tx, rx) = mpsc::channel();
    let server = serve(
        server_sock,
        ServiceTable::from(ProducerPort),
        move |_, call| {
            tx.send(call.reply.request_id()).unwrap();
        },
    );
    let whole = frame_bytes(&commit(1));
    let next = frame_bytes(&commit(2));
    client.write_all(&whole).unwrap();
    client.write_all(&next[..next.len() / 2]).unwrap();
    drop(client);
    assert!(matches!(server.join().unwrap(), End::Closed));
    assert_eq!(
        rx.try_iter().collect::<Vec<_>>(),
        [11],
        "only the whole frame was served"
    );
}

#[test]
fn the_client_fails_pending_calls_when_the_service_hangs_up_mid_reply() {
    let (client_sock, mut server_sock) = socket::pair().unwrap();
    let client = Client::from_stream(client_sock).unwrap();
    let fake_host = std::thread::spawn(move || {
        let mut host = host();
        loop {
            socket::recv_into(&server_sock, host.decoder()).unwrap();
            if let Some(call) = host.poll_call().unwrap() {
                // Half of a reply, then hang up.
                host.resolve(call.reply, &SyncResponse {}).unwrap();
                let seg = host.out().next_send().unwrap();
                server_sock
                    .write_all(&seg.bytes[..seg.bytes.len() / 2])
                    .unwrap();
                return;
            }
            socket::send_queued(&server_sock, host.out()).unwrap();
        }
    });
    let port = client.bind::<ProducerPort>().unwrap();
    let pending = port
        .start::<producer_port::Sync>(&Default::default(), None)
        .unwrap();
    fake_host.join().unwrap();
    // A close mid-frame is the service's fault, not an ordinary close:
    // every call, pending or later, is told how far the frame got.
    let error = pending.wait().unwrap_err();
    assert!(
        matches!(
            error,
            ClientError::Protocol(ProtocolError::ClosedMidFrame { buffered }) if buffered > 0
        ),
        "{error}"
    );
    assert!(matches!(
        port.call::<producer_port::Sync>(&Default::default()),
        Err(ClientError::Protocol(ProtocolError::ClosedMidFrame { .. }))
    ));
}

#[test]
fn the_client_drops_a_service_that_sends_an_oversized_frame() {
    let (client_sock, mut server_sock) = socket::pair().unwrap();
    let client = Client::from_stream(client_sock).unwrap();
    let fake_host = std::thread::spawn(move || {
        let mut host = host();
        loop {
            socket::recv_into(&server_sock, host.decoder()).unwrap();
            if host.poll_call().unwrap().is_some() {
                server_sock.write_all(&u32::MAX.to_le_bytes()).unwrap();
                // Keep the socket open: the client must close it.
                let mut rest = Vec::new();
                let _ = server_sock.read_to_end(&mut rest);
                return;
            }
            socket::send_queued(&server_sock, host.out()).unwrap();
        }
    });
    let port = client.bind::<ProducerPort>().unwrap();
    let pending = port
        .start::<producer_port::Sync>(&Default::default(), None)
        .unwrap();
    let error = pending.wait().unwrap_err();
    assert!(
        matches!(
            error,
            ClientError::Protocol(ProtocolError::Frame(FrameError::TooLarge { len: u32::MAX }))
        ),
        "{error}"
    );
    assert!(error.to_string().contains("exceeds"), "{error}");
    fake_host.join().unwrap();
}

#[test]
fn unknown_services_and_methods() {
    let (client_sock, server_sock) = socket::pair().unwrap();
    let (tx, rx) = mpsc::channel();
    let server = serve(
        server_sock,
        ServiceTable::from(ProducerPort),
        move |conn, call| {
            tx.send(call.method.name).unwrap();
            conn.reject(call.reply);
        },
    );
    let client = Client::from_stream(client_sock).unwrap();
    assert!(matches!(
        client.bind_by_name("NoSuchPort"),
        Err(ClientError::Bind(BindError::UnknownService(name))) if name == "NoSuchPort"
    ));
    let port = client.bind::<ProducerPort>().unwrap();
    // Not in the method table: an error for the caller, nothing is sent.
    match client.invoke_raw(port.binding(), "NoSuchMethod", Bytes::new(), None, true) {
        Err(ClientError::UnknownMethod(e)) => assert_eq!(e.method, "NoSuchMethod"),
        other => panic!("{other:?}"),
    }
    // A rejected call.
    match port.call::<producer_port::Sync>(&Default::default()) {
        Err(ClientError::Rpc(RpcError::Rejected(m))) => assert_eq!(m, "ProducerPort.Sync"),
        other => panic!("{other:?}"),
    }
    assert_eq!(rx.try_iter().collect::<Vec<_>>(), ["Sync"]);
    drop(port);
    drop(client);
    server.join().unwrap();

    // An unknown method id gets success=false, even with drop_reply.
    let (mut raw, server_sock) = socket::pair().unwrap();
    let server = serve(server_sock, ServiceTable::from(ProducerPort), |_, call| {
        panic!("{call:?}")
    });
    raw.write_all(&frame_bytes(&invoke_method_frame(
        5,
        1,
        99,
        Bytes::new(),
        true,
    )))
    .unwrap();
    raw.write_all(&frame_bytes(&invoke_method_frame(
        6,
        2,
        1,
        Bytes::new(),
        false,
    )))
    .unwrap();
    let mut dec = FrameDecoder::new();
    let mut replies = Vec::new();
    while replies.len() < 2 {
        socket::recv_into(&raw, &mut dec).unwrap();
        while let Some(f) = dec.next_frame().unwrap() {
            replies.push(frame_bytes(&f.frame));
        }
    }
    assert_eq!(replies[0], b"\x06\x00\x00\x00\x10\x05\x32\x02\x08\x00");
    assert_eq!(replies[1], b"\x06\x00\x00\x00\x10\x06\x32\x02\x08\x00");
    drop(raw);
    server.join().unwrap();
}

#[test]
fn ten_thousand_concurrent_requests_with_interleaved_streaming_replies() {
    const CALLS: usize = 10_000;
    const THREADS: usize = 4;
    const ROUNDS: u64 = 3;
    let (client_sock, server_sock) = socket::pair().unwrap();
    let mut waiting = Vec::new();
    let server = serve(
        server_sock,
        ServiceTable::from(ProducerPort),
        move |conn, call| {
            assert!(matches!(
                call.request,
                producer_port::Request::GetAsyncCommand(_)
            ));
            waiting.push(call.reply);
            if waiting.len() == CALLS {
                // Round-robin over every open stream: replies of different calls
                // interleave on the wire.
                for round in 0..ROUNDS {
                    for reply in &waiting {
                        let msg = GetAsyncCommandResponse {
                            cmd: Some(cmd::Cmd::Flush(cmd::Flush {
                                data_source_ids: vec![],
                                request_id: Some(reply.request_id()),
                                flags: Some(round),
                            })),
                        };
                        conn.reply(reply, Ok(&msg), round + 1 < ROUNDS, None)
                            .unwrap();
                    }
                }
            }
        },
    );
    let client = Client::from_stream(client_sock).unwrap();
    let port = client.bind::<ProducerPort>().unwrap();
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let port = port.clone();
            std::thread::spawn(move || {
                let mut calls: Vec<_> = (0..CALLS / THREADS)
                    .map(|_| {
                        port.start::<producer_port::GetAsyncCommand>(&Default::default(), None)
                            .unwrap()
                    })
                    .collect();
                for call in &mut calls {
                    let id = call.request_id();
                    for round in 0..ROUNDS {
                        let reply = call.next(TIMEOUT).unwrap().unwrap();
                        assert_eq!(reply.has_more, round + 1 < ROUNDS);
                        match reply.message.cmd {
                            Some(cmd::Cmd::Flush(f)) => {
                                assert_eq!((f.request_id, f.flags), (Some(id), Some(round)))
                            }
                            other => panic!("{other:?}"),
                        }
                    }
                    assert!(call.next(TIMEOUT).is_none());
                }
                calls.len()
            })
        })
        .collect();
    let total: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert_eq!(total, CALLS);
    drop(port);
    drop(client);
    assert!(matches!(server.join().unwrap(), End::Closed));
}

#[test]
fn a_truncated_control_message_fails_the_read() {
    let (client, server) = socket::pair().unwrap();
    let null = std::fs::File::open("/dev/null").unwrap();
    let fds: Vec<_> = (0..16).map(|_| null.as_fd()).collect();
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(16))];
    let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
    assert!(control.push(rustix::net::SendAncillaryMessage::ScmRights(&fds)));
    rustix::net::sendmsg(
        &client,
        &[std::io::IoSlice::new(b"x")],
        &mut control,
        rustix::net::SendFlags::empty(),
    )
    .unwrap();
    let mut dec = FrameDecoder::new();
    assert!(matches!(
        socket::recv_into(&server, &mut dec),
        Err(RecvError::Truncated)
    ));
    assert_eq!(dec.buffered(), 0);
}

#[test]
fn requests_decoded_by_the_host_match_what_the_client_sent() {
    let (client_sock, server_sock) = socket::pair().unwrap();
    let (tx, rx) = mpsc::channel();
    let server = serve(
        server_sock,
        ServiceTable::from(ProducerPort),
        move |conn, call| {
            tx.send((call.request.encode_args(), call.service_id))
                .unwrap();
            conn.resolve(call.reply, &InitializeConnectionResponse::default())
                .unwrap();
        },
    );
    let client = Client::from_stream(client_sock).unwrap();
    let port = client.bind::<ProducerPort>().unwrap();
    let req = InitializeConnectionRequest {
        producer_name: Some("p".into()),
        sdk_version: Some("v".into()),
        shm_key_windows: Some("k".into()),
        ..Default::default()
    };
    port.call::<producer_port::InitializeConnection>(&req)
        .unwrap();
    let (args, service_id) = rx.recv().unwrap();
    assert_eq!(service_id, port.binding().service_id());
    // Declaration order, as Perfetto writes it.
    assert_eq!(&args[..], b"\x1a\x01p\x42\x01v\x3a\x01k");
    drop(port);
    drop(client);
    server.join().unwrap();
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// A hostile client sends a large frame one byte and one fd per `sendmsg`:
/// the decoder holds at most one of its fds at a time, not one per byte
/// (4096 of them: above the common soft `RLIMIT_NOFILE` of 1024, where an
/// unbounded decoder would exhaust the descriptor table).
#[test]
fn a_client_cannot_park_an_fd_per_byte_of_a_partial_frame() {
    const BYTES: usize = 4096;
    let (client, server) = socket::pair().unwrap();
    let frame = invoke_method_frame(5, 1, 4, Bytes::from(vec![0x2a; BYTES]), false);
    let stream = frame_bytes(&frame);
    let file = memfd(b"payload fd");
    let before = open_fds();
    let mut dec = FrameDecoder::new();
    let mut received = 0;
    let mut got = None;
    for (i, byte) in stream.iter().enumerate() {
        let sent = socket::send_with_fd(&client, std::slice::from_ref(byte), Some(file.as_fd()));
        assert_eq!(sent.unwrap(), 1);
        // One byte with its fd per read: Linux ends a read at a segment with fds.
        assert_eq!(
            socket::recv_into(&server, &mut dec).unwrap(),
            Received::Data(1)
        );
        received += 1;
        assert!(
            dec.parked_fds() <= 1,
            "{} fds parked after byte {i}",
            dec.parked_fds()
        );
        if let Some(f) = dec.next_frame().unwrap() {
            got = Some(f);
        }
        if i % 512 == 0 {
            // Other tests of this binary run in parallel threads: allow slack.
            assert!(
                open_fds() < before + 64,
                "fd table grows: {} -> {}",
                before,
                open_fds()
            );
        }
    }
    assert_eq!(received, stream.len());
    assert_eq!(dec.fds_closed(), stream.len() as u64 - 1);
    let got = got.expect("the frame completes");
    assert_eq!(got.frame, frame);
    assert_eq!(
        read_fd(got.fd.expect("the frame keeps one fd")),
        b"payload fd"
    );
    assert_eq!(dec.parked_fds(), 0);
}

/// The client over TCP (`Client::connect` takes any family): calls work as
/// over a UNIX socket, and a request with a descriptor, which TCP cannot
/// carry, is refused before anything is sent, the connection still up.
#[test]
fn the_client_speaks_over_tcp_and_refuses_descriptors_there() {
    use shmtrace_ipc::socket::{Family, Listener, SocketAddress};
    let listener = Listener::bind(&SocketAddress::parse("127.0.0.1:0").unwrap()).unwrap();
    let port_number = listener.local_port().unwrap();
    let address = SocketAddress::parse(&format!("127.0.0.1:{port_number}")).unwrap();
    let accepted = std::thread::spawn(move || listener.accept_stream().unwrap());
    let client = Client::connect(&address).unwrap();
    let stream = accepted.join().unwrap();
    assert_eq!(stream.family(), Family::Tcp);
    assert!(!stream.passes_fds());
    let (tx, rx) = mpsc::channel();
    // The test's host loop takes a UnixStream; it only uses recvmsg and
    // sendmsg, which a TCP socket serves the same way.
    let server_sock = std::os::unix::net::UnixStream::from(std::os::fd::OwnedFd::from(stream));
    let server = serve(
        server_sock,
        ServiceTable::from(ProducerPort),
        move |conn, call| match call.request {
            producer_port::Request::InitializeConnection(r) => {
                tx.send(r.producer_name).unwrap();
                let reply = InitializeConnectionResponse {
                    use_shmem_emulation: Some(true),
                    ..Default::default()
                };
                conn.resolve(call.reply, &reply).unwrap();
            }
            other => panic!("unexpected {other:?}"),
        },
    );
    let port = client.bind::<ProducerPort>().unwrap();
    let init = |name: &str| {
        port.call::<producer_port::InitializeConnection>(&InitializeConnectionRequest {
            producer_name: Some(name.into()),
            ..Default::default()
        })
    };
    assert_eq!(init("first").unwrap().use_shmem_emulation, Some(true));
    let refused = port
        .send::<producer_port::CommitData>(&CommitDataRequest::default(), Some(memfd(b"smb")))
        .unwrap_err();
    assert!(
        matches!(&refused, ClientError::Io(e) if e.kind() == std::io::ErrorKind::InvalidInput),
        "{refused}"
    );
    // Nothing of the refused request reached the service; the connection
    // still carries calls.
    assert_eq!(init("second").unwrap().use_shmem_emulation, Some(true));
    let names: Vec<_> = rx.try_iter().collect();
    assert_eq!(names, [Some("first".into()), Some("second".into())]);
    drop(port);
    drop(client);
    assert!(matches!(server.join().unwrap(), End::Closed));
}
