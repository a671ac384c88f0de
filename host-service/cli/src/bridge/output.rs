//! What the [engine](super::engine) drives: the producer library's
//! chunk forwarding, behind a small trait so the engine can be tested
//! without a service.

use std::collections::HashMap;
use std::sync::Arc;

use shmtrace_producer::{
    BufferExhaustedPolicy, ChunkForwarder, DataSourceHandler, DataSourceOptions, ForwardError,
    ForwardPatch, ForwardStats, Forwarded, ForwardedSequence, RegisterError,
};

/// The forwarding side of the engine.
pub trait Output {
    /// One forwarded sequence (one firmware writer in one boot).
    type Sequence;
    /// Registers data source `name` (once; later calls do nothing).
    fn register(&mut self, name: &str) -> Result<(), RegisterError>;
    /// A new sequence of data source `name` (registered before).
    fn new_sequence(&mut self, name: &str) -> Option<Self::Sequence>;
    /// See [`ForwardedSequence::forward_chunk`].
    fn forward_chunk(
        &mut self,
        seq: &mut Self::Sequence,
        chunk: &[u8],
    ) -> Result<Forwarded, ForwardError>;
    /// See [`ForwardedSequence::forward_patches`].
    fn forward_patches(
        &mut self,
        seq: &mut Self::Sequence,
        chunk_id: u32,
        patches: &[ForwardPatch],
        has_more: bool,
    ) -> usize;
    /// See [`ForwardedSequence::set_injected_packet`].
    fn set_injected_packet(&mut self, seq: &mut Self::Sequence, packet: &[u8]);
    /// See [`ForwardedSequence::mark_loss`].
    fn mark_loss(&mut self, seq: &mut Self::Sequence, instance_id: Option<u64>) -> usize;
}

/// The producer library's forwarding: one [`ChunkForwarder`] per data
/// source name, all sharing `handler`.
pub struct ProducerOutput {
    forwarders: HashMap<String, ChunkForwarder>,
    handler: Arc<dyn DataSourceHandler>,
}

/// A handler shared by several data sources.
struct Shared(Arc<dyn DataSourceHandler>);

impl DataSourceHandler for Shared {
    fn on_setup(&self, a: &shmtrace_producer::SetupArgs<'_>) {
        self.0.on_setup(a);
    }
    fn on_start(&self, a: &shmtrace_producer::InstanceArgs<'_>) {
        self.0.on_start(a);
    }
    fn on_stop(&self, a: &shmtrace_producer::InstanceArgs<'_>) {
        self.0.on_stop(a);
    }
    fn on_flush(&self, a: &shmtrace_producer::InstanceArgs<'_>) {
        self.0.on_flush(a);
    }
    fn on_clear_incremental_state(&self, a: &shmtrace_producer::InstanceArgs<'_>) {
        self.0.on_clear_incremental_state(a);
    }
}

/// How long a forward waits for a free chunk of the SMB before dropping
/// the copy (the service frees chunks as it reads our commits).
pub const STALL_LIMIT: std::time::Duration = std::time::Duration::from_millis(100);

impl ProducerOutput {
    /// Forwarding whose data sources all report to `handler`.
    pub fn new(handler: Arc<dyn DataSourceHandler>) -> Self {
        ProducerOutput {
            forwarders: HashMap::new(),
            handler,
        }
    }

    /// The forwarders' counters, summed.
    pub fn stats(&self) -> ForwardStats {
        let mut t = ForwardStats::default();
        for f in self.forwarders.values() {
            let s = f.stats();
            t.chunks_received += s.chunks_received;
            t.chunks_forwarded += s.chunks_forwarded;
            t.chunks_no_session += s.chunks_no_session;
            t.chunks_invalid += s.chunks_invalid;
            t.chunks_too_big += s.chunks_too_big;
            t.chunks_no_room += s.chunks_no_room;
            t.chunks_no_writer_id += s.chunks_no_writer_id;
            t.chunks_lost += s.chunks_lost;
            t.chunks_skipped += s.chunks_skipped;
            t.orphan_fragments_dropped += s.orphan_fragments_dropped;
            t.losses_marked += s.losses_marked;
            t.lanes_restarted += s.lanes_restarted;
            t.packets_injected += s.packets_injected;
            t.start_packets_missed += s.start_packets_missed;
            t.patches_forwarded += s.patches_forwarded;
            t.patches_dropped += s.patches_dropped;
        }
        t
    }

    /// Sends what was forwarded now.
    pub fn flush(&self) {
        for f in self.forwarders.values() {
            f.flush();
        }
    }
}

impl Output for ProducerOutput {
    type Sequence = ForwardedSequence;

    fn register(&mut self, name: &str) -> Result<(), RegisterError> {
        if self.forwarders.contains_key(name) {
            return Ok(());
        }
        let options = DataSourceOptions {
            buffer_exhausted_policy: BufferExhaustedPolicy::StallThenDrop(STALL_LIMIT),
            ..Default::default()
        };
        let f = ChunkForwarder::register(name, options, Shared(self.handler.clone()))?;
        self.forwarders.insert(name.to_owned(), f);
        Ok(())
    }

    fn new_sequence(&mut self, name: &str) -> Option<ForwardedSequence> {
        self.forwarders.get(name).map(ChunkForwarder::new_sequence)
    }

    fn forward_chunk(
        &mut self,
        seq: &mut ForwardedSequence,
        chunk: &[u8],
    ) -> Result<Forwarded, ForwardError> {
        seq.forward_chunk(chunk)
    }

    fn forward_patches(
        &mut self,
        seq: &mut ForwardedSequence,
        chunk_id: u32,
        patches: &[ForwardPatch],
        has_more: bool,
    ) -> usize {
        seq.forward_patches(chunk_id, patches, has_more)
    }

    fn set_injected_packet(&mut self, seq: &mut ForwardedSequence, packet: &[u8]) {
        // Snapshots are ~30 bytes, far below the limit.
        let _ = seq.set_injected_packet(packet);
    }

    fn mark_loss(&mut self, seq: &mut ForwardedSequence, instance_id: Option<u64>) -> usize {
        seq.mark_loss(instance_id)
    }
}
