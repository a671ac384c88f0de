//! Iterating the fragments of a copied chunk payload.
//!
//! # Format
//!
//! A payload holds `count` fragments back to back, each a size varint
//! followed by that many bytes. Sizes are 1- to 4-byte varints (the v1
//! service never reads more than 4 bytes); size 0 is a legal padding
//! fragment (written when a producer returns a chunk whose count it had
//! inflated for scraping) and is skipped silently; size `0x0FFFFFFF`
//! (`FF FF FF 7F`) is the drop sentinel: the writer abandoned that packet.
//! Bytes after the last counted fragment are ignored.
//!
//! # Invariants
//!
//! * Iteration yields at most `count` items, never reads outside the
//!   payload, and is fused: after an error or a drop sentinel it returns
//!   `None` (the rest of the chunk is abandoned, as the v1 service does).
//! * `continues_from_prev` is only ever set on the fragment with index 0 and
//!   `continues_on_next` only on the fragment with index `count - 1`, and only
//!   when the chunk flags say so.

use crate::layout::{ChunkFlags, ChunkHeader, ChunkHeaderRepr, Packets, CHUNK_HEADER_SIZE};
use crate::proto::wire::{read_varint_max, VarintError, MAX_MESSAGE_LEN, SIZE_FIELD_LEN};

/// Why the fragments of a chunk could not be parsed (an ABI violation by the
/// producer). The byte `offset`s are relative to the start of the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChunkError {
    /// The copied chunk is shorter than its 8-byte header.
    HeaderTruncated {
        /// Bytes available.
        len: usize,
    },
    /// The header counts more fragments than the payload holds.
    CountExceedsContent {
        /// Fragment count from the header.
        count: u16,
        /// Fragments found before the payload ended.
        found: u16,
    },
    /// The payload ends inside a fragment's size varint.
    TruncatedSize {
        /// Index of the fragment.
        index: u16,
        /// Offset of its size varint.
        offset: usize,
    },
    /// A size varint does not end within 4 bytes.
    SizeTooLong {
        /// Index of the fragment.
        index: u16,
        /// Offset of its size varint.
        offset: usize,
    },
    /// A fragment's size runs past the end of the payload.
    FragmentOverflow {
        /// Index of the fragment.
        index: u16,
        /// Offset of its size varint.
        offset: usize,
        /// The declared size.
        size: u32,
        /// Bytes actually left after the size varint.
        available: usize,
    },
}

impl core::fmt::Display for ChunkError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Self::HeaderTruncated { len } => {
                write!(f, "chunk of {len} bytes is shorter than its {CHUNK_HEADER_SIZE}-byte header")
            }
            Self::CountExceedsContent { count, found } => {
                write!(f, "chunk header counts {count} fragments but the payload holds {found}")
            }
            Self::TruncatedSize { index, offset } => {
                write!(f, "fragment {index}: size varint at offset {offset} is truncated")
            }
            Self::SizeTooLong { index, offset } => {
                write!(f, "fragment {index}: size varint at offset {offset} is longer than 4 bytes")
            }
            Self::FragmentOverflow { index, offset, size, available } => write!(
                f,
                "fragment {index} at offset {offset}: size {size} exceeds the {available} bytes left"
            ),
        }
    }
}

impl core::error::Error for ChunkError {}

/// One fragment: a whole packet, or a piece of a packet that spans chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fragment<'a> {
    /// Index among the chunk's counted fragments (padding included).
    pub index: u16,
    /// Offset of the fragment's size varint in the payload.
    pub offset: usize,
    /// The fragment's bytes (TracePacket bytes, without a field tag).
    pub data: &'a [u8],
    /// The fragment continues a packet begun in the writer's previous chunk.
    pub continues_from_prev: bool,
    /// The packet continues in the writer's next chunk.
    pub continues_on_next: bool,
}

impl Fragment<'_> {
    /// `true` if this fragment is a whole packet.
    pub fn is_whole_packet(&self) -> bool {
        !self.continues_from_prev && !self.continues_on_next
    }
}

/// A drop sentinel: the writer abandoned the packet this fragment belongs to
/// (e.g. its shared memory buffer was full). Not an ABI violation; the
/// service counts it as `trace_writer_packet_loss`. Nothing after it in the
/// chunk is parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DroppedPacket {
    /// Index of the fragment carrying the sentinel.
    pub index: u16,
    /// Offset of the sentinel in the payload.
    pub offset: usize,
    /// The abandoned packet had begun in the writer's previous chunk, whose
    /// fragments must be discarded too.
    pub continues_from_prev: bool,
}

