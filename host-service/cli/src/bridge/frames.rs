//! The framed stream's decoder ([`shmtrace_abi::frame`], format v1) as a
//! [`StreamDecoder`]: bytes in any split, firmware events out, requests
//! encoded for the reverse channel.
//!
//! * HELLO → a hello; CHUNK → a chunk; PATCH entries → patch groups
//!   ([`PatchGrouper`]); CLOCK → a clock sample (two-way if it echoes a
//!   nonce, else one-way with the frame's time on the wire); STATS → the
//!   firmware's counters.
//! * Every loss is counted: what the frame decoder counts (garbage bytes,
//!   bad CRCs, oversized or truncated frames, duplicate and missing
//!   sequence numbers) and frames with a good CRC whose payload is unusable
//!   (unknown type, bad length, bad HELLO) or that only a host sends.
//! * A restart that cut the old boot's last frame (a bad, oversized or
//!   missing frame between the last good one and the new boot's HELLO: a
//!   board reset mid-frame) is counted apart, `cut_by_restart`: what that
//!   frame held no later chunk of its sequence reveals, so the engine marks
//!   it on the old boot's sequences ([`Engine::link_loss`](super::engine::Engine::link_loss)).
//! * So is an end of the stream that cut its last frame (a bad, oversized
//!   or truncated frame after the last good one: a file or pipe that ends,
//!   a TCP peer that disconnects, mid-frame), `cut_by_end`: nothing
//!   follows it, so the engine marks it as it marks the firmware's last
//!   drops. What that frame was (its kind byte is not checked yet) is not
//!   known: a cut frame that held no chunk is marked too (over-marking,
//!   never silence).
//! * A flush is a FLUSH frame followed by a SYNC with a nonce of the
//!   bridge's own (high bit set, so never one of the clock's): a firmware
//!   handles its commands in order, so once the CLOCK answering it arrives
//!   everything the flush committed came before it ([`flush_pending`](StreamDecoder::flush_pending)).
//!   That answer is not a clock sample. Until it comes (also after the
//!   bridge gave up waiting for the flush) the firmware is still busy with
//!   the flush, and a SYNC sent meanwhile waits behind it
//!   ([`flush_unanswered`](StreamDecoder::flush_unanswered)).
//!
//! Memory is bounded: the frame buffer (a 64 KiB page's chunk), and the
//! events decoded from one read.

use std::collections::VecDeque;

use shmtrace_abi::frame::{self, Frame, FrameDecoder, FrameEncoder, HEADER_LEN};

use super::input::StreamDecoder;
use super::patches::PatchGrouper;
use super::{ClockSample, FirmwareEvent, Hello, Request};

/// Bits on the wire per byte on a UART (8N1: start, 8 data, stop).
const BITS_PER_BYTE: u64 = 10;
/// A CLOCK frame's length: header, 12 payload bytes, CRC.
const CLOCK_FRAME_LEN: u64 = (HEADER_LEN + 12 + frame::CRC_LEN) as u64;
/// Nonces of flush barriers carry this bit; the clock's never do (they
/// count up from 1).
const BARRIER_BIT: u32 = 1 << 31;

/// Decodes frame format v1. See the module docs.
pub struct FrameStreamDecoder {
    decoder: FrameDecoder<Box<[u8]>>,
    state: State,
    encoder: FrameEncoder,
    next_barrier: u32,
    next_flush: u32,
    flush_timeouts: u64,
    /// Bad, oversized, truncated and missing frames up to the last good
    /// frame.
    bad_at_last_frame: u64,
    /// Restarts whose HELLO came after such a frame (module docs).
    cut_by_restart: u64,
    /// 1 if the stream ended after such a frame (module docs).
    cut_by_end: u64,
}

/// What decoded frames turn into (apart from the frame decoder, which
/// lends them).
struct State {
    events: VecDeque<FirmwareEvent>,
    patches: PatchGrouper,
    /// Line speed (bits/s) of a serial link, for the one-way transfer time.
    baud: Option<u32>,
    /// The flush barrier's nonce the firmware has not answered yet.
    barrier: Option<u32>,
    /// The last barrier's nonce until its answer comes, also after the
    /// flush was given up on: the firmware is still busy with that flush
    /// (module docs).
    unanswered: Option<u32>,
    /// `seq` of the last frame delivered.
    last_seq: Option<u32>,
    unusable: u64,
    from_host: u64,
}

