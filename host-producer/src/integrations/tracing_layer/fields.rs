//! Field values of `tracing` events and spans as debug annotations.
//!
//! [`Visitor`] hands the fields `tracing` visits to a [`FieldOut`]: the
//! encoder writing them into the chunk ([`EventVisit`]), or [`Collect`].
//! An event's fields are collected without allocating: primitive values in
//! place, text (`&str` values, `Debug` values formatted) appended to a
//! per-thread buffer that is lent to the event and given back, so it grows
//! to the longest event a thread writes and then stays. A span keeps the
//! fields it was made with ([`GivenFields`], the same flat values with a
//! text buffer of its own) until it closes, for its first slice; values
//! recorded later ([`SpanFields`]) are kept apart, written as recorded on a
//! slice end or a later begin.
//!
//! # Invariants
//!
//! * A field's `Debug` impl runs once per event, span or `record` call,
//!   however many times its fields are visited (once per session instance
//!   streamed into, again for a packet that did not fit in place, again
//!   for the instances that declined): the first visit of an event keeps
//!   each `Debug` value's text by its field's index ([`Texts`]) and every
//!   visit hands that text over ([`EventVisit`]); a span's fields are
//!   formatted once when given or recorded and kept as text. So a `Debug`
//!   impl whose output changes from call to call (a counter, a clock,
//!   interior mutability) shows its first call's output wherever the
//!   event is written, and no packet mixes two calls' lengths.
//! * The thread's [`TEXTS`] hold the `Debug` texts of the event whose
//!   fields the thread streams ([`STREAMING`] has [`FORMATTED`] once they
//!   do), from its first `Debug` value, which drops what an earlier event
//!   left there, until the next event; no user code runs between an
//!   event's first visit and its last (each of its `Debug` values was
//!   formatted by the first).
//! * An event emitted from a field's `Debug` while the thread's writer is
//!   taken (the outer event's fields being streamed into the chunk) is
//!   collected then (its own fields formatted once) and written right
//!   after the outer event ([`defer`], [`write_deferred`]).

use std::cell::{Cell, RefCell};
use std::fmt::{self, Write as _};

use tracing_core::field::{Field, Visit};
use tracing_core::Metadata;

use super::message::{literal_if_learnt, Literal};
use crate::encoding::annotation::{FieldId, FlatArgs, FlatValue as Flat};
use crate::encoding::event::{FieldKey, FieldValue, FlatFields, FlatOut};
use crate::{Arg, Category, DebugValue, EventType};

/// Fields one `tracing` callsite declares at most.
pub(super) const MAX_FIELDS: usize = 32;
/// Annotations of one event or slice at most: every field and the level.
pub(super) const MAX_ARGS: usize = MAX_FIELDS + 1;

/// Annotations being built for one event.
pub(super) type Args<'a> = heapless::Vec<Arg<'a>, MAX_ARGS>;

/// A text buffer kept by a thread beyond this capacity is freed instead.
const TEXT_KEEP: usize = 64 * 1024;

thread_local! {
    /// The thread's text buffers, while no event has them, empty but
    /// while an event's fields are streamed: then the texts of its `Debug`
    /// values (see [`EventVisit`]).
    static TEXTS: RefCell<Texts> = const { RefCell::new(Texts::new()) };
}

/// The texts of one event's values (`&str` values, `Debug` values
/// formatted), and which are its `Debug` values', in buffers the thread
/// lends to one event at a time ([`Texts::lend`], [`Texts::give_back`]).
#[derive(Default)]
struct Texts {
    text: String,
    /// Each `Debug` value's field index and its text's range in `text`,
    /// in the order they were formatted.
    debug: Vec<(usize, usize, usize)>,
}

impl Texts {
    const fn new() -> Self {
        Texts {
            text: String::new(),
            debug: Vec::new(),
        }
    }

    /// The thread's buffers; new ones while an event has them (a `Debug`
    /// impl that emits an event: the inner event finds them empty).
    #[inline]
    fn lend() -> Self {
        with_texts(std::mem::take).unwrap_or_default()
    }

    /// Gives the buffers back to the thread, emptied.
    fn give_back(mut self) {
        self.clear();
        let _ = with_texts(|t| *t = self);
    }

