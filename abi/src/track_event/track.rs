//! Tracks: timelines events go on, described once per sequence by a
//! `TrackDescriptor` packet.
//!
//! A [`Track`] holds slices and instants; a [`CounterTrack`] holds counter
//! samples. Both are plain `const` data meant for `static`s, identified by
//! a 64-bit uuid that must be unique in a trace: by default a hash of the
//! name (so the same firmware keeps its tracks across resets), or one the
//! program picks.

use crate::proto::wire::{varint_len, varint_words, WireType};
use crate::proto::{Args, Cursor, Target};
use crate::trace::counter_descriptor::Unit;
use crate::trace::trace_packet;
use crate::trace::track_event::{self, Type};
use crate::trace::{tag1, tag2};

use super::encode::{self, NOT_COUNTER, NO_PARENT, NO_UNIT, NO_UNIT_NAME};

/// The default track uuid of a track named `s`: FNV-1a (64-bit) of the
/// name folded to 32 bits (5 bytes on the wire instead of 10), never 0.
pub const fn name_uuid(s: &str) -> u64 {
    let bytes = s.as_bytes();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
        i += 1;
    }
    let folded = (h ^ (h >> 32)) & 0xFFFF_FFFF;
    if folded == 0 {
        1
    } else {
        folded
    }
}

/// A track for slices and instants.
///
/// Tracks hold their `TrackDescriptor` as the values, strings and skip bits
/// of [`encode::TRACK`] (and [`encode::DESCRIPTOR`]) after the time, worked
/// out at build time, so a writer hands them to the template as they are
/// (one layout for both kinds of track: one way to hand them over).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Track {
    /// uuid, parent uuid (0: none), a counter track's unit.
    ids: [u64; 3],
    /// name, a counter track's unit name.
    names: [&'static str; 2],
    /// [`NO_PARENT`], [`NOT_COUNTER`], [`NO_UNIT`], [`NO_UNIT_NAME`].
    skip: u32,
}

impl Track {
    /// A top-level track named `name`, with the uuid [`name_uuid`]`(name)`.
    pub const fn new(name: &'static str) -> Self {
        Self {
            ids: [name_uuid(name), 0, Unit::Unspecified as u64],
            names: [name, ""],
            skip: NO_PARENT | NOT_COUNTER | NO_UNIT | NO_UNIT_NAME,
        }
    }

    /// The same track with the uuid `uuid` (non-zero).
    pub const fn with_uuid(mut self, uuid: u64) -> Self {
        self.ids[0] = uuid;
        self
    }

    /// The same track nested under `parent` in the UI.
    pub const fn with_parent(mut self, parent: &Track) -> Self {
        self.ids[1] = parent.uuid();
        // A parent uuid of 0 (none) is not written.
        self.skip |= NO_PARENT;
        if parent.uuid() != 0 {
            self.skip &= !NO_PARENT;
        }
        self
    }

    /// Its uuid.
    pub const fn uuid(&self) -> u64 {
        self.ids[0]
    }

    /// Its name.
    pub const fn name(&self) -> &'static str {
        self.names[0]
    }

    /// Writes its `TrackDescriptor` fields ([`encode::TRACK`]).
    pub fn encode<T: Target>(&self, c: &mut Cursor<T>) {
        c.template(encode::TRACK, &self.descriptor([0; 2]));
    }

    /// The [`Args`] of its descriptor ([`encode::DESCRIPTOR`], whose time
    /// is `time`; [`encode::TRACK`], which has none).
    #[inline(always)]
    pub fn descriptor(&self, time: [u64; 2]) -> Args<'_> {
        Args {
            skip: self.skip,
            t: time,
            v: &self.ids,
            s: &self.names,
        }
    }
}

/// A track for counter samples (`TrackDescriptor.counter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct CounterTrack {
    /// What the writer's fast path writes of a sample on this track
    /// around its value, worked out at build time, by the value's shape
    /// ([`Rest::samples`]). First: a sample's rest is at the track's
    /// address plus 16 times the shape, one instruction.
    samples: [Rest; 6],
    track: Track,
}

