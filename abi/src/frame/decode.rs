//! The incremental, hostile-input frame decoder.
//!
//! # Invariants
//!
//! * `buf[..filled]` holds the bytes of the frame being assembled (and,
//!   after a bad frame, bytes read ahead that follow it): when `filled >= 1`
//!   it starts with `MAGIC[0]`, when `filled >= 2` with the whole magic, and
//!   `filled` never exceeds the buffer. New input is only taken up to the
//!   frame's known length.
//! * Every byte given to [`FrameDecoder::push`] ends up in exactly one of:
//!   a delivered frame, a frame counted as bad (oversized, bad CRC,
//!   duplicate), or the skipped-garbage count, or stays buffered.
//! * Work per call is bounded by the input and buffer lengths; memory is
//!   the buffer given to [`FrameDecoder::new`].
//! * A sender that restarts inside a frame (a board reset while it sent
//!   one) cuts it short, and the frame's length then takes in what the
//!   new run sends, HELLO first: a quiet new run (tracing off until a host
//!   that heard its HELLO enables it) sends too little to complete that
//!   length for a long time. So while a frame is assembled, a whole HELLO
//!   at `seq` 0 with a good CRC completed inside it ends it: the frame
//!   is counted as truncated, its bytes as garbage, and the HELLO is
//!   delivered.

use super::payload::{Frame, FrameError, HELLO_MAX_LEN, HELLO_MIN_LEN};
use super::{kind, CRC, CRC_LEN, HEADER_LEN, MAGIC};

/// A frame with a good CRC, in the decoder's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawFrame<'a> {
    /// `type`.
    pub kind: u8,
    /// `flags`.
    pub flags: u8,
    /// `seq`.
    pub seq: u32,
    /// The payload.
    pub payload: &'a [u8],
}

impl<'a> RawFrame<'a> {
    /// The typed frame.
    pub fn parse(&self) -> Result<Frame<'a>, FrameError> {
        Frame::parse(self.kind, self.payload)
    }
}

/// Counters of a [`FrameDecoder`]. Bad frames are skipped, never
/// delivered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecoderStats {
    /// Frames delivered.
    pub frames: u64,
    /// Bytes skipped looking for a magic (including the bytes of bad
    /// frames before the next magic).
    pub garbage_bytes: u64,
    /// Frames with a CRC mismatch (corrupt, or cut short and run into the
    /// next frame).
    pub bad_crc: u64,
    /// Frame headers announcing more payload than the buffer holds.
    pub oversized: u64,
    /// Frames cut off by the end of the stream ([`FrameDecoder::finish`]).
    pub truncated: u64,
    /// Frames with a `seq` at or before the last one delivered (duplicates,
    /// out of order): dropped.
    pub duplicates: u64,
    /// Frames missing according to `seq` gaps.
    pub lost: u64,
}

/// Assembles frames from a byte stream split anywhere; see the
/// [module docs](super). `B` is the frame buffer (e.g. `[u8; N]`,
/// `&mut [u8]`, `Vec<u8>`): frames with a payload over `len - 16` bytes are
/// oversized.
#[derive(Debug, Clone)]
pub struct FrameDecoder<B> {
    buf: B,
    filled: usize,
    /// Length of the frame handed out by the last `push` (dropped at the
    /// next one).
    delivered: usize,
    expected_seq: Option<u32>,
    stats: DecoderStats,
}

impl<B: AsRef<[u8]> + AsMut<[u8]>> FrameDecoder<B> {
    /// A decoder assembling frames in `buf`.
    pub fn new(buf: B) -> Self {
        FrameDecoder {
            buf,
            filled: 0,
            delivered: 0,
            expected_seq: None,
            stats: DecoderStats::default(),
        }
    }

    /// The counters.
    pub fn stats(&self) -> DecoderStats {
        self.stats
    }

    /// Largest payload accepted.
    pub fn max_payload(&self) -> usize {
        self.buf.as_ref().len().saturating_sub(HEADER_LEN + CRC_LEN)
    }

    /// Forgets the expected `seq` (the sender restarted; a HELLO does this
    /// by itself).
    pub fn reset_seq(&mut self) {
        self.expected_seq = None;
    }

