//! The trusted fields the service appends to every producer packet it
//! returns (facts §8.4).
//!
//! They go in a separate, final slice after the packet's own bytes. Protobuf
//! keeps the last value of a field, so appending makes them win; the
//! [validator](super::validator) guarantees the producer did not write them
//! (and did not leave a truncated field that would swallow them).

/// Field numbers and wire types, as tag bytes.
const TAG_TRUSTED_UID: &[u8] = &[0x18]; // 3, varint
const TAG_SEQUENCE_ID: &[u8] = &[0x50]; // 10, varint
const TAG_TRUSTED_PID: &[u8] = &[0xF8, 0x04]; // 79, varint
const TAG_MACHINE_ID: &[u8] = &[0x90, 0x06]; // 98, varint
const TAG_PREVIOUS_PACKET_DROPPED: &[u8] = &[0xD0, 0x02]; // 42, varint

/// Longest appendix: five tags and varints (negative int32s take 10 bytes).
pub const MAX_APPENDIX_LEN: usize = 1 + 10 + 1 + 5 + 2 + 10 + 2 + 5 + 2 + 5;

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
    buf: [u8; MAX_APPENDIX_LEN],
    len: usize,
}

impl Appendix {
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    fn put(&mut self, bytes: &[u8]) {
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    fn put_varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.put(&[v as u8 | 0x80]);
            v >>= 7;
        }
        self.put(&[v as u8]);
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
        let mut a = Appendix {
            buf: [0; MAX_APPENDIX_LEN],
            len: 0,
        };
        a.put(TAG_TRUSTED_UID);
        // int32 fields are sign-extended to 64 bits on the wire.
        a.put_varint(i64::from(self.uid) as u64);
        a.put(TAG_SEQUENCE_ID);
        a.put_varint(u64::from(self.sequence_id));
        if let Some(pid) = self.pid {
            a.put(TAG_TRUSTED_PID);
            a.put_varint(i64::from(pid) as u64);
        }
        if self.machine_id != 0 {
            a.put(TAG_MACHINE_ID);
            a.put_varint(u64::from(self.machine_id));
        }
        if self.previous_packet_dropped != 0 {
            a.put(TAG_PREVIOUS_PACKET_DROPPED);
            a.put_varint(u64::from(self.previous_packet_dropped));
        }
        a
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
        // facts §8.4: uid 1000, sequence 2, pid 1234.
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
