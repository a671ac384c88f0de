//! Framing: `<u32 little-endian length><IPCFrame>` on a byte stream.
//!
//! [`FrameDecoder`] is the receive side, sans-IO: it is fed the bytes (and
//! file descriptors) of each `recvmsg`, in whatever pieces they arrive, and
//! hands out whole decoded frames. Invariants:
//!
//! * A frame whose `4 + length` exceeds [`MAX_FRAME_LEN`] (128 KiB, the real
//!   Perfetto's receive buffer) is rejected as soon as its header is seen;
//!   the claimed length is never used to size an allocation. The receive
//!   buffer grows with the bytes actually received, up to [`MAX_FRAME_LEN`].
//! * A zero-length frame is skipped (as upstream does). A frame that is not a
//!   valid `IPCFrame` is an error (Perfetto drops such a frame and carries
//!   on; here a peer that sends invalid protobuf loses its connection, as a
//!   broken or hostile peer should). After any error the decoder stays
//!   failed: the caller closes the connection.
//! * File descriptors are bound to frames by stream position: an fd received
//!   with a `recvmsg` belongs to the frame containing the last byte that
//!   `recvmsg` returned. This is exact for senders that, like Perfetto and
//!   [`OutQueue`](super::outq::OutQueue), attach an fd to a `sendmsg` whose
//!   first byte is the first byte of its frame: Linux ends a stream read right
//!   after the first segment that carries descriptors.
//! * A frame carries at most one fd, so at most one is parked per frame: when
//!   a second fd arrives for a frame that is still incomplete, the earlier one
//!   is closed at once (upstream's host keeps one received fd per connection,
//!   the latest). A peer sending one byte and one fd per `sendmsg` therefore
//!   holds at most one descriptor in the service, not one per byte of a
//!   128 KiB frame. [`parked_fds`](FrameDecoder::parked_fds) and
//!   [`fds_closed`](FrameDecoder::fds_closed) expose the bound.
//!
//! [`encode_frame`] is the send side: the canonical (byte-identical to
//! Perfetto) encoding with the length prefix. The `*_frame` constructors build
//! each kind of frame with exactly the fields Perfetto sets.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;

use bytes::Bytes;
use prost::Message;
use thiserror::Error;

use super::rpc::MethodDescriptor;
use crate::protos::canonical;
use crate::protos::ipc_frame::{
    bind_service_reply::MethodInfo, BindService, BindServiceReply, InvokeMethod, InvokeMethodReply,
    Msg, RequestError,
};
use crate::protos::IpcFrame;

/// Bytes of the length prefix.
pub const HEADER_LEN: usize = 4;

/// Largest frame, length prefix included (Perfetto's `kIPCBufferSize`).
pub const MAX_FRAME_LEN: usize = 128 * 1024;

/// Largest `IPCFrame` payload.
pub const MAX_PAYLOAD_LEN: usize = MAX_FRAME_LEN - HEADER_LEN;

/// The receive buffer starts this small and doubles as data arrives.
const INITIAL_BUFFER: usize = 4096;

/// A receive window smaller than this is grown before the next `recvmsg`.
const MIN_RECV_WINDOW: usize = 1024;

/// Why a byte stream is not a valid frame sequence. Fatal for the connection.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FrameError {
    /// A header announced a frame larger than [`MAX_FRAME_LEN`].
    #[error("frame of {len} bytes (plus 4-byte header) exceeds the {MAX_FRAME_LEN}-byte limit")]
    TooLarge {
        /// The announced payload length.
        len: u32,
    },
    /// A complete frame is not a valid `IPCFrame`.
    #[error("malformed IPCFrame: {0}")]
    Malformed(#[from] prost::DecodeError),
}

/// A decoded frame and the file descriptor that came with it, if any.
#[derive(Debug)]
pub struct ReceivedFrame {
    /// The frame.
    pub frame: IpcFrame,
    /// A descriptor received with this frame's bytes (`SCM_RIGHTS`).
    pub fd: Option<OwnedFd>,
}

/// Incremental, bounded decoder of the frames of one connection.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    /// Received bytes live in `data[start..end]`; `data[end..]` is zeroed
    /// room for the next receive.
    data: Vec<u8>,
    start: usize,
    end: usize,
    /// Stream offset of `data[start]`.
    offset: u64,
    /// Received fds with the stream offset of the byte they are bound to.
    /// Sorted by offset; at most one per frame.
    fds: VecDeque<(u64, OwnedFd)>,
    /// Received fds closed because their frame got another one, or because
    /// they came between frames or with an empty frame.
    fds_closed: u64,
    error: Option<FrameError>,
}

