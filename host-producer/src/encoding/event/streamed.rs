//! Flat events encoded as their fields are handed over
//! ([`SequenceState::write_flat_streamed`]): the `tracing` layer's
//! instants, whose fields a visitor yields one at a time, go straight into
//! the chunk's window without first being collected (and their text
//! copied) into a buffer.
//!
//! # Invariants
//!
//! * The bytes are those of [`SequenceState::write_flat`] for the same
//!   fields, with every length as short as it goes: the packet's start,
//!   the trace point's pre-encoded head ([`flat_heads`]), then each field
//!   as [`put_flat_annotation`](super::fast::put_flat_annotation) writes
//!   it (its start pre-encoded where the head keeps it by the field's
//!   index, a literal's whole annotation where the head keeps that).
//! * In place, the TrackEvent's length is reserved as one byte: the whole
//!   packet is shorter than 128 bytes (else the encoding fails), so its
//!   varint has that one byte, and so has every annotation's.
//! * Where the writer takes no packet in place (the last bytes of a
//!   chunk, no chunk, a loss to mark first) or the packet is too long for
//!   that, it is encoded into the sequence's scratch buffer with the
//!   TrackEvent's length reserved as two bytes, taken back to one where
//!   that is enough (`long_packet`), and copied by the writer, which
//!   splits it across chunks where its general path would. Every value is
//!   handed over whole (a `Debug` value as its text, which the source
//!   formats once per event however often it hands it over: the layer's
//!   `EventVisit`), so an annotation's lengths are known before it is
//!   written, two-byte varints for one of 128 bytes or more.
//!   `write_flat` writes such packets the same way (by this encoder: its
//!   collected fields are [`FlatFields`] too).
//! * A trace point whose last event was too long to be written in place
//!   has its next one encoded into the scratch buffer at once (see
//!   [`flat_heads`]); otherwise a packet that turns out too long for its
//!   window has its fields handed over again, into the scratch buffer.
//! * It declines (returns [`Streamed::Declined`] with nothing written and
//!   the sequence unchanged but for what its head keeps, which stays
//!   valid) whenever `write_flat` would not take a pre-encoded head: no
//!   recent head for the trace point, a field name not interned, a reset
//!   due, a packet longer than the scratch buffer, or the fields' source
//!   asking for it ([`FlatFields::each`] returning `false`). The caller
//!   then collects the fields and calls `write_flat`.

use super::fast::{long_packet, put_annotation_start_sized, put_packet_head, ArgBytes};
use super::flat_heads::{FlatHead, Prefix};
use super::*;

/// A field value as a [`FlatFields`] source hands it over (a `Debug` value
/// as its text).
#[derive(Debug, Clone, Copy)]
pub(crate) enum FieldValue<'a> {
    Int(i64),
    Uint(u64),
    Bool(bool),
    Double(f64),
    Str(&'a str),
}

macro_rules! field_value_from {
    ($($t:ty => $v:ident),*) => {$(
        impl From<$t> for FieldValue<'_> {
            #[inline(always)]
            fn from(v: $t) -> Self {
                FieldValue::$v(v)
            }
        }
    )*};
}
field_value_from!(i64 => Int, u64 => Uint, bool => Bool, f64 => Double);

impl<'a> From<&'a str> for FieldValue<'a> {
    #[inline(always)]
    fn from(s: &'a str) -> Self {
        FieldValue::Str(s)
    }
}

impl<'a> FieldValue<'a> {
    /// Whether the value is written with a word store or two: a number
    /// below 2^28 (a varint of a word), text of at most 16 bytes (see
    /// `put_short_bytes`).
    #[inline(always)]
    fn is_short(self) -> bool {
        match self {
            FieldValue::Int(v) => (v as u64) < 1 << 28,
            FieldValue::Uint(v) => v < 1 << 28,
            FieldValue::Bool(_) | FieldValue::Double(_) => true,
            FieldValue::Str(s) => s.len() <= 16,
        }
    }

