//! The hand-tuned encoders of the commonest events: a [`PlainEvent`]
//! (slice begin or end, instant, integer counter) written byte by byte in
//! place in the chunk, the same with flat debug annotations, and
//! [`Interned::encode_fast`], the workspace's event encoder
//! ([`encode::event`]) for events without nested annotations. Each writes
//! exactly the bytes of the general path (`SequenceState::write_event`),
//! which the tests check, and declines (the general path then writes the
//! event) whenever an event needs more than it handles.

use super::*;
use shmtrace_abi::proto::wire::{self, MAX_ONE_BYTE_LEN, MAX_ONE_BYTE_VARINT};

/// Constant tags of the fast path, from the trace vocabulary.
const TAG_TIMESTAMP: u8 = tag1(trace_packet::TIMESTAMP, WireType::Varint);
const TAG_SEQUENCE_FLAGS: u8 = tag1(trace_packet::SEQUENCE_FLAGS, WireType::Varint);
const TAG_TRACK_EVENT: u8 = tag1(trace_packet::TRACK_EVENT, WireType::LengthDelimited);
const TAG_CATEGORY_IIDS: u8 = tag1(event_field::CATEGORY_IIDS, WireType::Varint);
pub(super) const TAG_DEBUG_ANNOTATIONS: u8 =
    tag1(event_field::DEBUG_ANNOTATIONS, WireType::LengthDelimited);
const TAG_TYPE: u8 = tag1(event_field::TYPE, WireType::Varint);
const TAG_NAME_IID: u8 = tag1(event_field::NAME_IID, WireType::Varint);
const TAG_TRACK_UUID: u8 = tag1(event_field::TRACK_UUID, WireType::Varint);
const TAG_COUNTER_VALUE: [u8; 2] = tag2(event_field::COUNTER_VALUE, WireType::Varint);
/// `DebugAnnotation.name_iid`.
pub(super) const TAG_ANNOTATION_NAME_IID: u8 = tag1(debug_annotation::NAME_IID, WireType::Varint);
/// `DebugAnnotation.bool_value`.
pub(super) const TAG_ARG_BOOL: u8 = tag1(debug_annotation::BOOL_VALUE, WireType::Varint);
/// `DebugAnnotation.uint_value`.
pub(super) const TAG_ARG_UINT: u8 = tag1(debug_annotation::UINT_VALUE, WireType::Varint);
/// `DebugAnnotation.int_value`.
pub(super) const TAG_ARG_INT: u8 = tag1(debug_annotation::INT_VALUE, WireType::Varint);
/// `DebugAnnotation.double_value`.
pub(super) const TAG_ARG_DOUBLE: u8 = tag1(debug_annotation::DOUBLE_VALUE, WireType::Fixed64);
/// `DebugAnnotation.string_value`.
pub(super) const TAG_ARG_STRING: u8 =
    tag1(debug_annotation::STRING_VALUE, WireType::LengthDelimited);
/// `DebugAnnotation.pointer_value`.
const TAG_ARG_POINTER: u8 = tag1(debug_annotation::POINTER_VALUE, WireType::Varint);

/// Bytes of `v` as a varint.
#[inline(always)]
pub(super) fn varint_len(v: u64) -> u8 {
    wire::varint_len(v) as u8
}

/// Appends varint `v` through `f`, keeping the cursor in registers.
///
/// [`Cursor::varint`] hands a value above 32 bits to an out-of-line
/// function that takes the cursor by reference. Where that call is inlined
/// (whether or not it runs), the cursor's address escapes, so the compiler
/// keeps its pointer, mask and length in memory and reloads them after
/// every byte stored through the window. Here a value above 32 bits is
/// split into two words by a function that never sees the cursor.
///
/// A value below 2^28 (ids, lengths, most time deltas and field values)
/// is spread into a word and stored at once (`varint_word`): no store and
/// no index per byte.
#[inline(always)]
pub(super) fn put_varint<T: Target>(f: &mut Cursor<T>, v: u64) {
    if v < 1 << 28 {
        let (word, n) = wire::varint_word(v as u32);
        f.word32(word, n);
        return;
    }
    match u32::try_from(v) {
        Ok(v) => f.varint32(v),
        Err(_) => put_varint_words(f, wire::varint_words(v), varint_len(v)),
    }
}

/// Appends a varint of `n` bytes held in two words (`words`, as
/// [`wire::varint_words`] makes them): two stores at most.
#[inline(always)]
fn put_varint_words<T: Target>(f: &mut Cursor<T>, (low, high): (u64, u16), n: u8) {
    let n = usize::from(n);
    f.word(low, n.min(8));
    if n > 8 {
        f.word(u64::from(high), n - 8);
    }
}

/// The packet's time as a delta, `sequence_flags`, and the TrackEvent's
/// tag (its length is the caller's to reserve).
#[inline(always)]
pub(super) fn put_packet_head<T: Target>(f: &mut Cursor<T>, delta: u64) {
    f.byte(TAG_TIMESTAMP);
    put_varint(f, delta);
    f.word(
        u64::from_le_bytes([
            TAG_SEQUENCE_FLAGS,
            SEQ_NEEDS_INCREMENTAL_STATE as u8,
            TAG_TRACK_EVENT,
            0,
            0,
            0,
            0,
            0,
        ]),
        3,
    );
}