/// What [`Fragments`] yields for each non-empty counted fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FragmentEvent<'a> {
    /// Packet data.
    Data(Fragment<'a>),
    /// The writer's drop sentinel; iteration ends after it.
    Dropped(DroppedPacket),
}

/// Iterator over the fragments of one chunk payload. See the module docs.
///
/// ```
/// use shmtrace_abi::layout::{ChunkFlags, Packets};
/// use shmtrace_abi::reader::{FragmentEvent, Fragments};
/// // Two compacted packets: TracePacket{timestamp=100}, {timestamp=101}.
/// let payload = [0x02, 0x40, 0x64, 0x02, 0x40, 0x65, 0xAA];
/// let packets = Packets::new(2, ChunkFlags::EMPTY).unwrap();
/// let data: Vec<&[u8]> = Fragments::new(&payload, packets)
///     .map(|f| match f.unwrap() {
///         FragmentEvent::Data(f) => f.data,
///         FragmentEvent::Dropped(_) => unreachable!(),
///     })
///     .collect();
/// assert_eq!(data, [&[0x40, 0x64][..], &[0x40, 0x65][..]]);
/// ```
#[derive(Debug, Clone)]
pub struct Fragments<'a> {
    payload: &'a [u8],
    pos: usize,
    index: u16,
    count: u16,
    flags: ChunkFlags,
    done: bool,
}

impl<'a> Fragments<'a> {
    /// Fragments of a complete chunk whose header word is `packets`.
    pub fn new(payload: &'a [u8], packets: Packets) -> Self {
        Self {
            payload,
            pos: 0,
            index: 0,
            count: packets.count(),
            flags: packets.flags(),
            done: false,
        }
    }

    /// Fragments of a chunk copied while still being written (a scraped
    /// chunk that was not `Complete`), given its header word as the producer
    /// wrote it: only the first `count - 1` fragments are known to be
    /// finished, and the continues-on-next and needs-patching flags do not
    /// hold yet. This is the one place the rule is applied:
    /// [`Smb::scrape`](crate::smb::Smb::scrape) leaves header and copy raw.
    pub fn new_incomplete(payload: &'a [u8], packets: Packets) -> Self {
        let flags = packets.flags().difference(
            ChunkFlags::LAST_PACKET_CONTINUES_ON_NEXT_CHUNK.union(ChunkFlags::CHUNK_NEEDS_PATCHING),
        );
        Self {
            payload,
            pos: 0,
            index: 0,
            count: packets.count().saturating_sub(1),
            flags,
            done: false,
        }
    }

    /// Splits a whole copied chunk (8-byte header, then payload — the form
    /// `ChunksToMove.data` carries in emulation mode) into its parsed header
    /// and the fragments of its payload.
    pub fn from_chunk(chunk: &'a [u8]) -> Result<(ChunkHeaderRepr, Self), ChunkError> {
        let view = ChunkHeader::new_checked(chunk)
            .map_err(|_| ChunkError::HeaderTruncated { len: chunk.len() })?;
        let header = ChunkHeaderRepr::parse(&view);
        let payload = chunk.get(CHUNK_HEADER_SIZE..).unwrap_or(&[]);
        Ok((header, Self::new(payload, header.packets)))
    }

    /// Payload bytes consumed so far: the end of the last fragment parsed.
    pub fn consumed(&self) -> usize {
        self.pos
    }

    /// The flags the iterator applies (after [`Fragments::new_incomplete`]'s
    /// clearing).
    pub fn flags(&self) -> ChunkFlags {
        self.flags
    }

    fn fail(&mut self, e: ChunkError) -> Option<Result<FragmentEvent<'a>, ChunkError>> {
        self.done = true;
        Some(Err(e))
    }

    /// Decodes the size varint at `self.pos`: `(value, varint_len)`.
    fn read_size(&self, index: u16) -> Result<(u32, usize), ChunkError> {
        let offset = self.pos;
        let rest = self.payload.get(offset..).unwrap_or(&[]);
        match read_varint_max(rest, SIZE_FIELD_LEN) {
            // At most 4 bytes of 7 bits: the value fits 28 bits.
            Ok((value, len)) => Ok((value as u32, len)),
            Err(VarintError::Truncated) => Err(ChunkError::TruncatedSize { index, offset }),
            Err(VarintError::TooLong) => Err(ChunkError::SizeTooLong { index, offset }),
        }
    }
}