    /// The abi's form of the value.
    #[inline(always)]
    fn arg(self) -> encode::ArgValue<'a> {
        use encode::ArgValue as A;
        match self {
            FieldValue::Int(v) => A::Int(v),
            FieldValue::Uint(v) => A::Uint(v),
            FieldValue::Bool(v) => A::Bool(v),
            FieldValue::Double(v) => A::Double(v),
            FieldValue::Str(s) => A::Str(s),
        }
    }
}

/// A field as a [`FlatFields`] source hands it over: which of its trace
/// point's fields it is, and its name (asked for only where needed).
pub(crate) trait FieldKey: Copy {
    /// The field's index among the fields its trace point declares: one
    /// index names one field for every event given the same site (see
    /// [`flat_heads`]).
    fn index(self) -> usize;
    /// The field's name.
    fn name(self) -> &'static str;
}

/// Where a [`FlatFields`] source hands its fields, in order.
pub(crate) trait FlatOut {
    /// A field with a value at hand (a [`FieldValue`], or what makes one:
    /// a typed value the encoder's rare paths take by value).
    fn value<'v>(&mut self, field: impl FieldKey, value: impl Into<FieldValue<'v>> + Copy);
    /// A field whose value is the literal `text`: text the program holds
    /// for good (a `tracing` event's message without arguments), the same
    /// at every event of the trace point, which an encoder may keep
    /// pre-encoded by its address.
    #[inline(always)]
    fn literal(&mut self, field: impl FieldKey, text: &'static str) {
        self.value(field, text);
    }
}

/// Fields of one event, handed over one by one, the same values at every
/// call of [`FlatFields::each`] (a `Debug` value formatted once, at the
/// first, and its text kept for the others).
pub(crate) trait FlatFields {
    /// Hands every field to `out`, in order; `false` if what was handed
    /// over must not be written (the caller then goes the other way).
    fn each<O: FlatOut>(&self, out: &mut O) -> bool;
}

/// The [`FlatOut`] writing fields into a window after a pre-encoded head.
struct InPlace<'a, T: Target> {
    f: &'a mut Cursor<T>,
    /// The trace point's head: its fields' prefixes are kept there.
    head: &'a mut FlatHead,
    arg_names: &'a StrInterner,
    /// No field declined so far.
    ok: bool,
}

/// How a field's annotation starts: pre-encoded, or by its name's id.
#[derive(Clone, Copy)]
enum Start {
    Prefix(Prefix),
    Iid(u64),
}

impl Start {
    /// Writes the start of an annotation whose value (its tag included)
    /// takes `value` bytes, its length complete and as short as it goes
    /// (one byte below 128, else a varint).
    #[inline(always)]
    fn put_sized<T: Target>(self, f: &mut Cursor<T>, value: usize) {
        match self {
            Start::Prefix(prefix) => prefix.put_any_sized(f, value),
            Start::Iid(iid) => put_annotation_start_sized(f, iid, value),
        }
    }
}

impl<T: Target> InPlace<'_, T> {
    /// How `field`'s annotation starts: by the prefix its trace point's
    /// head keeps for it, else by its name's id (its prefix then kept);
    /// `None` (and the encoding declined) if the name is not interned.
    #[inline(always)]
    fn start(&mut self, field: impl FieldKey) -> Option<Start> {
        match self.head.field_prefix(field.index()) {
            Some(prefix) => Some(Start::Prefix(prefix)),
            None => self.start_by_name(field.index(), field.name()),
        }
    }

    /// [`InPlace::start`] for a field without a kept prefix (the first
    /// events of a trace point's head).
    #[cold]
    #[inline(never)]
    fn start_by_name(&mut self, index: usize, name: &'static str) -> Option<Start> {
        // (Fields after one that declined are still written: the packet
        // is not used, and declining is rare.)
        let Some(iid) = self.arg_names.lookup(name) else {
            self.ok = false;
            return None;
        };
        Some(match self.head.keep_field_prefix(index, iid) {
            Some(prefix) => Start::Prefix(prefix),
            None => Start::Iid(iid),
        })
    }
}

