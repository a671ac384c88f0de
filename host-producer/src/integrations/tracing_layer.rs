//! [`TracingLayer`]: spans and events of the [`tracing`] crate as track
//! events, in every session that enables their target.
//!
//! ```no_run
//! use tracing_subscriber::layer::SubscriberExt as _;
//! use tracing_subscriber::util::SubscriberInitExt as _;
//!
//! shmtrace_producer::init(shmtrace_producer::ProducerConfig::default()).unwrap();
//! tracing_subscriber::registry()
//!     .with(shmtrace_producer::TracingLayer::new())
//!     .init();
//! let _span = tracing::info_span!("frame", number = 1).entered();
//! tracing::info!(fps = 59.9, "drawn");
//! ```
//!
//! [`tracing`]: https://docs.rs/tracing
//!
//! # Mapping
//!
//! * **Target → category.** A callsite's target (by default its module
//!   path, e.g. `my_app::net`) is a [`DynamicCategory`](crate::DynamicCategory)
//!   of that name, so `TrackEventConfig`'s `enabled_categories`,
//!   `disabled_categories` (wildcards included) and tags select targets; a
//!   target named `disabled-by-default-…` is tagged `slow`, off unless a
//!   session asks for it. Name categories statically with
//!   [`register_categories`](crate::track_event::register_categories) to
//!   give them a description or tags, and the target picks that category.
//! * **Level → annotation.** Every event and slice begin carries a string
//!   annotation `level` (`"TRACE"` … `"ERROR"`); only the `follows_from`
//!   instants below do not.
//! * **Event → instant** on the calling thread's track, named after the
//!   callsite (`event src/main.rs:12`: what `tracing` names it); its fields
//!   are annotations, the message one named `message`.
//! * **Span → slices.** Each time a thread enters a span, a slice named
//!   after the span begins on that thread's track; it ends when the thread
//!   exits the span. The first slice carries the span's fields; a field
//!   recorded later ([`Span::record`](https://docs.rs/tracing/latest/tracing/struct.Span.html#method.record))
//!   rides on the end of the slice it was recorded in (a trace processor
//!   adds an end's annotations to its slice), else on the span's next
//!   slice, else on an instant named after the span when it closes.
//! * **A span entered more than once** (an `async` task instrumented with
//!   `.instrument()`, polled on one thread and then another) gets a track
//!   of its own, named after it, under the process: when it closes, one
//!   slice covering its life, from its first entry (its first poll) to its
//!   close, with all its fields, is written there, while each poll stays a
//!   slice on the track of the thread that ran it. (From its first entry,
//!   not its creation: stamping every span when it is made would cost a
//!   clock read per span, most of which are entered right away anyway.)
//! * **`follows_from` → a flow** from the span it follows (an instant
//!   `follows_from` inside its current slice if the calling thread is in
//!   it, else its next slice or its close) to the following span's next
//!   slice (or its close). Both ends carry the id as a `flow_id`, so a
//!   trace processor links them in time order. A span that follows one
//!   already closed gets no flow: every event of the closed span is
//!   written, and a flow's start can only ride on an event written when it
//!   is declared (an instant elsewhere would show the flow starting in
//!   whatever the calling thread was doing, not in the span followed).
//!
//! Field values are typed annotations: `i64`, `u64`, `bool` and `f64`
//! values as such (smaller integers widen, `i128`/`u128` are written as
//! text), `&str` values as strings, `Debug` and `Display` values formatted
//! as strings.
//!
//! # Invariants
//!
//! * **A thread's track nests.** Each thread keeps the spans it entered
//!   and whose slice it began, innermost last. Exiting one that is not
//!   innermost (guards dropped out of order, or an `enter` guard held
//!   across an `.await` on a single-threaded executor) ends the slices of
//!   the spans inside it first, and their own exits later end nothing. An
//!   exit on a thread that did not enter the span ends nothing.
//! * **Interest.** The layer carries a per-layer filter (see
//!   `tracing_subscriber`'s `Filter`): a callsite whose target's category
//!   no session enables has `Interest::never` from it, so with no other
//!   layer interested the callsite costs what `tracing` costs for one with
//!   no interest (one relaxed load and a branch at the macro), while other
//!   layers beside this one still see everything (a plain layer's `never`
//!   would disable the callsite for them too). Interest is cached per
//!   callsite by `tracing`, and categories change when sessions start and
//!   stop, so whenever the set of enabled categories changes the producer
//!   calls `tracing_core::callsite::rebuild_interest_cache()` (once a layer
//!   exists). The alternative, `Interest::sometimes()` and a check in
//!   `enabled`, would cost a dynamic dispatch per disabled event forever to
//!   save a rebuild per session start and stop. Between a session's stop
//!   and the rebuild, a callsite still marked `always` reaches the layer,
//!   which finds its category off (one relaxed load) and writes nothing.
//! * **Interning.** Event and span names, field names and categories are
//!   `'static` strings: each is interned once per sequence (writer) and then
//!   written as its id.
//! * **No allocation per event** for events whose fields are primitive
//!   values: an event of a recent trace point is encoded into the chunk as
//!   `tracing` hands its fields over (a message without arguments copied
//!   unformatted, a `Debug` value formatted into a per-thread buffer
//!   reused from event to event, then copied); otherwise (a first event,
//!   a packet too long for the chunk's window, ...) fields go to an array
//!   on the stack, text to that buffer, and the fields are visited again
//!   for that. A span's state is a slot of the layer's own table
//!   (`spans`), found by span id without the registry: making, entering,
//!   exiting and closing a span allocate nothing once the slot's buffers
//!   have grown (fields, text values, flows; beyond the per-thread stack's
//!   growth to its deepest nesting). A span whose table group is full
//!   keeps its state in the registry's extensions instead (one allocation
//!   when made).
//! * **A field's `Debug` runs once** per event, span or `record` call,
//!   however many times its fields are visited (one visit per session
//!   instance, another for a packet that did not fit in place, another to
//!   collect them for the instances that declined): the first visit's
//!   text is kept and handed over by the others (`fields`). So a `Debug`
//!   impl whose output changes from call to call shows its first call's
//!   output in every session's packet.
//! * **Re-entry.** An event emitted from a field's `Debug` while the outer
//!   event is being encoded (the thread's writer taken) is collected then
//!   (its own fields formatted once) and written right after the outer
//!   one, which is written the collecting way (its texts as first
//!   formatted). A span entered or exited from a field's `Debug` while the
//!   outer event is being encoded finds the thread's writer taken: that
//!   slice begin or end is dropped and counted
//!   (`ProducerStats::reentrant_drops`).

