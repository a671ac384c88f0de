//! Region ABI v1: a firmware's SMB and commit ring in RAM a host can read.
//!
//! A *region* is one block of memory shared by a firmware (the producer)
//! and one consumer: a host process mapping the same RAM (QEMU
//! `memory-backend-file,share=on`, a UIO/devmem window, a dual-core MCU's
//! shared SRAM, a RAM dump), or the firmware itself draining its ring into
//! a byte stream ([`crate::frame`]). It holds a header, a ring of commit
//! records, and a Perfetto SMB (ABI v1 pages and chunks, see
//! [`crate::layout`]). This page is the whole specification: a firmware
//! written in C from it works with the host tools.
//!
//! All integers are little-endian. Offsets are from the region base, which
//! is 8-aligned. Words marked *atomic* are naturally aligned 32-bit words
//! accessed with single 32-bit loads and stores (and compare-and-swap where
//! stated); the 64-bit `magic` and `sync_time` are two such words, low word
//! first.
//!
//! # Layout
//!
//! ```text
//! base + 0                      header (header_size = 256 bytes)
//! base + ring_offset            ring: ring_slots × slot_size (32) bytes
//! base + smb_offset             SMB: smb_size bytes, pages of page_size
//! base + region_size            end
//! ```
//!
//! This crate's [`RegionStorage`] puts the ring at 256 and the SMB right
//! after the ring; a consumer accepts any placement that passes the checks
//! below.
//!
//! ## Header (256 bytes)
//!
//! | offset | type | field | written by | meaning |
//! |---|---|---|---|---|
//! | `0x00` | `[u8; 8]` | `magic` | firmware | `73 68 6d 74 72 61 63 65` ("shmtrace"); the word at `0x00` is cleared first and written last at initialization |
//! | `0x08` | u16 | `version` | firmware | 1 |
//! | `0x0A` | u16 | `header_size` | firmware | 256 (a consumer accepts any multiple of 8 >= 256 and reads the first 256) |
//! | `0x0C` | u32 | `region_size` | firmware | bytes from the base to the end of the region |
//! | `0x10` | u32 | `boot_id` | firmware | differs from the previous boot's (see initialization) |
//! | `0x14` | u32 | `flags` | firmware | bit 0 `STREAM_MODE`: the firmware drains the ring itself and a host must not; other bits 0 |
//! | `0x18` | u32 | `ring_offset` | firmware | 8-aligned |
//! | `0x1C` | u32 | `ring_slots` | firmware | power of two, 2..=65536 |
//! | `0x20` | u32 | `slot_size` | firmware | 32 (a consumer accepts multiples of 8 >= 32 and reads the first 32) |
//! | `0x24` | u32 | `smb_offset` | firmware | 8-aligned |
//! | `0x28` | u32 | `smb_size` | firmware | non-zero multiple of `page_size`, at most 65536 pages |
//! | `0x2C` | u32 | `page_size` | firmware | multiple of 4096 in 4096..=65536 |
//! | `0x30` | u32 | `clock_id` | firmware | the firmware's absolute clock, 1..=127 (sequence-scoped ids are 64..=127; default 65) |
//! | `0x34` | `[u8; 12]` | reserved | firmware | 0 |
//! | `0x40` | `[u8; 64]` | data source name | firmware | UTF-8, NUL padded (ends at the first NUL or after 64 bytes), not empty |
//! | `0x80` | `[u8; 64]` | producer name | firmware | UTF-8, NUL padded, may be empty |
//! | `0xC0` | u32 atomic | `ring_head` | firmware (CAS) | next ring position producers claim |
//! | `0xC4` | u32 atomic | `ring_tail` | consumer | next ring position the consumer reads |
//! | `0xC8` | u32 atomic | `trace_enabled` | host (firmware initializes) | 1: write events, 0: don't |
//! | `0xCC` | u32 atomic | `clear_request` | host (increments) | when it changes, writers restart their sequences (clear incremental state) |
//! | `0xD0` | u32 atomic | `flush_request` | host (increments) | firmware commits the chunks its writers hold ... |
//! | `0xD4` | u32 atomic | `flush_ack` | firmware | ... and then stores the `flush_request` value it served |
//! | `0xD8` | u32 atomic | `sync_request` | host | a non-zero nonce asking for the firmware clock |
//! | `0xDC` | u32 atomic | `sync_response` | firmware | the nonce `sync_time` answers (0 while writing it) |
//! | `0xE0` | u64 (2 atomic words) | `sync_time` | firmware | firmware clock (ns, clock `clock_id`) when it answered |
//! | `0xE8` | u32 atomic | `packets_dropped` | firmware | packets its writers dropped |
//! | `0xEC` | u32 atomic | `ring_overflows` | firmware | chunk commits that found the ring full |
//! | `0xF0` | u32 atomic | `chunks_lost` | firmware | chunks lost (could not be completed) |
//! | `0xF4` | u32 atomic | `heartbeat` | firmware | incremented now and then while it runs |
//! | `0xF8` | `[u8; 8]` | reserved | | 0 |
//!
//! Counters wrap at 2^32; consumers look at differences.
//!
//! ## Ring slot (32 bytes)
//!
//! | offset | type | CHUNK (`kind` 1) | PATCH (`kind` 2) |
//! |---|---|---|---|
//! | `0x00` | u32 atomic | `seq` (ring protocol) | `seq` |
//! | `0x04` | u8 | `kind` = 1 | `kind` = 2 |
//! | `0x05` | u8 | `flags` = 0 | `flags`: bit 0 `HAS_MORE` (more patches for this chunk follow) |
//! | `0x06` | u16 | `writer_id` | `writer_id` |
//! | `0x08` | u32 | `chunk_id` | `chunk_id` |
//! | `0x0C` | u16 | `page` (index in the SMB) | `offset` (from the chunk payload start, after the 8-byte chunk header) |
//! | `0x0E` | u8, u8 | `chunk` (index in the page), 0 | 0, 0 |
//! | `0x10` | u32 / `[u8; 4]` | `used`: payload bytes in use (after the chunk header) | `data`: the 4 bytes to write at `offset` |
//! | `0x14` | `[u8; 12]` | reserved, 0 | reserved, 0 |
//!
//! A CHUNK slot says "move chunk `chunk` of page `page`, which holds chunk
//! `chunk_id` of writer `writer_id`, out of the SMB": the consumer copies
//! the chunk header and the first `used` payload bytes (bytes after the
//! last fragment need not be copied; `used` = the payload size is always
//! right). A PATCH slot is one `CommitDataRequest.ChunkToPatch.Patch`:
//! a chunk marked `CHUNK_NEEDS_PATCHING` is complete once the last patch
//! for it without `HAS_MORE` arrived. A patch group is published as
//! consecutive slots, all of them but the last with `HAS_MORE` (the last
//! with it if the writer has more patches for the chunk to come).
//!
//! ## SMB
//!
//! Perfetto SMB ABI v1 ([`crate::layout`], [`crate::state`]): pages of
//! `page_size` bytes, an 8-byte page header (`header_bitmap`: layout in
//! bits 28..=30, 2-bit chunk states), chunks with an 8-byte header
//! (`chunk_id` u32, `writer_id` u16, `packets` u16). The firmware takes a
//! chunk `Free → BeingWritten` (compare-and-swap of the page's
//! `header_bitmap`), writes it, and hands it over `BeingWritten →
//! Complete`; the consumer takes it `Complete → BeingRead`, copies it and
//! frees it (`→ Free`, header cleared first). Fragment encoding, patches
//! and flags are exactly Perfetto's.
//!
//! # Ring protocol
//!
//! A bounded multi-producer queue (D. Vyukov's bounded MPMC queue; one
//! consumer). Positions are u32 counters that wrap; position `pos` uses
//! slot `pos % ring_slots`. For position `pos` the slot's `seq` means:
//! `seq == pos` free (or claimed, not yet published), `seq == pos + 1`
//! published, `seq == pos + ring_slots` consumed. See [`ring`] for the
//! steps and memory orderings; in short:
//!
//! * **Produce** (any number of firmware contexts: thread, interrupts,
//!   another core; lock-free): read `pos = ring_head`; check `seq == pos`
//!   for each slot needed (acquire; smaller means full: leave; larger means
//!   someone else claimed it: reread `ring_head`); claim with
//!   `compare_exchange(ring_head, pos, pos + n)`; write the slot bodies;
//!   store `seq = pos + 1` (release) for each. Give up after a bounded
//!   number of lost races.
//! * **Consume** (one consumer): at `pos = tail` load `seq` (acquire).
//!   `pos + 1`: read the body, then store `seq = pos + ring_slots`
//!   (release) and `ring_tail = pos + 1`. `pos`: nothing yet (a producer
//!   may hold the position; later positions wait for it). `pos +
//!   ring_slots`: already consumed (a consumer stopped before updating
//!   `ring_tail`): skip. Anything else: a broken slot: count it, release
//!   it as consumed, skip.
//!
//! Ring full on a chunk commit: the chunk stays `Complete` and the firmware
//! increments `ring_overflows`. A consumer that sees `ring_overflows` change
//! scans the SMB for `Complete` chunks and moves them out too (they may
//! arrive out of chunk-id order; trace buffers sort chunks by id). Ring
//! full on patches: the firmware keeps them and tries again later.
//!
//! # Initialization (at every boot)
//!
//! 1. If the header in RAM is valid (magic and version), read its
//!    `boot_id`: the new one is `boot_id + 1`. Otherwise any value.
//! 2. Store 0 into the magic word at `0x00`; memory barrier (release).
//! 3. Store `boot_id`, then every other header field (the magic word at
//!    `0x04` included): control words 0 except `trace_enabled`.
//! 4. Ring: `seq` of slot `i` = `i`, bodies 0, `ring_head = ring_tail = 0`.
//! 5. SMB: every page header 0 (all pages free, unpartitioned).
//! 6. Store the magic word at `0x00` last, with release ordering.
//!
//! A consumer copies the header as: load `boot_id` and the magic word at
//! `0x00` (acquire), copy all words, acquire barrier, load them again; the
//! copy is good only if the magic is valid and neither word changed. It
//! polls the magic word and `boot_id`, and checks that `ring_tail` still
//! holds what it last stored there (only the consumer writes it; step 4
//! zeroes it); a change of any of them means the firmware reset: its
//! writer sequences are over, and chunks of the new boot start new ones.
//! The `ring_tail` check catches a reset whose `boot_id` repeats: RAM a
//! reset zeroes keeps no header to count from (QEMU zero-fills a
//! `NOLOAD` segment of the ELF at every start and reset), so step 1 starts
//! again from [`RegionConfig::boot_id`] there.
//!
//! # Control
//!
//! * `trace_enabled`, `clear_request`, `flush_request` and `sync_request`
//!   are the host's (see [`Control`]).
//! * Flush: the host increments `flush_request`; the firmware flushes its
//!   writers, then stores that value in `flush_ack`.
//! * Clock sync: the host stores a new non-zero nonce in `sync_request`;
//!   the firmware (once per nonce) stores 0 in `sync_response`, barrier,
//!   `sync_time` (its clock in ns), then the nonce in `sync_response`
//!   (release). The host reads `sync_response`, `sync_time`, and
//!   `sync_response` again, and keeps the time if both reads are its nonce.
//!
//! # Using it
//!
//! Firmware: a [`RegionStorage`] in a `static`, [`RegionStorage::take`] once
//! (with a [`RegionHeader`] built in a `const`,
//! [`RegionStorage::take_header`]: the config is checked and the header laid
//! out at compile time, so the firmware stores the header's words and holds
//! no code to make them), a [`RegionArbiter`] per writer, and [`crate::link`]'s service for the
//! control words (shared RAM) or the drain into frames (stream mode),
//! polled from the main loop. A host (or a stream-mode firmware):
//! [`RegionReader`], polled.
//!
//! ```
//! use shmtrace_abi::layout::PageLayout;
//! use shmtrace_abi::region::{
//!     Record, RegionArbiter, RegionConfig, RegionHeader, RegionReader, RegionStorage, TakeError,
//! };
//! use shmtrace_abi::writer::TraceWriter;
//!
//! // Firmware.
//! static REGION: RegionStorage<8192, 16> = RegionStorage::new();
//! const HEADER: Result<RegionHeader<8192, 16>, TakeError> =
//!     RegionHeader::new(&RegionConfig::new("fw.track_event"));
//! let handles = match &HEADER {
//!     Ok(header) => REGION.take_header(header),
//!     Err(e) => Err(*e),
//! };
//! let handles = handles.unwrap();
//! let arbiter = RegionArbiter::new(&handles, PageLayout::Div4).unwrap();
//! let mut writer: TraceWriter<_> = TraceWriter::new(arbiter, 1, 0).unwrap();
//! let _ = writer.write_packet(|p| p.uint64(8, 100));
//! writer.flush();
//!
//! // Host (here through the firmware's handles; a host process uses the
//! // unsafe `RegionReader::from_raw_parts` over its mapping).
//! let mut reader = RegionReader::attach(&handles).unwrap();
//! let mut buf = vec![0u8; reader.chunk_buffer_len()];
//! while let Ok(Some(record)) = reader.poll(&mut buf) {
//!     match record {
//!         Record::Chunk(c) => assert_eq!(c.header.writer_id, 1),
//!         Record::Patch(_) | Record::Reset(_) => {}
//!     }
//! }
//! assert_eq!(reader.stats().chunks, 1);
//! ```

mod arbiter;
mod control;
#[allow(unsafe_code)]
mod raw;
mod reader;
pub mod ring;
#[allow(unsafe_code)]
mod storage;
#[cfg(test)]
#[allow(unsafe_code)]
mod tests;
mod wire;

pub use arbiter::{ArbiterError, RegionArbiter};
pub use control::{Control, Counters, Ring};
pub use reader::{ChunkRecord, ReaderError, ReaderStats, Record, RegionReader};
pub use storage::{
    RegionConfig, RegionHandles, RegionHeader, RegionStorage, TakeError, DEFAULT_CLOCK_ID,
};
pub use wire::*;