/// The TrackEvent's type, category id and name id.
#[inline(always)]
pub(super) fn put_event_ids<T: Target>(f: &mut Cursor<T>, kind: u8, cat: u64, name: u64) {
    f.byte2([TAG_TYPE, kind]);
    f.byte(TAG_CATEGORY_IIDS);
    put_varint(f, cat);
    f.byte(TAG_NAME_IID);
    put_varint(f, name);
}

/// One flat debug annotation (one-byte length): its interned name and
/// its value.
#[inline(always)]
pub(super) fn put_flat_annotation<T: Target>(
    f: &mut Cursor<T>,
    name_iid: u64,
    value: encode::ArgValue<'_>,
) {
    let a = put_annotation_start(f, name_iid);
    put_arg_value(f, value);
    f.end_short(a);
}

/// The start of a flat debug annotation whose name has the interned id
/// `name_iid` and whose value (its tag included) takes `value` bytes, its
/// length complete and as short as it goes (one byte below 128, else a
/// varint).
#[inline(always)]
pub(super) fn put_annotation_start_sized<T: Target>(
    f: &mut Cursor<T>,
    name_iid: u64,
    value: usize,
) {
    // Most: a one-byte id and length, four bytes in one store.
    if name_iid <= MAX_ONE_BYTE_VARINT && value <= MAX_ONE_BYTE_LEN as usize - 2 {
        let start = [
            TAG_DEBUG_ANNOTATIONS,
            2 + value as u8,
            TAG_ANNOTATION_NAME_IID,
            name_iid as u8,
        ];
        f.word32(u32::from_le_bytes(start), 4);
        return;
    }
    f.byte(TAG_DEBUG_ANNOTATIONS);
    put_varint(f, 1 + u64::from(varint_len(name_iid)) + value as u64);
    f.byte(TAG_ANNOTATION_NAME_IID);
    put_varint(f, name_iid);
}

/// The start of a flat debug annotation (one-byte length) whose name has
/// the interned id `name_iid`; returns where its body starts, for
/// `end_short` once its value is written.
#[inline(always)]
pub(super) fn put_annotation_start<T: Target>(f: &mut Cursor<T>, name_iid: u64) -> usize {
    f.byte(TAG_DEBUG_ANNOTATIONS);
    let a = f.begin_short();
    f.byte(TAG_ANNOTATION_NAME_IID);
    put_varint(f, name_iid);
    a
}

/// A flat debug annotation value's bytes ([`ArgBytes::with`]): its first
/// `head_len` bytes (at most 8: its tag and its varint, or the start of
/// either) in `head`, then `tail`. The one definition of how a flat value
/// is encoded: [`ArgBytes::put`] writes these bytes and [`ArgBytes::len`]
/// counts them, so the size an annotation's start says is the size of
/// what follows it.
#[derive(Clone, Copy)]
pub(super) struct ArgBytes<'a> {
    head: u64,
    head_len: usize,
    tail: Tail<'a>,
}

/// What follows an [`ArgBytes`]' head.
#[derive(Clone, Copy)]
enum Tail<'a> {
    None,
    /// The low bytes of a word (a double; a long varint's last bytes).
    Word(u64, usize),
    /// A string's bytes.
    Text(&'a [u8]),
}

impl<'a> ArgBytes<'a> {
    /// Hands the bytes of `value` to `f` and returns what it returns: as
    /// [`encode::arg_value`] writes the value (its tag, then a varint, a
    /// double's 8 bytes, or a string's length and bytes). `f` is inlined
    /// where each shape of bytes is made, so that what it does with them
    /// (its stores) takes no second dispatch on their shape. `SHORT`: the
    /// caller knows that a varint value (an integer, a string's length)
    /// is below 2^28 (the longer form's code is left out).
    #[inline(always)]
    pub(super) fn with<const SHORT: bool, R>(
        value: encode::ArgValue<'a>,
        f: impl FnOnce(Self) -> R,
    ) -> R {
        use encode::ArgValue as A;
        match value {
            A::Bool(b) => Self::varint::<SHORT, R>(TAG_ARG_BOOL, u64::from(b), f),
            A::Uint(u) => Self::varint::<SHORT, R>(TAG_ARG_UINT, u, f),
            A::Int(i) => Self::varint::<SHORT, R>(TAG_ARG_INT, i as u64, f),
            A::Double(d) => f(ArgBytes {
                head: u64::from(TAG_ARG_DOUBLE),
                head_len: 1,
                tail: Tail::Word(d.to_bits(), 8),
            }),
            A::Str(s) => Self::varint::<SHORT, R>(
                TAG_ARG_STRING,
                s.len() as u64,
                #[inline(always)]
                |b| {
                    f(ArgBytes {
                        tail: Tail::Text(s.as_bytes()),
                        ..b
                    })
                },
            ),
            A::Pointer(p) => Self::varint::<SHORT, R>(TAG_ARG_POINTER, p, f),
        }
    }

    /// [`ArgBytes::with`] for the one-byte tag `tag` and the varint `v`:
    /// in the head below 2^28 (`varint_word`), else its first 7 bytes
    /// there and the rest (up to 3) in the tail (`varint_words`).
    #[inline(always)]
    fn varint<const SHORT: bool, R>(tag: u8, v: u64, f: impl FnOnce(Self) -> R) -> R {
        let tag = u64::from(tag);
        debug_assert!(!SHORT || v < 1 << 28);
        if SHORT || v < 1 << 28 {
            let (word, n) = wire::varint_word(v as u32);
            return f(ArgBytes {
                head: tag | u64::from(word) << 8,
                head_len: 1 + n,
                tail: Tail::None,
            });
        }
        let (low, high) = wire::varint_words(v);
        let len = 1 + usize::from(varint_len(v));
        f(ArgBytes {
            head: tag | low << 8,
            head_len: len.min(8),
            tail: Tail::Word(low >> 56 | u64::from(high) << 8, len.saturating_sub(8)),
        })
    }

