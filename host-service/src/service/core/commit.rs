//! `CommitData`: moving chunks out of a producer's SMB (or out of the
//! request, in shmem emulation) into trace buffers, applying patches, and
//! SMB scraping (upstream: `ProducerEndpointImpl::CommitData` in
//! src/tracing/service/tracing_service_endpoints_impl.cc,
//! `TracingServiceImpl::CopyProducerPageIntoLogBuffer`, `ApplyChunkPatches`
//! and `ScrapeSharedMemoryBuffers` in src/tracing/service/tracing_service_impl.cc).
//!
//! Every chunk is copied before it is looked at (once: from the SMB straight
//! into a reservation in its trace buffer, where the buffer allows); every index and id the
//! producer sends is checked against what it owns. A chunk the producer may
//! not write (unknown or foreign buffer, or not the buffer its writer
//! registered) is discarded and counted. Where upstream would abort on a
//! `CHECK` — the producer changed a chunk's layout or state while the
//! service held it — the producer loses its connection.

use std::collections::HashMap;

use shmtrace_abi::layout::{ChunkHeaderRepr, CHUNK_HEADER_SIZE, MAX_WRITER_ID};
use shmtrace_abi::reader::MAX_PATCHES_PER_GROUP;
use shmtrace_abi::smb::CopyError;

use super::error::CommitError;
use super::producer::Producer;
use super::{BufferId, ProducerId, SessionId, TracingService};
use crate::protos::commit_data_request::{ChunkToPatch, ChunksToMove};
use crate::protos::CommitDataRequest;
use crate::service::buffer::{ChunkCommit, PatchResult, TraceBuffer};
use crate::service::shm::SharedMemory;

/// Largest chunk accepted in `ChunksToMove.data` (the chunk header's
/// 16-bit sizes; upstream truncates 65536 and would abort).
pub const MAX_EMULATED_CHUNK: usize = 65535;

impl TracingService {
    /// Handles one `CommitDataRequest` of `producer`: moves, then patches,
    /// then the flush ack. `Err` names a fault that costs the producer its
    /// connection.
    pub(super) fn commit_data(
        &mut self,
        producer: ProducerId,
        req: CommitDataRequest,
    ) -> Result<(), CommitError> {
        for c in &req.chunks_to_move {
            self.move_chunk(producer, c)?;
        }
        for p in &req.chunks_to_patch {
            self.patch_chunk(producer, p);
        }
        if let Some(id) = req.flush_request_id.filter(|&id| id != 0) {
            self.flush_acked(producer, id);
        }
        Ok(())
    }

    /// Whether `producer` may write chunks of `writer` into `buffer`.
    fn may_write(&self, producer: ProducerId, writer: u16, buffer: u32) -> Option<BufferId> {
        let p = self.producers.get(&producer)?;
        let buffer = target_of(p, &self.buffers, buffer)?;
        writer_may_write(p, writer, buffer).then_some(buffer)
    }

    fn move_chunk(&mut self, producer: ProducerId, c: &ChunksToMove) -> Result<(), CommitError> {
        let target = c.target_buffer.unwrap_or(0);
        if let Some(data) = &c.data {
            self.move_inline_chunk(producer, target, data, c.chunk_incomplete.unwrap_or(false));
            return Ok(());
        }
        if self.producers.get(&producer).is_some_and(|p| p.emulated) {
            // A page reference from a producer whose SMB the service does
            // not have: nothing to read.
            self.stats.chunks_discarded += 1;
            return Ok(());
        }
        let (page, chunk) = (
            c.page.unwrap_or(u32::MAX) as usize,
            c.chunk.unwrap_or(u32::MAX) as usize,
        );
        match self.take_chunk(producer, page, chunk, target)? {
            Taken::Stored | Taken::Nothing => {}
            Taken::Copied(header, len) => {
                let copy = std::mem::take(&mut self.chunk_copy);
                let payload = copy.get(CHUNK_HEADER_SIZE..len).unwrap_or(&[]);
                self.store_chunk(producer, target, header, payload, true);
                self.chunk_copy = copy;
            }
        }
        Ok(())
    }

