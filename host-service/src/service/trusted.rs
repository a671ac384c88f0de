//! The trusted fields the service appends to every producer packet it
//! returns, in upstream's order (`TracingServiceImpl::ReadBuffers`,
//! src/tracing/service/tracing_service_impl.cc): `trusted_uid`,
//! `trusted_packet_sequence_id`, `trusted_pid`, `machine_id` (if not 0) and
//! `previous_packet_dropped` (if the buffer reports a loss).
//!
//! They go in a separate, final slice after the packet's own bytes. Protobuf
//! keeps the last value of a field, so appending makes them win; the
//! [validator](super::validator) guarantees the producer did not write them
//! (and did not leave a truncated field that would swallow them).

use shmtrace_abi::proto::wire::{tag, varint_len, WireType, MAX_VARINT_LEN};
use shmtrace_abi::proto::{Cursor, TARGET_SLACK};
use shmtrace_abi::trace::trace_packet;

/// Bytes of the tag of varint field `field`.
const fn tag_len(field: u32) -> usize {
    varint_len(tag(field, WireType::Varint) as u64)
}

/// Longest appendix: five tags and varints (negative int32s take 10 bytes,
/// uint32s 5).
pub const MAX_APPENDIX_LEN: usize = tag_len(trace_packet::TRUSTED_UID)
    + MAX_VARINT_LEN
    + tag_len(trace_packet::TRUSTED_PACKET_SEQUENCE_ID)
    + 5
    + tag_len(trace_packet::TRUSTED_PID)
    + MAX_VARINT_LEN
    + tag_len(trace_packet::MACHINE_ID)
    + 5
    + tag_len(trace_packet::PREVIOUS_PACKET_DROPPED)
    + 5;

/// The appendix buffer: a power of two at least [`MAX_APPENDIX_LEN`] long
/// plus the cursor's slack, so the whole appendix always fits.
const BUF_LEN: usize = MAX_APPENDIX_LEN.next_power_of_two() + TARGET_SLACK;

/// What the service vouches for about a producer packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrustedFields {
    /// The producer's uid (from `SO_PEERCRED`).
    pub uid: i32,
    /// The packet sequence id within the session (2 and up).
    pub sequence_id: u32,
    /// The producer's pid, when known.
    pub pid: Option<i32>,
    /// The producer's machine id (0 for this machine: omitted).
    pub machine_id: u32,
    /// `DataLossReason` bits for `previous_packet_dropped` (0: omitted).
    pub previous_packet_dropped: u32,
}

/// An encoded appendix.
#[derive(Clone, Copy)]
pub struct Appendix {
    buf: [u8; BUF_LEN],
    len: usize,
}

impl Appendix {
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl std::fmt::Debug for Appendix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Appendix").field(&self.as_bytes()).finish()
    }
}

impl TrustedFields {
    /// Encodes the appendix: uid, sequence id, pid, machine id, loss — the
    /// order upstream writes them.
    pub fn encode(&self) -> Appendix {
        let mut buf = [0; BUF_LEN];
        let mut c = Cursor::new(&mut buf);
        // int32 fields are sign-extended to 64 bits on the wire.
        c.int(trace_packet::TRUSTED_UID, i64::from(self.uid));
        c.uint(
            trace_packet::TRUSTED_PACKET_SEQUENCE_ID,
            u64::from(self.sequence_id),
        );
        if let Some(pid) = self.pid {
            c.int(trace_packet::TRUSTED_PID, i64::from(pid));
        }
        if self.machine_id != 0 {
            c.uint(trace_packet::MACHINE_ID, u64::from(self.machine_id));
        }
        if self.previous_packet_dropped != 0 {
            c.uint(
                trace_packet::PREVIOUS_PACKET_DROPPED,
                u64::from(self.previous_packet_dropped),
            );
        }
        // At most MAX_APPENDIX_LEN bytes were written, which the buffer
        // holds (BUF_LEN), so the cursor never reports an overflow.
        let len = c.finish().unwrap_or(0);
        Appendix { buf, len }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(uid: i32, seq: u32, pid: Option<i32>, machine: u32, loss: u32) -> TrustedFields {
        TrustedFields {
            uid,
            sequence_id: seq,
            pid,
            machine_id: machine,
            previous_packet_dropped: loss,
        }
    }

    #[test]
    fn matches_upstream_bytes() {
        // Upstream's trailing slice for uid 1000, sequence 2, pid 1234.
        let a = fields(1000, 2, Some(1234), 0, 0).encode();
        assert_eq!(
            a.as_bytes(),
            [0x18, 0xE8, 0x07, 0x50, 0x02, 0xF8, 0x04, 0xD2, 0x09]
        );
        // From the v59 capture: uid 0, sequence 2, pid 14971, first packet
        // flagged with the bare V1 loss bit.
        let a = fields(0, 2, Some(14971), 0, 1).encode();
        assert_eq!(
            a.as_bytes(),
            [0x18, 0x00, 0x50, 0x02, 0xF8, 0x04, 0xFB, 0x74, 0xD0, 0x02, 0x01]
        );
    }

    #[test]
    fn optional_fields_and_negative_ids() {
        let a = fields(-1, 3, None, 7, 65).encode();
        let mut expect = vec![0x18];
        expect.extend_from_slice(&[0xFF; 9]);
        expect.push(0x01);
        expect.extend_from_slice(&[0x50, 0x03, 0x90, 0x06, 0x07, 0xD0, 0x02, 0x41]);
        assert_eq!(a.as_bytes(), &expect[..]);
        let longest = fields(i32::MIN, u32::MAX, Some(i32::MIN), u32::MAX, u32::MAX).encode();
        assert_eq!(longest.as_bytes().len(), MAX_APPENDIX_LEN);
    }
}