    /// Bytes [`ArgBytes::put`] appends.
    #[inline(always)]
    pub(super) fn len(self) -> usize {
        self.head_len
            + match self.tail {
                Tail::None => 0,
                Tail::Word(_, n) => n,
                Tail::Text(s) => s.len(),
            }
    }

    /// Appends the bytes with the cursor's inlined byte writers only (a
    /// call that takes the cursor by reference keeps the cursor in memory
    /// for the whole inlined encoder: see [`put_varint`]): a word store or
    /// two for most values.
    #[inline(always)]
    pub(super) fn put<T: Target>(self, f: &mut Cursor<T>) {
        f.word(self.head, self.head_len);
        match self.tail {
            Tail::None => {}
            Tail::Word(word, n) => f.word(word, n),
            Tail::Text(s) => put_short_bytes(f, s),
        }
    }
}

/// Appends a flat debug annotation value (its tag and contents):
/// [`ArgBytes::put`]. [`encode::arg_value`] writes the same bytes through
/// the cursor's field writers, which the compiler may leave out of line.
#[inline(always)]
pub(super) fn put_arg_value<T: Target>(f: &mut Cursor<T>, value: encode::ArgValue<'_>) {
    ArgBytes::with::<false, _>(
        value,
        #[inline(always)]
        |bytes| bytes.put(f),
    );
}

/// Appends `s` with at most two word stores when it has at most 16 bytes
/// (the strings events mostly carry: a call to the library's `memcpy`
/// costs more than such a copy), else through [`Cursor::bytes`]. Two
/// stores of a string's first and last 8 (or 4) bytes overlap in its
/// middle, where both write the same bytes.
#[inline(always)]
pub(super) fn put_short_bytes<T: Target>(f: &mut Cursor<T>, s: &[u8]) {
    let n = s.len();
    if n > 16 {
        f.bytes(s);
    } else if let (Some(&head), Some(&tail)) = (s.first_chunk::<8>(), s.last_chunk::<8>()) {
        f.word(u64::from_le_bytes(head), n - 8);
        f.word(u64::from_le_bytes(tail), 8);
    } else if let (Some(&head), Some(&tail)) = (s.first_chunk::<4>(), s.last_chunk::<4>()) {
        f.word32(u32::from_le_bytes(head), n - 4);
        f.word32(u32::from_le_bytes(tail), 4);
    } else {
        match *s {
            [a] => f.byte(a),
            [a, b] => f.byte2([a, b]),
            [a, b, c] => {
                f.byte2([a, b]);
                f.byte(c);
            }
            _ => {}
        }
    }
}

/// The abi's form of a flat debug annotation value; `None` for a dict or
/// an array, which the general encoder nests.
#[inline(always)]
pub(super) fn flat_value<'a>(
    value: &crate::encoding::annotation::DebugValue<'a>,
) -> Option<encode::ArgValue<'a>> {
    use crate::encoding::annotation::DebugValue as V;
    use encode::ArgValue as A;
    Some(match *value {
        V::Bool(b) => A::Bool(b),
        V::Uint(u) => A::Uint(u),
        V::Int(i) => A::Int(i),
        V::Double(d) => A::Double(d),
        V::Str(s) => A::Str(s),
        V::Pointer(p) => A::Pointer(p),
        V::Dict(_) | V::Array(_) => return None,
    })
}

impl SequenceState {
    /// Writes one [`PlainEvent`] (see there) of kind `KIND` (an
    /// [`EventType`] as `u8`, so each kind gets its own copy without
    /// branches on it). Returns `false` if any packet was dropped, like
    /// [`SequenceState::write_event`].
    #[inline(never)]
    pub(crate) fn write_plain<const KIND: u8, W: PacketWriter>(
        &mut self,
        w: &mut W,
        ev: &PlainEvent<'_>,
    ) -> bool {
        debug_assert_eq!(ev.kind as u8, KIND);
        self.try_write_plain::<KIND, W>(w, ev) || self.write_plain_slow(w, ev)
    }

    /// What [`SequenceState::write_plain`]'s dedicated encoder declined:
    /// as the firmware's writer (`shmtrace_abi::track_event`) does for the
    /// same event, the new strings of a slice begin or an instant each go
    /// first in a packet of their own (after the reset, if one is due);
    /// then the general path writes the event.
    #[cold]
    #[inline(never)]
    fn write_plain_slow<W: PacketWriter>(&mut self, w: &mut W, ev: &PlainEvent<'_>) -> bool {
        let named = matches!(ev.kind, EventType::SliceBegin | EventType::Instant);
        if named && !ev.category.is_group() && !self.intern_alone(w, ev) {
            self.needs_reset = true;
            self.lost_before_start |= !self.started;
            if ev.kind == EventType::SliceBegin {
                self.slices.push(false);
            }
            return false;
        }
        self.write_event(w, &ev.data(), None)
    }