impl FrameDecoder {
    /// An empty decoder (allocates nothing until data arrives).
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes received but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Room to receive into; pass the number of bytes received to
    /// [`commit`](Self::commit).
    ///
    /// Call [`next_frame`](Self::next_frame) until it returns `Ok(None)`
    /// before receiving again: then the room is never empty (the buffered
    /// remainder is shorter than one frame).
    pub fn recv_buf(&mut self) -> &mut [u8] {
        if self.start > 0 {
            self.data.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let room = self.data.len() - self.end;
        if room < MIN_RECV_WINDOW && self.data.len() < MAX_FRAME_LEN {
            let grown = (self.data.len() * 2).clamp(INITIAL_BUFFER, MAX_FRAME_LEN);
            self.data.resize(grown, 0);
        }
        let limit = (self.start + MAX_FRAME_LEN).min(self.data.len());
        self.data.get_mut(self.end..limit).unwrap_or_default()
    }

    /// Records that `len` bytes were received into [`recv_buf`](Self::recv_buf),
    /// together with the descriptor that came with them.
    pub fn commit(&mut self, len: usize, fd: Option<OwnedFd>) {
        let len = len.min(self.data.len() - self.end);
        self.end += len;
        self.note_fd(len, fd);
    }

    /// Feeds bytes received elsewhere (tests, fuzzing, other transports).
    pub fn push(&mut self, bytes: &[u8], fd: Option<OwnedFd>) {
        if self.start > 0 && self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        self.data.truncate(self.end);
        self.data.extend_from_slice(bytes);
        self.end = self.data.len();
        self.note_fd(bytes.len(), fd);
    }

    /// Descriptors received and held for frames that are not complete yet
    /// (at most one per buffered frame).
    pub fn parked_fds(&self) -> usize {
        self.fds.len()
    }

    /// Descriptors this decoder closed instead of handing them out with a
    /// frame (a second fd for one frame, an fd between frames or with an
    /// empty frame).
    pub fn fds_closed(&self) -> u64 {
        self.fds_closed
    }

    fn note_fd(&mut self, len: usize, fd: Option<OwnedFd>) {
        let Some(fd) = fd else {
            return;
        };
        let stream_end = self.offset + self.buffered() as u64;
        // The last byte of this receive (or, for an empty one, the next).
        let at = if len > 0 { stream_end - 1 } else { stream_end };
        if let Some(&(last, _)) = self.fds.back() {
            if self.frame_end_after(last) > at {
                // Same frame as the parked one: a frame carries one fd, and
                // (like upstream) the latest wins.
                self.fds.pop_back();
                self.fds_closed += 1;
                if self.fds_closed == 1 {
                    // Once per connection: a hostile peer may send thousands.
                    log::warn!(
                        "more than one file descriptor for one frame; closing the earlier ones"
                    );
                }
            }
        }
        self.fds.push_back((at, fd));
    }

    /// Stream offset just past the frame that contains stream offset `pos`
    /// (`u64::MAX` if that frame's end is not known yet). `pos` must not be
    /// before `self.offset`. Walks the buffered headers from the first
    /// unreturned frame: after the caller drains [`next_frame`](Self::next_frame)
    /// (as the socket shell does) that is one frame.
    fn frame_end_after(&self, pos: u64) -> u64 {
        let buffered = &self.data[self.start..self.end];
        let mut frame = 0usize;
        loop {
            let Some(header) = buffered
                .get(frame..)
                .and_then(|b| b.first_chunk::<HEADER_LEN>())
            else {
                return u64::MAX;
            };
            let end =
                self.offset + (frame + HEADER_LEN) as u64 + u64::from(u32::from_le_bytes(*header));
            if end > pos {
                return end;
            }
            // `end <= pos` < stream end, so the next frame starts inside `buffered`.
            frame = (end - self.offset) as usize;
        }
    }

    /// The next complete frame, if one is buffered.
    ///
    /// Errors are fatal: the same error is returned from then on.
    pub fn next_frame(&mut self) -> Result<Option<ReceivedFrame>, FrameError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        loop {
            let buffered = &self.data[self.start..self.end];
            let Some(header) = buffered.first_chunk::<HEADER_LEN>() else {
                return Ok(None);
            };
            let len = u32::from_le_bytes(*header);
            let total = len as usize + HEADER_LEN;
            if total > MAX_FRAME_LEN {
                return Err(self.fail(FrameError::TooLarge { len }));
            }
            let Some(payload) = buffered.get(HEADER_LEN..total) else {
                return Ok(None);
            };
            let payload = Bytes::copy_from_slice(payload);
            let frame_start = self.offset;
            self.offset += total as u64;
            self.start += total;
            let fd = self.take_fd(frame_start, self.offset);
            if payload.is_empty() {
                if fd.is_some() {
                    self.fds_closed += 1;
                    log::warn!("closing a file descriptor that came with an empty frame");
                }
                continue;
            }
            return match IpcFrame::decode(payload) {
                Ok(frame) => Ok(Some(ReceivedFrame { frame, fd })),
                Err(e) => Err(self.fail(FrameError::Malformed(e))),
            };
        }
    }