impl std::fmt::Debug for FrameStreamDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameStreamDecoder")
            .field("stats", &self.decoder.stats())
            .finish_non_exhaustive()
    }
}

impl FrameStreamDecoder {
    /// A decoder for a link of `baud` bits/s (`None`: not a serial link, or
    /// unknown: transfer time 0).
    pub fn new(baud: Option<u32>) -> Self {
        FrameStreamDecoder {
            decoder: FrameDecoder::new(
                vec![0u8; frame::MAX_PAYLOAD + HEADER_LEN + frame::CRC_LEN].into_boxed_slice(),
            ),
            state: State {
                events: VecDeque::new(),
                patches: PatchGrouper::new(),
                baud: baud.filter(|&b| b > 0),
                barrier: None,
                unanswered: None,
                last_seq: None,
                unusable: 0,
                from_host: 0,
            },
            encoder: FrameEncoder::new(),
            next_barrier: 0,
            next_flush: 0,
            flush_timeouts: 0,
            bad_at_last_frame: 0,
            cut_by_restart: 0,
            cut_by_end: 0,
        }
    }
}

impl State {
    /// Nanoseconds `bytes` take on the link.
    fn transfer_ns(&self, bytes: u64) -> u64 {
        self.baud
            .map_or(0, |b| bytes * BITS_PER_BYTE * 1_000_000_000 / u64::from(b))
    }

    /// Handles one good frame; `true` if it was a restart's HELLO.
    fn frame(&mut self, kind: u8, seq: u32, payload: &[u8]) -> bool {
        let expected = self.last_seq.map(|s| s.wrapping_add(1));
        self.last_seq = Some(seq);
        if expected.is_some_and(|e| e != seq) {
            // Frames went missing right before this one: a patch group in
            // progress lost its end.
            self.patches.finish(&mut self.events);
        }
        let parsed = match Frame::parse(kind, payload) {
            Ok(f) => f,
            Err(_) => {
                self.unusable += 1;
                return false;
            }
        };
        if !matches!(parsed, Frame::Patch(_)) {
            self.patches.finish(&mut self.events);
        }
        match parsed {
            Frame::Hello(h) => {
                // A sender that restarts sends HELLO first, at seq 0
                // (frame format): a new boot even if its boot_id repeats
                // (firmware whose RAM a reset zeroes keeps none to count
                // from). A HELLO later in a run is the same boot's.
                let restart = seq == 0 && expected.is_some();
                if restart {
                    self.events.push_back(FirmwareEvent::Reset);
                    // The new boot never answers the old one's barrier: it
                    // is busy with no flush, and may be asked for its
                    // time at once. (The flush itself waits on, until it
                    // is given up: its sessions see the restart first.)
                    self.unanswered = None;
                }
                self.events.push_back(FirmwareEvent::Hello(Hello {
                    boot_id: h.boot_id,
                    data_source: h.data_source.as_str().to_owned(),
                    producer: h.producer.as_str().to_owned(),
                    clock_id: h.clock_id,
                }));
                return restart;
            }
            Frame::Chunk(bytes) => self.events.push_back(FirmwareEvent::Chunk(bytes.to_vec())),
            Frame::Patch(entries) => {
                for p in entries.iter() {
                    self.patches.push(p, &mut self.events);
                }
            }
            Frame::Clock { firmware_ns, nonce } => {
                if nonce != 0 && self.unanswered == Some(nonce) {
                    self.unanswered = None;
                }
                if nonce != 0 && self.barrier == Some(nonce) {
                    self.barrier = None;
                } else if nonce & BARRIER_BIT == 0 {
                    self.events.push_back(FirmwareEvent::Clock(ClockSample {
                        firmware_ns,
                        nonce: (nonce != 0).then_some(nonce),
                        transfer_ns: self.transfer_ns(CLOCK_FRAME_LEN),
                    }));
                }
                // Else the answer to a barrier given up on: nothing.
            }
            Frame::Stats(s) => self.events.push_back(FirmwareEvent::Stats(vec![
                ("packets_dropped".into(), u64::from(s.packets_dropped)),
                ("ring_overflows".into(), u64::from(s.ring_overflows)),
                ("chunks_lost".into(), u64::from(s.chunks_lost)),
                ("frames_dropped".into(), u64::from(s.frames_dropped)),
            ])),
            Frame::Enable | Frame::Disable | Frame::Clear | Frame::Flush(_) | Frame::Sync(_) => {
                // Only a host sends these: an echo of our own requests (a
                // tty in cooked mode, a loop-back), never firmware data.
                self.from_host += 1;
            }
        }
        false
    }
}

