//! Why packets of a sequence were lost: the bits of
//! `TracePacket.previous_packet_dropped` (Perfetto's `DataLossReason`).

use core::fmt;
use core::ops::{BitOr, BitOrAssign};

/// A set of `DataLossReason` bits, reported in `previous_packet_dropped` on
/// the first packet a sequence yields after losing data.
///
/// Every non-empty value has [`DataLoss::PRESENT`] set (so readers that treat
/// the field as a bool still see "dropped"); the other bits say why. The bit
/// values are Perfetto's (`TracePacket.DataLossReason` in
/// protos/perfetto/trace/trace_packet.proto), so trace processors that understand
/// them show the cause.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct DataLoss(u32);

impl DataLoss {
    /// Nothing lost.
    pub const NONE: Self = Self(0);
    /// Something was lost (always set together with a cause).
    pub const PRESENT: Self = Self(1);
    /// The reader skipped chunk ids that never arrived (or arrived too late).
    pub const READ_GAP: Self = Self(2);
    /// A chunk's fragments could not be parsed; the rest of it was dropped.
    pub const CHUNK_CORRUPTED: Self = Self(4);
    /// A chunk began with the continuation of a packet whose beginning is
    /// gone.
    pub const ORPHAN_CONTINUATION: Self = Self(8);
    /// A packet spanning chunks could not be reassembled: a chunk id is
    /// missing in the middle of it.
    pub const REASSEMBLY_GAP: Self = Self(16);
    /// A packet spanning chunks could not be reassembled: the chunks are
    /// there but their continuation flags do not chain (or the patches it
    /// waited for never arrived).
    pub const REASSEMBLY_BROKEN_CHAIN: Self = Self(32);
    /// Unread data was overwritten by the ring buffer wrapping.
    pub const OVERWRITE: Self = Self(64);
    /// The writer abandoned a packet (the drop sentinel `FF FF FF 7F`).
    pub const WRITER_ABORT: Self = Self(128);

    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// `true` if nothing was lost.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// `true` if every bit of `other` is set in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// A loss with `cause` (`PRESENT` added).
    pub const fn because(cause: Self) -> Self {
        Self(cause.0 | Self::PRESENT.0)
    }
}

impl BitOr for DataLoss {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

impl BitOrAssign for DataLoss {
    fn bitor_assign(&mut self, rhs: Self) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for DataLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [(DataLoss, &str); 8] = [
            (DataLoss::PRESENT, "PRESENT"),
            (DataLoss::READ_GAP, "READ_GAP"),
            (DataLoss::CHUNK_CORRUPTED, "CHUNK_CORRUPTED"),
            (DataLoss::ORPHAN_CONTINUATION, "ORPHAN_CONTINUATION"),
            (DataLoss::REASSEMBLY_GAP, "REASSEMBLY_GAP"),
            (DataLoss::REASSEMBLY_BROKEN_CHAIN, "REASSEMBLY_BROKEN_CHAIN"),
            (DataLoss::OVERWRITE, "OVERWRITE"),
            (DataLoss::WRITER_ABORT, "WRITER_ABORT"),
        ];
        if self.is_empty() {
            return f.write_str("DataLoss(NONE)");
        }
        f.write_str("DataLoss(")?;
        let mut first = true;
        for (bit, name) in NAMES {
            if self.contains(bit) {
                if !first {
                    f.write_str(" | ")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_are_perfettos() {
        assert_eq!(DataLoss::because(DataLoss::READ_GAP).bits(), 3);
        assert_eq!(DataLoss::because(DataLoss::OVERWRITE).bits(), 65);
        assert_eq!(DataLoss::because(DataLoss::WRITER_ABORT).bits(), 129);
        let all = DataLoss::PRESENT
            | DataLoss::READ_GAP
            | DataLoss::CHUNK_CORRUPTED
            | DataLoss::ORPHAN_CONTINUATION
            | DataLoss::REASSEMBLY_GAP
            | DataLoss::REASSEMBLY_BROKEN_CHAIN
            | DataLoss::OVERWRITE
            | DataLoss::WRITER_ABORT;
        assert_eq!(all.bits(), 255);
        assert_eq!(
            format!("{:?}", DataLoss::because(DataLoss::READ_GAP)),
            "DataLoss(PRESENT | READ_GAP)"
        );
    }
}