impl<T: Target> InPlace<'_, T> {
    /// [`FlatOut::literal`] for a literal not kept: kept if its field has
    /// a kept prefix and the annotation fits the head (not tried again
    /// for the literal last found too long), else written as any text
    /// value.
    #[inline(never)]
    fn literal_out_of_line(&mut self, field: impl FieldKey, text: &'static str) {
        let index = field.index();
        if self.head.is_long_literal(index, text) {
            return self.value_out_of_line(field, text);
        }
        if let Some(prefix) = self.head.field_prefix(index) {
            if let Some(bytes) = self.head.keep_literal(index, prefix, text) {
                return bytes.put(self.f);
            }
        }
        self.value_out_of_line(field, text);
    }

    /// [`FlatOut::value`] for a field without a kept prefix, or a value
    /// that is not [short](FieldValue::is_short) (a text of 128 bytes or
    /// more included: its lengths are varints of two bytes).
    #[inline(never)]
    fn value_out_of_line<'v>(&mut self, field: impl FieldKey, value: impl Into<FieldValue<'v>>) {
        if let Some(start) = self.start(field) {
            let f = &mut *self.f;
            ArgBytes::with::<false, _>(
                value.into().arg(),
                #[inline(always)]
                |value| {
                    start.put_sized(f, value.len());
                    value.put(f);
                },
            );
        }
    }
}

/// A field's annotation after its kept `prefix`, for a
/// [short](FieldValue::is_short) value: the prefix with the annotation's
/// length complete (the value's size), then the value's bytes; the length
/// known before any byte is stored, so that the prefix is stored with it
/// and nothing is back-filled.
#[inline(always)]
fn put_short_annotation<T: Target>(f: &mut Cursor<T>, prefix: Prefix, value: FieldValue<'_>) {
    ArgBytes::with::<true, _>(
        value.arg(),
        #[inline(always)]
        |value| {
            prefix.put_sized(f, value.len());
            value.put(f);
        },
    );
}

impl<T: Target> FlatOut for InPlace<'_, T> {
    // Inlined into each of the visitor's typed methods, where the value's
    // kind is known: no call, no dispatch on the kind. The cursor is a
    // local for the field's bytes (`Cursor::local`).
    //
    // The rest (a field without a kept prefix, a value too long for a
    // word store or two) is a call the method ends with, its arguments in
    // registers (`value_out_of_line`): what stays inline calls nothing, so
    // it needs no callee-saved registers (none saved and restored per
    // field).
    #[inline(always)]
    fn value<'v>(&mut self, field: impl FieldKey, value: impl Into<FieldValue<'v>> + Copy) {
        let prefix = self.head.field_prefix(field.index());
        let Some(prefix) = prefix.filter(|_| value.into().is_short()) else {
            return self.value_out_of_line(field, value);
        };
        let value = value.into();
        self.f.local(
            #[inline(always)]
            |f| put_short_annotation(f, prefix, value),
        );
    }

    // The trace point's head keeps the annotation pre-encoded (the last
    // literal it saw): a literal seen again is copied in word stores.
    #[inline(always)]
    fn literal(&mut self, field: impl FieldKey, text: &'static str) {
        match self.head.literal(field.index(), text) {
            Some(bytes) => bytes.put(self.f),
            None => self.literal_out_of_line(field, text),
        }
    }
}

/// What [`SequenceState::write_flat_streamed`] made of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Streamed {
    /// Written.
    Written,
    /// Encoded, but the writer dropped it (no chunk to give); the sequence
    /// is reset as after any lost event. The caller counts it.
    Dropped,
    /// Nothing written, the sequence unchanged: the caller writes the
    /// event with [`SequenceState::write_flat`].
    Declined,
}

/// The packet of a streamed event: its start, the trace point's head
/// `entry`, then `fields`; `false` if a field declined. The TrackEvent's
/// length takes one byte if `LONG` is `false` (a TrackEvent of 128 bytes or
/// more fails the encoding), else two (a redundant varint, see
/// [`long_packet`]). Returns where the TrackEvent's body starts.
#[inline(always)]
fn encode_streamed<T: Target, F: FlatFields, const LONG: bool>(
    f: &mut Cursor<T>,
    delta: u64,
    entry: &mut FlatHead,
    arg_names: &StrInterner,
    fields: &F,
) -> (usize, bool) {
    put_packet_head(f, delta);
    let te = if LONG {
        f.begin_nested()
    } else {
        f.begin_short()
    };
    entry.put(f);
    let mut out = InPlace {
        f,
        head: entry,
        arg_names,
        ok: true,
    };
    let complete = fields.each(&mut out);
    let ok = out.ok && complete;
    if LONG {
        f.end_nested(te);
    } else {
        f.end_short(te);
    }
    (te, ok)
}