    /// Interns `ev`'s category and name, each new one with a packet of its
    /// own (`sequence_flags` and the entry alone in `interned_data`), after
    /// the reset if one is due; a string the tables have no room for is
    /// left to the event (inline). `false` if a packet was lost.
    fn intern_alone<W: PacketWriter>(&mut self, w: &mut W, ev: &PlainEvent<'_>) -> bool {
        // After a loss, while the buffer is still full, as `write_event`.
        if self.needs_reset && !w.ensure_chunk() {
            return false;
        }
        if !self.prepare(w, None, ev.ns) {
            return false;
        }
        for (kind, s) in [
            (Kind::Category, ev.category.name()),
            (Kind::EventName, ev.name),
        ] {
            self.interned.new_entries.clear();
            let _ = self.interned.intern(kind, s);
            let Some(&entry) = self.interned.new_entries.first() else {
                continue;
            };
            self.interned.new_entries.clear();
            let mut c = Cursor::new(&mut *self.scratch);
            c.uint(
                trace_packet::SEQUENCE_FLAGS,
                u64::from(SEQ_NEEDS_INCREMENTAL_STATE),
            );
            encode::interned_data::<_, true>(&mut c, &[entry]);
            let written = match c.finish() {
                Some(n) => w.write_encoded_packet_in(&self.scratch[..], n),
                None => false,
            };
            if !written {
                return false;
            }
        }
        true
    }

    /// The dedicated encoder of [`SequenceState::write_plain`], straight
    /// into the chunk; `false` (nothing changed) where the general path
    /// must do the work: a reset or a descriptor is due, a string is not in
    /// the front cache, the time went backwards, an end has no written
    /// begin, or the chunk has no room for a window.
    #[inline(always)]
    pub(super) fn try_write_plain<const KIND: u8, W: PacketWriter>(
        &mut self,
        w: &mut W,
        ev: &PlainEvent<'_>,
    ) -> bool {
        const BEGIN: u8 = EventType::SliceBegin as u8;
        const END: u8 = EventType::SliceEnd as u8;
        const INSTANT: u8 = EventType::Instant as u8;
        const COUNTER: u8 = EventType::Counter as u8;
        if self.needs_reset || ev.ns < self.clock_base {
            return false;
        }
        let delta = ev.ns - self.clock_base;
        // A counter's track uuid, encoded when the track became recent.
        let mut uuid_varint = (0, 0);
        // The TrackEvent after its type: two (tag, varint) fields, or none.
        let (tag_a, a, tag_b, b) = match KIND {
            BEGIN | INSTANT => {
                if ev.category.is_group() {
                    return false;
                }
                let Some(cat) = self.interned.categories.cached(ev.category.name()) else {
                    return false;
                };
                let Some(name) = self.interned.names.cached(ev.name) else {
                    return false;
                };
                ([TAG_CATEGORY_IIDS, 0], cat, [TAG_NAME_IID, 0], name)
            }
            END => {
                if !self.slices.top_written() {
                    return false;
                }
                ([0, 0], 0, [0, 0], 0)
            }
            _ => {
                let Some(track) = ev.track else { return false };
                let uuid = track.uuid();
                if uuid == self.thread_track.uuid() || !self.tracks.is_recent(uuid) {
                    return false;
                }
                uuid_varint = self.tracks.recent_varint();
                (
                    [TAG_TRACK_UUID, 0],
                    uuid,
                    TAG_COUNTER_VALUE,
                    ev.value as u64,
                )
            }
        };
        let field_len = |tag: [u8; 2], v: u64| match tag {
            [0, _] => 0,
            [_, 0] => 1 + varint_len(v),
            _ => 2 + varint_len(v),
        };
        // Below 128: a 1-byte length.
        let te_len = 2 + field_len(tag_a, a) + field_len(tag_b, b);
        let written = w.write_in_place(|f| {
            // Timestamp, sequence flags and the TrackEvent's header and type:
            // one 8-byte store when the delta takes one byte.
            let head = [
                TAG_SEQUENCE_FLAGS,
                SEQ_NEEDS_INCREMENTAL_STATE as u8,
                TAG_TRACK_EVENT,
                te_len,
                TAG_TYPE,
                KIND,
            ];
            if delta <= MAX_ONE_BYTE_VARINT {
                let [h0, h1, h2, h3, h4, h5] = head;
                f.word(
                    u64::from_le_bytes([TAG_TIMESTAMP, delta as u8, h0, h1, h2, h3, h4, h5]),
                    8,
                );
            } else {
                f.byte(TAG_TIMESTAMP);
                put_varint(f, delta);
                let [h0, h1, h2, h3, h4, h5] = head;
                f.word(u64::from_le_bytes([h0, h1, h2, h3, h4, h5, 0, 0]), 6);
            }
            if KIND == COUNTER {
                // The value first, as `encode::event` orders them.
                f.byte2(TAG_COUNTER_VALUE);
                put_varint(f, b);
                f.byte(TAG_TRACK_UUID);
                put_varint_words(f, uuid_varint, varint_len(a));
                return true;
            }
            // Two one-byte tags with one-byte values (category and name
            // ids): one store.
            if tag_a[1] == 0 && tag_b[1] == 0 && tag_a[0] != 0 && (a | b) <= MAX_ONE_BYTE_VARINT {
                f.word(
                    u64::from_le_bytes([tag_a[0], a as u8, tag_b[0], b as u8, 0, 0, 0, 0]),
                    4,
                );
                return true;
            }
            // Slice ends (no fields), or ids of two bytes or more: the two
            // fields' tags are one byte each (a counter returned above).
            for (tag, v) in [(tag_a, a), (tag_b, b)] {
                if tag[0] != 0 {
                    f.byte(tag[0]);
                    put_varint(f, v);
                }
            }
            true
        });
        if written {
            self.clock_base = ev.ns;
            match KIND {
                BEGIN => self.slices.push(true),
                END => {
                    self.slices.pop();
                }
                _ => {}
            }
        }
        written
    }