/// The bytes of a fast-path event's `track_event` that a caller of the
/// writer's fast path does not pass in registers (see `fast_event` in the
/// writer), and their lengths. `lens`, [`Rest::lens`]: byte 0 the packet's
/// size less its timestamp's varint, byte 1 the timestamp's tag (the
/// packet's first two bytes, with the varint's length added), byte 2
/// where the tail goes, byte 3 the `track_event`'s length; flags
/// [`Rest::A_ONLY`] (all of it in the registers, at byte 0) and
/// [`Rest::SLOW_BIT`]. A counter sample's bytes are `head`'s 4 at byte 0
/// (`type` and the value's tag), the registers' 8 at byte 4 (the value) and
/// `tail`'s 8 where `lens` says (the value's last bytes, if any, and
/// `track_uuid`), in this order, so each store's bytes past those it means
/// are overwritten by a later one's or lie past the event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Rest {
    pub(super) tail: u64,
    pub(super) head: u32,
    pub(super) lens: u32,
}

impl Rest {
    /// Bit of `lens`: every byte is in the registers (`head` and `tail`
    /// are not written).
    pub(super) const A_ONLY: u32 = 1 << 23;
    /// Bit of `lens`: an event the fast path does not write.
    pub(super) const SLOW_BIT: u32 = 1 << 31;
    /// [`Rest::samples`]' index of a negative integer's.
    pub(super) const NEGATIVE: usize = 4;
    /// [`Rest::samples`]' index of a double's.
    pub(super) const DOUBLE: usize = 5;
    /// Where a sample's value starts: after `head`.
    pub(super) const VALUE_AT: usize = 4;

    /// The `lens` of a `track_event` of `len` bytes (at most 31) whose
    /// tail goes at byte `at_tail`.
    pub(super) const fn lens(len: u32, at_tail: u32) -> u32 {
        // After the size and the timestamp: `sequence_flags` (2 bytes) and
        // the `track_event`'s tag and 1-byte length.
        let size = 1 + 4 + len;
        size | (tag1(trace_packet::TIMESTAMP, WireType::Varint) as u32) << 8
            | at_tail << 16
            | len << 24
    }

    /// A sample's: `head`, the value's `n` bytes in the registers, then
    /// `tail`'s `nt`.
    const fn sample(head: u32, n: u32, tail: (u64, u32)) -> Self {
        let at_tail = Rest::VALUE_AT as u32 + n;
        Rest {
            tail: tail.0,
            head,
            lens: Rest::lens(at_tail + tail.1, at_tail),
        }
    }

    /// A sample's `head`: `type = TYPE_COUNTER` and the value's `tag`.
    const fn sample_head(tag: [u8; 2]) -> u32 {
        u32::from_le_bytes([
            tag1(track_event::TYPE, WireType::Varint),
            Type::Counter as u8,
            tag[0],
            tag[1],
        ])
    }

    /// A counter sample's on the track `uuid`, by the value's shape, as
    /// `encode::event` orders its fields (`type = TYPE_COUNTER`, the value,
    /// `track_uuid = uuid`): a non-negative integer of 1 to 4 varint bytes
    /// (in the registers), a negative one (its first 8 varint bytes in the
    /// registers, the last 2, the same for every `i32`, first in the tail)
    /// or a double (its 8 bytes in the registers); the slow path's if the
    /// tail takes more than 8 bytes (a uuid of 2^35 or more).
    const fn samples(uuid: u64) -> [Self; 6] {
        let len = varint_len(uuid);
        if 3 + len > 8 {
            let slow = Rest {
                tail: 0,
                head: 0,
                lens: Rest::SLOW_BIT,
            };
            return [slow; 6];
        }
        // The tag, then the varint (at most 5 bytes here: the bytes of
        // its word past them are 0).
        let uuid_field =
            tag1(track_event::TRACK_UUID, WireType::Varint) as u64 | varint_words(uuid).0 << 8;
        let field = (uuid_field, (1 + len) as u32);
        let int = Rest::sample_head(tag2(track_event::COUNTER_VALUE, WireType::Varint));
        let dbl = Rest::sample_head(tag2(track_event::DOUBLE_COUNTER_VALUE, WireType::Fixed64));
        [
            Rest::sample(int, 1, field),
            Rest::sample(int, 2, field),
            Rest::sample(int, 3, field),
            Rest::sample(int, 4, field),
            Rest::sample(int, 8, (0x01FF | field.0 << 16, field.1 + 2)),
            Rest::sample(dbl, 8, field),
        ]
    }
}