    /// Empties the buffers (freed instead if they grew past
    /// [`TEXT_KEEP`] bytes).
    #[inline]
    fn clear(&mut self) {
        if self.text.capacity() > TEXT_KEEP {
            return self.free();
        }
        self.text.clear();
        self.debug.clear();
    }

    /// [`Texts::clear`] for buffers grown too long to keep.
    #[cold]
    fn free(&mut self) {
        *self = Texts::new();
    }

    /// The range of the text `value` formats as the value of the field
    /// `index`: as formatted before for this event, else formatted now
    /// (and kept).
    #[inline]
    fn debug_text(&mut self, index: usize, value: &dyn fmt::Debug) -> (usize, usize) {
        if let Some(&(_, start, end)) = self.debug.iter().find(|(i, _, _)| *i == index) {
            return (start, end);
        }
        let range = format_into(&mut self.text, value);
        self.debug.push((index, range.0, range.1));
        range
    }
}

/// Where a [`Collect`] visitor puts flat values and their text.
pub(super) trait FlatSink {
    /// Appends a value (a callsite has at most [`MAX_FIELDS`] fields, each
    /// visited once: a sink may drop values past that many).
    fn push(&mut self, field: FieldId, value: Flat);
    /// The buffer holding the text of the values (`Flat::Text` ranges).
    fn text(&mut self) -> &mut String;
    /// The range of [`FlatSink::text`] holding the text `value` formats
    /// as the value of the field `index`, formatted into it now (a sink
    /// that keeps an event's `Debug` texts: unless it was before).
    #[inline]
    fn debug_text(&mut self, _index: usize, value: &dyn fmt::Debug) -> (usize, usize) {
        format_into(self.text(), value)
    }
}

/// Runs `f` on the thread's text buffers; `None` while they are taken or
/// gone (thread exit).
#[inline]
fn with_texts<R>(f: impl FnOnce(&mut Texts) -> R) -> Option<R> {
    TEXTS
        .try_with(|t| t.try_borrow_mut().ok().map(|mut t| f(&mut t)))
        .ok()
        .flatten()
}

/// Appends the text `value` formats to `text`; returns where it lies. A
/// `Debug` impl that fails leaves what it wrote.
#[inline]
fn format_into(text: &mut String, value: &dyn fmt::Debug) -> (usize, usize) {
    let start = text.len();
    let _ = write!(text, "{value:?}");
    (start, text.len())
}

/// Where a [`Visitor`] hands fields: a [`FlatOut`] that also takes
/// `Debug` values.
pub(super) trait FieldOut: FlatOut {
    /// A field whose value is the text `value` formats (`{:?}`): formatted
    /// once per event (see the module docs).
    fn debug(&mut self, field: &Field, value: &dyn fmt::Debug);
}

/// The visitor handing a callsite's fields to a [`FieldOut`]: to
/// [`Collect`], or to the encoder (see [`EventVisit`]).
pub(super) struct Visitor<O>(pub(super) O);

impl<O: FieldOut> Visit for Visitor<O> {
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

impl<O: FieldOut> Visitor<O> {
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

impl<T: FlatSink> FlatOut for Collect<'_, T> {
    #[inline]
    fn value<'v>(&mut self, field: impl FieldKey, value: impl Into<FieldValue<'v>> + Copy) {
        let field = FieldId::of(field);
        let flat = match value.into() {
            FieldValue::Int(v) => Flat::Int(v),
            FieldValue::Uint(v) => Flat::Uint(v),
            FieldValue::Bool(v) => Flat::Bool(v),
            FieldValue::Double(v) => Flat::Double(v),
            FieldValue::Str(s) => {
                let text = self.0.text();
                let start = text.len();
                text.push_str(s);
                Flat::Text(start, text.len())
            }
        };
        self.0.push(field, flat);
    }
}

impl<T: FlatSink> FieldOut for Collect<'_, T> {
    #[inline]
    fn debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let (start, end) = self.0.debug_text(field.index(), value);
        self.0.push(FieldId::of(field), Flat::Text(start, end));
    }
}

/// The [`FieldOut`] of an event's fields streamed into an encoder: a
/// `Debug` value handed over as its text, formatted on the event's first
/// visit and kept in the thread's text buffers until the event is written
/// ([`EventVisit`]).
struct Stream<'a, O>(&'a mut O);

