//! Field values of `tracing` events and spans as debug annotations.
//!
//! [`Visitor`] hands the fields `tracing` visits to a [`FlatOut`]: the
//! encoder writing them into the chunk ([`EventVisit`]), or [`Collect`].
//! An event's fields are collected without allocating: primitive values in
//! place, text (`&str` values, `Debug` values formatted) appended to a
//! per-thread buffer that is lent to the event and given back, so it grows
//! to the longest event a thread writes and then stays. A span keeps the
//! fields it was made with ([`GivenFields`], the same flat values with a
//! text buffer of its own) until it closes, for its first slice; values
//! recorded later ([`SpanFields`]) are kept apart, written as recorded on a
//! slice end or a later begin.

use std::cell::Cell;
use std::fmt::{self, Write as _};

use tracing_core::field::{Field, Visit};

use super::message::{literal_if_learnt, Literal};
use crate::encoding::annotation::{FieldId, FlatArgs, FlatValue as Flat};
use crate::encoding::event::{FieldKey, FieldValue, FlatFields, FlatOut};
use crate::{Arg, DebugValue};

/// Fields one `tracing` callsite declares at most.
pub(super) const MAX_FIELDS: usize = 32;
/// Annotations of one event or slice at most: every field and the level.
pub(super) const MAX_ARGS: usize = MAX_FIELDS + 1;

/// Annotations being built for one event.
pub(super) type Args<'a> = heapless::Vec<Arg<'a>, MAX_ARGS>;

/// A text buffer kept by a thread beyond this capacity is freed instead.
const TEXT_KEEP: usize = 64 * 1024;

thread_local! {
    /// The thread's text buffer, while no event has it.
    static TEXT: Cell<String> = const { Cell::new(String::new()) };
}

/// Where a [`Collect`] visitor puts flat values and their text.
pub(super) trait FlatSink {
    /// Appends a value (a callsite has at most [`MAX_FIELDS`] fields, each
    /// visited once: a sink may drop values past that many).
    fn push(&mut self, field: FieldId, value: Flat);
    /// The buffer holding the text of the values (`Flat::Text` ranges).
    fn text(&mut self) -> &mut String;
}

/// The visitor handing a callsite's fields to a [`FlatOut`]: to
/// [`Collect`], or straight to the encoder (see [`EventVisit`]).
pub(super) struct Visitor<'a, O>(pub(super) &'a mut O);

impl<O: FlatOut> Visit for Visitor<'_, O> {
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.value(field, value);
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.value(field, value);
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.value(field, value);
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.value(field, value);
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.value(field, value);
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        match literal_if_learnt(value) {
            // A message without arguments: its text, unformatted.
            Literal::Text(text) => self.0.literal(field, text),
            Literal::Not => self.0.debug(field, value),
            Literal::Unknown => self.record_debug_first(field, value),
        }
    }
}

impl<O: FlatOut> Visitor<'_, O> {
    /// [`Visit::record_debug`] before the first message's vtable is
    /// learnt (out of line: what `record_debug` keeps inline calls
    /// nothing but calls it ends with).
    #[cold]
    #[inline(never)]
    fn record_debug_first(&mut self, field: &Field, value: &dyn fmt::Debug) {
        super::message::learn_once(field);
        self.record_debug(field, value);
    }
}

/// A `tracing` field: its index in its callsite's field set, which the
/// callsite's `Metadata` (the layer's site) fixes, as it fixes the name.
impl FieldKey for &Field {
    #[inline(always)]
    fn index(self) -> usize {
        Field::index(self)
    }
    #[inline(always)]
    fn name(self) -> &'static str {
        Field::name(self)
    }
}

/// Collects fields into a [`FlatSink`].
pub(super) struct Collect<'a, T>(pub(super) &'a mut T);

impl<T: FlatSink> Collect<'_, T> {
    /// Appends the text `write` writes as a text value.
    #[inline]
    fn text(&mut self, field: FieldId, write: impl FnOnce(&mut String)) {
        let text = self.0.text();
        let start = text.len();
        write(text);
        let end = text.len();
        self.0.push(field, Flat::Text(start, end));
    }
}

impl<T: FlatSink> FlatOut for Collect<'_, T> {
    #[inline]
    fn value<'v>(&mut self, field: impl FieldKey, value: impl Into<FieldValue<'v>> + Copy) {
        let field = FieldId::of(field);
        let flat = match value.into() {
            FieldValue::Int(v) => Flat::Int(v),
            FieldValue::Uint(v) => Flat::Uint(v),
            FieldValue::Bool(v) => Flat::Bool(v),
            FieldValue::Double(v) => Flat::Double(v),
            FieldValue::Str(s) => return self.text(field, |text| text.push_str(s)),
        };
        self.0.push(field, flat);
    }

    #[inline]
    fn debug(&mut self, field: impl FieldKey, value: &dyn fmt::Debug) {
        // A `Debug` impl that fails leaves what it wrote.
        let field = FieldId::of(field);
        self.text(field, |text| {
            let _ = write!(text, "{value:?}");
        });
    }
}