impl CounterTrack {
    /// A top-level counter track named `name`, with the uuid
    /// [`name_uuid`]`(name)` and no unit.
    pub const fn new(name: &'static str) -> Self {
        let mut track = Track::new(name);
        track.skip &= !NOT_COUNTER;
        Self {
            samples: Rest::samples(track.uuid()),
            track,
        }
    }

    /// The same track with the uuid `uuid` (non-zero).
    pub const fn with_uuid(self, uuid: u64) -> Self {
        Self {
            track: self.track.with_uuid(uuid),
            samples: Rest::samples(uuid),
        }
    }

    /// The same track nested under `parent` in the UI.
    pub const fn with_parent(self, parent: &Track) -> Self {
        Self {
            track: self.track.with_parent(parent),
            ..self
        }
    }

    /// The same track with a standard unit.
    pub const fn with_unit(mut self, unit: Unit) -> Self {
        self.track.ids[2] = unit as u64;
        self.track.skip &= !NO_UNIT;
        if matches!(unit, Unit::Unspecified) {
            self.track.skip |= NO_UNIT;
        }
        self
    }

    /// The same track with a free-form unit name ("mA", "rpm").
    pub const fn with_unit_name(mut self, unit_name: &'static str) -> Self {
        self.track.names[1] = unit_name;
        self.track.skip &= !NO_UNIT_NAME;
        if unit_name.is_empty() {
            self.track.skip |= NO_UNIT_NAME;
        }
        self
    }

    /// Its uuid.
    pub const fn uuid(&self) -> u64 {
        self.track.uuid()
    }

    /// What the writer's fast path writes of a sample on this track
    /// around its value: `shape` 0 to 3 for a non-negative integer of 1 to
    /// 4 varint bytes, [`Rest::NEGATIVE`] for a negative one,
    /// [`Rest::DOUBLE`] for a double.
    #[inline(always)]
    pub(super) fn sample_rest(&self, shape: usize) -> &Rest {
        // A shape past the table is a double's: no panic.
        &self.samples[shape.min(Rest::DOUBLE)]
    }

    /// Writes its `TrackDescriptor` fields ([`encode::TRACK`]).
    pub fn encode<T: Target>(&self, c: &mut Cursor<T>) {
        self.track.encode(c);
    }
}

/// Something described by a `TrackDescriptor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnyTrack {
    /// A slice track.
    Slices(&'static Track),
    /// A counter track.
    Counter(&'static CounterTrack),
}

impl AnyTrack {
    /// Its uuid.
    pub const fn uuid(&self) -> u64 {
        self.track().uuid()
    }

    /// Its descriptor's fields: the track's, or the counter track's.
    #[inline(always)]
    pub const fn track(&self) -> &'static Track {
        match self {
            AnyTrack::Slices(t) => t,
            AnyTrack::Counter(t) => &t.track,
        }
    }

    /// What a [`TrackSet`] remembers it by: the address of its `static`
    /// (one word, compared in one instruction; two statics with the same
    /// uuid are described once each).
    #[inline(always)]
    pub fn key(&self) -> usize {
        match self {
            AnyTrack::Slices(t) => *t as *const Track as usize,
            AnyTrack::Counter(t) => *t as *const CounterTrack as usize,
        }
    }

    /// Writes its `TrackDescriptor` fields ([`encode::TRACK`]).
    pub fn encode<T: Target>(&self, c: &mut Cursor<T>) {
        self.track().encode(c);
    }
}

/// The tracks whose descriptor was emitted on a sequence since its last
/// clear, by [`AnyTrack::key`]: up to `N` of them, then nothing more is
/// remembered (the descriptor of a track beyond that is written again
/// before each use). Oldest first (the first tracks a sequence uses, found
/// first); a free slot holds 0, which is no `static`'s address, so a
/// lookup needs no length.
pub struct TrackSet<const N: usize> {
    keys: [usize; N],
}

