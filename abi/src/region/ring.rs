//! The commit ring: a bounded multi-producer queue of 32-byte slots after
//! D. Vyukov's bounded MPMC queue, over words shared with the consumer.
//!
//! The protocol runs unchanged on the shared mapping (relaxed atomic body
//! words) and, under `--cfg loom`, on owned loom words (whose bodies are
//! loom cells, so loom reports any body access the sequence words do not
//! order): it is generic over [`RingWords`].
//!
//! # Protocol
//!
//! Positions are `u32` counters that wrap; slot `pos & (slots - 1)` serves
//! position `pos`. Each slot has a sequence word `seq`:
//!
//! | `seq - pos` (wrapping) | slot state for position `pos` |
//! |---|---|
//! | `0` | free for a producer (or claimed, not yet published) |
//! | `1` | published: the record for `pos` is readable |
//! | `slots` | consumed: free for position `pos + slots` |
//!
//! Initialization sets `seq[i] = i`, `head = tail = 0`.
//!
//! * **Produce `n` records** (`n >= 1`, all or nothing): load
//!   `pos = head` (Relaxed); for each `p` in `pos..pos + n`, load
//!   `seq[p]` (**Acquire**: pairs with the consumer's release of the slot,
//!   so its reads of the previous record happen before our writes):
//!   `seq == p` continue; `seq - p < 0` (as i32) the ring is full; `> 0`
//!   another producer got there first. Then one weak
//!   `compare_exchange(head, pos, pos + n)` claims the positions if all
//!   were free (Relaxed: the claim orders nothing, the sequence words do);
//!   if another producer got there first it is
//!   `compare_exchange(head, pos, pos)`, which fetches the latest `head`
//!   (a read-modify-write sees it, where a load could keep returning a
//!   stale one): if it succeeds `head` never moved and the slot is broken:
//!   give up as full. On failure (a lost race, or a spurious one) retry
//!   from the value found. Having won, write each body (Relaxed word
//!   stores), then
//!   `seq[p] = p + 1` (**Release**: publishes the body). Retries are
//!   bounded by [`CAS_ATTEMPTS`]; running out counts as full, so a peer
//!   scribbling on `head` or `seq` can never make a producer spin.
//! * **Consume position `pos`** (one consumer): load `seq[pos]`
//!   (**Acquire**: pairs with the producer's release, so the body is
//!   complete); if `seq == pos + 1` read the body (Relaxed), then store
//!   `seq = pos + slots` (**Release**: the producer that reuses the slot
//!   sees our reads done) and `tail = pos + 1` (Release; informative, and
//!   where a consumer that restarts resumes).
//!
//! A producer interrupted between its claim and its publication (by an
//! interrupt that commits too, or on another core) holds up the consumer at
//! its position until it publishes; later positions may be published
//! meanwhile and are consumed in order afterwards.

use crate::sync::{AtomicWord32, Ordering, CAS_ATTEMPTS};

use super::wire::SlotBody;

/// The words of one ring: the head and tail counters, each slot's sequence
/// word and body.
pub trait RingWords {
    /// Type of the shared words.
    type Word: AtomicWord32;

    /// Number of slots (a power of two, at least 2).
    fn slots(&self) -> u32;
    /// The `head` word (producers claim positions here).
    fn head(&self) -> &Self::Word;
    /// The `tail` word (the consumer's next position).
    fn tail(&self) -> &Self::Word;
    /// Sequence word of slot `index` (`index < slots`).
    fn seq(&self, index: u32) -> Option<&Self::Word>;
    /// Stores the body of slot `index` (the caller owns the slot).
    fn write_body(&self, index: u32, body: &SlotBody);
    /// Loads the body of slot `index` (the caller owns the slot).
    fn read_body(&self, index: u32) -> SlotBody;
}

/// The ring had no room for all the records (or the claim lost
/// [`CAS_ATTEMPTS`] races in a row).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingFull;

impl core::fmt::Display for RingFull {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("commit ring full")
    }
}