    fn fail(&mut self, error: FrameError) -> FrameError {
        self.error = Some(error.clone());
        self.fds.clear();
        error
    }

    /// The fd bound to a byte in `start..end`; extra ones are closed.
    fn take_fd(&mut self, start: u64, end: u64) -> Option<OwnedFd> {
        let mut found = None;
        while let Some((at, _)) = self.fds.front() {
            if *at >= end {
                break;
            }
            let Some((at, fd)) = self.fds.pop_front() else {
                break;
            };
            if at < start {
                self.fds_closed += 1;
                log::warn!("closing a file descriptor received between frames");
            } else if found.replace(fd).is_some() {
                self.fds_closed += 1;
                log::warn!("more than one file descriptor for one frame; closing the earlier one");
            }
        }
        found
    }
}

/// Appends `frame` to `out`, length prefix included, encoded exactly as
/// Perfetto would. Fails (appending nothing) if it exceeds [`MAX_FRAME_LEN`].
pub fn encode_frame(frame: &IpcFrame, out: &mut Vec<u8>) -> Result<(), FrameTooLarge> {
    let mark = out.len();
    out.extend_from_slice(&[0; HEADER_LEN]);
    canonical::encode_into(frame, out);
    let len = out.len() - mark - HEADER_LEN;
    if len > MAX_PAYLOAD_LEN {
        out.truncate(mark);
        return Err(FrameTooLarge { len });
    }
    out[mark..mark + HEADER_LEN].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(())
}

/// A frame to send is larger than [`MAX_FRAME_LEN`]; the peer would drop the
/// connection, so it is not sent. Large replies must be split (as ReadBuffers
/// and QueryServiceState do).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("frame payload of {len} bytes exceeds the {MAX_PAYLOAD_LEN}-byte limit")]
pub struct FrameTooLarge {
    /// Encoded payload length.
    pub len: usize,
}

fn frame(request_id: u64, msg: Msg) -> IpcFrame {
    IpcFrame {
        request_id: Some(request_id),
        msg: Some(msg),
        data_for_testing: Vec::new(),
    }
}

/// `BindService { service_name }`.
pub fn bind_service_frame(request_id: u64, service_name: &str) -> IpcFrame {
    frame(
        request_id,
        Msg::MsgBindService(BindService {
            service_name: Some(service_name.to_owned()),
        }),
    )
}

/// `BindServiceReply`: the method table of `service_id`, or (for `None`) an
/// empty reply meaning "no such service", as Perfetto sends it.
pub fn bind_service_reply_frame(
    request_id: u64,
    bound: Option<(u32, &[MethodDescriptor])>,
) -> IpcFrame {
    let reply = match bound {
        Some((service_id, methods)) => BindServiceReply {
            success: Some(true),
            service_id: Some(service_id),
            methods: methods
                .iter()
                .map(|m| MethodInfo {
                    id: Some(m.id),
                    name: Some(m.name.to_owned()),
                })
                .collect(),
        },
        None => BindServiceReply::default(),
    };
    frame(request_id, Msg::MsgBindServiceReply(reply))
}

/// `InvokeMethod` with every field set, as Perfetto's client sends it.
pub fn invoke_method_frame(
    request_id: u64,
    service_id: u32,
    method_id: u32,
    args: Bytes,
    drop_reply: bool,
) -> IpcFrame {
    frame(
        request_id,
        Msg::MsgInvokeMethod(InvokeMethod {
            service_id: Some(service_id),
            method_id: Some(method_id),
            args_proto: Some(args),
            drop_reply: Some(drop_reply),
        }),
    )
}

