//! Counters of one trace buffer, with the meanings of Perfetto's
//! `TraceStats.BufferStats` (protos/perfetto/common/trace_stats.proto, kept
//! by upstream's src/tracing/service/trace_buffer_v1.cc).

/// Counters of one [`TraceBuffer`](super::TraceBuffer).
///
/// Byte counts are *footprints*: a chunk's stored bytes rounded up to
/// [`RECORD_ALIGN`](super::RECORD_ALIGN) plus the
/// [`RECORD_OVERHEAD`](super::RECORD_OVERHEAD) each record is charged for its
/// index entry, like upstream counts its record headers.
///
/// Every chunk that is stored ends as exactly one of: read
/// (`chunks_read`), overwritten (`chunks_overwritten`), replaced by a
/// re-commit that had to move (`chunks_relocated`), or still in the buffer.
/// Every chunk that is offered but not stored is counted in
/// `chunks_discarded` or `abi_violations`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BufferStats {
    /// Configured size in bytes.
    pub buffer_size: u64,
    /// Footprint of every record written (chunks and padding).
    pub bytes_written: u64,
    /// Footprint of records evicted while they still held unread fragments.
    pub bytes_overwritten: u64,
    /// Footprint of records the reader finished.
    pub bytes_read: u64,
    /// Bytes left empty at the end of the ring when the write cursor wrapped.
    pub padding_bytes_written: u64,
    /// Padding bytes reclaimed by later writes.
    pub padding_bytes_cleared: u64,
    /// New chunks stored.
    pub chunks_written: u64,
    /// Re-commits of a stored chunk that replaced its copy (scrape, then the
    /// real commit).
    pub chunks_rewritten: u64,
    /// Re-commits that grew beyond the old copy's footprint and were stored
    /// anew at the write cursor (the old copy is dead).
    pub chunks_relocated: u64,
    /// Chunks evicted by the ring buffer while they held unread fragments.
    pub chunks_overwritten: u64,
    /// Chunks refused: by the DISCARD policy once full, or arriving after the
    /// reader had moved past their position in the sequence.
    pub chunks_discarded: u64,
    /// Chunks the reader finished.
    pub chunks_read: u64,
    /// Chunks that arrived with an id older than the newest of their
    /// sequence.
    pub chunks_committed_out_of_order: u64,
    /// Times the write cursor wrapped to the start of the ring.
    pub write_wrap_count: u64,
    /// Patches applied.
    pub patches_succeeded: u64,
    /// Patch groups that failed: chunk gone, or a patch out of bounds.
    pub patches_failed: u64,
    /// Packets spanning chunks that were reassembled.
    pub readaheads_succeeded: u64,
    /// Packets spanning chunks that could not be reassembled.
    pub readaheads_failed: u64,
    /// Malformed producer data: unparsable fragments, chunks larger than the
    /// buffer, re-commits that shrink or drop flags.
    pub abi_violations: u64,
    /// Drop sentinels seen (packets the writer abandoned).
    pub trace_writer_packet_loss: u64,
}

impl BufferStats {
    /// These counters with the read ones (bytes and chunks read,
    /// readaheads) at zero: a cloned buffer's start.
    pub fn without_reads(self) -> Self {
        Self {
            bytes_read: 0,
            chunks_read: 0,
            readaheads_succeeded: 0,
            readaheads_failed: 0,
            ..self
        }
    }
}