    /// [`SequenceState::write_plain`] for a slice begin or an instant
    /// (`KIND`) with debug annotations: its encoders take those with a
    /// static name and a flat value (not a dict or an array), the general
    /// path the others. Its own function, so that the encoder of events
    /// without annotations stays as small as it is.
    /// Up to [`PLAIN_ARGS_IN_PLACE`] annotations, tried in place first;
    /// then (more annotations, a packet too long for a window, no window)
    /// the same encoder into the scratch buffer
    /// ([`SequenceState::write_plain_args_copied`]), else the general path.
    #[inline(never)]
    pub(crate) fn write_plain_args<const KIND: u8, W: PacketWriter>(
        &mut self,
        w: &mut W,
        ev: &PlainEvent<'_>,
    ) -> bool {
        debug_assert_eq!(ev.kind as u8, KIND);
        (ev.args.len() <= PLAIN_ARGS_IN_PLACE && self.try_write_plain_args::<KIND, W>(w, ev))
            || self.write_plain_args_copied_or_general::<KIND, W>(w, ev)
    }

    /// What [`SequenceState::write_plain_args`] did not write in place.
    #[cold]
    #[inline(never)]
    fn write_plain_args_copied_or_general<const KIND: u8, W: PacketWriter>(
        &mut self,
        w: &mut W,
        ev: &PlainEvent<'_>,
    ) -> bool {
        match self.write_plain_args_copied::<KIND, W>(w, ev) {
            Some(written) => written,
            None => self.write_event(w, &ev.data(), None),
        }
    }

    /// The time of a flat or plain event at `ns` as a delta after the
    /// sequence's previous event, if the dedicated encoders may write it
    /// now: no reset due, time not gone backwards, a category that is not
    /// a group.
    #[inline(always)]
    pub(super) fn flat_delta(&self, category: &Category, ns: u64) -> Option<u64> {
        if self.needs_reset || ns < self.clock_base || category.is_group() {
            return None;
        }
        Some(ns - self.clock_base)
    }

    /// Notes a flat or plain event of `KIND` stamped `ns` written.
    #[inline(always)]
    pub(super) fn written_flat<const KIND: u8>(&mut self, ns: u64) {
        self.clock_base = ns;
        if KIND == EventType::SliceBegin as u8 {
            self.slices.push(true);
        }
    }

    /// The dedicated encoder of [`SequenceState::write_plain_args`], into
    /// the chunk in place; `false` (nothing changed) where another way
    /// must do the work: a reset is due, a name is not in its front cache
    /// (the scratch-buffer way looks past it, the general path interns
    /// it), the time went backwards, an annotation is not flat, or the
    /// packet does not fit a window. The
    /// packet (at most 127 bytes) gives every nested message a one-byte
    /// length.
    #[inline(always)]
    pub(super) fn try_write_plain_args<const KIND: u8, W: PacketWriter>(
        &mut self,
        w: &mut W,
        ev: &PlainEvent<'_>,
    ) -> bool {
        let Some(delta) = self.flat_delta(ev.category, ev.ns) else {
            return false;
        };
        let interned = &self.interned;
        let written = w.write_in_place(|f| {
            encode_plain_args::<_, KIND, false>(f, interned, delta, ev).is_some()
        });
        if written {
            self.written_flat::<KIND>(ev.ns);
        }
        written
    }

    /// [`SequenceState::try_write_plain_args`] into the scratch buffer,
    /// for any number of annotations (names found past the front cache
    /// too), the TrackEvent's length as short as it goes
    /// ([`long_packet`]: the bytes written in place for a packet short
    /// enough), handed to the writer to copy: `Some(false)` if it dropped
    /// it (see [`SequenceState::copied`]), `None` (nothing changed) where
    /// the general path must do the work.
    #[inline(never)]
    pub(super) fn write_plain_args_copied<const KIND: u8, W: PacketWriter>(
        &mut self,
        w: &mut W,
        ev: &PlainEvent<'_>,
    ) -> Option<bool> {
        let delta = self.flat_delta(ev.category, ev.ns)?;
        let scratch = &mut *self.scratch;
        let mut c = Cursor::new(&mut *scratch);
        let te = encode_plain_args::<_, KIND, true>(&mut c, &self.interned, delta, ev)?;
        let len = c.finish()?;
        let start = long_packet(scratch, te, len);
        let written = w.write_encoded_packet_in(&scratch[start..], len - start);
        Some(self.copied::<KIND>(written, ev.ns))
    }

    /// Notes a slice begin or an instant (`KIND`) stamped `ns` that a
    /// dedicated encoder handed to the writer to copy: `written`, or
    /// dropped (then, as `write_event` after a lost packet, the sequence
    /// is reset before its next event, and a lost begin's end is not
    /// written either). Returns `written`.
    pub(super) fn copied<const KIND: u8>(&mut self, written: bool, ns: u64) -> bool {
        if written {
            self.clock_base = ns;
        } else {
            self.needs_reset = true;
            self.lost_before_start |= !self.started;
        }
        if KIND == EventType::SliceBegin as u8 {
            self.slices.push(written);
        }
        written
    }
}