impl<O: FlatOut> FlatOut for Stream<'_, O> {
    #[inline(always)]
    fn value<'v>(&mut self, field: impl FieldKey, value: impl Into<FieldValue<'v>> + Copy) {
        self.0.value(field, value);
    }

    #[inline(always)]
    fn literal(&mut self, field: impl FieldKey, text: &'static str) {
        self.0.literal(field, text);
    }
}

impl<O: FlatOut> FieldOut for Stream<'_, O> {
    // Out of line: what `record_debug` keeps inline (a literal message)
    // calls nothing but calls it ends with.
    #[inline(never)]
    fn debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // The event's first text: what the buffers hold is another's.
        let first = STREAMING
            .try_with(|s| {
                let state = s.get();
                s.set(state | FORMATTED);
                state & FORMATTED == 0
            })
            .unwrap_or(true);
        let out = &mut *self.0;
        let kept = with_texts(|t| {
            if first {
                t.clear();
            }
            let (start, end) = t.debug_text(field.index(), value);
            out.value(field, t.text.get(start..end).unwrap_or(""));
        });
        if kept.is_none() {
            // The buffers taken or gone (thread exit): formatted again at
            // each visit.
            let mut text = String::new();
            format_into(&mut text, value);
            out.value(field, text.as_str());
        }
    }
}

thread_local! {
    /// What the thread is doing with the event whose fields it streams
    /// into chunks: [`BUSY`] while it streams them (with the writer
    /// taken), [`REENTERED`] once an event came in meanwhile (from a
    /// `Debug` impl), [`FORMATTED`] once it formatted a `Debug` value
    /// (whose text is kept in [`TEXTS`]). The next event starts it over
    /// ([`EventVisit::reentered`]).
    static STREAMING: Cell<u8> = const { Cell::new(0) };
    /// Events that came in while the thread's writer was taken, in the
    /// order they came (see [`defer`]).
    static DEFERRED: RefCell<Vec<Deferred>> = const { RefCell::new(Vec::new()) };
}

/// See [`STREAMING`].
const BUSY: u8 = 1;
/// See [`STREAMING`].
const REENTERED: u8 = 2;
/// See [`STREAMING`].
const FORMATTED: u8 = 4;

/// An event's fields handed to the encoder as `tracing` visits them.
///
/// A `Debug` value is formatted on the event's first visit, its text kept
/// by its field's index in the thread's text buffers ([`TEXTS`]; what
/// another event left there is dropped first): every visit (one per
/// session instance, another for a packet that did not fit in place)
/// hands that text over, and [`EventVisit::collect`] collects it for the
/// instances that declined. So once a visit ran, no `Debug` impl runs
/// again for the event.
///
/// A `Debug` value's impl may itself emit an event while the encoder holds
/// the thread's writer, which would then drop it. So the inner event is
/// not written then: it is collected ([`defer`]), and the outer one
/// declines ([`FlatFields::each`] returns `false`), to be written the
/// collecting way (its texts as they were formatted), then the inner one
/// ([`write_deferred`]).
pub(super) struct EventVisit<'a>(pub(super) &'a tracing_core::Event<'a>);

impl EventVisit<'_> {
    /// Whether this event comes from inside another's fields being
    /// streamed; if so, marks that one as having deferred events. Else
    /// starts the thread's [`STREAMING`] state over for this event.
    #[inline]
    pub(super) fn reentered() -> bool {
        STREAMING
            .try_with(|s| {
                let state = s.get();
                if state == 0 {
                    return false;
                }
                let busy = state & BUSY != 0;
                s.set(if busy { state | REENTERED } else { 0 });
                busy
            })
            .unwrap_or(false)
    }

    /// The event's fields, collected (each `Debug` value's text as a visit
    /// formatted it).
    pub(super) fn collect(&self) -> EventFields {
        let formatted = STREAMING
            .try_with(|s| s.replace(s.get() & !FORMATTED) & FORMATTED != 0)
            .unwrap_or(false);
        let mut fields = EventFields {
            values: heapless::Vec::new(),
            texts: formatted.then(Texts::lend),
        };
        self.0.record(&mut Visitor(Collect(&mut fields)));
        fields
    }
}