    /// Stores a chunk sent inline (shmem emulation): `data` is the whole
    /// chunk, header included, as the producer copied it out of its own
    /// buffer; `page`/`chunk` of the request are informational. Sizes
    /// outside `CHUNK_HEADER_SIZE..=MAX_EMULATED_CHUNK` (upstream truncates
    /// the size to 16 bits and would abort at 65536), an invalid header, a
    /// buffer the producer may not write: the chunk is discarded and
    /// counted (`chunks_discarded`). The payload then goes through the same
    /// checks as a chunk read from an SMB (the trace buffer parses its
    /// fragments as hostile input).
    fn move_inline_chunk(
        &mut self,
        producer: ProducerId,
        target: u32,
        data: &[u8],
        incomplete: bool,
    ) {
        if data.len() < CHUNK_HEADER_SIZE || data.len() > MAX_EMULATED_CHUNK {
            log::debug!(
                "producer {producer}: discarding an inline chunk of {} bytes",
                data.len()
            );
            self.stats.chunks_discarded += 1;
            return;
        }
        let mut head = [0u8; CHUNK_HEADER_SIZE];
        head.copy_from_slice(&data[..CHUNK_HEADER_SIZE]);
        let header = ChunkHeaderRepr::from_bytes(head);
        self.store_chunk(
            producer,
            target,
            header,
            &data[CHUNK_HEADER_SIZE..],
            !incomplete,
        );
    }

    /// Takes chunk `page`/`chunk` out of `producer`'s SMB and frees it. The
    /// chunk is copied once, straight into a reservation of the target
    /// buffer, and stored from there; where the buffer gives no reservation
    /// it is copied into `self.chunk_copy` for [`store_chunk`](Self::store_chunk).
    fn take_chunk(
        &mut self,
        producer: ProducerId,
        page: usize,
        chunk: usize,
        target: u32,
    ) -> Result<Taken, CommitError> {
        // Out of the producer while it is read (its view borrows it, and
        // the copy borrows `self`), back in afterwards.
        let Some(mut shm) = self.producers.get_mut(&producer).and_then(|p| p.smb.take()) else {
            return Ok(Taken::Nothing);
        };
        let taken = self.take_chunk_from(&mut shm, producer, page, chunk, target);
        if let Some(p) = self.producers.get_mut(&producer) {
            p.smb = Some(shm);
        }
        taken
    }

    /// [`take_chunk`](Self::take_chunk) from `shm`, `producer`'s SMB.
    fn take_chunk_from(
        &mut self,
        shm: &mut SharedMemory,
        producer: ProducerId,
        page: usize,
        chunk: usize,
        target: u32,
    ) -> Result<Taken, CommitError> {
        let Some(p) = self.producers.get(&producer) else {
            return Ok(Taken::Nothing);
        };
        let smb = shm.smb();
        // Complete → BeingRead; anything else (out of range, not complete)
        // is ignored, as upstream does.
        let Ok(readable) = smb.try_acquire_chunk_for_reading(page, chunk) else {
            return Ok(Taken::Nothing);
        };
        let buffer = target_of(p, &self.buffers, target);
        let mut reservation = buffer
            .and_then(|b| self.buffers.get_mut(&b))
            .and_then(|(_, buf)| buf.reserve(readable.chunk_size()));
        let copied = match &mut reservation {
            Some(r) => readable.copy_out(r.chunk_mut()),
            None => readable.copy_out(&mut self.chunk_copy),
        };
        if let Err(source) = readable.release_as_free() {
            // Upstream CHECK-fails here: the producer changed the page under
            // us.
            return Err(CommitError::ChunkChanged {
                producer,
                page,
                chunk,
                source,
            });
        }
        let copied = match copied {
            Ok(copied) => copied,
            Err(CopyError::InvalidHeader(e)) => {
                log::debug!("producer {producer}: chunk {page}/{chunk} has an invalid header: {e}");
                self.stats.chunks_discarded += 1;
                return Ok(Taken::Nothing);
            }
            Err(source) => return Err(CommitError::Copy { producer, source }),
        };
        let Some(reservation) = reservation else {
            return Ok(Taken::Copied(copied.header, copied.len));
        };
        // The reservation exists only if the target buffer does, so
        // `buffer` is that buffer.
        if buffer.is_some_and(|b| writer_may_write(p, copied.header.writer_id, b)) {
            reservation.commit(producer, true);
        } else {
            drop(reservation);
            self.stats.chunks_discarded += 1;
        }
        Ok(Taken::Stored)
    }

    /// Offers a copied chunk to its buffer if the producer may write there.
    fn store_chunk(
        &mut self,
        producer: ProducerId,
        target: u32,
        header: ChunkHeaderRepr,
        payload: &[u8],
        complete: bool,
    ) {
        if header.validate().is_err() {
            self.stats.chunks_discarded += 1;
            return;
        }
        let Some(buffer) = self.may_write(producer, header.writer_id, target) else {
            self.stats.chunks_discarded += 1;
            return;
        };
        if let Some((_, buf)) = self.buffers.get_mut(&buffer) {
            buf.commit(&ChunkCommit::new(producer, &header, payload, complete));
        }
    }

