//! Frame format v1: firmware chunks and patches over a byte stream (UART,
//! semihosting, an RTT-style ring, TCP), with loss detection.
//!
//! A firmware in stream mode drains its own [region](crate::region) ring
//! (a [`RegionReader`](crate::region::RegionReader) over its own handles)
//! and sends each record as a frame ([`crate::link::StreamService`] does
//! all of the firmware's part); the host bridge decodes the stream
//! with [`FrameDecoder`] and forwards chunks and patches to a tracing
//! service. A host may send commands back on a reverse channel. This page
//! is the whole specification.
//!
//! # Frame
//!
//! All integers little-endian.
//!
//! | offset | size | field | |
//! |---|---|---|---|
//! | 0 | 2 | `magic` | `D5 7A` |
//! | 2 | 1 | `type` | see below |
//! | 3 | 1 | `flags` | 0 (receivers ignore it) |
//! | 4 | 4 | `seq` | u32: 0 for the sender's first frame after it starts, then +1 per frame (wraps) |
//! | 8 | 4 | `len` | u32: payload length |
//! | 12 | `len` | payload | per type |
//! | 12 + `len` | 4 | `crc` | u32: CRC-32/ISO-HDLC (the zlib/Ethernet CRC: poly `0x04C11DB7` reflected, init and xorout `0xFFFFFFFF`) of bytes `0 .. 12 + len` |
//!
//! A sender restarts `seq` at 0 when it restarts, and then sends HELLO
//! first. It sends HELLO again now and then (every second:
//! [`crate::link::StreamService`]), so a receiver that starts after it
//! learns which boot, data source and clock its chunks belong to; a HELLO
//! of the boot a receiver knows changes nothing. A receiver expects `seq` to grow by one: a larger one means
//! frames were lost (counted), a smaller or equal one is a duplicate or
//! out of order (counted, dropped); a HELLO is accepted whatever its `seq`
//! and the count goes on from it (a HELLO at `seq` 0, or at a smaller one
//! than expected, is a restart; one further on tells how many frames
//! before it were lost).
//!
//! # Types and payloads
//!
//! Firmware to host:
//!
//! | type | name | payload |
//! |---|---|---|
//! | `0x01` | HELLO | u16 `version` = 1, u16 0, u32 `boot_id`, u32 `clock_id` (the firmware's absolute clock, 1..=127), u32 `page_size` (of its SMB: the largest chunk is `page_size - 8`), u32 `flags` (0), u8 data source name length (1..=64) + UTF-8 name, u8 producer name length (0..=64) + UTF-8 name |
//! | `0x02` | CHUNK | one chunk as in the SMB: its 8-byte header (`chunk_id` u32, `writer_id` u16, `packets` u16), then its payload; bytes after the last fragment may be left out (so 8 ..= `page_size - 8` bytes) |
//! | `0x03` | PATCH | 1 or more 16-byte entries: u16 `writer_id`, u8 flags (bit 0 `has_more`: more patches for this chunk follow), u8 0, u32 `chunk_id`, u16 `offset` (from the chunk payload start), u16 0, 4 bytes `data` |
//! | `0x04` | CLOCK | u64 firmware time (ns on clock `clock_id`), u32 the host's sync nonce it answers (0: unsolicited: a sender that has had no host frame sends one every second, so a one-way link relates the clocks too) |
//! | `0x05` | STATS | u32 `packets_dropped`, u32 `ring_overflows`, u32 `chunks_lost`, u32 `frames_dropped` (frames the firmware could not send); receivers ignore bytes after 16 |
//!
//! Host to firmware (optional reverse channel):
//!
//! | type | name | payload |
//! |---|---|---|
//! | `0x81` | ENABLE | empty: start tracing |
//! | `0x82` | DISABLE | empty: stop tracing |
//! | `0x83` | CLEAR | empty: restart writer sequences |
//! | `0x84` | FLUSH | u32 request id: commit what the writers hold |
//! | `0x85` | SYNC | u32 nonce: answer with a CLOCK frame carrying it |
//!
//! Frames of other types are skipped (counted as unknown) so later
//! versions can add some.
//!
//! A host sends no HELLO, and one that restarts (a bridge started again)
//! counts its `seq` from 0 again: a firmware obeys host frames whatever
//! their `seq` ([`crate::link::StreamService`] does).
//!
//! # Command order
//!
//! A firmware obeys the host's frames one at a time, in the order they
//! arrive, each completely before it reads the next:
//!
//! * FLUSH: its writers commit the chunks they hold, and every record its
//!   ring then holds is sent, before anything the firmware sends after
//!   reading the next frame.
//! * SYNC: the CLOCK frame is sent at once (the clock read on receipt, no
//!   drain first), so its time is as close to the request as it can be.
//!
//! So the CLOCK answering a SYNC that follows a FLUSH comes after every
//! frame of the data that FLUSH committed: a host uses FLUSH + SYNC (with a
//! nonce of its own) as a flush barrier, and `shmtrace bridge` does. The
//! firmware may send data frames (and STATS) between commands at any time.
//! [`crate::link::StreamService`] keeps these rules.
//!
//! # Decoding hostile streams
//!
//! [`FrameDecoder`] takes bytes in any split and hands out whole frames. It
//! looks for the magic, skipping (and counting) anything else; a frame
//! whose length exceeds its buffer (oversized) or whose CRC does not match
//! (corrupt, or cut short by lost bytes and followed by the next frame) is
//! counted and decoding resumes at the next magic *after the start of that
//! frame*, so a good frame hidden behind a bad header is found. A sender
//! that restarts inside a frame cuts it short: a whole HELLO at `seq` 0
//! inside the frame being assembled ends that frame (counted truncated)
//! at once, rather than when the new run has sent enough to fill the cut
//! frame's length (a new run that waits to be enabled sends little).
//! Memory is the caller's buffer; nothing panics.
//!
//! ```
//! use shmtrace_abi::frame::{Frame, FrameDecoder, FrameEncoder};
//!
//! let mut enc = FrameEncoder::new();
//! let mut wire = Vec::new();
//! enc.clock(123_456_789, 7, &mut |b: &[u8]| wire.extend_from_slice(b));
//! enc.chunk(&[0, 0, 0, 0, 1, 0, 1, 0, 2, 0x40, 0x64], &mut |b: &[u8]| wire.extend_from_slice(b));
//!
//! let mut dec = FrameDecoder::new([0u8; 4096 + 16]);
//! let mut got = Vec::new();
//! for piece in wire.chunks(5) {
//!     let mut input = piece;
//!     while !input.is_empty() {
//!         let (used, frame) = dec.push(input);
//!         input = &input[used..];
//!         if let Some(frame) = frame {
//!             got.push(format!("{:?}", frame.parse().unwrap()));
//!         }
//!     }
//! }
//! assert_eq!(got.len(), 2);
//! assert!(got[0].starts_with("Clock"));
//! assert_eq!(dec.stats().frames, 2);
//! ```

