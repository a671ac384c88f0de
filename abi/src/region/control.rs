//! Typed access to a live region: the control words of the header and the
//! ring, as atomics over the shared memory.

use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use crate::sync::{AtomicLeU32, AtomicWord32};

use super::raw::Mem;
use super::ring::{self, RingFull, RingWords};
use super::wire::{offset, RingGeometry, SlotBody, SlotRepr, HEADER_SIZE};

/// The ring of a live region (see [`ring`] for the protocol).
#[derive(Clone, Copy, Debug)]
pub struct Ring<'m> {
    /// The slots' words (`slots` x `stride` of them), located once.
    words: &'m [AtomicLeU32],
    slots: u32,
    /// Words per slot (8 in v1).
    stride: usize,
    /// The header's control words: `ring_head` and `ring_tail` first.
    control: &'m [AtomicLeU32; CONTROL_WORDS],
}

impl<'m> Ring<'m> {
    /// `None` if the ring's words are out of `mem` (never for a validated
    /// geometry).
    fn new(
        mem: Mem<'m>,
        geometry: RingGeometry,
        control: &'m [AtomicLeU32; CONTROL_WORDS],
    ) -> Option<Self> {
        let stride = geometry.slot_size as usize / 4;
        Some(Ring {
            words: mem.words(
                geometry.offset as usize,
                (geometry.slots as usize).checked_mul(stride)?,
            )?,
            slots: geometry.slots,
            stride,
            control,
        })
    }

    /// The body words of slot `index` (`None` past the ring).
    #[inline]
    fn body(&self, index: u32) -> Option<&'m [AtomicLeU32; 7]> {
        // (Wrapping: an index below `slots` does not wrap, and one that
        // does still finds words of the ring or none.)
        let at = (index as usize).wrapping_mul(self.stride);
        self.words.get(at.wrapping_add(1)..)?.first_chunk()
    }

    /// Publishes one record; [`RingFull`] if there is no room.
    pub fn push(&self, record: &SlotRepr) -> Result<(), RingFull> {
        let body = record.to_body();
        ring::try_push(self, 1, &mut || body)
    }

    /// Number of slots.
    pub fn slots(&self) -> u32 {
        self.slots
    }
}

impl RingWords for Ring<'_> {
    type Word = AtomicLeU32;

    fn slots(&self) -> u32 {
        self.slots
    }

    fn head(&self) -> &AtomicLeU32 {
        let [head, ..] = self.control;
        head
    }

    fn tail(&self) -> &AtomicLeU32 {
        let [_, tail, ..] = self.control;
        tail
    }

    fn seq(&self, index: u32) -> Option<&AtomicLeU32> {
        // (No check against `slots`: `words` holds `slots` slots, so none
        // is found past them. Wrapping as in `body`.)
        self.words.get((index as usize).wrapping_mul(self.stride))
    }

    fn write_body(&self, index: u32, body: &SlotBody) {
        // One check for the seven words, and one store each (the body is
        // mostly constants).
        if let Some([w1, w2, w3, w4, w5, w6, w7]) = self.body(index) {
            let [b1, b2, b3, b4, b5, b6, b7] = *body;
            w1.store(b1, Relaxed);
            w2.store(b2, Relaxed);
            w3.store(b3, Relaxed);
            w4.store(b4, Relaxed);
            w5.store(b5, Relaxed);
            w6.store(b6, Relaxed);
            w7.store(b7, Relaxed);
        }
    }

    fn read_body(&self, index: u32) -> SlotBody {
        let mut body = [0u32; 7];
        if let Some(words) = self.body(index) {
            for (value, w) in body.iter_mut().zip(words) {
                *value = w.load(Relaxed);
            }
        }
        body
    }
}

/// The control words of a live region (header bytes `0xC0..0x100`) and its
/// ring. Cheap to copy; every access is one atomic operation.
///
/// Who writes what (the [module docs](super) have the table): the host
/// writes `trace_enabled`, `clear_request`, `flush_request` and
/// `sync_request`; the firmware writes the rest. Both sides may read
/// everything.
///
/// The control words are located once, when the control is made, so each
/// access is one load or store (a writer reads `trace_enabled` and
/// `clear_request` per event).
#[derive(Clone, Copy, Debug)]
pub struct Control<'m> {
    ring: Ring<'m>,
}

