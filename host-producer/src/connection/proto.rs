//! Pure conversions between the producer's own types and the protocol's
//! messages (prost types from `shmtrace-ipc`): the data source configs the
//! service sends, the descriptors data sources are registered with, and the
//! `CommitDataRequest`s the sender builds (cut into parts under SMB
//! emulation). No I/O: the connection sends and receives what these build.

use bytes::Bytes;
use shmtrace_ipc::protos::{self as pb, commit_data_request};

use crate::connection::outbox::{ChunkToMove, ChunkToPatch, CommitRequest, DescriptorInfo};
use crate::data_source::DataSourceConfig;
use crate::track_event::filter::TrackEventConfig;

/// Largest CommitData the sender builds under emulation (chunk bytes ride
/// in the message; `kMaxCommitDataRequestChunkSize`).
pub(crate) const MAX_EMULATED_COMMIT_BYTES: usize = 130_560;
/// Decodes the parts of a serialized `DataSourceConfig` the runtime uses.
pub(crate) fn decode_config(raw: Option<&Bytes>) -> DataSourceConfig {
    let raw = raw.cloned().unwrap_or_default();
    let parsed: pb::DataSourceConfig = prost::Message::decode(raw.clone()).unwrap_or_default();
    let track_event_config = parsed.track_event_config.as_ref().map(|b| {
        let t: pb::TrackEventConfig = prost::Message::decode(b.clone()).unwrap_or_default();
        TrackEventConfig {
            disabled_categories: t.disabled_categories,
            enabled_categories: t.enabled_categories,
            disabled_tags: t.disabled_tags,
            enabled_tags: t.enabled_tags,
        }
    });
    DataSourceConfig {
        name: parsed.name.unwrap_or_default(),
        target_buffer: parsed.target_buffer.unwrap_or(0),
        trace_duration_ms: parsed.trace_duration_ms.unwrap_or(0),
        tracing_session_id: parsed.tracing_session_id.unwrap_or(0),
        track_event_config,
        // DROP = 1, STALL_THEN_ABORT = 2, STALL_THEN_DROP = 3.
        stall_when_exhausted: match parsed.buffer_exhausted_policy {
            Some(1) => Some(false),
            Some(2 | 3) => Some(true),
            _ => None,
        },
        raw: raw.to_vec(),
    }
}

/// The `DataSourceDescriptor` a data source is registered with: ours, plus
/// the data source's extra fields (those the protocol schema knows, e.g.
/// `gpu_counter_descriptor`; later fields replace earlier ones). The
/// identity and notification fields are always ours.
pub(crate) fn descriptor_proto(d: &DescriptorInfo) -> pb::DataSourceDescriptor {
    let mut desc = pb::DataSourceDescriptor::default();
    if !d.extra_fields.is_empty() {
        if let Err(e) = prost::Message::merge(&mut desc, &d.extra_fields[..]) {
            log::warn!("shmtrace-producer: data source {:?}: ignoring malformed extra descriptor fields: {e}", d.name);
            desc = pb::DataSourceDescriptor::default();
        }
    }
    desc.name = Some(d.name.clone());
    desc.id = Some(d.id);
    desc.will_notify_on_stop = Some(true);
    desc.will_notify_on_start = Some(true);
    desc.handles_incremental_state_clear = Some(true);
    desc.no_flush = d.no_flush.then_some(true);
    if let Some(te) = &d.track_event_descriptor {
        desc.track_event_descriptor = Some(Bytes::from(te.clone()));
    }
    desc
}

/// `CommitDataRequest` for some chunks and patch groups of a request.
pub(crate) fn commit_proto(
    chunks: &[ChunkToMove],
    patches: &[ChunkToPatch],
    flush_request_id: u64,
) -> pb::CommitDataRequest {
    pb::CommitDataRequest {
        chunks_to_move: chunks
            .iter()
            .map(|c| commit_data_request::ChunksToMove {
                page: c.data.is_none().then_some(c.page),
                chunk: c.data.is_none().then_some(c.chunk),
                target_buffer: Some(c.target_buffer),
                data: c.data.clone().map(Bytes::from),
                chunk_incomplete: None,
            })
            .collect(),
        chunks_to_patch: patches
            .iter()
            .map(|p| commit_data_request::ChunkToPatch {
                target_buffer: Some(p.target_buffer),
                writer_id: Some(p.writer_id),
                chunk_id: Some(p.chunk_id),
                patches: p
                    .patches
                    .iter()
                    .map(|e| commit_data_request::chunk_to_patch::Patch {
                        offset: Some(e.offset),
                        data: Some(Bytes::copy_from_slice(&e.data)),
                    })
                    .collect(),
                has_more_patches: Some(p.has_more_patches),
            })
            .collect(),
        flush_request_id: (flush_request_id != 0).then_some(flush_request_id),
    }
}

/// Upper bound of a `ChunksToMove`'s encoded size (inline bytes + framing;
/// upstream's estimate).
fn move_size(c: &ChunkToMove) -> usize {
    c.data.as_ref().map_or(0, Vec::len) + 32
}

/// Upper bound of a `ChunkToPatch`'s encoded size (upstream's estimate).
fn patch_size(p: &ChunkToPatch) -> usize {
    32 + p.patches.iter().map(|e| e.data.len() + 16).sum::<usize>()
}

/// Emulated SMB: chunk bytes ride in the request, so it is cut into
/// messages whose estimated size stays under [`MAX_EMULATED_COMMIT_BYTES`]
/// (the IPC frame limit minus headroom). As upstream does: chunks first, in
/// order; then the patch groups, packed after the last chunks and into as
/// many trailing messages as they need (patches apply after moves and IPC
/// is ordered); the flush ack rides on the last message only, so the
/// service acknowledges the flush once everything has arrived.
pub(crate) fn emulated_parts(req: &CommitRequest) -> Vec<pb::CommitDataRequest> {
    // Part boundaries over the sequence "every chunk, then every patch".
    let sizes = req
        .chunks_to_move
        .iter()
        .map(move_size)
        .chain(req.chunks_to_patch.iter().map(patch_size));
    let mut cuts = vec![0];
    let mut bytes = 0;
    for (i, len) in sizes.enumerate() {
        if bytes != 0 && bytes + len >= MAX_EMULATED_COMMIT_BYTES {
            cuts.push(i);
            bytes = 0;
        }
        bytes += len;
    }
    let total = req.chunks_to_move.len() + req.chunks_to_patch.len();
    cuts.push(total);
    let moves = req.chunks_to_move.len();
    let last = cuts.len() - 2;
    cuts.windows(2)
        .enumerate()
        .map(|(n, w)| {
            let (a, b) = (w[0], w[1]);
            let chunks = &req.chunks_to_move[a.min(moves)..b.min(moves)];
            let patches = &req.chunks_to_patch[a.max(moves) - moves..b.max(moves) - moves];
            let flush = if n == last { req.flush_request_id } else { 0 };
            commit_proto(chunks, patches, flush)
        })
        .collect()
}