mod callsites;
mod fields;
mod message;
mod spans;

use std::any::TypeId;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tracing_core::span::{Attributes, Id, Record};
use tracing_core::subscriber::Interest;
use tracing_core::{Dispatch, Event, LevelFilter, Metadata, Subscriber};
use tracing_subscriber::filter::Filtered;
use tracing_subscriber::layer::{Context, Filter, Layer};
use tracing_subscriber::registry::LookupSpan;

use crate::encoding::annotation::FlatArgs;
use crate::integrations::target_category;
use crate::track_event::{__event, __event_at, __flat_event_in, __slice_end, __streamed_event};
use crate::{Arg, Category, EventName, EventType, Flow, Timestamp, Track};

use fields::{Args, EventVisit};
use spans::{Slot, SpanTable};

/// A [`tracing_subscriber::Layer`] writing `tracing` spans and events as
/// track events (see the [module docs](self) for the mapping).
///
/// ```no_run
/// use tracing_subscriber::layer::SubscriberExt as _;
/// use tracing_subscriber::util::SubscriberInitExt as _;
/// tracing_subscriber::registry()
///     .with(shmtrace_producer::TracingLayer::new())
///     .init();
/// ```
pub struct TracingLayer<S> {
    inner: Filtered<Writer, Categories, S>,
}