/// Most annotations of an event [`SequenceState::write_plain_args`] tries
/// in place: most events with more take 128 bytes or more (an annotation
/// takes at least 6, a text's bytes more), which the in-place encoder
/// would find only once it encoded them; one with more that is short
/// enough is encoded into the scratch buffer, the same bytes, and copied.
const PLAIN_ARGS_IN_PLACE: usize = 8;

/// The packet of a slice begin or an instant (`KIND`) with flat
/// annotations ([`SequenceState::write_plain_args`]), its time `delta`
/// after the sequence's previous event: the TrackEvent's length reserved
/// as one byte if `LONG` is `false` (the packet must be shorter than 128
/// bytes: a longer one fails the encoding), else two (see [`long_packet`]),
/// every annotation's length as short as it goes. Names are taken from
/// the interning tables' front caches, and past them if `LONG`. Returns
/// where the TrackEvent's body starts; `None` for a name not interned or
/// a value that is not flat.
#[inline(always)]
fn encode_plain_args<T: Target, const KIND: u8, const LONG: bool>(
    f: &mut Cursor<T>,
    interned: &Interned,
    delta: u64,
    ev: &PlainEvent<'_>,
) -> Option<usize> {
    let find = |table: &StrInterner, s| {
        if LONG {
            table.lookup(s)
        } else {
            table.cached(s)
        }
    };
    let cat = find(&interned.categories, ev.category.name())?;
    let name = find(&interned.names, ev.name)?;
    put_packet_head(f, delta);
    let te = if LONG {
        f.begin_nested()
    } else {
        f.begin_short()
    };
    put_event_ids(f, KIND, cat, name);
    for arg in ev.args {
        let ArgName::Static(n) = arg.name else {
            return None;
        };
        let (Some(iid), Some(value)) = (find(&interned.arg_names, n), flat_value(&arg.value))
        else {
            return None;
        };
        if LONG {
            ArgBytes::with::<false, _>(
                value,
                #[inline(always)]
                |value| {
                    put_annotation_start_sized(f, iid, value.len());
                    value.put(f);
                },
            );
        } else {
            put_flat_annotation(f, iid, value);
        }
    }
    if LONG {
        f.end_nested(te);
    } else {
        f.end_short(te);
    }
    Some(te)
}

// A TrackEvent in the scratch buffer has a size a two-byte varint says.
const _: () = assert!(FAST_CAP < 1 << 14);

/// A packet of a dedicated encoder encoded into `buf[..len]` with its
/// TrackEvent's length reserved as two bytes, the TrackEvent's body
/// starting at `te`, with that length as short as it goes: the two bytes
/// if it takes two (the whole packet then takes more than 127 bytes),
/// else the packet's fields before the length moved one byte further on
/// and a one-byte length, the bytes the same encoder writes in place.
/// Returns where the packet starts in `buf`.
#[inline(always)]
pub(super) fn long_packet(buf: &mut Scratch, te: usize, len: usize) -> usize {
    let size = len - te;
    if size > MAX_ONE_BYTE_LEN as usize {
        return 0;
    }
    // `te` is past the packet's time, flags and TrackEvent tag (at most
    // 14 bytes) and the two bytes reserved.
    buf.copy_within(..te - 2, 1);
    buf[te - 1] = size as u8;
    1
}

impl Interned {
    /// [`SequenceState::write_event_fields`] for events without nested
    /// annotations, through the workspace's event encoder
    /// ([`encode::event`]; nested sizes of one byte if `SHORT`, for a
    /// packet written in place, else two). `false` if the event does not
    /// qualify: a dict or array value, or more categories, annotations or
    /// flows than the fixed arrays here hold (interned strings stay pending
    /// for the retry).
    #[inline(always)]
    pub(super) fn encode_fast<T: Target, const SHORT: bool>(
        &mut self,
        c: &mut Cursor<T>,
        thread_uuid: u64,
        ev: &EventData<'_>,
        stamp: Stamp,
    ) -> bool {
        let mut categories: heapless::Vec<encode::Str<'_>, MAX_FAST_CATEGORIES> =
            heapless::Vec::new();
        if let Some(cat) = ev.category {
            if !matches!(ev.kind, EventType::SliceEnd | EventType::Counter) {
                let mut add = |this: &mut Self, name: &'static str| {
                    let s = match this.intern(Kind::Category, name) {
                        Some(iid) => encode::Str::Iid(iid),
                        None => encode::Str::Inline(name),
                    };
                    categories.push(s).is_ok()
                };
                let fits = if cat.is_group() {
                    cat.members().all(|m| add(self, m))
                } else {
                    add(self, cat.name())
                };
                if !fits {
                    return false;
                }
            }
        }
        let name = match ev.name {
            EventName::None => None,
            EventName::Static(n) => Some(match self.intern(Kind::EventName, n) {
                Some(iid) => encode::Str::Iid(iid),
                None => encode::Str::Inline(n),
            }),
            EventName::Dynamic(n) => Some(encode::Str::Inline(n)),
        };
        let mut args: heapless::Vec<encode::Arg<'_>, MAX_FAST_ARGS> = heapless::Vec::new();
        for arg in ev.args {
            let Some(value) = flat_value(&arg.value) else {
                return false;
            };
            let name = match arg.name {
                ArgName::Static(n) => match self.intern(Kind::AnnotationName, n) {
                    Some(iid) => encode::Str::Iid(iid),
                    None => encode::Str::Inline(n),
                },
                ArgName::Dynamic(n) => encode::Str::Inline(n),
            };
            if args.push(encode::Arg { name, value }).is_err() {
                return false;
            }
        }
        let mut flows: heapless::Vec<u64, MAX_FAST_FLOWS> = heapless::Vec::new();
        let mut terminating: heapless::Vec<u64, MAX_FAST_FLOWS> = heapless::Vec::new();
        for (out, from) in [
            (&mut flows, ev.flows),
            (&mut terminating, ev.terminating_flows),
        ] {
            for f in from {
                if out.push(f.id()).is_err() {
                    return false;
                }
            }
        }
        let time = if stamp.clock == INCREMENTAL_CLOCK_ID {
            encode::Time::Delta(stamp.value)
        } else {
            encode::Time::Absolute {
                clock_id: stamp.clock,
                ns: stamp.value,
            }
        };
        let event = encode::Event {
            kind: ev.kind,
            time,
            track_uuid: ev.track.map(|t| t.uuid()).filter(|&u| u != thread_uuid),
            categories: &categories,
            name,
            args: &args,
            flows: &flows,
            terminating_flows: &terminating,
            counter: ev.counter,
            interned: &self.new_entries,
        };
        encode::event::<T, SHORT>(c, &event);
        true
    }
}