    fn patch_chunk(&mut self, producer: ProducerId, p: &ChunkToPatch) {
        let n = p.patches.len() as u64;
        let writer = p.writer_id.unwrap_or(0);
        let buffer = BufferId::try_from(p.target_buffer.unwrap_or(0)).ok();
        let valid_writer = (1..=u32::from(MAX_WRITER_ID)).contains(&writer);
        let Some(buffer) = buffer.filter(|b| valid_writer && self.buffers.contains_key(b)) else {
            self.stats.patches_discarded += n;
            return;
        };
        if p.patches.len() > MAX_PATCHES_PER_GROUP {
            self.stats.patches_discarded += n;
            return;
        }
        let patches: Vec<(u32, &[u8])> = p
            .patches
            .iter()
            .map(|x| {
                (
                    x.offset.unwrap_or(u32::MAX),
                    x.data.as_deref().unwrap_or(&[]),
                )
            })
            .collect();
        let Some((_, buf)) = self.buffers.get_mut(&buffer) else {
            return;
        };
        // The key includes the trusted producer id: a producer can only
        // ever patch its own chunks.
        match buf.patch(
            producer,
            writer as u16,
            p.chunk_id.unwrap_or(0),
            &patches,
            p.has_more_patches.unwrap_or(false),
        ) {
            PatchResult::Applied(outcome) => {
                self.stats.patches_discarded += u64::from(outcome.discarded)
            }
            PatchResult::TooMany(_) => self.stats.patches_discarded += n,
            PatchResult::ChunkNotFound => {}
        }
    }

    /// Scrapes `producer`'s SMB (if it asked for scraping): copies every
    /// chunk being written or complete-but-uncommitted into the buffer its
    /// writer registered — of session `only` if given.
    ///
    /// Without a registered writer whose buffer would take its chunks (its
    /// threads have exited, or it writes into no buffer of `only`), nothing
    /// can be copied, so the SMB is not read at all: reading every page's
    /// header would map, and for pages the producer never used allocate,
    /// the whole SMB in the service (32 MiB for upstream's largest).
    /// Upstream returns early alike when the producer has no writers or no
    /// buffer in the session (`ScrapeSharedMemoryBuffers`,
    /// src/tracing/service/tracing_service_impl.cc).
    pub(super) fn scrape_producer(&mut self, producer: ProducerId, only: Option<SessionId>) {
        let Some(p) = self.producers.get_mut(&producer) else {
            return;
        };
        if !p.scraping {
            return;
        }
        let buffers = &self.buffers;
        let takes_chunks = |b: &BufferId| {
            buffers
                .get(b)
                .is_some_and(|(sid, _)| only.is_none_or(|s| s == *sid))
        };
        if !p.writers.values().any(takes_chunks) {
            return;
        }
        let Some(shm) = p.smb.as_mut() else { return };
        let writers = p.writers.clone();
        let mut found = Vec::new();
        let mut dst = vec![0u8; shm.page_size().get()];
        let result = shm.scrape_all(&mut dst, |scraped, bytes| {
            let Some(&buffer) = writers.get(&scraped.header.writer_id) else {
                return;
            };
            found.push((
                buffer,
                scraped.header,
                scraped.complete,
                bytes.get(CHUNK_HEADER_SIZE..).unwrap_or(&[]).to_vec(),
            ));
        });
        if let Err(e) = result {
            log::warn!("producer {producer}: scraping failed: {e}");
        }
        for (buffer, header, complete, payload) in found {
            let Some((sid, buf)) = self.buffers.get_mut(&buffer) else {
                continue;
            };
            if only.is_some_and(|s| s != *sid) {
                continue;
            }
            buf.commit(&ChunkCommit::new(producer, &header, &payload, complete));
        }
    }
}

/// What [`TracingService::take_chunk`] did.
enum Taken {
    /// No chunk to take (no SMB, not complete, out of range, invalid header).
    Nothing,
    /// Copied into a reservation and stored (or discarded).
    Stored,
    /// Copied into `chunk_copy`: header and chunk length.
    Copied(ChunkHeaderRepr, usize),
}

/// The buffer `target` if `p` may write into it at all.
fn target_of(
    p: &Producer,
    buffers: &HashMap<BufferId, (SessionId, TraceBuffer)>,
    target: u32,
) -> Option<BufferId> {
    let buffer = BufferId::try_from(target).ok()?;
    (buffers.contains_key(&buffer) && p.allowed_buffers.contains(&buffer)).then_some(buffer)
}

/// Whether `writer` of `p` may write into `buffer` (the buffer its data
/// source registered it for, if it registered).
fn writer_may_write(p: &Producer, writer: u16, buffer: BufferId) -> bool {
    p.writers
        .get(&writer)
        .is_none_or(|&registered| registered == buffer)
}
