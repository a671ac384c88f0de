//! The send queue of one connection: encoded frames waiting for the socket,
//! and the file descriptors that must travel with some of them.
//!
//! Perfetto's attachment rule: an fd rides as `SCM_RIGHTS` on the *first*
//! `sendmsg` of the frame it belongs to. [`OutQueue::next_send`] enforces it
//! by cutting the byte stream into segments: a segment never crosses the
//! start of a frame that carries an fd, and that frame's segment (which
//! starts at its first byte and ends at its last) is the one that carries the
//! fd. Frames without fds are coalesced into as few `sendmsg` calls as
//! possible. Sans-IO: the socket shell calls `next_send`, sends, and reports
//! how many bytes went out with [`OutQueue::advance`].

use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::frame::{encode_frame, FrameTooLarge};
use crate::protos::IpcFrame;

/// Queued bytes beyond this many are compacted away once sent.
const COMPACT_AFTER: usize = 64 * 1024;

#[derive(Debug)]
struct FdMark {
    /// Stream offsets of the first and one-past-last byte of the frame.
    start: u64,
    end: u64,
    fd: OwnedFd,
}

/// Outgoing bytes and fds of one connection.
#[derive(Debug, Default)]
pub struct OutQueue {
    buf: Vec<u8>,
    /// `buf[head..]` is unsent.
    head: usize,
    /// Stream offset of `buf[head]`.
    offset: u64,
    fds: VecDeque<FdMark>,
}

/// One `sendmsg` worth of data: send `bytes`, with `fd` as `SCM_RIGHTS`.
#[derive(Debug)]
pub struct Segment<'a> {
    /// Bytes to send.
    pub bytes: &'a [u8],
    /// Descriptor to attach to this `sendmsg`.
    pub fd: Option<BorrowedFd<'a>>,
}

impl OutQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Unsent bytes.
    pub fn len(&self) -> usize {
        self.buf.len() - self.head
    }

    /// Whether everything was sent.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Encodes `frame` (canonically) at the end of the queue, with `fd` to be
    /// sent along with it. Nothing is queued if the frame is too large.
    pub fn push_frame(
        &mut self,
        frame: &IpcFrame,
        fd: Option<OwnedFd>,
    ) -> Result<(), FrameTooLarge> {
        let start = self.offset + self.len() as u64;
        encode_frame(frame, &mut self.buf)?;
        if let Some(fd) = fd {
            let end = self.offset + self.len() as u64;
            self.fds.push_back(FdMark { start, end, fd });
        }
        Ok(())
    }

    /// The next segment to send, if anything is queued.
    pub fn next_send(&self) -> Option<Segment<'_>> {
        let unsent = self.buf.get(self.head..)?;
        if unsent.is_empty() {
            return None;
        }
        let (len, fd) = match self.fds.front() {
            Some(mark) if mark.start == self.offset => {
                ((mark.end - mark.start) as usize, Some(mark.fd.as_fd()))
            }
            Some(mark) => ((mark.start - self.offset) as usize, None),
            None => (unsent.len(), None),
        };
        Some(Segment {
            bytes: unsent.get(..len).unwrap_or(unsent),
            fd,
        })
    }

    /// Records that the first `sent` bytes of the last [`next_send`](Self::next_send)
    /// segment went out (with its fd, if it had one and `sent > 0`).
    pub fn advance(&mut self, sent: usize) {
        let sent = sent.min(self.len());
        if sent == 0 {
            return;
        }
        if self.fds.front().is_some_and(|m| m.start == self.offset) {
            // The kernel holds its own reference now; close ours.
            self.fds.pop_front();
        }
        self.head += sent;
        self.offset += sent as u64;
        if self.head == self.buf.len() {
            self.buf.clear();
            self.head = 0;
        } else if self.head > COMPACT_AFTER {
            self.buf.drain(..self.head);
            self.head = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{bind_service_frame, request_error_frame};

    fn fd() -> OwnedFd {
        std::fs::File::open("/dev/null").unwrap().into()
    }

    #[test]
    fn frames_without_fds_are_coalesced() {
        let mut q = OutQueue::new();
        q.push_frame(&bind_service_frame(1, "A"), None).unwrap();
        q.push_frame(&bind_service_frame(2, "B"), None).unwrap();
        let seg = q.next_send().unwrap();
        assert!(seg.fd.is_none());
        assert_eq!(seg.bytes.len(), q.len());
        let n = seg.bytes.len();
        q.advance(n);
        assert!(q.is_empty() && q.next_send().is_none());
    }

    #[test]
    fn an_fd_frame_is_its_own_segment_and_the_fd_goes_once() {
        let mut q = OutQueue::new();
        q.push_frame(&bind_service_frame(1, "A"), None).unwrap();
        let before = q.len();
        q.push_frame(&request_error_frame(2, "with fd"), Some(fd()))
            .unwrap();
        let fd_frame = q.len() - before;
        q.push_frame(&bind_service_frame(3, "C"), None).unwrap();

        let seg = q.next_send().unwrap();
        assert_eq!((seg.bytes.len(), seg.fd.is_some()), (before, false));
        q.advance(before);

        let seg = q.next_send().unwrap();
        assert_eq!((seg.bytes.len(), seg.fd.is_some()), (fd_frame, true));
        // A partial send still delivers the fd; the rest goes without it.
        q.advance(3);
        let seg = q.next_send().unwrap();
        assert!(seg.fd.is_none());
        assert_eq!(seg.bytes.len(), q.len());
    }

    #[test]
    fn a_zero_byte_send_keeps_the_fd() {
        let mut q = OutQueue::new();
        q.push_frame(&bind_service_frame(1, "A"), Some(fd()))
            .unwrap();
        q.advance(0);
        assert!(q.next_send().unwrap().fd.is_some());
    }
}