/// Most categories (group members), annotations and flow ids an event
/// encoded by [`Interned::encode_fast`] has; the general encoder takes
/// larger ones.
const MAX_FAST_CATEGORIES: usize = 8;
const MAX_FAST_ARGS: usize = 16;
const MAX_FAST_FLOWS: usize = 8;

/// Most annotations of an event written by
/// [`SequenceState::write_flat`] (a `tracing` callsite's fields and the
/// level).
#[cfg(feature = "tracing")]
const MAX_FLAT_ARGS: usize = 40;

/// A lower bound of the size of the TrackEvent of a flat event with
/// `args` (its type, category id and name id take at least 6 bytes; an
/// annotation at least 6, its tag and length, its name's tag and id, its
/// value's tag and a byte, and a text value its bytes more): exact for ids
/// and integers below 128 and texts shorter than 128 bytes.
#[cfg(feature = "tracing")]
#[inline(always)]
pub(super) fn least_flat_len(args: &crate::encoding::annotation::FlatArgs<'_>) -> usize {
    use crate::encoding::annotation::FlatValue;
    let text: usize = args
        .values
        .iter()
        .map(|(_, v)| match *v {
            FlatValue::Text(start, end) => args.text.get(start..end).map_or(0, str::len),
            FlatValue::Double(_) => 7,
            _ => 0,
        })
        .sum();
    6 + (6 + args.head.1.len()) + 6 * args.values.len() + text
}

#[cfg(feature = "tracing")]
impl SequenceState {
    /// Writes an instant or a slice begin (`KIND`, an [`EventType`] as
    /// `u8`) named `name` in `category`, stamped `ns` (BOOTTIME), with the
    /// annotations of `args`: encoded in place like
    /// [`SequenceState::write_plain_args`] when every name is interned and
    /// the packet fits a window, else (a packet too long for one, or no
    /// window) after the trace point's pre-encoded head into the scratch
    /// buffer as [`SequenceState::write_flat_streamed`] encodes it there
    /// (the same bytes), else through the general path. Returns
    /// `false` if any packet was dropped, like
    /// [`SequenceState::write_event`]. `site` identifies the trace point:
    /// every event given the same site has the same `category`, `name` and
    /// head annotation (`args.head`), so a pre-encoded head is found by
    /// the site alone (`flat_heads`).
    #[inline(never)]
    pub(crate) fn write_flat<const KIND: u8, W: PacketWriter>(
        &mut self,
        w: &mut W,
        site: usize,
        category: &'static Category,
        name: &'static str,
        args: &crate::encoding::annotation::FlatArgs<'_>,
        ns: u64,
    ) -> bool {
        // Surely 128 bytes or more: not tried in place (the one-byte
        // lengths would find it only once most of it is encoded), and a
        // long event for the general path.
        let long = least_flat_len(args) > streamed::MAX_IN_PLACE;
        if !long && self.try_write_flat::<KIND, W>(w, site, category, name, args, ns) {
            return true;
        }
        match self.write_flat_copied_after_head::<KIND, W>(w, site, category, name, args, ns) {
            Some(written) => written,
            None => self.write_flat_general::<KIND, W>(w, category, name, args, ns, long),
        }
    }

    /// What [`SequenceState::try_write_flat`] did not write in place,
    /// after the trace point's pre-encoded head (made here if the names
    /// are interned) into the scratch buffer: `Some(false)` if the writer
    /// dropped it (see [`SequenceState::copied`]), `None` (nothing
    /// changed) where the general path must do the work.
    #[inline(never)]
    fn write_flat_copied_after_head<const KIND: u8, W: PacketWriter>(
        &mut self,
        w: &mut W,
        site: usize,
        category: &'static Category,
        name: &'static str,
        args: &crate::encoding::annotation::FlatArgs<'_>,
        ns: u64,
    ) -> Option<bool> {
        let delta = self.flat_delta(category, ns)?;
        if !self.flat_head::<KIND>(site, category, name, args.head) {
            return None;
        }
        match self.write_flat_copied::<KIND, W, _>(w, site, args, delta, ns) {
            Streamed::Written => Some(true),
            Streamed::Dropped => Some(false),
            Streamed::Declined => None,
        }
    }

