//! Entry points for the fuzz targets in `fuzz/` (also run by the tests on
//! the golden captures, so they stay correct without a fuzzer).

use std::sync::Arc;

use bytes::Bytes;
use prost::Message;

use crate::client::{ClientCore, Incoming};
use crate::frame::FrameDecoder;
use crate::host::{HostConnection, ServiceTable};
use crate::protos::{
    canonical, consumer_port, producer_port, relay_port, ConsumerPort, IpcFrame, ProducerPort,
    RelayPort, SyncResponse,
};
use crate::rpc::ServiceRequest;

/// Requests of a host exposing every port.
#[derive(Debug)]
enum Either {
    Producer(producer_port::Request),
    Consumer(consumer_port::Request),
    /// Boxed: `InitRelay` carries a whole `SystemInfo`.
    Relay(Box<relay_port::Request>),
}

/// Feeds `data` (after a first byte choosing the read size) to a host
/// exposing the three ports on a remote (TCP-like) connection, which takes
/// a relay's `SetPeerIdentity`, and to a client, as if a hostile peer had
/// sent it.
///
/// Checks: nothing panics; every call the host dispatches re-encodes and
/// decodes to the same request; at most one peer identity is ever taken;
/// every decoded frame survives a canonical encode/decode round trip; the
/// host's replies are valid frames.
pub fn ipc_frame(data: &[u8]) {
    let Some((&seed, data)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(seed % 61) + 1;
    let table = ServiceTable::new()
        .expose::<ProducerPort>(Either::Producer)
        .expose::<ConsumerPort>(Either::Consumer)
        .expose::<RelayPort>(|r| Either::Relay(Box::new(r)));
    let mut host = HostConnection::remote(Arc::new(table));
    let mut identities = 0;
    let mut client = ClientCore::<u8>::new();
    let mut client_decoder = FrameDecoder::new();
    // Make the client expect replies to the first few request ids.
    for _ in 0..4 {
        client.bind("ProducerPort", 0);
    }
    let mut host_ok = true;
    let mut client_ok = true;

    for piece in data.chunks(chunk) {
        if host_ok {
            host.decoder().push(piece, None);
            loop {
                let polled = host.poll_call();
                identities += usize::from(host.take_peer_identity().is_some());
                assert!(identities <= 1, "a second peer identity was taken");
                match polled {
                    Ok(Some(call)) => {
                        match &call.request {
                            Either::Relay(r) => {
                                let again =
                                    relay_port::Request::decode(r.method().id, r.encode_args())
                                        .expect("a re-encoded request decodes");
                                assert_eq!(&again, &**r);
                            }
                            Either::Producer(r) => {
                                let again =
                                    producer_port::Request::decode(r.method().id, r.encode_args())
                                        .expect("a re-encoded request decodes");
                                assert_eq!(&again, r);
                            }
                            Either::Consumer(r) => {
                                let again =
                                    consumer_port::Request::decode(r.method().id, r.encode_args())
                                        .expect("a re-encoded request decodes");
                                assert_eq!(&again, r);
                            }
                        }
                        if call.method.server_streaming {
                            let _ = host.reply(&call.reply, Ok(&SyncResponse {}), true, None);
                        }
                        let _ = host.resolve(call.reply, &SyncResponse {});
                    }
                    Ok(None) => break,
                    Err(_) => {
                        host_ok = false;
                        break;
                    }
                }
            }
        }
        if client_ok {
            client_decoder.push(piece, None);
            loop {
                match client_decoder.next_frame() {
                    Ok(Some(received)) => {
                        check_round_trip(&received.frame);
                        if let Incoming::Bound {
                            result: Ok(binding),
                            ..
                        } = client.handle_frame(received)
                        {
                            let _ =
                                client.invoke(&binding, "GetAsyncCommand", Bytes::new(), Some(1));
                        }
                    }
                    Ok(None) => break,
                    Err(_) => {
                        client_ok = false;
                        break;
                    }
                }
            }
        }
    }

    // Whatever the host queued must be a valid frame sequence.
    let mut replies = FrameDecoder::new();
    while let Some(segment) = host.out().next_send() {
        let n = segment.bytes.len();
        replies.push(segment.bytes, None);
        host.out().advance(n);
    }
    while let Some(frame) = replies.next_frame().expect("host output is well-formed") {
        check_round_trip(&frame.frame);
    }
    let _ = client.disconnect();
}

fn check_round_trip(frame: &IpcFrame) {
    let once = canonical::encode(frame);
    let decoded = IpcFrame::decode(&once[..]).expect("canonical output decodes");
    assert_eq!(canonical::encode(&decoded), once);
}