impl<'a> Iterator for Fragments<'a> {
    type Item = Result<FragmentEvent<'a>, ChunkError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.done && self.index < self.count {
            let index = self.index;
            let offset = self.pos;
            if offset >= self.payload.len() {
                let count = self.count;
                return self.fail(ChunkError::CountExceedsContent {
                    count,
                    found: index,
                });
            }
            let (size, varint_len) = match self.read_size(index) {
                Ok(v) => v,
                Err(e) => return self.fail(e),
            };
            let first = index == 0;
            // `index < count`, so neither this nor the `+ 1`s below wrap;
            // the saturating forms only say so to the lint.
            let next_index = index.saturating_add(1);
            let last = next_index == self.count;
            let continues_from_prev = first
                && self
                    .flags
                    .contains(ChunkFlags::FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK);
            if size == MAX_MESSAGE_LEN {
                self.done = true;
                return Some(Ok(FragmentEvent::Dropped(DroppedPacket {
                    index,
                    offset,
                    continues_from_prev,
                })));
            }
            // `offset < payload.len()` and the varint lies inside the rest:
            // `start <= payload.len()`; `size` < 2^28 cannot overflow it.
            let start = offset.saturating_add(varint_len);
            let available = self.payload.len().saturating_sub(start);
            let end = start.saturating_add(size as usize);
            let Some(data) = self.payload.get(start..end) else {
                return self.fail(ChunkError::FragmentOverflow {
                    index,
                    offset,
                    size,
                    available,
                });
            };
            self.pos = end;
            self.index = next_index;
            if data.is_empty() {
                continue;
            }
            let continues_on_next = last
                && self
                    .flags
                    .contains(ChunkFlags::LAST_PACKET_CONTINUES_ON_NEXT_CHUNK);
            return Some(Ok(FragmentEvent::Data(Fragment {
                index,
                offset,
                data,
                continues_from_prev,
                continues_on_next,
            })));
        }
        None
    }
}

impl core::iter::FusedIterator for Fragments<'_> {}

// Tests may panic: that is how they fail.
#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
mod tests {
    use super::*;
    use std::vec::Vec;

    fn packets(count: u16, flags: u8) -> Packets {
        Packets::new(count, ChunkFlags::from_bits_retain(flags)).expect("count <= 1023")
    }