    /// The stream ended: a partly received frame is counted as truncated
    /// and dropped, and the bytes buffered behind it are searched for
    /// whole frames (a frame whose length field was corrupted upwards
    /// swallows the frames after it until its CRC can be checked). Call
    /// until it returns `None`.
    pub fn finish(&mut self) -> Option<RawFrame<'_>> {
        self.drop_delivered();
        loop {
            if let Some(total) = self.settle() {
                if self.deliver(total) {
                    return self.delivered_frame();
                }
                continue;
            }
            if self.filled == 0 {
                return None;
            }
            self.stats.truncated += 1;
            self.resync();
        }
    }

    /// Marks the good frame `buf[..total]` delivered if its `seq` is
    /// acceptable (`true`); else drops it.
    fn deliver(&mut self, total: usize) -> bool {
        let seq = self.u32_at(4);
        let kind_byte = self.buf.as_ref().get(2).copied().unwrap_or(0);
        if !self.accept_seq(kind_byte, seq) {
            self.consume(total);
            return false;
        }
        self.delivered = total;
        self.stats.frames += 1;
        true
    }

    fn drop_delivered(&mut self) {
        let delivered = core::mem::take(&mut self.delivered);
        self.consume(delivered);
    }

    /// Drops the first `n` buffered bytes (a frame); bytes after it (read
    /// ahead while a bad frame was being assembled) stay.
    fn consume(&mut self, n: usize) {
        let filled = self.filled;
        let n = n.min(filled);
        self.buf.as_mut().copy_within(n..filled, 0);
        self.filled = filled - n;
    }

    /// Takes bytes from `input` until a frame is complete or the input is
    /// used up. Returns how many bytes were taken and the frame, if one
    /// completed (it borrows the decoder until the next call). Call again
    /// with the rest of the input.
    pub fn push(&mut self, input: &[u8]) -> (usize, Option<RawFrame<'_>>) {
        self.drop_delivered();
        if self.buf.as_ref().len() < HEADER_LEN + CRC_LEN {
            // No frame fits: everything is garbage.
            self.stats.garbage_bytes += input.len() as u64;
            return (input.len(), None);
        }
        let mut used = 0;
        loop {
            if let Some(total) = self.settle() {
                if self.deliver(total) {
                    return (used, self.delivered_frame());
                }
                continue;
            }
            let Some(rest) = input.get(used..).filter(|r| !r.is_empty()) else {
                return (used, None);
            };
            if self.filled == 0 {
                match rest.iter().position(|&b| b == MAGIC[0]) {
                    Some(skip) => {
                        self.stats.garbage_bytes += skip as u64;
                        used += skip;
                    }
                    None => {
                        self.stats.garbage_bytes += rest.len() as u64;
                        return (input.len(), None);
                    }
                }
            }
            let rest = &input[used..];
            let want = self.wanted().saturating_sub(self.filled);
            let n = want.min(rest.len());
            let filled = self.filled;
            if let Some(dst) = self.buf.as_mut().get_mut(filled..filled + n) {
                dst.copy_from_slice(&rest[..n]);
            }
            self.filled += n;
            used += n;
            // Only a frame still incomplete: a whole one's CRC decides.
            // (A buffer too small for any HELLO, a firmware's for host
            // commands, never holds one: the check compiles away there.)
            let incomplete = self.buf.as_ref().len() >= HEADER_LEN + HELLO_MIN_LEN + CRC_LEN
                && self.filled >= HEADER_LEN
                && self.filled < self.wanted();
            if let Some(at) = incomplete.then(|| self.restart_inside(filled)).flatten() {
                self.stats.truncated += 1;
                self.stats.garbage_bytes += at as u64;
                self.consume(at);
            }
        }
    }

    /// Where a restart's HELLO (a whole HELLO frame at `seq` 0 with a good
    /// CRC) that the bytes after `buf[..old]` completed starts inside the
    /// frame being assembled, if one does (module docs). Looks at the new
    /// bytes and the longest HELLO frame before them.
    fn restart_inside(&self, old: usize) -> Option<usize> {
        const LONGEST: usize = HEADER_LEN + HELLO_MAX_LEN + CRC_LEN;
        let buf = self.buf.as_ref().get(..self.filled)?;
        let from = old.saturating_sub(LONGEST).max(1);
        (from..buf.len()).find(|&at| {
            let Some(header) = buf.get(at..at + HEADER_LEN) else {
                return false;
            };
            let word = |i: usize| {
                u32::from_le_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]])
            };
            let len = word(8) as usize;
            if header[..3] != [MAGIC[0], MAGIC[1], kind::HELLO]
                || word(4) != 0
                || len > HELLO_MAX_LEN
            {
                return false;
            }
            // `len` is bounded now: no overflow on a 32-bit `usize`.
            let end = at + HEADER_LEN + len + CRC_LEN;
            end > old
                && buf
                    .get(end - CRC_LEN..end)
                    .is_some_and(|crc| CRC.checksum(&buf[at..end - CRC_LEN]).to_le_bytes() == *crc)
        })
    }

    /// The frame `deliver` accepted last.
    fn delivered_frame(&self) -> Option<RawFrame<'_>> {
        let buf = self.buf.as_ref();
        let total = self.delivered;
        Some(RawFrame {
            kind: *buf.get(2)?,
            flags: *buf.get(3)?,
            seq: self.u32_at(4),
            payload: buf.get(HEADER_LEN..total.checked_sub(CRC_LEN)?)?,
        })
    }

    fn u32_at(&self, at: usize) -> u32 {
        match self.buf.as_ref().get(at..at + 4) {
            Some(&[a, b, c, d]) => u32::from_le_bytes([a, b, c, d]),
            _ => 0,
        }
    }

    /// Bytes the frame being assembled needs in all (as far as known).
    fn wanted(&self) -> usize {
        if self.filled < HEADER_LEN {
            // The magic is checked byte by byte as it arrives.
            if self.filled < 2 {
                self.filled + 1
            } else {
                HEADER_LEN
            }
        } else {
            HEADER_LEN + self.u32_at(8) as usize + CRC_LEN
        }
    }

    /// Checks the buffered bytes; `Some(total)` when `buf[..total]` is a
    /// whole frame with a good CRC. Bad prefixes are dropped up to the next
    /// magic candidate.
    fn settle(&mut self) -> Option<usize> {
        loop {
            let filled = self.filled;
            let buf = self.buf.as_ref();
            if filled == 0 {
                return None;
            }
            if buf[0] != MAGIC[0] || (filled >= 2 && buf[1] != MAGIC[1]) {
                self.resync();
                continue;
            }
            if filled < HEADER_LEN {
                return None;
            }
            let len = self.u32_at(8) as usize;
            if len > self.max_payload() {
                self.stats.oversized += 1;
                self.resync();
                continue;
            }
            let total = HEADER_LEN + len + CRC_LEN;
            if filled < total {
                return None;
            }
            let body = &buf[..total - CRC_LEN];
            if CRC.checksum(body) != self.u32_at(total - CRC_LEN) {
                self.stats.bad_crc += 1;
                self.resync();
                continue;
            }
            return Some(total);
        }
    }

    /// Drops the first byte and everything up to the next `MAGIC[0]`
    /// followed by `MAGIC[1]` (or ending the buffer).
    fn resync(&mut self) {
        let filled = self.filled;
        let buf = self.buf.as_mut();
        let next = (1..filled)
            .find(|&p| buf[p] == MAGIC[0] && (p + 1 == filled || buf[p + 1] == MAGIC[1]))
            .unwrap_or(filled);
        self.stats.garbage_bytes += next as u64;
        buf.copy_within(next..filled, 0);
        self.filled = filled - next;
    }

    /// Sequence check of a good frame; `false` drops it.
    fn accept_seq(&mut self, kind_byte: u8, seq: u32) -> bool {
        let accept = match self.expected_seq {
            // Accepted whatever its seq, and the count goes on from it: at
            // seq 0 a sender that restarted; later the sender's periodic
            // repeat, after which the frames it skipped were lost. (A
            // smaller seq is a restart whose first HELLO was lost.)
            Some(expected) if kind_byte == kind::HELLO => {
                let ahead = seq.wrapping_sub(expected) as i32;
                if seq != 0 && ahead > 0 {
                    self.stats.lost += ahead as u64;
                }
                true
            }
            _ if kind_byte == kind::HELLO => true,
            None => true,
            Some(expected) => {
                let ahead = seq.wrapping_sub(expected) as i32;
                if ahead < 0 {
                    self.stats.duplicates += 1;
                    false
                } else {
                    self.stats.lost += ahead as u64;
                    true
                }
            }
        };
        if accept {
            self.expected_seq = Some(seq.wrapping_add(1));
        }
        accept
    }
}