impl core::error::Error for RingFull {}

/// How many positions from `pos` on to claim: `n` if the `n` slots are
/// free for them, 0 if another producer claimed one first (`head` moved);
/// `None` if the ring is full there (or a sequence word is broken).
fn probe<R: RingWords + ?Sized>(ring: &R, pos: u32, n: u32) -> Option<u32> {
    let mask = ring.slots().wrapping_sub(1);
    for i in 0..n {
        let p = pos.wrapping_add(i);
        let dif = ring.seq(p & mask)?.load(Ordering::Acquire).wrapping_sub(p) as i32;
        if dif < 0 {
            return None;
        }
        if dif > 0 {
            return Some(0);
        }
    }
    Some(n)
}

/// Publishes `n` records, all or none, in consecutive positions: `body` is
/// called `n` times, in order, once the positions are claimed.
pub fn try_push<R: RingWords + ?Sized>(
    ring: &R,
    n: u32,
    body: &mut dyn FnMut() -> SlotBody,
) -> Result<(), RingFull> {
    if n == 0 {
        return Ok(());
    }
    if n > ring.slots() {
        return Err(RingFull);
    }
    let mask = ring.slots().wrapping_sub(1);
    let head = ring.head();
    let mut pos = head.load(Ordering::Relaxed);
    for _ in 0..CAS_ATTEMPTS {
        // Free: claim the positions. Moved: another producer claimed a
        // position from `pos` on, so `head` has moved past it: fetch it
        // with a read-modify-write of `pos` for itself (which sees the
        // latest value, where a load could keep returning a stale one);
        // succeeding means `head` did not move: the sequence word is not
        // one a producer wrote.
        let claim = probe(ring, pos, n).ok_or(RingFull)?;
        match head.compare_exchange_weak(
            pos,
            pos.wrapping_add(claim),
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) if claim == 0 => return Err(RingFull),
            Ok(_) => {
                for i in 0..n {
                    let p = pos.wrapping_add(i);
                    ring.write_body(p & mask, &body());
                    if let Some(seq) = ring.seq(p & mask) {
                        seq.store(p.wrapping_add(1), Ordering::Release);
                    }
                }
                return Ok(());
            }
            // A lost race, or a spurious failure (`found == pos`): probe
            // again.
            Err(found) => pos = found,
        }
    }
    Err(RingFull)
}

/// What the consumer finds at its position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peek {
    /// A published record (the body is a private copy).
    Ready(SlotBody),
    /// Nothing published yet (empty, or a producer has claimed the position
    /// and not published it).
    NotReady,
    /// The slot was consumed already (a consumer stopped between releasing
    /// the slot and storing `tail`): skip it, it is no record.
    Consumed,
    /// A sequence word no correct peer writes: the record is lost.
    Garbage {
        /// The word found.
        seq: u32,
    },
}

/// Looks at position `pos` without consuming it.
pub fn peek<R: RingWords + ?Sized>(ring: &R, pos: u32) -> Peek {
    let slots = ring.slots();
    let index = pos & slots.wrapping_sub(1);
    let Some(seq) = ring.seq(index) else {
        return Peek::NotReady;
    };
    let seq = seq.load(Ordering::Acquire);
    if seq == pos.wrapping_add(1) {
        Peek::Ready(ring.read_body(index))
    } else if seq == pos {
        Peek::NotReady
    } else if seq == pos.wrapping_add(slots) {
        Peek::Consumed
    } else {
        Peek::Garbage { seq }
    }
}

/// Hands slot `pos` back to the producers and advances `tail`. Also used for
/// a [`Peek::Garbage`] slot (so producers can use it again).
pub fn release<R: RingWords + ?Sized>(ring: &R, pos: u32) {
    let slots = ring.slots();
    if let Some(seq) = ring.seq(pos & slots.wrapping_sub(1)) {
        seq.store(pos.wrapping_add(slots), Ordering::Release);
    }
    ring.tail().store(pos.wrapping_add(1), Ordering::Release);
}
