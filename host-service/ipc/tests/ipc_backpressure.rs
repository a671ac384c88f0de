//! The client's reply queues over a real socket pair: a service flooding a
//! call that its caller reads slowly stops the client's reader (so the
//! service's sends block) instead of growing the client's memory and
//! descriptors; a caller waiting on another call is never stuck behind the
//! full queue; a call left unread while others are served is cut off at
//! [`REPLY_QUEUE_LIMIT`], not the connection; and a call dropped by its
//! caller is cancelled: the replies the service goes on sending it are read
//! and discarded (counted, with their descriptors closed), holding up no
//! other call however many they are.

mod ipc_common;

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ipc_common::{memfd, memfd_named, memfds_named, read_fd};
use shmtrace_ipc::connection::{REPLY_QUEUE_DEPTH, REPLY_QUEUE_LIMIT};
use shmtrace_ipc::host::{HostConnection, PendingReply, ServiceTable};
use shmtrace_ipc::protos::{
    get_async_command_response as cmd, producer_port, GetAsyncCommandResponse, ProducerPort,
    SyncResponse,
};
use shmtrace_ipc::socket::{self, Received};
use shmtrace_ipc::{Binding, Client, ClientError, PendingCall};

const TIMEOUT: Option<Duration> = Some(Duration::from_secs(10));

/// How long the service's sends must make no progress to count as
/// blocked (a reader that keeps reading unblocks them within
/// microseconds).
const STALL: Duration = Duration::from_millis(200);

/// The `i`th command of a flood: a flush whose `flags` say `i`.
fn command(i: usize) -> GetAsyncCommandResponse {
    GetAsyncCommandResponse {
        cmd: Some(cmd::Cmd::Flush(cmd::Flush {
            data_source_ids: vec![],
            request_id: None,
            flags: Some(i as u64),
        })),
    }
}

fn index(reply: &GetAsyncCommandResponse) -> usize {
    match &reply.cmd {
        Some(cmd::Cmd::Flush(f)) => f.flags.unwrap() as usize,
        other => panic!("{other:?}"),
    }
}

/// The service end: answers binds, collects `calls` invocations.
struct Host {
    stream: UnixStream,
    conn: HostConnection<producer_port::Request>,
}

impl Host {
    fn new(stream: UnixStream) -> Self {
        Host {
            stream,
            conn: HostConnection::new(Arc::new(ServiceTable::from(ProducerPort)), None),
        }
    }

    /// The next `calls` invocations' reply handles.
    fn calls(&mut self, calls: usize) -> Vec<PendingReply> {
        let mut replies = Vec::new();
        while replies.len() < calls {
            match socket::recv_into(&self.stream, self.conn.decoder()).unwrap() {
                Received::Data(_) | Received::WouldBlock => {}
                Received::Closed => panic!("the client hung up"),
            }
            while let Some(call) = self.conn.poll_call().unwrap() {
                replies.push(call.reply);
            }
            self.flush();
        }
        replies
    }

    /// Queues commands `range` on `stream`, none of them final.
    fn commands(&mut self, stream: &PendingReply, range: std::ops::Range<usize>) {
        for i in range {
            self.conn
                .reply(stream, Ok(&command(i)), true, None)
                .unwrap();
        }
    }

    /// Sends everything queued (blocking).
    fn flush(&mut self) {
        while !self.conn.out().is_empty() {
            socket::send_queued(&self.stream, self.conn.out()).unwrap();
        }
    }

    /// Answers one more call (a Sync), then waits until the client hangs up.
    fn answer_one_then_close(mut self) {
        let call = self.calls(1).remove(0);
        self.conn.resolve(call, &SyncResponse {}).unwrap();
        self.flush();
        self.until_closed();
    }

    /// Waits until the client hangs up.
    fn until_closed(mut self) {
        self.stream.set_nonblocking(false).unwrap();
        let mut rest = Vec::new();
        let _ = self.stream.read_to_end(&mut rest);
    }
}

