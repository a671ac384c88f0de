//! The stream link's cost: CHUNK frames encoded between [`crate::markers`].
//!
//! A stream-mode firmware (`shmtrace_abi::link::StreamService`) sends each
//! chunk it drains as a CHUNK frame: a 12-byte header, the chunk, and the
//! frame's CRC-32 over both (`shmtrace_abi::frame`). [`run`] encodes chunks
//! of each length in [`LENGTHS`] with a [`FrameEncoder`], [`ROUNDS`] times,
//! each call between the markers (a window with nothing in it first, the
//! markers' own cost), into a sink that only counts the bytes and keeps
//! the CRC: `report.py` counts the instructions of each window, so the
//! difference between two lengths is the CRC's cost per byte, and a whole
//! chunk's the cost of one frame before the bytes reach a driver.
//!
//! The chunk bytes come from [`SEED`] through xorshift32 (13, 17, 5, low
//! byte), so the report recomputes each frame and checks the CRC the
//! firmware printed. The `frames` binary (Cortex-M4) and the M0 package's
//! `m0-frames` (thumbv6m, which includes this file) both run it.
//!
//! # Output
//!
//! ```text
//! frames seed SEED rounds ROUNDS      then, per window after the empty one,
//! frame SEQ LEN SENT CRC              the frame's seq, the chunk length, the
//!                                     bytes the sink got, the CRC (hex)
//! ```

use core::fmt::Arguments;
use core::hint::black_box;

use shmtrace_abi::frame::FrameEncoder;

use crate::markers;

/// Chunk lengths measured: an empty chunk (its 8-byte header), a quarter
/// of one and a whole chunk of a 4 KiB page split in 4, as the demos and
/// the live sessions lay theirs out (1016 bytes: what a full one sends).
pub const LENGTHS: [usize; 3] = [8, 264, 1016];
/// Rounds over [`LENGTHS`].
pub const ROUNDS: u32 = 2;
/// Seed of the chunk bytes.
pub const SEED: u32 = 0x5EED_F00D;
/// The longest chunk measured.
const CHUNK: usize = 1016;

/// Encodes the frames (see the module docs), printing each line with
/// `print`.
pub fn run(print: &mut dyn FnMut(Arguments<'_>)) {
    let mut chunk = [0u8; CHUNK];
    let mut x = SEED;
    for byte in chunk.iter_mut() {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *byte = x as u8;
    }
    print(format_args!("frames seed {SEED} rounds {ROUNDS}"));
    let mut enc = FrameEncoder::new();
    for _ in 0..ROUNDS {
        markers::begin();
        markers::end();
        for len in LENGTHS {
            let seq = enc.next_seq();
            let bytes = black_box(&chunk[..len.min(CHUNK)]);
            let (mut sent, mut crc) = (0usize, [0u8; 4]);
            markers::begin();
            enc.chunk(bytes, &mut |piece: &[u8]| {
                sent += piece.len();
                if let Ok(last) = piece.try_into() {
                    crc = last;
                }
            });
            markers::end();
            print(format_args!(
                "frame {seq} {len} {sent} {:08x}",
                u32::from_le_bytes(crc)
            ));
        }
    }
}