impl FrameStreamDecoder {
    /// After a good frame (`restart`: a restart's HELLO): counts a restart
    /// that cut the old boot's last frame, and the bad frames so far (the
    /// decoder stops at the good frame's end, so they came before it).
    fn after_frame(&mut self, restart: bool) {
        let bad = bad_frames(&self.decoder.stats());
        if restart && bad > self.bad_at_last_frame {
            self.cut_by_restart += 1;
        }
        self.bad_at_last_frame = bad;
    }
}

/// The frames a decoder found bad (bad CRC, oversized, truncated) or
/// missing.
fn bad_frames(s: &frame::DecoderStats) -> u64 {
    s.bad_crc + s.oversized + s.truncated + s.lost
}

impl StreamDecoder for FrameStreamDecoder {
    fn push(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let (used, frame) = self.decoder.push(bytes);
            bytes = &bytes[used..];
            let Some(f) = frame else { continue };
            let restart = self.state.frame(f.kind, f.seq, f.payload);
            self.after_frame(restart);
        }
    }

    fn finish(&mut self) {
        while let Some(f) = self.decoder.finish() {
            let restart = self.state.frame(f.kind, f.seq, f.payload);
            self.after_frame(restart);
        }
        if bad_frames(&self.decoder.stats()) > self.bad_at_last_frame {
            self.cut_by_end = 1;
        }
        let state = &mut self.state;
        state.patches.finish(&mut state.events);
    }

    fn next_event(&mut self) -> Option<FirmwareEvent> {
        self.state.events.pop_front()
    }

    fn loss(&self) -> Vec<(&'static str, u64)> {
        let s = self.decoder.stats();
        vec![
            ("garbage_bytes", s.garbage_bytes),
            ("bad_crc", s.bad_crc),
            ("oversized", s.oversized),
            ("truncated", s.truncated),
            ("duplicates", s.duplicates),
            ("frames_lost", s.lost),
            ("unusable_frames", self.state.unusable),
            ("host_frames", self.state.from_host),
        ]
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("frames", self.decoder.stats().frames),
            ("flush_timeouts", self.flush_timeouts),
            ("cut_by_restart", self.cut_by_restart),
            ("cut_by_end", self.cut_by_end),
        ]
    }

    fn encode_request(&mut self, request: Request, out: &mut Vec<u8>) -> bool {
        use shmtrace_abi::frame::kind;
        let sink = &mut |b: &[u8]| out.extend_from_slice(b);
        match request {
            Request::Enable(true) => self.encoder.command(kind::ENABLE, sink),
            Request::Enable(false) => self.encoder.command(kind::DISABLE, sink),
            Request::Clear => self.encoder.command(kind::CLEAR, sink),
            Request::Sync(nonce) => self.encoder.command_u32(kind::SYNC, nonce, sink),
            Request::Flush => {
                self.next_flush = self.next_flush.wrapping_add(1);
                self.encoder.command_u32(kind::FLUSH, self.next_flush, sink);
                self.next_barrier = self.next_barrier.wrapping_add(1) & !BARRIER_BIT;
                let nonce = self.next_barrier | BARRIER_BIT;
                self.encoder.command_u32(kind::SYNC, nonce, sink);
                self.state.barrier = Some(nonce);
                self.state.unanswered = Some(nonce);
            }
        }
        true
    }

    fn flush_pending(&self) -> bool {
        self.state.barrier.is_some()
    }

    fn flush_unanswered(&self) -> bool {
        self.state.unanswered.is_some()
    }

    fn give_up_flush(&mut self) {
        if self.state.barrier.take().is_some() {
            self.flush_timeouts += 1;
        }
    }
}

#[cfg(test)]
mod tests;