/// A client, and a host on a thread running `serve`.
fn connect(serve: impl FnOnce(Host) + Send + 'static) -> (Client, JoinHandle<()>) {
    let (client_sock, server_sock) = socket::pair().unwrap();
    let host = std::thread::spawn(move || serve(Host::new(server_sock)));
    (Client::from_stream(client_sock).unwrap(), host)
}

#[test]
fn a_call_read_slowly_stops_the_reader_not_the_memory() {
    const FLOOD: usize = 600;
    // The number of replies sent when the service's sends first stalled
    // for STALL (FLOOD if they never did).
    let (stalled_tx, stalled_rx) = mpsc::channel();
    let (client, host) = connect(move |mut host| {
        let stream = host.calls(1).remove(0);
        host.stream.set_nonblocking(true).unwrap();
        let mut reported = false;
        for i in 0..FLOOD {
            // Each with a descriptor, as SetupTracing carries the SMB.
            let fd = memfd(&i.to_le_bytes());
            host.conn
                .reply(&stream, Ok(&command(i)), i + 1 < FLOOD, Some(fd))
                .unwrap();
            let mut since = Instant::now();
            while !host.conn.out().is_empty() {
                if socket::send_queued(&host.stream, host.conn.out()).unwrap() > 0 {
                    since = Instant::now();
                } else if !reported && since.elapsed() >= STALL {
                    reported = true;
                    stalled_tx.send(i).unwrap();
                } else {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        if !reported {
            stalled_tx.send(FLOOD).unwrap();
        }
        host.until_closed();
    });
    let port = client.bind::<ProducerPort>().unwrap();
    let mut stream = port
        .start::<producer_port::GetAsyncCommand>(&Default::default(), None)
        .unwrap();
    // Nobody reads the stream: the reader fills its queue and stops.
    let stalled_at = stalled_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(
        stalled_at < FLOOD,
        "the service sent all {FLOOD} replies: the client read them into memory unread"
    );
    // The service's stall report can come before the reader (descheduled
    // on a loaded machine) has filled the queue; it fills it, and stops
    // there.
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.queued_replies() < REPLY_QUEUE_DEPTH && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        client.queued_replies(),
        REPLY_QUEUE_DEPTH,
        "the reader stops at the queue depth"
    );
    // Reading lets the rest flow: every reply arrives, in order, with its
    // descriptor; the queue never exceeds the depth.
    for i in 0..FLOOD {
        let reply = stream.next(TIMEOUT).unwrap().unwrap();
        assert_eq!(index(&reply.message), i);
        assert_eq!(reply.has_more, i + 1 < FLOOD);
        assert_eq!(read_fd(reply.fd.unwrap()), i.to_le_bytes());
        assert!(client.queued_replies() <= REPLY_QUEUE_DEPTH);
    }
    assert!(stream.next(TIMEOUT).is_none());
    drop((stream, port, client));
    host.join().unwrap();
}

type Stream = PendingCall<producer_port::GetAsyncCommand>;

/// Binds and starts a command stream, then a Sync.
fn stream_and_sync(
    client: &Client,
) -> (
    Binding<ProducerPort>,
    Stream,
    PendingCall<producer_port::Sync>,
) {
    let port = client.bind::<ProducerPort>().unwrap();
    let stream = port
        .start::<producer_port::GetAsyncCommand>(&Default::default(), None)
        .unwrap();
    let sync = port
        .start::<producer_port::Sync>(&Default::default(), None)
        .unwrap();
    (port, stream, sync)
}

/// Starts a stream and a Sync; the service answers the Sync only after
/// `flood` replies to the stream (then two more, the last final). Returns
/// the Sync's result as `wait` awaited it, and the stream's replies.
fn a_reply_behind_a_flood(
    flood: usize,
    wait: impl FnOnce(&mut PendingCall<producer_port::Sync>) -> Result<(), ClientError>,
) -> (Result<(), ClientError>, Vec<Result<usize, ClientError>>) {
    let (client, host) = connect(move |mut host| {
        let calls = host.calls(2);
        host.commands(&calls[0], 0..flood);
        host.conn
            .resolve(calls[1].clone(), &SyncResponse {})
            .unwrap();
        for i in flood..flood + 2 {
            host.conn
                .reply(&calls[0], Ok(&command(i)), i == flood, None)
                .unwrap();
        }
        host.flush();
        host.until_closed();
    });
    let (port, mut stream, mut sync) = stream_and_sync(&client);
    let synced = wait(&mut sync);
    let mut replies = Vec::new();
    while let Some(reply) = stream.next(TIMEOUT) {
        replies.push(reply.map(|r| index(&r.message)));
    }
    assert!(
        port.start::<producer_port::Sync>(&Default::default(), None)
            .is_ok(),
        "the connection is up"
    );
    drop((stream, sync, port, client));
    host.join().unwrap();
    (synced, replies)
}

/// `replies` are the first `n` replies, in order.
fn in_order(replies: &[Result<usize, ClientError>], n: usize) -> bool {
    replies.len() == n
        && replies
            .iter()
            .enumerate()
            .all(|(i, r)| matches!(r, Ok(k) if *k == i))
}

#[test]
fn a_caller_waiting_on_another_call_is_not_stuck_behind_a_full_queue() {
    let flood = 3 * REPLY_QUEUE_DEPTH;
    let (synced, replies) =
        a_reply_behind_a_flood(flood, |sync| sync.next(TIMEOUT).unwrap().map(|_| ()));
    synced.expect("the Sync reply, queued behind the stream's");
    assert!(in_order(&replies, flood + 2), "{replies:?}");
}

#[test]
fn a_caller_polling_another_call_is_not_stuck_behind_a_full_queue() {
    let flood = 3 * REPLY_QUEUE_DEPTH;
    let (synced, replies) = a_reply_behind_a_flood(flood, |sync| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match sync.next(Some(Duration::ZERO)) {
                Some(Err(ClientError::Timeout)) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Some(result) => return result.map(|_| ()),
                None => return Err(ClientError::Disconnected),
            }
        }
    });
    synced.expect("the Sync reply, queued behind the stream's");
    assert!(in_order(&replies, flood + 2), "{replies:?}");
}

