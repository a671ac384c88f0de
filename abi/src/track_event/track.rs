//! Tracks: timelines events go on, described once per sequence by a
//! `TrackDescriptor` packet.
//!
//! A [`Track`] holds slices and instants; a [`CounterTrack`] holds counter
//! samples. Both are plain `const` data meant for `static`s, identified by
//! a 64-bit uuid that must be unique in a trace: by default a hash of the
//! name (so the same firmware keeps its tracks across resets), or one the
//! program picks.

use crate::proto::wire::{varint_len, WireType};
use crate::proto::{Cursor, Target};
use crate::trace::counter_descriptor::{self, Unit};
use crate::trace::track_event::{self, Type};
use crate::trace::{tag1, track_descriptor};

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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Track {
    uuid: u64,
    name: &'static str,
    parent_uuid: u64,
}

impl Track {
    /// A top-level track named `name`, with the uuid [`name_uuid`]`(name)`.
    pub const fn new(name: &'static str) -> Self {
        Self {
            uuid: name_uuid(name),
            name,
            parent_uuid: 0,
        }
    }

    /// The same track with the uuid `uuid` (non-zero).
    pub const fn with_uuid(self, uuid: u64) -> Self {
        Self { uuid, ..self }
    }

    /// The same track nested under `parent` in the UI.
    pub const fn with_parent(self, parent: &Track) -> Self {
        Self {
            parent_uuid: parent.uuid,
            ..self
        }
    }

    /// Its uuid.
    pub const fn uuid(&self) -> u64 {
        self.uuid
    }

    /// Its name.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// Writes its `TrackDescriptor` fields.
    #[inline(never)]
    pub fn encode<T: Target>(&self, c: &mut Cursor<T>) {
        c.uint(track_descriptor::UUID, self.uuid);
        if self.parent_uuid != 0 {
            c.uint(track_descriptor::PARENT_UUID, self.parent_uuid);
        }
        c.string(track_descriptor::NAME, self.name);
    }
}

/// A track for counter samples (`TrackDescriptor.counter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterTrack {
    track: Track,
    unit: Unit,
    unit_name: &'static str,
    /// The first fields of a sample's `track_event` on this track (`type`,
    /// `track_uuid`), encoded at build time: the low `head_len` bytes.
    head: u64,
    /// 0 if they take more than 8 bytes (a uuid of 2^35 or more).
    head_len: u8,
}

/// The first fields of a counter sample's `track_event` on track `uuid`:
/// `type = TYPE_COUNTER`, `track_uuid = uuid`, as a word and its length (0
/// if longer than 8 bytes).
const fn sample_head(uuid: u64) -> (u64, u8) {
    let len = varint_len(uuid);
    if 3 + len > 8 {
        return (0, 0);
    }
    let mut head = u64::from_le_bytes([
        tag1(track_event::TYPE, WireType::Varint),
        Type::Counter as u8,
        tag1(track_event::TRACK_UUID, WireType::Varint),
        0,
        0,
        0,
        0,
        0,
    ]);
    let mut i = 0;
    let mut v = uuid;
    while i < len {
        let more = if i + 1 < len { 0x80 } else { 0 };
        head |= ((v & 0x7F) | more) << (8 * (3 + i));
        v >>= 7;
        i += 1;
    }
    (head, (3 + len) as u8)
}

impl CounterTrack {
    /// A top-level counter track named `name`, with the uuid
    /// [`name_uuid`]`(name)` and no unit.
    pub const fn new(name: &'static str) -> Self {
        let track = Track::new(name);
        let (head, head_len) = sample_head(track.uuid);
        Self {
            track,
            unit: Unit::Unspecified,
            unit_name: "",
            head,
            head_len,
        }
    }

