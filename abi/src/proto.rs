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
//! * [`Cursor`]: a cheaper writer for one small message in a fixed-size
//!   buffer (a chunk [`Window`](crate::smb::Window) or an array), used for
//!   the common packet shapes; the caller falls back to the encoder when it
//!   reports an overflow.
//! * [`Encoder`] / [`Message`]: typed field writers. A nested message
//!   reserves room for its size, which the sink back-fills when the message
//!   closes. The chunk stream reserves 4 bytes and writes a 4-byte redundant
//!   varint, or compacts it to 1 byte when the body is at most 127 bytes and
//!   still contiguous with the size field (the same rule protozero follows);
//!   [`SliceSink`] produces canonical minimal varints (or, on request, 4-byte
//!   redundant ones).
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

pub mod cursor;
pub mod encoder;
mod slice;
pub mod template;
pub mod wire;

pub use cursor::{Cursor, Measure, Target, TARGET_SLACK};
pub use encoder::{EncodeError, Encoder, Message, Sink, MAX_DEPTH, SMALL_WRITE_LEN};
pub use slice::{encode_to_slice, encoded_len, CountedSlot, SizeCounter, SliceSink, SliceSlot};
pub use template::{Args, Template};