impl<S> TracingLayer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    /// The layer (the producer itself is started with
    /// [`init`](crate::init)). Making it offers the `track_event` data
    /// source to the service, as
    /// [`register_categories`](crate::track_event::register_categories)
    /// does, so sessions can enable targets before their first event.
    pub fn new() -> Self {
        LAYER_MADE.store(true, Ordering::Relaxed);
        crate::runtime::runtime().advertise_track_event(false);
        TracingLayer {
            inner: Writer {
                spans: SpanTable::new(),
            }
            .with_filter(Categories),
        }
    }
}

#[cfg(test)]
impl<S> TracingLayer<S> {
    /// How many keys of its span table hold a span.
    pub(crate) fn spans_held(&self) -> usize {
        self.inner.inner().spans.held()
    }
}

impl<S> Default for TracingLayer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<S> std::fmt::Debug for TracingLayer<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TracingLayer").finish_non_exhaustive()
    }
}

// Everything is the filtered writer's: the wrapper exists so that users
// name one type and get the per-layer filter with it. Except that the
// calls about an existing span (enter, exit, record, follows_from, close)
// go to the writer directly: it acts only on spans it made its state for,
// which the filter enabled, so the filter's own check (a second registry
// lookup per call) would only repeat that.
impl<S> Layer<S> for TracingLayer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_register_dispatch(&self, subscriber: &Dispatch) {
        self.inner.on_register_dispatch(subscriber);
    }
    fn on_layer(&mut self, subscriber: &mut S) {
        self.inner.on_layer(subscriber);
    }
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        self.inner.register_callsite(metadata)
    }
    fn enabled(&self, metadata: &Metadata<'_>, ctx: Context<'_, S>) -> bool {
        self.inner.enabled(metadata, ctx)
    }
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        self.inner.on_new_span(attrs, id, ctx);
    }
    fn max_level_hint(&self) -> Option<LevelFilter> {
        self.inner.max_level_hint()
    }
    fn on_record(&self, span: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        self.inner.inner().on_record(span, values, ctx);
    }
    fn on_follows_from(&self, span: &Id, follows: &Id, ctx: Context<'_, S>) {
        self.inner.inner().on_follows_from(span, follows, ctx);
    }
    // `Filtered` would answer `true` too, after reading and rewriting its
    // thread-local state unchanged: neither `Categories` nor the writer
    // filters events one by one.
    fn event_enabled(&self, _event: &Event<'_>, _ctx: Context<'_, S>) -> bool {
        true
    }
    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        self.inner.on_event(event, ctx);
    }
    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        self.inner.inner().on_enter(id, ctx);
    }
    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        self.inner.inner().on_exit(id, ctx);
    }
    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        self.inner.inner().on_close(id, ctx);
    }
    fn on_id_change(&self, old: &Id, new: &Id, ctx: Context<'_, S>) {
        self.inner.on_id_change(old, new, ctx);
    }
    // `tracing_subscriber` finds per-layer filters (and their ids) through
    // this method: the wrapped `Filtered` must answer for the wrapper.
    // `unsafe`: a `Layer` method's own signature; its one block forwards.
    #[allow(unsafe_code)]
    #[doc(hidden)]
    unsafe fn downcast_raw(&self, id: TypeId) -> Option<*const ()> {
        if id == TypeId::of::<Self>() {
            return Some(self as *const Self as *const ());
        }
        // SAFETY: the caller upholds `downcast_raw`'s contract (it casts
        // the pointer only to the type whose id it passed); we pass the
        // same id on, and the pointer the inner layer returns points into
        // `self.inner`, which lives as long as `self`.
        unsafe { self.inner.downcast_raw(id) }
    }
}

/// Whether a [`TracingLayer`] was ever made (only then do session starts
/// and stops rebuild `tracing`'s interest cache).
static LAYER_MADE: AtomicBool = AtomicBool::new(false);

/// Called by the category registry after the set of enabled categories
/// may have changed (a session started or stopped, categories were
/// registered), with no lock held.
pub(crate) fn enabled_categories_changed() {
    if LAYER_MADE.load(Ordering::Relaxed) {
        tracing_core::callsite::rebuild_interest_cache();
    }
}