/// The reply to a method: `Ok(reply bytes)` is a success, `Err(())` a
/// rejection (`success` unset), each with `has_more`.
pub fn invoke_method_reply_frame(
    request_id: u64,
    reply: Result<Bytes, ()>,
    has_more: bool,
) -> IpcFrame {
    let (success, reply_proto) = match reply {
        Ok(bytes) => (Some(true), Some(bytes)),
        Err(()) => (None, None),
    };
    frame(
        request_id,
        Msg::MsgInvokeMethodReply(InvokeMethodReply {
            success,
            has_more: Some(has_more),
            reply_proto,
        }),
    )
}

/// The reply to an invocation the host could not dispatch (unknown service
/// or method, undecodable arguments): `success = false` and nothing else.
pub fn invalid_invocation_frame(request_id: u64) -> IpcFrame {
    frame(
        request_id,
        Msg::MsgInvokeMethodReply(InvokeMethodReply {
            success: Some(false),
            ..Default::default()
        }),
    )
}

/// `SetPeerIdentity`, as a relay sends it first on each connection it
/// opens to the central service (request id 0, every field set; upstream's
/// src/traced_relay/relay_service.cc).
pub fn set_peer_identity_frame(identity: &crate::host::PeerIdentity) -> IpcFrame {
    frame(
        0,
        Msg::SetPeerIdentity(crate::protos::ipc_frame::SetPeerIdentity {
            pid: Some(identity.pid),
            uid: Some(identity.uid),
            machine_id_hint: Some(identity.machine_id_hint.clone()),
            machine_name: Some(identity.machine_name.clone()),
        }),
    )
}