thread_local! {
    /// Whether the thread is writing an event's fields straight into a
    /// chunk (with the writer taken), and whether an event came in
    /// meanwhile (from a `Debug` impl).
    static STREAMING: Cell<Streaming> = const { Cell::new(Streaming::Idle) };
}

/// See [`STREAMING`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Streaming {
    Idle,
    Busy,
    Reentered,
}

/// An event's fields handed to the encoder as `tracing` visits them.
///
/// A `Debug` value's impl may itself emit an event while the encoder holds
/// the thread's writer, which would then drop it. So the inner event is
/// not written ([`EventVisit::reentered`] tells the layer it came in), the
/// outer one declines ([`FlatFields::each`] returns `false`), and the
/// layer writes it the collecting way, visiting the fields again outside
/// the writer: the inner event is emitted (and written) then.
pub(super) struct EventVisit<'a>(pub(super) &'a tracing_core::Event<'a>);

impl EventVisit<'_> {
    /// Whether this event comes from inside another's fields being
    /// streamed; if so, marks that one to decline.
    #[inline]
    pub(super) fn reentered() -> bool {
        STREAMING
            .try_with(|s| {
                let busy = s.get() != Streaming::Idle;
                if busy {
                    s.set(Streaming::Reentered);
                }
                busy
            })
            .unwrap_or(false)
    }
}

impl FlatFields for EventVisit<'_> {
    #[inline]
    fn each<O: FlatOut>(&self, out: &mut O) -> bool {
        if STREAMING.try_with(|s| s.set(Streaming::Busy)).is_err() {
            return false;
        }
        // A field's `Debug` may panic, and a runtime may catch it: the
        // thread must not stay marked busy (every later event would be
        // taken for a re-entered one).
        let idle_on_unwind = IdleOnUnwind;
        self.0.record(&mut Visitor(out));
        core::mem::forget(idle_on_unwind);
        STREAMING.with(|s| s.replace(Streaming::Idle)) == Streaming::Busy
    }
}

/// Marks the thread [`Streaming::Idle`] when dropped: while an event's
/// fields are streamed, it is dropped only if they panic.
struct IdleOnUnwind;

impl Drop for IdleOnUnwind {
    fn drop(&mut self) {
        let _ = STREAMING.try_with(|s| s.set(Streaming::Idle));
    }
}

/// The fields of one event.
pub(super) struct EventFields {
    values: heapless::Vec<(FieldId, Flat), MAX_FIELDS>,
    /// The thread's text buffer, once a field needed it.
    text: Option<String>,
}

impl EventFields {
    /// No fields yet.
    #[inline]
    pub(super) fn new() -> Self {
        EventFields {
            values: heapless::Vec::new(),
            text: None,
        }
    }

    /// The annotations: `head`, then the fields.
    #[inline]
    pub(super) fn args(&self, head: (&'static str, &'static str)) -> FlatArgs<'_> {
        FlatArgs {
            head,
            values: &self.values,
            text: self.text.as_deref().unwrap_or(""),
        }
    }
}

impl FlatSink for EventFields {
    #[inline]
    fn push(&mut self, field: FieldId, value: Flat) {
        let _ = self.values.push((field, value));
    }

    #[inline]
    fn text(&mut self) -> &mut String {
        // Re-entered (a `Debug` impl that emits an event): the inner event
        // finds the cell empty and takes a fresh buffer.
        self.text
            .get_or_insert_with(|| TEXT.try_with(Cell::take).unwrap_or_default())
    }
}

impl Drop for EventFields {
    fn drop(&mut self) {
        if let Some(mut text) = self.text.take() {
            if text.capacity() <= TEXT_KEEP {
                text.clear();
                let _ = TEXT.try_with(|cell| cell.set(text));
            }
        }
    }
}

/// The fields a span was made with, kept until it closes: its buffers stay
/// with the slot for its next span (text up to [`TEXT_KEEP`] bytes), so
/// after warm-up keeping them allocates nothing.
#[derive(Default)]
pub(super) struct GivenFields {
    values: Vec<(FieldId, Flat)>,
    text: String,
}

impl GivenFields {
    /// No fields, for a new span.
    #[inline]
    pub(super) fn clear(&mut self) {
        self.values.clear();
        if self.text.capacity() > TEXT_KEEP {
            self.text = String::new();
        }
        self.text.clear();
    }