    /// Whether the trace point `site` (see [`SequenceState::write_flat`])
    /// has a pre-encoded head for events of `KIND`: a recent one, else one
    /// made now if its strings are interned and its head fits.
    fn flat_head<const KIND: u8>(
        &mut self,
        site: usize,
        category: &'static Category,
        name: &'static str,
        head: (&'static str, &'static str),
    ) -> bool {
        let resets = self.resets;
        if self.flat_heads.get_mut(KIND, site, resets).is_some() {
            return true;
        }
        let interned = &self.interned;
        let (Some(cat), Some(name_iid), Some(head_iid)) = (
            interned.categories.lookup(category.name()),
            interned.names.lookup(name),
            interned.arg_names.lookup(head.0),
        ) else {
            return false;
        };
        (self.flat_heads)
            .insert(KIND, site, name_iid, (head.1, head_iid), cat, resets)
            .is_some()
    }

    /// [`SequenceState::write_flat`] through [`EventData`] (`long`: not
    /// tried in place, see [`SequenceState::write_long_event`]).
    #[cold]
    #[inline(never)]
    fn write_flat_general<const KIND: u8, W: PacketWriter>(
        &mut self,
        w: &mut W,
        category: &'static Category,
        name: &'static str,
        args: &crate::encoding::annotation::FlatArgs<'_>,
        ns: u64,
        long: bool,
    ) -> bool {
        // Pushed in place (`collect` would build the array and then move
        // all of its capacity).
        let mut list: heapless::Vec<Arg<'_>, MAX_FLAT_ARGS> = heapless::Vec::new();
        for (n, v) in args.iter() {
            if list.push(Arg::new(n, v)).is_err() {
                break;
            }
        }
        let kind = if KIND == EventType::SliceBegin as u8 {
            EventType::SliceBegin
        } else {
            EventType::Instant
        };
        let mut data = EventData::new(kind, Some(category), Timestamp::boottime(ns));
        data.name = EventName::Static(name);
        data.args = &list;
        if long {
            return self.write_long_event(w, &data);
        }
        self.write_event(w, &data, None)
    }

    /// The in-place encoder of [`SequenceState::write_flat`] (the bytes
    /// of [`SequenceState::try_write_plain_args`] for the same event);
    /// `false` (nothing changed) where another way must do the work (the
    /// scratch buffer's, else the general path).
    #[inline(always)]
    fn try_write_flat<const KIND: u8, W: PacketWriter>(
        &mut self,
        w: &mut W,
        site: usize,
        category: &'static Category,
        name: &'static str,
        args: &crate::encoding::annotation::FlatArgs<'_>,
        ns: u64,
    ) -> bool {
        const BEGIN: u8 = EventType::SliceBegin as u8;
        const INSTANT: u8 = EventType::Instant as u8;
        debug_assert!(KIND == BEGIN || KIND == INSTANT);
        let Some(delta) = self.flat_delta(category, ns) else {
            return false;
        };
        let interned = &self.interned;
        let resets = self.resets;
        if let Some(head) = self.flat_heads.get_mut(KIND, site, resets) {
            // A recent trace point: its head copied, its fields' starts
            // taken by index.
            let written = w.write_in_place(|f| {
                put_packet_head(f, delta);
                let te = f.begin_short();
                head.put(f);
                for (field, value) in args.fields() {
                    let Some(value) = flat_value(&value) else {
                        return false;
                    };
                    let a = match head.field_prefix(field.index) {
                        Some(prefix) => prefix.put(f),
                        None => {
                            let Some(iid) = interned.arg_names.lookup(field.name) else {
                                return false;
                            };
                            match head.keep_field_prefix(field.index, iid) {
                                Some(prefix) => prefix.put(f),
                                None => put_annotation_start(f, iid),
                            }
                        }
                    };
                    put_arg_value(f, value);
                    f.end_short(a);
                }
                f.end_short(te);
                true
            });
            if written {
                self.written_flat::<KIND>(ns);
            }
            return written;
        }
        // The ids of the fields' names, for the trace point's entry.
        let mut names: heapless::Vec<(usize, u64), MAX_FLAT_ARGS> = heapless::Vec::new();
        let mut ids = (0, 0, 0);
        let written = w.write_in_place(|f| {
            // Names whose front-cache slot another string holds are found
            // in the table (a direct-mapped cache can thrash between two).
            let (Some(cat), Some(name_iid), Some(head_iid)) = (
                interned.categories.lookup(category.name()),
                interned.names.lookup(name),
                interned.arg_names.lookup(args.head.0),
            ) else {
                return false;
            };
            ids = (cat, name_iid, head_iid);
            put_packet_head(f, delta);
            let te = f.begin_short();
            put_event_ids(f, KIND, cat, name_iid);
            put_flat_annotation(f, head_iid, encode::ArgValue::Str(args.head.1));
            for (field, value) in args.fields() {
                let (Some(iid), Some(value)) =
                    (interned.arg_names.lookup(field.name), flat_value(&value))
                else {
                    return false;
                };
                let _ = names.push((field.index, iid));
                put_flat_annotation(f, iid, value);
            }
            f.end_short(te);
            true
        });
        if written {
            let (cat, name_iid, head_iid) = ids;
            let head = (args.head.1, head_iid);
            if let Some(entry) = self
                .flat_heads
                .insert(KIND, site, name_iid, head, cat, resets)
            {
                for &(index, iid) in &names {
                    let _ = entry.keep_field_prefix(index, iid);
                }
            }
            self.written_flat::<KIND>(ns);
        }
        written
    }
}