    /// The same track with the uuid `uuid` (non-zero).
    pub const fn with_uuid(self, uuid: u64) -> Self {
        let (head, head_len) = sample_head(uuid);
        Self {
            track: self.track.with_uuid(uuid),
            head,
            head_len,
            ..self
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
    pub const fn with_unit(self, unit: Unit) -> Self {
        Self { unit, ..self }
    }

    /// The same track with a free-form unit name ("mA", "rpm").
    pub const fn with_unit_name(self, unit_name: &'static str) -> Self {
        Self { unit_name, ..self }
    }

    /// Its uuid.
    pub const fn uuid(&self) -> u64 {
        self.track.uuid
    }

    /// The first fields of a sample's `track_event` on this track (`type =
    /// TYPE_COUNTER`, `track_uuid`) as the low bytes of a word, and how many
    /// there are; `None` if they take more than 8 bytes.
    #[inline(always)]
    pub fn sample_head(&self) -> Option<(u64, usize)> {
        (self.head_len != 0).then_some((self.head, usize::from(self.head_len)))
    }

    /// Writes its `TrackDescriptor` fields. Inline: firmware writes
    /// descriptors from one place ([`AnyTrack::encode`]); the plain track's
    /// fields stay one function ([`Track::encode`]).
    #[inline]
    pub fn encode<T: Target>(&self, c: &mut Cursor<T>) {
        self.track.encode(c);
        let counter = c.begin_short_field(track_descriptor::COUNTER);
        if self.unit != Unit::Unspecified {
            c.uint(counter_descriptor::UNIT, self.unit as u64);
        }
        if !self.unit_name.is_empty() {
            c.string(counter_descriptor::UNIT_NAME, self.unit_name);
        }
        c.end_short(counter);
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
        match self {
            AnyTrack::Slices(t) => t.uuid,
            AnyTrack::Counter(t) => t.track.uuid,
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

    /// Writes its `TrackDescriptor` fields.
    pub fn encode<T: Target>(&self, c: &mut Cursor<T>) {
        match self {
            AnyTrack::Slices(t) => t.encode(c),
            AnyTrack::Counter(t) => t.encode(c),
        }
    }
}

/// The tracks whose descriptor was emitted on a sequence since its last
/// clear, by [`AnyTrack::key`]: up to `N` of them, then nothing more is
/// remembered (the descriptor of a track beyond that is written again
/// before each use).
pub struct TrackSet<const N: usize> {
    keys: [usize; N],
    len: usize,
}

impl<const N: usize> Default for TrackSet<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> TrackSet<N> {
    /// An empty set.
    pub const fn new() -> Self {
        Self {
            keys: [0; N],
            len: 0,
        }
    }

    /// Whether the track with `key` is in the set: newest first (the
    /// sequence's default track, described first at every reset, is not
    /// looked up by the writers).
    #[inline(always)]
    pub fn contains(&self, key: usize) -> bool {
        let live = self.keys.get(..self.len).unwrap_or_default();
        live.iter().rev().any(|&k| k == key)
    }

    /// Adds the track with `key`; `false` if the set is full.
    pub fn insert(&mut self, key: usize) -> bool {
        match self.keys.get_mut(self.len) {
            Some(slot) => {
                *slot = key;
                self.len += 1;
                true
            }
            None => false,
        }
    }

    /// Empties the set.
    pub fn clear(&mut self) {
        self.len = 0;
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
    }

    #[test]
    fn sample_heads_are_the_encoded_type_and_uuid() {
        for uuid in [1, 127, 128, 0xFFFF_FFFF, (1 << 35) - 1] {
            let t = CounterTrack::new("t").with_uuid(uuid);
            let mut b = [0u8; 16 + TARGET_SLACK];
            let mut c = Cursor::new(&mut b);
            c.uint(track_event::TYPE, Type::Counter as u64);
            c.uint(track_event::TRACK_UUID, uuid);
            let n = c.finish().unwrap();
            let (head, len) = t.sample_head().unwrap();
            assert_eq!(&head.to_le_bytes()[..len], &b[..n], "{uuid:#x}");
        }
        assert_eq!(
            CounterTrack::new("t").with_uuid(1 << 35).sample_head(),
            None
        );
        assert!(CounterTrack::new("t").sample_head().is_some());
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
        assert!(s.insert(a) && s.insert(b));
        assert!(!s.insert(c));
        assert!(s.contains(b) && !s.contains(c));
        s.clear();
        assert!(!s.contains(a));
    }
}