impl FlatFields for EventVisit<'_> {
    #[inline]
    fn each<O: FlatOut>(&self, out: &mut O) -> bool {
        if STREAMING.try_with(|s| s.set(s.get() | BUSY)).is_err() {
            return false;
        }
        // A field's `Debug` may panic, and a runtime may catch it: the
        // thread must not stay marked busy (every later event would be
        // taken for a re-entered one).
        let idle_on_unwind = IdleOnUnwind;
        self.0.record(&mut Visitor(Stream(out)));
        core::mem::forget(idle_on_unwind);
        let state = STREAMING.with(|s| {
            let state = s.get();
            s.set(state & !BUSY);
            state
        });
        state & REENTERED == 0
    }
}

/// Marks the thread idle when dropped: while an event's fields are
/// streamed, it is dropped only if they panic. The events deferred by
/// then are dropped too: the panic costs the event whose field panicked
/// and what its fields emitted.
struct IdleOnUnwind;

impl Drop for IdleOnUnwind {
    fn drop(&mut self) {
        let _ = STREAMING.try_with(|s| s.set(0));
        let _ = DEFERRED.try_with(|d| d.try_borrow_mut().map(|mut d| d.clear()));
    }
}

/// An event that came in while the thread's writer was taken, collected.
struct Deferred {
    category: &'static Category,
    meta: &'static Metadata<'static>,
    ns: u64,
    fields: GivenFields,
}

/// Collects `event` (of `meta`, in `category`), which came in while the
/// thread's writer was taken ([`EventVisit::reentered`]), stamped now,
/// for [`write_deferred`]: rare, so it allocates.
#[cold]
#[inline(never)]
pub(super) fn defer(
    event: &tracing_core::Event<'_>,
    meta: &'static Metadata<'static>,
    category: &'static Category,
) {
    let ns = crate::clock::now_ns();
    // Its own fields may emit events too, deferred while they are
    // collected: this one, which came first, goes before them.
    let Ok(at) = DEFERRED.try_with(|d| d.borrow().len()) else {
        return;
    };
    let mut fields = GivenFields::default();
    event.record(&mut Visitor(Collect(&mut fields)));
    let _ = DEFERRED.try_with(|d| {
        let mut d = d.borrow_mut();
        let at = at.min(d.len());
        d.insert(
            at,
            Deferred {
                category,
                meta,
                ns,
                fields,
            },
        );
    });
}

/// Writes the events [`defer`] collected, in the order they came.
#[cold]
#[inline(never)]
pub(super) fn write_deferred() {
    const INSTANT: u8 = EventType::Instant as u8;
    let Ok(events) = DEFERRED.try_with(|d| std::mem::take(&mut *d.borrow_mut())) else {
        return;
    };
    for e in events {
        let head = ("level", e.meta.level().as_str());
        let mask = e.category.enabled_instances();
        crate::track_event::__flat_event_in::<INSTANT>(
            e.category,
            mask,
            super::site(e.meta),
            e.meta.name(),
            &e.fields.args(head),
            e.ns,
        );
    }
}

/// The fields of one event, collected.
pub(super) struct EventFields {
    values: heapless::Vec<(FieldId, Flat), MAX_FIELDS>,
    /// The thread's text buffers, once a field needed them.
    texts: Option<Texts>,
}

impl EventFields {
    /// The annotations: `head`, then the fields.
    #[inline]
    pub(super) fn args(&self, head: (&'static str, &'static str)) -> FlatArgs<'_> {
        FlatArgs {
            head,
            values: &self.values,
            text: self.texts.as_ref().map_or("", |t| &t.text),
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
        &mut self.texts.get_or_insert_with(Texts::lend).text
    }

    /// The field's text as formatted at the event's first visit, else
    /// formatted now (and kept).
    #[inline]
    fn debug_text(&mut self, index: usize, value: &dyn fmt::Debug) -> (usize, usize) {
        self.texts
            .get_or_insert_with(Texts::lend)
            .debug_text(index, value)
    }
}

impl Drop for EventFields {
    fn drop(&mut self) {
        if let Some(texts) = self.texts.take() {
            texts.give_back();
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