/// `RequestError { error }`.
pub fn request_error_frame(request_id: u64, error: &str) -> IpcFrame {
    frame(
        request_id,
        Msg::MsgRequestError(RequestError {
            error: Some(error.to_owned()),
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(frame: &IpcFrame) -> Vec<u8> {
        let mut out = Vec::new();
        encode_frame(frame, &mut out).unwrap();
        out
    }

    #[test]
    fn bind_service_bytes_match_the_facts_example() {
        assert_eq!(
            encoded(&bind_service_frame(1, "ProducerPort")),
            b"\x12\x00\x00\x00\x10\x01\x1a\x0e\x0a\x0cProducerPort"
        );
    }

    #[test]
    fn reply_kinds_set_the_fields_perfetto_sets() {
        assert_eq!(
            encoded(&invoke_method_reply_frame(4, Ok(Bytes::new()), false)),
            b"\x0a\x00\x00\x00\x10\x04\x32\x06\x08\x01\x10\x00\x1a\x00"
        );
        assert_eq!(
            encoded(&invoke_method_reply_frame(4, Err(()), false)),
            b"\x06\x00\x00\x00\x10\x04\x32\x02\x10\x00"
        );
        assert_eq!(
            encoded(&invalid_invocation_frame(4)),
            b"\x06\x00\x00\x00\x10\x04\x32\x02\x08\x00"
        );
        assert_eq!(
            encoded(&bind_service_reply_frame(9, None)),
            b"\x04\x00\x00\x00\x10\x09\x22\x00"
        );
    }

    #[test]
    fn decodes_partial_and_coalesced_input() {
        let mut stream = encoded(&bind_service_frame(1, "A"));
        stream.extend(encoded(&bind_service_frame(2, "B")));
        stream.extend([0, 0, 0, 0]); // an empty frame is skipped
        stream.extend(encoded(&request_error_frame(3, "x")));
        let mut dec = FrameDecoder::new();
        let mut ids = Vec::new();
        for byte in &stream {
            dec.push(&[*byte], None);
            while let Some(f) = dec.next_frame().unwrap() {
                ids.push(f.frame.request_id.unwrap());
            }
        }
        assert_eq!(ids, [1, 2, 3]);
        assert_eq!(dec.buffered(), 0);
    }

    #[test]
    fn oversized_header_fails_before_the_payload_arrives() {
        let mut dec = FrameDecoder::new();
        dec.push(&(MAX_PAYLOAD_LEN as u32).to_le_bytes(), None);
        assert!(
            dec.next_frame().unwrap().is_none(),
            "the largest legal frame is only incomplete"
        );
        let mut dec = FrameDecoder::new();
        dec.push(&(MAX_PAYLOAD_LEN as u32 + 1).to_le_bytes(), None);
        let err = FrameError::TooLarge {
            len: MAX_PAYLOAD_LEN as u32 + 1,
        };
        assert_eq!(dec.next_frame().unwrap_err(), err);
        dec.push(b"more", None);
        assert_eq!(dec.next_frame().unwrap_err(), err, "errors are sticky");
        assert!(dec.data.len() < 64, "no allocation for the claimed length");
    }

    #[test]
    fn garbage_is_malformed() {
        let mut dec = FrameDecoder::new();
        dec.push(&[3, 0, 0, 0, 0xff, 0xff, 0xff], None);
        assert!(matches!(dec.next_frame(), Err(FrameError::Malformed(_))));
    }

    #[test]
    fn recv_buf_grows_with_data_and_stays_bounded() {
        let mut dec = FrameDecoder::new();
        let mut total = 0;
        let big = (MAX_PAYLOAD_LEN as u32).to_le_bytes();
        let first = dec.recv_buf();
        assert_eq!(first.len(), INITIAL_BUFFER);
        first[..4].copy_from_slice(&big);
        let n = first.len();
        dec.commit(n, None);
        total += n;
        while total < MAX_FRAME_LEN {
            assert!(dec.next_frame().unwrap().is_none());
            let room = dec.recv_buf().len();
            assert!(room > 0 && total + room <= MAX_FRAME_LEN);
            dec.commit(room, None);
            total += room;
        }
        // 131068 zero bytes: tag 0 is invalid protobuf.
        assert!(matches!(dec.next_frame(), Err(FrameError::Malformed(_))));
        assert_eq!(dec.data.len(), MAX_FRAME_LEN);
    }

    fn null_fd() -> Option<OwnedFd> {
        Some(std::fs::File::open("/dev/null").unwrap().into())
    }

    #[test]
    fn one_fd_is_parked_per_frame_and_the_latest_wins() {
        let frame = encoded(&bind_service_frame(7, "ProducerPort"));
        let mut dec = FrameDecoder::new();
        // Header and first payload byte, then one byte and one fd at a time.
        dec.push(&frame[..5], null_fd());
        for byte in &frame[5..frame.len() - 1] {
            dec.push(std::slice::from_ref(byte), null_fd());
            assert_eq!(dec.parked_fds(), 1);
            assert!(dec.next_frame().unwrap().is_none());
        }
        let last = dec.fds.back().unwrap().0;
        dec.push(&frame[frame.len() - 1..], None);
        assert_eq!(dec.fds_closed(), (frame.len() - 6) as u64);
        let got = dec.next_frame().unwrap().unwrap();
        assert_eq!(got.frame, bind_service_frame(7, "ProducerPort"));
        assert!(got.fd.is_some(), "the last fd sent with the frame survives");
        assert_eq!(last, frame.len() as u64 - 2);
        assert_eq!(dec.parked_fds(), 0);
    }

    #[test]
    fn fds_of_distinct_buffered_frames_are_all_kept() {
        let one = encoded(&bind_service_frame(1, "A"));
        let two = encoded(&bind_service_frame(2, "B"));
        let mut dec = FrameDecoder::new();
        dec.push(&one[..2], None); // incomplete header: frame end unknown
        dec.push(&one[2..], null_fd());
        dec.push(&two[..1], null_fd()); // first byte of the next frame
        dec.push(&two[1..], None);
        assert_eq!(dec.parked_fds(), 2);
        assert_eq!(dec.fds_closed(), 0);
        for id in [1, 2] {
            let got = dec.next_frame().unwrap().unwrap();
            assert_eq!(got.frame.request_id, Some(id));
            assert!(got.fd.is_some());
        }
        // Two fds while the header is still incomplete: same frame.
        dec.push(&one[..1], null_fd());
        dec.push(&one[1..2], null_fd());
        assert_eq!((dec.parked_fds(), dec.fds_closed()), (1, 1));
    }

    #[test]
    fn too_large_frames_are_not_encoded() {
        // request_id (2) + tag (1) + length (4) + success, has_more (4) +
        // reply tag (1) + 3-byte length + data: 15 bytes of overhead.
        let f = invoke_method_reply_frame(1, Ok(Bytes::from(vec![0; MAX_PAYLOAD_LEN - 14])), false);
        let mut out = vec![7];
        assert_eq!(
            encode_frame(&f, &mut out),
            Err(FrameTooLarge {
                len: MAX_PAYLOAD_LEN + 1
            })
        );
        assert_eq!(out, [7]);
        let f = invoke_method_reply_frame(1, Ok(Bytes::from(vec![0; MAX_PAYLOAD_LEN - 15])), false);
        encode_frame(&f, &mut out).unwrap();
        assert_eq!(out.len(), 1 + MAX_FRAME_LEN);
        let mut dec = FrameDecoder::new();
        dec.push(&out[1..], None);
        assert_eq!(dec.next_frame().unwrap().unwrap().frame, f);
    }
}