mod decode;
mod encode;
mod payload;

pub use decode::{DecoderStats, FrameDecoder, RawFrame};
pub use encode::{BufferTooSmall, FrameEncoder};
pub use payload::{Frame, FrameError, FrameStats, Hello, Patches, PATCH_ENTRY_LEN};

/// `magic`.
pub const MAGIC: [u8; 2] = [0xD5, 0x7A];
/// Bytes before the payload.
pub const HEADER_LEN: usize = 12;
/// Bytes of the trailing CRC.
pub const CRC_LEN: usize = 4;
/// Frame format version (HELLO `version`).
pub const VERSION: u16 = 1;
/// Largest payload a v1 sender produces: a whole chunk of a 64 KiB page.
pub const MAX_PAYLOAD: usize = crate::layout::MAX_PAGE_SIZE - crate::layout::PAGE_HEADER_SIZE;

/// Frame types.
pub mod kind {
    /// Firmware identity and geometry.
    pub const HELLO: u8 = 0x01;
    /// A chunk.
    pub const CHUNK: u8 = 0x02;
    /// Patches.
    pub const PATCH: u8 = 0x03;
    /// Firmware clock reading.
    pub const CLOCK: u8 = 0x04;
    /// Firmware counters.
    pub const STATS: u8 = 0x05;
    /// Host: start tracing.
    pub const ENABLE: u8 = 0x81;
    /// Host: stop tracing.
    pub const DISABLE: u8 = 0x82;
    /// Host: restart writer sequences.
    pub const CLEAR: u8 = 0x83;
    /// Host: flush.
    pub const FLUSH: u8 = 0x84;
    /// Host: clock sync request.
    pub const SYNC: u8 = 0x85;
}

/// The CRC-32/ISO-HDLC implementation (the same value whichever):
///
/// * hosts, which decode at link speed: a 16 KiB slice-by-16 table;
/// * targets without an OS: a 1 KiB table (one lookup per byte: 7
///   instructions per frame byte on a Cortex-M4, 10 on a Cortex-M0, counted
///   by `abi/firmware/report.py`);
/// * with the `crc-bitwise` feature, every target: no table, 8 shifts per
///   byte (64 and 81 instructions per byte), for a flash too small to
///   spare the 1 KiB.
#[cfg(feature = "crc-bitwise")]
type CrcImpl = crc::NoTable;
#[cfg(all(not(feature = "crc-bitwise"), target_os = "none"))]
type CrcImpl = crc::Table<1>;
#[cfg(all(not(feature = "crc-bitwise"), not(target_os = "none")))]
type CrcImpl = crc::Table<16>;

static CRC: crc::Crc<u32, CrcImpl> = crc::Crc::<u32, CrcImpl>::new(&crc::CRC_32_ISO_HDLC);