    fn collect(it: Fragments<'_>) -> Vec<Result<FragmentEvent<'_>, ChunkError>> {
        it.collect()
    }

    fn data<'a>(
        index: u16,
        offset: usize,
        data: &'a [u8],
        prev: bool,
        next: bool,
    ) -> FragmentEvent<'a> {
        FragmentEvent::Data(Fragment {
            index,
            offset,
            data,
            continues_from_prev: prev,
            continues_on_next: next,
        })
    }

    /// Appendix B: page 0, Div1, chunk 0 complete, writer 1, chunk id 0.
    const APPENDIX_B_CHUNK: [u8; 16] = [
        0x00, 0x00, 0x00, 0x00, // chunk_id = 0
        0x01, 0x00, // writer_id = 1
        0x02, 0x00, // count = 2, flags = 0
        0x02, 0x40, 0x64, // fragment 0
        0x02, 0x40, 0x65, // fragment 1
        0xEE, 0xEE, // unused tail
    ];

    #[test]
    fn parses_the_appendix_b_chunk() {
        let (header, frags) = Fragments::from_chunk(&APPENDIX_B_CHUNK).expect("header");
        assert_eq!(
            (header.chunk_id, header.writer_id, header.packets.count()),
            (0, 1, 2)
        );
        assert_eq!(
            collect(frags),
            [
                Ok(data(0, 0, &[0x40, 0x64], false, false)),
                Ok(data(1, 3, &[0x40, 0x65], false, false)),
            ]
        );
    }

    #[test]
    fn continuation_flags_apply_to_first_and_last_fragment_only() {
        // 3 fragments, needs patching + continues on next (packets 0x1803).
        let payload = [0x01, 0xAA, 0x01, 0xBB, 0x84, 0x80, 0x80, 0x00, 1, 2, 3, 4];
        assert_eq!(packets(3, 0x6).bits(), 0x1803);
        assert_eq!(
            collect(Fragments::new(&payload, packets(3, 0x6))),
            [
                Ok(data(0, 0, &[0xAA], false, false)),
                Ok(data(1, 2, &[0xBB], false, false)),
                Ok(data(2, 4, &[1, 2, 3, 4], false, true)),
            ]
        );
        // A middle chunk: one fragment, continues both ways (0x0C01).
        let payload = [0x82, 0x80, 0x80, 0x00, 9, 9];
        assert_eq!(packets(1, 0x3).bits(), 0x0C01);
        assert_eq!(
            collect(Fragments::new(&payload, packets(1, 0x3))),
            [Ok(data(0, 0, &[9, 9], true, true))]
        );
    }

    #[test]
    fn zero_length_fragments_are_skipped() {
        // An inflated count padded with 0x00, and zero fragments in between.
        let payload = [0x00, 0x01, 0x07, 0x00, 0x00];
        assert_eq!(
            collect(Fragments::new(&payload, packets(4, 0))),
            [Ok(data(1, 1, &[0x07], false, false))]
        );
        // Redundant zero size `80 80 80 00` is a zero-length fragment as well.
        let payload = [0x80, 0x80, 0x80, 0x00, 0x01, 0x05];
        assert_eq!(
            collect(Fragments::new(&payload, packets(2, 0))),
            [Ok(data(1, 4, &[0x05], false, false))]
        );
    }

    #[test]
    fn drop_sentinel_is_reported_and_ends_the_chunk() {
        let payload = [0x01, 0x07, 0xFF, 0xFF, 0xFF, 0x7F, 0x01, 0x08];
        assert_eq!(
            collect(Fragments::new(&payload, packets(3, 0x1))),
            [
                Ok(data(0, 0, &[0x07], true, false)),
                Ok(FragmentEvent::Dropped(DroppedPacket {
                    index: 1,
                    offset: 2,
                    continues_from_prev: false
                })),
            ]
        );
        // On a continuation fragment the dropped packet began earlier.
        let payload = [0xFF, 0xFF, 0xFF, 0x7F];
        assert_eq!(
            collect(Fragments::new(&payload, packets(1, 0x1))),
            [Ok(FragmentEvent::Dropped(DroppedPacket {
                index: 0,
                offset: 0,
                continues_from_prev: true
            }))]
        );
    }

    #[test]
    fn each_malformation_has_its_own_error() {
        // Count larger than the content.
        let payload = [0x01, 0x07];
        assert_eq!(
            collect(Fragments::new(&payload, packets(3, 0))),
            [
                Ok(data(0, 0, &[0x07], false, false)),
                Err(ChunkError::CountExceedsContent { count: 3, found: 1 }),
            ]
        );
        // Truncated size varint.
        let payload = [0x01, 0x07, 0x85, 0x80];
        assert_eq!(
            collect(Fragments::new(&payload, packets(2, 0)))[1],
            Err(ChunkError::TruncatedSize {
                index: 1,
                offset: 2
            })
        );
        // Size varint longer than 4 bytes.
        let payload = [0x80, 0x80, 0x80, 0x80, 0x00, 0x00];
        assert_eq!(
            collect(Fragments::new(&payload, packets(1, 0))),
            [Err(ChunkError::SizeTooLong {
                index: 0,
                offset: 0
            })]
        );
        // Size past the end of the payload.
        let payload = [0x05, 1, 2, 3];
        assert_eq!(
            collect(Fragments::new(&payload, packets(1, 0))),
            [Err(ChunkError::FragmentOverflow {
                index: 0,
                offset: 0,
                size: 5,
                available: 3
            })]
        );
        // A truncated header.
        assert_eq!(
            Fragments::from_chunk(&[0u8; 7]).map(|(h, _)| h),
            Err(ChunkError::HeaderTruncated { len: 7 })
        );
    }

    #[test]
    fn iteration_is_fused_after_an_error() {
        let payload = [0x05, 1];
        let mut it = Fragments::new(&payload, packets(1, 0));
        assert!(matches!(it.next(), Some(Err(_))));
        assert_eq!(it.next(), None);
        assert_eq!(it.next(), None);
    }

    #[test]
    fn incomplete_chunks_trust_count_minus_one_and_drop_tail_flags() {
        // Being written: 2 counted, the second unfinished (size not yet set).
        let payload = [0x01, 0x07, 0x00, 0x00, 0x00, 0x00, 0x09];
        let it = Fragments::new_incomplete(&payload, packets(2, 0x7));
        assert_eq!(
            it.flags(),
            ChunkFlags::FIRST_PACKET_CONTINUES_FROM_PREV_CHUNK
        );
        assert_eq!(collect(it), [Ok(data(0, 0, &[0x07], true, false))]);
        assert_eq!(
            collect(Fragments::new_incomplete(&payload, packets(0, 0))),
            []
        );
    }

    #[test]
    fn consumed_tracks_the_end_of_the_last_fragment() {
        let mut it = Fragments::new(&APPENDIX_B_CHUNK[8..], packets(2, 0));
        assert_eq!(it.consumed(), 0);
        it.next();
        assert_eq!(it.consumed(), 3);
        it.next();
        assert_eq!(it.consumed(), 6);
    }
}