    /// Whether the span was made with no field.
    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The annotations: `head`, then the fields.
    #[inline]
    pub(super) fn args(&self, head: (&'static str, &'static str)) -> FlatArgs<'_> {
        FlatArgs {
            head,
            values: &self.values,
            text: &self.text,
        }
    }

    /// Appends the annotations of the fields that `recorded` has no value
    /// for (a value recorded since replaces the given one) to `out`.
    pub(super) fn push_args<'a>(&'a self, recorded: Option<&SpanFields>, out: &mut Args<'a>) {
        for (field, value) in self.args(("", "")).fields() {
            if !recorded.is_some_and(|r| r.has(field.name)) {
                let _ = out.push(Arg::new(field.name, value));
            }
        }
    }
}

impl FlatSink for GivenFields {
    #[inline]
    fn push(&mut self, field: FieldId, value: Flat) {
        if self.values.len() < MAX_FIELDS {
            self.values.push((field, value));
        }
    }

    #[inline]
    fn text(&mut self) -> &mut String {
        &mut self.text
    }
}

/// A value kept by a span.
enum Owned {
    Int(i64),
    Uint(u64),
    Bool(bool),
    Double(f64),
    Text(String),
}

/// The fields of a span: those given when it was made, then as recorded.
#[derive(Default)]
pub(super) struct SpanFields {
    values: Vec<(&'static str, Owned)>,
    /// Bit `i`: value `i` changed since the span's last slice event wrote
    /// its fields.
    dirty: u64,
    /// Emptied text buffers of a span that used this before (see
    /// [`SpanFields::clear`]).
    spare: Vec<String>,
}

impl SpanFields {
    /// No fields, for a new span; the buffers stay for its text values
    /// (each at most [`TEXT_KEEP`] bytes, as many as a span has fields).
    pub(super) fn clear(&mut self) {
        self.dirty = 0;
        for (_, value) in self.values.drain(..) {
            if let Owned::Text(mut s) = value {
                if s.capacity() <= TEXT_KEEP && self.spare.len() < MAX_FIELDS {
                    s.clear();
                    self.spare.push(s);
                }
            }
        }
    }

    /// Whether a value of the field `name` was recorded.
    pub(super) fn has(&self, name: &'static str) -> bool {
        self.values.iter().any(|(n, _)| same_field(n, name))
    }

    /// Whether a value changed since [`SpanFields::take_dirty`].
    pub(super) fn is_dirty(&self) -> bool {
        self.dirty != 0
    }

    /// Appends the annotations of the values changed since the last call
    /// (all of them if `all`) to `out`, and marks every value written.
    pub(super) fn take_dirty<'a>(&'a mut self, all: bool, out: &mut Args<'a>) {
        let dirty = std::mem::take(&mut self.dirty);
        for (i, (name, value)) in self.values.iter().enumerate() {
            if all || dirty & (1 << i) != 0 {
                let _ = out.push(Arg::new(name, owned_value(value)));
            }
        }
    }

    fn set(&mut self, field: &Field, value: Owned) {
        let name = field.name();
        let i = match self.values.iter().position(|(n, _)| same_field(n, name)) {
            Some(i) => {
                self.values[i].1 = value;
                i
            }
            None => {
                if self.values.len() >= MAX_FIELDS {
                    return;
                }
                self.values.push((name, value));
                self.values.len() - 1
            }
        };
        self.dirty |= 1 << i;
    }

    /// The text value of `field`, emptied for reuse (a recorded string
    /// overwrites the previous one in place).
    fn text(&mut self, field: &Field) -> String {
        match self
            .values
            .iter_mut()
            .find(|(n, _)| same_field(n, field.name()))
        {
            Some((_, Owned::Text(s))) => {
                let mut s = std::mem::take(s);
                s.clear();
                s
            }
            _ => self.spare.pop().unwrap_or_default(),
        }
    }
}

/// Whether two field names of one span's callsite name the same field:
/// `tracing` hands out each field's name as the same `&'static str` (its
/// callsite's field set holds it), so its address and length tell, without
/// comparing the text.
#[inline]
fn same_field(a: &'static str, b: &'static str) -> bool {
    std::ptr::eq(a, b)
}

fn owned_value(value: &Owned) -> DebugValue<'_> {
    match value {
        Owned::Int(v) => DebugValue::Int(*v),
        Owned::Uint(v) => DebugValue::Uint(*v),
        Owned::Bool(v) => DebugValue::Bool(*v),
        Owned::Double(v) => DebugValue::Double(*v),
        Owned::Text(s) => DebugValue::Str(s),
    }
}

impl Visit for SpanFields {
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.set(field, Owned::Int(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.set(field, Owned::Uint(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.set(field, Owned::Bool(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.set(field, Owned::Double(value));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        let mut s = self.text(field);
        s.push_str(value);
        self.set(field, Owned::Text(s));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let mut s = self.text(field);
        let _ = write!(s, "{value:?}");
        self.set(field, Owned::Text(s));
    }
}