impl<const N: usize> Default for TrackSet<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> TrackSet<N> {
    /// An empty set.
    pub const fn new() -> Self {
        Self { keys: [0; N] }
    }

    /// Whether the track with `key` (not 0) is in the set: the first slot
    /// tested on its own (the common case: one counter track, or the
    /// first one), then the others.
    #[inline(always)]
    pub fn contains(&self, key: usize) -> bool {
        match self.keys.split_first() {
            Some((&first, others)) => first == key || others.contains(&key),
            None => false,
        }
    }

    /// Adds the track with `key` (not 0); `false` if the set is full.
    pub fn insert(&mut self, key: usize) -> bool {
        match self.keys.iter_mut().find(|k| **k == 0) {
            Some(slot) => {
                *slot = key;
                true
            }
            None => false,
        }
    }

    /// Empties the set.
    pub fn clear(&mut self) {
        self.keys = [0; N];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::TARGET_SLACK;

    #[test]
    fn descriptors_encode_their_fields() {
        static PARENT: Track = Track::new("motor").with_uuid(7);
        static CURRENT: CounterTrack = CounterTrack::new("current")
            .with_uuid(9)
            .with_parent(&PARENT)
            .with_unit(Unit::Count)
            .with_unit_name("mA");
        let mut b = [0u8; 64 + TARGET_SLACK];
        let mut c = Cursor::new(&mut b);
        CURRENT.encode(&mut c);
        let n = c.finish().unwrap();
        assert_eq!(
            &b[..n],
            &[
                0x08, 9, 0x28, 7, 0x12, 7, b'c', b'u', b'r', b'r', b'e', b'n', b't', 0x42, 6, 0x18,
                2, 0x32, 2, b'm', b'A'
            ]
        );
        assert_eq!(Track::new("x").uuid(), name_uuid("x"));
        assert_ne!(name_uuid("a"), name_uuid("b"));
        // No parent field for a parent uuid of 0, no counter message for a
        // counter track without a unit, a unit set back to none.
        let fields = |t: &AnyTrack| {
            let mut b = [0u8; 64 + TARGET_SLACK];
            let mut c = Cursor::new(&mut b);
            t.encode(&mut c);
            let n = c.finish().unwrap();
            b[..n].to_vec()
        };
        static NO_PARENT: Track = Track::new("p").with_uuid(0);
        static CHILD: Track = Track::new("x").with_uuid(3).with_parent(&NO_PARENT);
        assert_eq!(fields(&AnyTrack::Slices(&CHILD)), [0x08, 3, 0x12, 1, b'x']);
        static PLAIN: CounterTrack = CounterTrack::new("c")
            .with_uuid(4)
            .with_unit(Unit::Count)
            .with_unit(Unit::Unspecified)
            .with_unit_name("mA")
            .with_unit_name("");
        assert_eq!(
            fields(&AnyTrack::Counter(&PLAIN)),
            [0x08, 4, 0x12, 1, b'c', 0x42, 0]
        );
    }

    #[test]
    fn the_track_set_is_bounded() {
        static A: Track = Track::new("a");
        static B: Track = Track::new("b");
        static C: CounterTrack = CounterTrack::new("c");
        let [a, b, c] = [
            AnyTrack::Slices(&A).key(),
            AnyTrack::Slices(&B).key(),
            AnyTrack::Counter(&C).key(),
        ];
        let mut s = TrackSet::<2>::new();
        assert!(!s.contains(a));
        assert!(s.insert(a) && s.contains(a) && !s.contains(b));
        assert!(s.insert(b));
        assert_eq!(s.keys, [a, b], "oldest first");
        assert!(!s.insert(c));
        assert!(s.contains(a) && s.contains(b) && !s.contains(c));
        s.clear();
        assert!(!s.contains(a) && !s.contains(b));
        assert!(s.insert(c) && s.contains(c) && !s.contains(a));
    }
}