#[test]
fn a_call_left_unread_is_cut_off_at_the_limit_not_the_connection() {
    let flood = REPLY_QUEUE_LIMIT + 100;
    let (synced, replies) =
        a_reply_behind_a_flood(flood, |sync| sync.next(TIMEOUT).unwrap().map(|_| ()));
    synced.expect("the Sync reply, queued behind the stream's");
    // The first REPLY_QUEUE_LIMIT, in order, then the overrun; the rest
    // were dropped.
    assert_eq!(replies.len(), REPLY_QUEUE_LIMIT + 1);
    assert!(in_order(&replies[..REPLY_QUEUE_LIMIT], REPLY_QUEUE_LIMIT));
    assert!(
        matches!(replies[REPLY_QUEUE_LIMIT], Err(ClientError::Overrun)),
        "{:?}",
        replies[REPLY_QUEUE_LIMIT]
    );
}

/// Starts a stream and a Sync; the service sends `before` replies to the
/// stream, of which the caller reads `read`, then the caller drops the
/// stream. The service then sends `flood` more replies to it (the last
/// final), each with a descriptor, and only then answers the Sync; then it
/// serves one more Sync. No caller waits while the flood is sent, so a
/// reader that held back for the dropped call would stall the service for
/// good.
fn a_flood_for_a_dropped_call(before: usize, read: usize, flood: usize) {
    let (dropped_tx, dropped_rx) = mpsc::channel();
    let (flooded_tx, flooded_rx) = mpsc::channel();
    // Replies of the flood sent so far (for the failure message).
    let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let sent_by_host = Arc::clone(&sent);
    // The flood's descriptors, by name (tests of this binary run at once).
    let name = format!("dropped-call-flood-{before}-{read}");
    let host_name = name.clone();
    let (client, host) = connect(move |mut host| {
        let calls = host.calls(2);
        host.commands(&calls[0], 0..before);
        host.flush();
        dropped_rx.recv().unwrap();
        for i in before..before + flood {
            let fd = memfd_named(&host_name, &i.to_le_bytes());
            let last = i + 1 == before + flood;
            host.conn
                .reply(&calls[0], Ok(&command(i)), !last, Some(fd))
                .unwrap();
            host.flush();
            sent_by_host.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        flooded_tx.send(()).unwrap();
        host.conn
            .resolve(calls[1].clone(), &SyncResponse {})
            .unwrap();
        host.flush();
        host.answer_one_then_close();
    });
    let (port, mut stream, mut sync) = stream_and_sync(&client);
    for i in 0..read {
        let reply = stream.next(TIMEOUT).unwrap().unwrap();
        assert_eq!((index(&reply.message), reply.has_more), (i, true));
    }
    let unread = before - read;
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.queued_replies() < unread && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(client.queued_replies(), unread);
    assert_eq!(client.pending_requests(), 2, "the stream and the Sync");
    drop(stream);
    assert_eq!(
        client.pending_requests(),
        1,
        "the dropped stream is no longer pending"
    );
    assert_eq!(client.queued_replies(), 0);
    assert_eq!(client.discarded_replies(), unread as u64);
    dropped_tx.send(()).unwrap();
    // Nobody waits on a call: only a reader that reads on lets the flood
    // through.
    assert!(
        flooded_rx.recv_timeout(Duration::from_secs(20)).is_ok(),
        "the service's sends stalled after {} of the {flood} replies to the dropped call",
        sent.load(std::sync::atomic::Ordering::Relaxed)
    );
    sync.next(TIMEOUT)
        .unwrap()
        .expect("the Sync reply, behind the flood");
    assert_eq!(client.discarded_replies(), (unread + flood) as u64);
    assert_eq!(client.pending_requests(), 0);
    // The service closed each after sending it (the Sync reply came after
    // the last); the client closed each as it discarded the reply.
    assert_eq!(
        memfds_named(&name),
        0,
        "descriptors of the dropped call's replies still open"
    );
    port.call::<producer_port::Sync>(&Default::default())
        .expect("the connection is up");
    drop((sync, port, client));
    host.join().unwrap();
}

#[test]
fn replies_to_a_dropped_call_hold_up_no_other_call() {
    a_flood_for_a_dropped_call(0, 0, 2 * REPLY_QUEUE_LIMIT);
}

#[test]
fn replies_to_a_stream_dropped_mid_stream_hold_up_no_other_call() {
    a_flood_for_a_dropped_call(10, 3, 2 * REPLY_QUEUE_LIMIT);
}

#[test]
fn a_call_timed_out_then_dropped_is_cancelled() {
    let (dropped_tx, dropped_rx) = mpsc::channel();
    let (client, host) = connect(move |mut host| {
        let first = host.calls(1).remove(0);
        dropped_rx.recv().unwrap();
        // Late: its caller gave up. Then a reply to an id never issued.
        host.conn.resolve(first, &SyncResponse {}).unwrap();
        host.conn
            .resolve(PendingReply::new(1_000_000, false), &SyncResponse {})
            .unwrap();
        host.flush();
        host.answer_one_then_close();
    });
    let port = client.bind::<ProducerPort>().unwrap();
    assert_eq!(client.pending_requests(), 0, "the bind was answered");
    let mut call = port
        .start::<producer_port::Sync>(&Default::default(), None)
        .unwrap();
    assert!(matches!(
        call.next(Some(Duration::from_millis(20))),
        Some(Err(ClientError::Timeout))
    ));
    assert_eq!(client.pending_requests(), 1);
    drop(call);
    assert_eq!(
        client.pending_requests(),
        0,
        "the dropped call is cancelled"
    );
    dropped_tx.send(()).unwrap();
    port.call::<producer_port::Sync>(&Default::default())
        .expect("the next call gets its own reply");
    assert_eq!(
        client.discarded_replies(),
        2,
        "the late reply and the one to an id never issued"
    );
    assert_eq!(client.pending_requests(), 0);
    drop((port, client));
    host.join().unwrap();
}