/// The per-layer filter: a callsite is interesting while a session enables
/// its target's category.
struct Categories;

impl<S> Filter<S> for Categories {
    fn enabled(&self, meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        target_category::category(meta.target()).is_enabled()
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        if target_category::category_static(meta.target()).is_enabled() {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        None
    }
}

/// Serials of spans and flows.
fn next_serial() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A span the thread entered and whose slice it began.
struct Entered {
    id: u64,
    category: &'static Category,
    /// A field was recorded while entered: the end carries it.
    recorded: bool,
}

thread_local! {
    /// The spans the thread is in, innermost last.
    static ENTERED: RefCell<Vec<Entered>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on the thread's entered spans; not at all while they are
/// already borrowed (re-entered) or gone (thread exit).
fn with_entered<R>(f: impl FnOnce(&mut Vec<Entered>) -> R) -> Option<R> {
    ENTERED
        .try_with(|e| e.try_borrow_mut().ok().map(|mut e| f(&mut e)))
        .ok()
        .flatten()
}

/// The layer proper (under the [`Categories`] filter).
struct Writer {
    spans: SpanTable,
}

/// The trace point of a callsite's events for the flat encoders: its
/// metadata's address (a callsite's metadata is a `static` of its own), as
/// its target (category), name and level (head annotation) are fixed.
#[inline(always)]
fn site(meta: &'static Metadata<'static>) -> usize {
    meta as *const Metadata<'static> as usize
}

/// The `level` annotation of `meta`.
#[inline]
fn level(meta: &Metadata<'_>) -> Arg<'static> {
    Arg::new("level", meta.level().as_str())
}

/// Begins `name`'s slice on the thread's track, stamped `ns`.
#[inline]
fn begin(cat: &'static Category, name: &'static str, args: &[Arg<'_>], flows: &[Flow], ns: u64) {
    if flows.is_empty() {
        __event_at(
            cat,
            EventType::SliceBegin,
            EventName::Static(name),
            args,
            ns,
        );
    } else {
        cat.slice(name)
            .args(args)
            .flows(flows)
            .timestamp(Timestamp::boottime(ns))
            .emit();
    }
}

/// Begins the slice of a span of `meta` on the thread's track, in the
/// instances of `mask` (those enabling `cat`), stamped `ns`, with the
/// annotations of `args` (whose head is the level): after
/// the callsite's pre-encoded head where the sequence has it, as an event
/// is (`__streamed_event`), else through `write_flat` (which makes that
/// head).
#[inline]
fn flat_begin(
    cat: &'static Category,
    mask: u8,
    meta: &'static Metadata<'static>,
    args: &FlatArgs<'_>,
    ns: u64,
) {
    const BEGIN: u8 = EventType::SliceBegin as u8;
    let site = site(meta);
    let declined = __streamed_event::<BEGIN, _>(cat, mask, site, args, ns);
    if declined != 0 {
        __flat_event_in::<BEGIN>(cat, declined, site, meta.name(), args, ns);
    }
}

impl Writer {
    /// Runs `f` on the state of the live span `id` (in its table slot, or
    /// in the registry's extensions) and its callsite; `close`: the span
    /// is closing, its state is let go afterwards.
    #[inline]
    fn with_slot<S, R>(
        &self,
        id: &Id,
        ctx: &Context<'_, S>,
        close: bool,
        f: impl FnOnce(&Slot, &'static Metadata<'static>, &'static Category) -> R,
    ) -> Option<R>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        if let Some((slot, key)) = self.spans.get(id.into_u64()) {
            let (meta, category) = slot.callsite()?;
            let r = f(slot, meta, category);
            if close {
                self.spans.release(key);
            }
            return Some(r);
        }
        self.with_extension_slot(id, ctx, close, f)
    }

    /// [`Writer::with_slot`] for a span kept in the registry's extensions.
    #[cold]
    fn with_extension_slot<S, R>(
        &self,
        id: &Id,
        ctx: &Context<'_, S>,
        close: bool,
        f: impl FnOnce(&Slot, &'static Metadata<'static>, &'static Category) -> R,
    ) -> Option<R>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let span = ctx.span(id)?;
        if close {
            let slot = span.extensions_mut().remove::<Slot>()?;
            let (meta, category) = slot.callsite()?;
            return Some(f(&slot, meta, category));
        }
        let ext = span.extensions();
        let slot = ext.get::<Slot>()?;
        let (meta, category) = slot.callsite()?;
        Some(f(slot, meta, category))
    }

    /// Ends the slice of `entered` on the thread's track, with the fields
    /// recorded while it was open.
    fn end<S>(&self, entered: &Entered, ctx: &Context<'_, S>)
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        if entered.recorded {
            let id = Id::from_u64(entered.id);
            let written = self.with_slot(&id, ctx, false, |slot, _, _| {
                let mut cold = slot.cold();
                let mut args = Args::new();
                if let Some(cold) = &mut cold {
                    slot.note_fields_written(cold);
                    cold.fields.take_dirty(false, &mut args);
                }
                __event(
                    entered.category,
                    EventType::SliceEnd,
                    EventName::None,
                    &args,
                );
            });
            if written.is_some() {
                return;
            }
        }
        __slice_end(entered.category);
    }
}

impl<S> Layer<S> for Writer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let meta = attrs.metadata();
        let (callsite, category) = match callsites::number(meta) {
            Some((n, cs)) => (Some(n), cs.category),
            None => (None, target_category::category_static(meta.target())),
        };
        if !category.is_enabled() {
            return;
        }
        if let Some(slot) = self.spans.claim(id.into_u64()) {
            slot.start(meta, category, callsite, attrs);
            return;
        }
        let Some(span) = ctx.span(id) else { return };
        let slot = Slot::default();
        slot.start(meta, category, callsite, attrs);
        span.extensions_mut().insert(slot);
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        let category = self.with_slot(id, &ctx, false, |slot, meta, category| {
            let first_ns = slot.enter();
            let first = first_ns.is_some();
            let mask = category.enabled_instances();
            let enabled = mask != 0;
            if !(first || enabled) {
                return category;
            }
            // The first slice's time is also the start of the span's
            // whole life, should it be entered again.
            let ns = crate::clock::now_ns();
            if let Some(first_ns) = first_ns {
                first_ns.store(ns, Ordering::Relaxed);
            }
            if enabled {
                let head = ("level", meta.level().as_str());
                let given = slot.given();
                if first {
                    slot.given_carried.store(true, Ordering::Relaxed);
                }
                match slot.cold() {
                    // The fields it was made with ride on its first slice.
                    None => {
                        let args = if first {
                            given.args(head)
                        } else {
                            FlatArgs::head_only(head)
                        };
                        flat_begin(category, mask, meta, &args, ns);
                    }
                    Some(mut cold) => {
                        let mut args = Args::new();
                        let _ = args.push(level(meta));
                        if first {
                            given.push_args(Some(&cold.fields), &mut args);
                        }
                        let flows = std::mem::take(&mut cold.flows);
                        slot.note_fields_written(&cold);
                        cold.fields.take_dirty(false, &mut args);
                        begin(category, meta.name(), &args, &flows, ns);
                    }
                }
            }
            category
        });
        let Some(category) = category else { return };
        with_entered(|stack| {
            stack.push(Entered {
                id: id.into_u64(),
                category,
                recorded: false,
            })
        });
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        let id = id.into_u64();
        with_entered(|stack| {
            let Some(at) = stack.iter().rposition(|e| e.id == id) else {
                return;
            };
            // Spans entered inside it and not exited yet end first.
            while stack.len() > at {
                if let Some(entered) = stack.pop() {
                    self.end(&entered, &ctx);
                }
            }
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let recorded = self.with_slot(id, &ctx, false, |slot, _, _| {
            let mut cold = slot.cold_mut();
            values.record(&mut cold.fields);
            slot.note_pending(&cold);
        });
        if recorded.is_none() {
            return;
        }
        let id = id.into_u64();
        with_entered(|stack| {
            if let Some(e) = stack.iter_mut().rev().find(|e| e.id == id) {
                e.recorded = true;
            }
        });
    }

    fn on_follows_from(&self, id: &Id, follows: &Id, ctx: Context<'_, S>) {
        if id == follows {
            return;
        }
        let category_of = |id: &Id| self.with_slot(id, &ctx, false, |_, _, category| category);
        let (Some(category), Some(cause_category)) = (category_of(id), category_of(follows)) else {
            return;
        };
        // Both ends or neither: a flow with one end links nothing.
        if !category.is_enabled() || !cause_category.is_enabled() {
            return;
        }
        let flow = Flow::process_scoped(next_serial());
        let cause_id = follows.into_u64();
        let cause_here = with_entered(|stack| stack.iter().any(|e| e.id == cause_id)) == Some(true);
        let add_flow = |slot: &Slot, _, _| {
            let mut cold = slot.cold_mut();
            cold.flows.push(flow);
            slot.note_pending(&cold);
        };
        if cause_here {
            cause_category.instant("follows_from").flows(&[flow]).emit();
        } else {
            self.with_slot(follows, &ctx, false, add_flow);
        }
        self.with_slot(id, &ctx, false, add_flow);
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let category = target_category::category_static(meta.target());
        let mask = category.enabled_instances();
        if mask == 0 {
            return;
        }
        if EventVisit::reentered() {
            return fields::defer(event, meta, category);
        }
        const INSTANT: u8 = EventType::Instant as u8;
        let ns = crate::clock::now_ns();
        let site = site(meta);
        let visit = EventVisit(event);
        let declined = __streamed_event::<INSTANT, _>(category, mask, site, &visit, ns);
        if declined != 0 {
            let head = ("level", meta.level().as_str());
            let fields = visit.collect();
            let args = fields.args(head);
            __flat_event_in::<INSTANT>(category, declined, site, meta.name(), &args, ns);
            drop(fields);
            // Events from its fields' `Debug` (they made it decline).
            fields::write_deferred();
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        // Most spans: nothing left to write, whatever the category.
        if let Some((slot, key)) = self.spans.get(id.into_u64()) {
            if slot.closes_quietly() {
                self.spans.release(key);
                return;
            }
        }
        self.with_slot(&id, &ctx, true, |slot, meta, category| {
            let enters = slot.enters();
            let mut cold = slot.close(enters > 1);
            if !category.is_enabled() {
                return;
            }
            // The given fields, unless its one slice carried them (a span
            // never entered, or first entered while its category was off,
            // had none; a whole-life slice carries them again).
            let given = slot.given();
            let carried = enters == 1 && slot.given_carried.load(Ordering::Relaxed);
            let given = (!carried && !given.is_empty()).then_some(given);
            if enters <= 1 && cold.is_none() && given.is_none() {
                return;
            }
            let name = meta.name();
            let mut args = Args::new();
            let _ = args.push(level(meta));
            if let Some(given) = given {
                given.push_args(cold.as_deref().map(|c| &c.fields), &mut args);
            }
            let (fields, flows) = match &mut cold {
                Some(cold) => {
                    let cold = &mut **cold;
                    (Some(&mut cold.fields), &cold.flows[..])
                }
                None => (None, &[][..]),
            };
            if enters > 1 {
                // Its whole life on its own track (unique: span ids are
                // reused).
                let track = Track::named(name, next_serial());
                if let Some(fields) = fields {
                    fields.take_dirty(true, &mut args);
                }
                category
                    .slice(name)
                    .track(&track)
                    .timestamp(Timestamp::boottime(slot.first_ns()))
                    .args(&args)
                    .flows(flows)
                    .emit();
                category.end().track(&track).emit();
            } else {
                // What no slice of it carried.
                let mut recorded = false;
                if let Some(fields) = fields {
                    recorded = fields.is_dirty();
                    fields.take_dirty(false, &mut args);
                }
                if given.is_some() || recorded || !flows.is_empty() {
                    category.instant(name).args(&args).flows(flows).emit();
                }
            }
        });
    }
}