/// Packets (and TrackEvents) of more bytes than this are not written in
/// place (their size takes more than the one byte a packet written in
/// place has).
pub(super) const MAX_IN_PLACE: usize = shmtrace_abi::proto::wire::MAX_ONE_BYTE_LEN as usize;

impl SequenceState {
    /// Writes an instant or a slice begin (`KIND`, an [`EventType`] as
    /// `u8`) of the trace point `site` (in `category`: see
    /// [`SequenceState::write_flat`]), stamped `ns` (BOOTTIME), with its
    /// name and head annotation as its pre-encoded head has them (else it
    /// declines) and then `fields`, encoded into the chunk as
    /// `fields` hands them over (see the module docs). Where the writer
    /// takes no packet in place (the last bytes of a chunk, no chunk, a
    /// loss to mark first) or the packet is too long for that, the packet
    /// is encoded into the scratch buffer and handed to the writer to
    /// copy, split across chunks where its general path splits packets
    /// (at once for a trace point whose last event was too long, its
    /// fields visited once; else they are visited again).
    #[inline(always)]
    pub(crate) fn write_flat_streamed<const KIND: u8, W: PacketWriter, F: FlatFields>(
        &mut self,
        w: &mut W,
        site: usize,
        category: &'static Category,
        fields: &F,
        ns: u64,
    ) -> Streamed {
        const BEGIN: u8 = EventType::SliceBegin as u8;
        const INSTANT: u8 = EventType::Instant as u8;
        debug_assert!(KIND == BEGIN || KIND == INSTANT);
        let Some(delta) = self.flat_delta(category, ns) else {
            return Streamed::Declined;
        };
        // No recent head for the trace point (then declined there), or
        // its last event was too long to be written in place.
        let Some(entry) = self.flat_heads.get_short_mut(KIND, site, self.resets) else {
            return self.write_flat_copied::<KIND, W, F>(w, site, fields, delta, ns);
        };
        let arg_names = &self.interned.arg_names;
        let written = w.write_in_place(|f| {
            encode_streamed::<_, _, false>(f, delta, entry, arg_names, fields).1
        });
        if !written {
            // No packet in place, the packet too long for one, or a field
            // declined (then declined again there: rare).
            return self.write_flat_copied::<KIND, W, F>(w, site, fields, delta, ns);
        }
        self.written_flat::<KIND>(ns);
        Streamed::Written
    }

    /// [`SequenceState::write_flat_streamed`] through the scratch buffer:
    /// the packet encoded there with a two-byte TrackEvent length, made as
    /// short as it goes ([`long_packet`]: the bytes written in place for a
    /// packet short enough), and handed to the writer to copy. Notes in
    /// the trace point's head whether the packet was too long to be
    /// written in place. Out of line: the hot path keeps its registers.
    #[cold]
    #[inline(never)]
    pub(super) fn write_flat_copied<const KIND: u8, W: PacketWriter, F: FlatFields>(
        &mut self,
        w: &mut W,
        site: usize,
        fields: &F,
        delta: u64,
        ns: u64,
    ) -> Streamed {
        let Some(entry) = self.flat_heads.get_mut(KIND, site, self.resets) else {
            return Streamed::Declined;
        };
        let scratch = &mut *self.scratch;
        let mut c = Cursor::new(&mut *scratch);
        let (te, ok) =
            encode_streamed::<_, _, true>(&mut c, delta, entry, &self.interned.arg_names, fields);
        let Some(len) = c.finish().filter(|_| ok) else {
            return Streamed::Declined;
        };
        let start = long_packet(scratch, te, len);
        entry.set_long(len - start > MAX_IN_PLACE);
        let written = w.write_encoded_packet_in(&scratch[start..], len - start);
        match self.copied::<KIND>(written, ns) {
            true => Streamed::Written,
            false => Streamed::Dropped,
        }
    }
}
