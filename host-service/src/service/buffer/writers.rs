//! Per-writer chunk statistics (`TraceStats.writer_stats`,
//! protos/perfetto/common/trace_stats.proto): for
//! every `{producer, writer}` that had a chunk read, a histogram of the
//! chunks' payload sizes.
//!
//! Like upstream's default buffer (V1), a chunk is counted when it has been
//! read completely and was complete (not a scraped, unfinished copy); the
//! value is the size of its valid fragments. The buckets are upstream's:
//! upper bounds [`BUCKET_BOUNDS`] plus an overflow bucket.
//!
//! At most [`MAX_WRITERS`] writers are tracked per buffer (upstream's map is
//! unbounded; 32767 writer ids per producer would let one producer grow it
//! without limit). Chunks of writers beyond the cap are counted in
//! [`WriterStats::untracked_chunks`].

use std::collections::BTreeMap;

use super::{ProducerId, WriterId};

/// Upper bounds (inclusive) of the histogram buckets, in bytes; one more
/// bucket holds everything larger.
pub const BUCKET_BOUNDS: [i64; 10] = [8, 32, 128, 512, 1024, 2048, 4096, 8192, 12288, 16384];

/// Number of buckets, the overflow bucket included.
pub const NUM_BUCKETS: usize = BUCKET_BOUNDS.len() + 1;

/// Most writers tracked per buffer.
pub const MAX_WRITERS: usize = 4096;

/// Payload sizes of one writer's chunks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChunkHistogram {
    /// Chunks per bucket.
    pub counts: [u64; NUM_BUCKETS],
    /// Sum of the payload sizes per bucket.
    pub sums: [i64; NUM_BUCKETS],
}

impl ChunkHistogram {
    /// Counts one chunk of `payload` bytes.
    pub fn add(&mut self, payload: usize) {
        let value = i64::try_from(payload).unwrap_or(i64::MAX);
        let bucket = BUCKET_BOUNDS
            .iter()
            .position(|&bound| value <= bound)
            .unwrap_or(NUM_BUCKETS - 1);
        self.counts[bucket] += 1;
        self.sums[bucket] = self.sums[bucket].saturating_add(value);
    }
}

/// The histograms of a buffer's writers.
#[derive(Debug, Default, Clone)]
pub struct WriterStats {
    writers: BTreeMap<(ProducerId, WriterId), ChunkHistogram>,
    /// Chunks read of writers not tracked (beyond `MAX_WRITERS`).
    pub untracked_chunks: u64,
}

impl WriterStats {
    /// Counts a chunk of `writer` of `producer` read completely.
    pub fn chunk_read(&mut self, producer: ProducerId, writer: WriterId, payload: usize) {
        let full = self.writers.len() >= MAX_WRITERS;
        match self.writers.get_mut(&(producer, writer)) {
            Some(h) => h.add(payload),
            None if full => self.untracked_chunks += 1,
            None => self
                .writers
                .entry((producer, writer))
                .or_default()
                .add(payload),
        }
    }

    /// Every tracked writer with its histogram, by producer then writer.
    pub fn iter(&self) -> impl Iterator<Item = (ProducerId, WriterId, &ChunkHistogram)> {
        self.writers.iter().map(|(&(p, w), h)| (p, w, h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_land_in_upstreams_buckets() {
        let mut h = ChunkHistogram::default();
        for size in [0, 8, 9, 4088, 4096, 16384, 16385, 65535] {
            h.add(size);
        }
        assert_eq!(h.counts, [2, 1, 0, 0, 0, 0, 2, 0, 0, 1, 2]);
        assert_eq!(h.sums[0], 8);
        assert_eq!(h.sums[6], 4088 + 4096);
        assert_eq!(h.sums[10], 16385 + 65535);
    }

    #[test]
    fn writers_beyond_the_cap_are_counted_not_tracked() {
        let mut w = WriterStats::default();
        for writer in 0..MAX_WRITERS as u16 {
            w.chunk_read(1, writer + 1, 100);
        }
        w.chunk_read(2, 1, 100);
        w.chunk_read(1, 1, 100);
        assert_eq!(w.untracked_chunks, 1);
        assert_eq!(w.iter().count(), MAX_WRITERS);
        assert_eq!(w.iter().next().map(|(_, _, h)| h.counts[2]), Some(2));
    }
}
