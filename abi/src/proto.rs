//! A zero-allocation protobuf encoder for scattered output.
//!
//! Perfetto producers write protobuf straight into shared-memory chunks
//! without knowing message sizes up front. This module follows the same idea
//! as protozero with its own design:
//!
//! * [`wire`]: tags, varints, zigzag, and 4-byte redundant varints
//!   (`85 80 80 00` for 5, `80 80 80 00` for 0 — never a zero first byte).
//! * [`Sink`]: one logical byte stream over possibly many regions. The
//!   trace writer's chunk stream implements it and switches chunks in the
//!   middle of a field; [`SliceSink`] implements it over a plain `&mut [u8]`
//!   (tests, messages the service builds); [`SizeCounter`] only measures.
//! * [`Encoder`] / [`Message`]: typed field writers. Nested messages reserve
//!   a 4-byte size that is back-filled when the message closes; a small body
//!   (≤ 127 bytes) still contiguous with its size field is compacted to a
//!   1-byte size.
//!
//! Nesting is limited to [`MAX_DEPTH`] open messages; deeper messages are
//! dropped whole and counted, never a panic (see [`encoder`]'s invariants).
//!
//! ```
//! use shmtrace_abi::proto::encode_to_slice;
//! let mut buf = [0u8; 8];
//! // TracePacket { timestamp = 100 }
//! let n = encode_to_slice(&mut buf, |p| p.uint64(8, 100)).unwrap();
//! assert_eq!(&buf[..n], &[0x40, 0x64]);
//! ```

pub mod encoder;
mod slice;
pub mod wire;

pub use encoder::{EncodeError, Encoder, Message, Sink, MAX_DEPTH, SMALL_WRITE_LEN};
pub use slice::{encode_to_slice, encoded_len, CountedSlot, SizeCounter, SliceSink, SliceSlot};