/// The control words: header bytes `0xC0..0x100`.
const CONTROL_WORDS: usize = (HEADER_SIZE - offset::CONTROL) / 4;

// `ring_head` and `ring_tail` are the first two control words (`Ring`).
const _: () =
    assert!(offset::RING_HEAD == offset::CONTROL && offset::RING_TAIL == offset::CONTROL + 4);

impl<'m> Control<'m> {
    /// `None` if a control word is out of `mem` (never for a validated
    /// header).
    pub(crate) fn new(mem: Mem<'m>, ring: RingGeometry) -> Option<Self> {
        let words = mem.words(offset::CONTROL, CONTROL_WORDS)?.try_into().ok()?;
        Some(Control {
            ring: Ring::new(mem, ring, words)?,
        })
    }

    /// The control word at header offset `at` (a constant: no check is
    /// left).
    #[inline(always)]
    fn word(&self, at: usize) -> Option<&'m AtomicLeU32> {
        self.ring.control.get(at.checked_sub(offset::CONTROL)? / 4)
    }

    /// The ring.
    pub fn ring(&self) -> &Ring<'m> {
        &self.ring
    }

    #[inline(always)]
    fn load(&self, at: usize, order: core::sync::atomic::Ordering) -> u32 {
        self.word(at).map_or(0, |w| w.load(order))
    }

    #[inline(always)]
    fn store(&self, at: usize, value: u32, order: core::sync::atomic::Ordering) {
        if let Some(w) = self.word(at) {
            w.store(value, order);
        }
    }

    #[inline(always)]
    fn add(&self, at: usize, n: u32) {
        if let Some(w) = self.word(at) {
            w.fetch_add(n, Relaxed);
        }
    }

    // ------------------------------------------------------------ host side

    /// Host: turns tracing on or off.
    pub fn set_trace_enabled(&self, enabled: bool) {
        self.store(offset::TRACE_ENABLED, u32::from(enabled), Release);
    }

    /// Host: asks the writers to restart their sequences (clear their
    /// incremental state). Returns the new request value.
    pub fn request_clear(&self) -> u32 {
        let next = self.clear_request().wrapping_add(1);
        self.store(offset::CLEAR_REQUEST, next, Release);
        next
    }

    /// Host: asks the firmware to commit what it holds. Returns the request
    /// id; the flush is done once [`flush_ack`](Self::flush_ack) equals it.
    pub fn request_flush(&self) -> u32 {
        let next = self.flush_request().wrapping_add(1);
        self.store(offset::FLUSH_REQUEST, next, Release);
        next
    }

    /// Host: asks the firmware for its clock, tagged `nonce` (use a value
    /// different from the previous one).
    pub fn request_sync(&self, nonce: u32) {
        self.store(offset::SYNC_REQUEST, nonce, Release);
    }

    /// Host: the firmware's answer to the last sync request, as
    /// `(nonce, firmware ns)`; `None` while it has answered no request or
    /// is writing its answer.
    pub fn sync_response(&self) -> Option<(u32, u64)> {
        let nonce = self.load(offset::SYNC_RESPONSE, Acquire);
        let lo = self.load(offset::SYNC_TIME, Relaxed);
        let hi = self.load(offset::SYNC_TIME + 4, Relaxed);
        core::sync::atomic::fence(Acquire);
        let again = self.load(offset::SYNC_RESPONSE, Relaxed);
        (nonce == again && nonce != 0).then_some((nonce, u64::from(hi) << 32 | u64::from(lo)))
    }

    // -------------------------------------------------------- firmware side

    /// Whether the host wants events (`trace_enabled != 0`).
    #[inline]
    pub fn trace_enabled(&self) -> bool {
        self.load(offset::TRACE_ENABLED, Relaxed) != 0
    }

    /// The host's clear request counter: when it changed since a writer
    /// last looked, the writer restarts its sequence. (Relaxed: the request
    /// publishes nothing else a writer reads, so no barrier per event.)
    #[inline]
    pub fn clear_request(&self) -> u32 {
        self.load(offset::CLEAR_REQUEST, Relaxed)
    }

    /// The host's flush request counter.
    pub fn flush_request(&self) -> u32 {
        self.load(offset::FLUSH_REQUEST, Acquire)
    }

    /// The last flush request the firmware acknowledged.
    pub fn flush_ack(&self) -> u32 {
        self.load(offset::FLUSH_ACK, Acquire)
    }

    /// Firmware: every writer has committed for flush request `id`.
    pub fn ack_flush(&self, id: u32) {
        self.store(offset::FLUSH_ACK, id, Release);
    }

    /// The host's pending sync nonce (0: none).
    pub fn sync_request(&self) -> u32 {
        self.load(offset::SYNC_REQUEST, Acquire)
    }

    /// Firmware: if the host asked for a sync it has not been answered,
    /// answers it with `now_ns()` (called only then) and returns `true`.
    pub fn answer_sync(&self, now_ns: impl FnOnce() -> u64) -> bool {
        let nonce = self.sync_request();
        if nonce == 0 || nonce == self.load(offset::SYNC_RESPONSE, Relaxed) {
            return false;
        }
        let t = now_ns();
        // Clear the response first, so a host never pairs the new time
        // with the old nonce.
        self.store(offset::SYNC_RESPONSE, 0, Relaxed);
        core::sync::atomic::fence(Release);
        self.store(offset::SYNC_TIME, t as u32, Relaxed);
        self.store(offset::SYNC_TIME + 4, (t >> 32) as u32, Relaxed);
        self.store(offset::SYNC_RESPONSE, nonce, Release);
        true
    }

    /// Firmware: counts packets its writers dropped.
    pub fn count_packets_dropped(&self, n: u32) {
        self.add(offset::PACKETS_DROPPED, n);
    }

    /// Firmware: counts a chunk commit that found the ring full.
    pub fn count_ring_overflow(&self) {
        self.add(offset::RING_OVERFLOWS, 1);
    }

    /// Firmware: counts a chunk lost (could not be completed).
    pub fn count_chunk_lost(&self) {
        self.add(offset::CHUNKS_LOST, 1);
    }

    /// Firmware: counts a chunk commit that failed: a chunk lost if `lost`
    /// ([`count_chunk_lost`](Self::count_chunk_lost)), else one that found
    /// the ring full ([`count_ring_overflow`](Self::count_ring_overflow)).
    pub(crate) fn count_failed_commit(&self, lost: bool) {
        let at = if lost {
            offset::CHUNKS_LOST
        } else {
            offset::RING_OVERFLOWS
        };
        self.add(at, 1);
    }

    /// Firmware: shows it is alive (call periodically).
    pub fn beat(&self) {
        self.add(offset::HEARTBEAT, 1);
    }

    /// The firmware's counters and the ring positions, as loaded now.
    pub fn counters(&self) -> Counters {
        Counters {
            packets_dropped: self.load(offset::PACKETS_DROPPED, Relaxed),
            ring_overflows: self.load(offset::RING_OVERFLOWS, Acquire),
            chunks_lost: self.load(offset::CHUNKS_LOST, Relaxed),
            heartbeat: self.load(offset::HEARTBEAT, Relaxed),
            ring_head: self.ring.head().load(Relaxed),
            ring_tail: self.ring.tail().load(Relaxed),
        }
    }
}

/// Firmware counters of a region (all wrap at 2^32).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Packets the writers dropped (`packets_dropped`).
    pub packets_dropped: u32,
    /// Chunk commits that found the ring full (`ring_overflows`).
    pub ring_overflows: u32,
    /// Chunks lost (`chunks_lost`).
    pub chunks_lost: u32,
    /// `heartbeat`.
    pub heartbeat: u32,
    /// `ring_head`.
    pub ring_head: u32,
    /// `ring_tail`.
    pub ring_tail: u32,
}
