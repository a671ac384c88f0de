//! The track event API: categories, events, session observers.
//!
//! Register categories once, then emit events with the macros
//! ([`trace_event!`](crate::trace_event), [`trace_instant!`](crate::trace_instant),
//! [`trace_counter!`](crate::trace_counter), …) or the [`Event`] builder for
//! everything else (tracks, explicit timestamps, flows, arbitrary fields):
//!
//! ```
//! use shmtrace_producer::{track_event, trace_event, trace_instant, trace_counter, Category, Flow, Track};
//!
//! static RENDERING: Category = Category::new("rendering").with_description("Graphics");
//! track_event::register_categories(&[&RENDERING]);
//!
//! fn draw_player(number: u32) {
//!     let _slice = trace_event!(RENDERING, "DrawPlayer", "player_number" => number);
//!     trace_instant!(RENDERING, "Checkpoint");
//!     trace_counter!(RENDERING, "Framerate", 120.0);
//!     // Builder: another track, a flow.
//!     let request = Track::new(42);
//!     RENDERING.instant("HandleRequest").track(&request).flows(&[Flow::process_scoped(7)]).emit();
//! }
//! draw_player(1); // no session: each trace point is one relaxed load
//! ```
//!
//! A disabled trace point costs one relaxed load (the category's bitmask of
//! sessions enabling it); arguments are not evaluated.

pub(crate) mod category;
pub(crate) mod data_source;
pub mod filter;
pub(crate) mod startup;
pub(crate) mod track;

pub use data_source::{add_session_observer, remove_session_observer, TrackEventSessionObserver};

use crate::encoding::annotation::Arg;
use crate::encoding::event::{
    CounterValue, EventContext, EventData, EventName, EventType, ExtraFields, PlainEvent,
};
use crate::smb::writer::ProducerSink;
use crate::track_event::category::{registry, Category};
use crate::track_event::data_source::track_event_type;
use crate::track_event::track::{CounterTrack, Flow, Timestamp, Track};

/// Registers static categories so sessions can enable them and the service
/// advertises them (`TrackEventDescriptor`). Registering again is a no-op.
/// The first call, even with no categories, advertises the `track_event`
/// data source to the service (what `PerfettoTeInit` does upstream): a
/// program that never calls it nor makes a [`DynamicCategory`] does not
/// offer track events.
pub fn register_categories(categories: &[&'static Category]) {
    let changed = registry().register(categories);
    data_source::advertise(changed);
}

/// What track event writers of sessions set up from now on do when the SMB
/// is full (default: drop and mark the loss, like Perfetto's SDK). A
/// session's `DataSourceConfig.buffer_exhausted_policy` is ignored unless
/// the program opts in with [`set_buffer_exhausted_policy_configurable`].
pub fn set_buffer_exhausted_policy(policy: crate::BufferExhaustedPolicy) {
    track_event_type().set_policy(policy);
}

/// Lets sessions set up from now on choose the policy through their
/// `DataSourceConfig.buffer_exhausted_policy` (STALL_THEN_DROP and
/// STALL_THEN_ABORT stall at most [`CONFIG_STALL_LIMIT`](crate::CONFIG_STALL_LIMIT)
/// per packet, then drop). Off by default, as in Perfetto's SDK: a session
/// cannot make the program's threads wait unless the program agrees.
pub fn set_buffer_exhausted_policy_configurable(configurable: bool) {
    track_event_type().set_policy_configurable(configurable);
}

/// Whether any session has track events enabled (any category).
pub fn is_enabled() -> bool {
    track_event_type().enabled_mask() != 0
}

/// A category known only at run time (e.g. from a script engine).
///
/// One named `disabled-by-default-…` is tagged `slow`, as upstream's C++ SDK
/// does, so sessions leave it off unless they ask for it.
///
/// Creating one looks the name up in the registry (a lock and a hash
/// lookup), so create it once and keep it; after that it is as cheap as a
/// static [`Category`].
///
/// ```
/// use shmtrace_producer::DynamicCategory;
/// let cat = DynamicCategory::new("nodejs.something");
/// assert_eq!(cat.name(), "nodejs.something");
/// assert!(std::ptr::eq(cat.category(), DynamicCategory::new("nodejs.something").category()));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct DynamicCategory {
    category: &'static Category,
}

impl DynamicCategory {
    /// The dynamic category `name` (registered on first use; the first
    /// dynamic category advertises the `track_event` data source, like
    /// [`register_categories`]).
    pub fn new(name: &str) -> Self {
        let category = registry().dynamic(name);
        data_source::advertise(false);
        DynamicCategory { category }
    }

    /// The name.
    pub fn name(&self) -> &'static str {
        self.category.name()
    }

    /// The underlying category (usable wherever a static one is).
    pub fn category(&self) -> &'static Category {
        self.category
    }

    /// Whether any running session enables it: one relaxed load.
    #[inline(always)]
    pub fn is_enabled(&self) -> bool {
        self.category.is_enabled()
    }
}

/// Anything that names a category: a `&'static Category` (a static) or a
/// [`DynamicCategory`]. Used by the macros.
pub trait IntoCategory {
    /// The category.
    fn into_category(self) -> &'static Category;
}

impl IntoCategory for &'static Category {
    #[inline(always)]
    fn into_category(self) -> &'static Category {
        self
    }
}

impl IntoCategory for &DynamicCategory {
    #[inline(always)]
    fn into_category(self) -> &'static Category {
        self.category()
    }
}

impl IntoCategory for DynamicCategory {
    #[inline(always)]
    fn into_category(self) -> &'static Category {
        self.category()
    }
}

/// A track event about to be emitted. Build it with [`Category::slice`],
/// [`Category::instant`], [`Category::counter`] or [`Category::end`], adjust
/// it, then [`emit`](Event::emit) it (or [`scoped`](Event::scoped) for a
/// slice that ends when the guard drops).
#[must_use = "an event is only recorded when emitted"]
#[derive(Debug, Clone, Copy)]
pub struct Event<'a> {
    category: &'static Category,
    data: EventData<'a>,
    timestamp: Option<Timestamp>,
}

impl Category {
    fn event<'a>(&'static self, kind: EventType, name: EventName<'a>) -> Event<'a> {
        let mut data = EventData::new(kind, Some(self), Timestamp::boottime(0));
        data.name = name;
        Event {
            category: self,
            data,
            timestamp: None,
        }
    }

    /// A slice begin (emit it, or use [`Event::scoped`]).
    #[inline]
    pub fn slice<'a>(&'static self, name: impl Into<EventName<'a>>) -> Event<'a> {
        self.event(EventType::SliceBegin, name.into())
    }

    /// An instant event.
    #[inline]
    pub fn instant<'a>(&'static self, name: impl Into<EventName<'a>>) -> Event<'a> {
        self.event(EventType::Instant, name.into())
    }

    /// The end of the innermost open slice (on the thread's track unless
    /// [`Event::track`] says otherwise).
    #[inline]
    pub fn end<'a>(&'static self) -> Event<'a> {
        self.event(EventType::SliceEnd, EventName::None)
    }

    /// A counter sample on `track`.
    #[inline]
    pub fn counter<'a>(
        &'static self,
        track: &'a CounterTrack<'a>,
        value: impl Into<CounterValue>,
    ) -> Event<'a> {
        let mut e = self.event(EventType::Counter, EventName::None);
        e.data.track = Some(track.track());
        e.data.counter = Some(value.into());
        e
    }
}

impl<'a> Event<'a> {
    /// Puts the event on `track` instead of the thread's track.
    #[inline]
    pub fn track(mut self, track: &'a Track<'a>) -> Self {
        self.data.track = Some(track);
        self
    }

    /// Sets an explicit timestamp (default: now, boot time).
    #[inline]
    pub fn timestamp(mut self, timestamp: Timestamp) -> Self {
        self.timestamp = Some(timestamp);
        self
    }

    /// Adds flows (arrows to other events with the same flow).
    #[inline]
    pub fn flows(mut self, flows: &'a [Flow]) -> Self {
        self.data.flows = flows;
        self
    }

    /// Adds flows that end at this event.
    #[inline]
    pub fn terminating_flows(mut self, flows: &'a [Flow]) -> Self {
        self.data.terminating_flows = flows;
        self
    }

    /// Adds debug annotations.
    #[inline]
    pub fn args(mut self, args: &'a [Arg<'a>]) -> Self {
        self.data.args = args;
        self
    }

    /// Whether emitting would record anything (one relaxed load).
    #[inline(always)]
    pub fn is_enabled(&self) -> bool {
        self.category.is_enabled()
    }

    /// The event's data with its timestamp resolved (now, unless set).
    #[inline]
    fn stamped(mut self) -> EventData<'a> {
        self.data.timestamp = self.timestamp.unwrap_or_else(Timestamp::now);
        self.data
    }

    /// Records the event in every session that enables its category.
    #[inline]
    pub fn emit(self) {
        let mask = self.category.enabled_instances();
        if mask != 0 {
            write(&self.stamped(), mask, None);
        }
    }

    /// Like [`emit`](Self::emit), and `f` may write more TrackEvent fields
    /// (called once per session).
    #[inline]
    pub fn emit_with(self, mut f: impl FnMut(&mut EventContext<'_, '_, ProducerSink>)) {
        let mask = self.category.enabled_instances();
        if mask != 0 {
            write(&self.stamped(), mask, Some(&mut f));
        }
    }

    /// Emits a slice begin and returns a guard that ends the slice (on the
    /// same track) when dropped.
    #[inline]
    pub fn scoped(self) -> SliceGuard<'a> {
        let mask = self.category.enabled_instances();
        if mask == 0 {
            return SliceGuard::disabled();
        }
        let category = self.category;
        let mut data = self.stamped();
        data.kind = EventType::SliceBegin;
        write(&data, mask, None);
        SliceGuard {
            category: Some(category),
            track: data.track,
        }
    }
}

/// Writes `data` (timestamp resolved) into every instance in `mask`.
/// `data` is read in place, never copied: it was just built field by
/// field, and wide reloads of narrow fresh stores stall.
#[inline(never)]
fn write(data: &EventData<'_>, mask: u8, mut extra: Option<ExtraFields<'_, ProducerSink>>) {
    track_event_type().with_writers(mask, |inner, instance| {
        let extra = extra
            .as_mut()
            .map(|f| &mut **f as ExtraFields<'_, ProducerSink>);
        if !inner.seq.write_event(&mut inner.out, data, extra) {
            count_drop(instance);
        }
    });
}

/// [`write()`] for the common shapes (see [`PlainEvent`]); `KIND` is
/// `ev.kind` as `u8`.
#[inline(never)]
fn write_plain<const KIND: u8>(ev: &PlainEvent<'_>, mask: u8) {
    track_event_type().with_writers(mask, |inner, instance| {
        if !inner.seq.write_plain::<KIND, _>(&mut inner.out, ev) {
            count_drop(instance);
        }
    });
}

/// [`write_plain`] for a slice begin or an instant with debug annotations
/// (those with a dynamic name, a dict or an array go the general way).
#[inline(never)]
fn write_plain_args<const KIND: u8>(ev: &PlainEvent<'_>, mask: u8) {
    track_event_type().with_writers(mask, |inner, instance| {
        if !inner.seq.write_plain_args::<KIND, _>(&mut inner.out, ev) {
            count_drop(instance);
        }
    });
}

/// Counts a packet the instance's writer dropped.
fn count_drop(instance: &crate::data_source::Instance) {
    instance
        .arbiter
        .counters
        .packets_dropped
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// A [`PlainEvent`] of `kind` in `cat`, stamped now.
#[inline(always)]
fn plain<'a>(kind: EventType, cat: &'static Category, name: &'static str) -> PlainEvent<'a> {
    PlainEvent {
        ns: crate::clock::now_ns(),
        ..plain_unstamped(kind, cat, name)
    }
}

/// [`plain`] with no time yet (0).
#[inline(always)]
fn plain_unstamped<'a>(
    kind: EventType,
    cat: &'static Category,
    name: &'static str,
) -> PlainEvent<'a> {
    PlainEvent {
        kind,
        category: cat,
        name,
        args: &[],
        track: None,
        value: 0,
        ns: 0,
    }
}

/// Ends a slice when dropped (returned by [`trace_event!`](crate::trace_event)
/// and [`Event::scoped`]).
#[must_use = "the slice ends when this guard is dropped"]
#[derive(Debug)]
pub struct SliceGuard<'a> {
    category: Option<&'static Category>,
    track: Option<&'a Track<'a>>,
}

impl SliceGuard<'_> {
    /// A guard that does nothing (the category was disabled).
    #[inline(always)]
    pub fn disabled() -> Self {
        SliceGuard {
            category: None,
            track: None,
        }
    }
}

impl Drop for SliceGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        let Some(cat) = self.category else { return };
        match self.track {
            None => end_now(cat),
            Some(track) => cat.end().track(track).emit(),
        }
    }
}

/// Ends the innermost slice on the thread's track, stamped now, in every
/// session that enables `cat`.
#[inline(always)]
fn end_now(cat: &'static Category) {
    let mask = cat.enabled_instances();
    if mask != 0 {
        write_plain::<{ EventType::SliceEnd as u8 }>(&plain(EventType::SliceEnd, cat, ""), mask);
    }
}

/// [`end_now`] out of line (the `tracing` layer's slice ends without
/// annotations).
#[cfg(feature = "tracing")]
#[inline(never)]
pub(crate) fn __slice_end(cat: &'static Category) {
    end_now(cat);
}

#[doc(hidden)]
// Out of line and cold, as in Perfetto's SDK: what a trace point inlines is
// its enabled check alone, laid out so that a disabled trace point falls
// through (no taken branch) and the emitting call sits out of the way.
#[inline(never)]
#[cold]
pub fn __scoped_slice<'a>(
    cat: &'static Category,
    name: EventName<'a>,
    args: &[Arg<'_>],
) -> SliceGuard<'a> {
    let mask = cat.enabled_instances();
    if mask == 0 {
        return SliceGuard::disabled();
    }
    match name {
        EventName::Static(n) if args.is_empty() => {
            write_plain::<{ EventType::SliceBegin as u8 }>(
                &plain(EventType::SliceBegin, cat, n),
                mask,
            );
        }
        EventName::Static(n) => {
            write_plain_args::<{ EventType::SliceBegin as u8 }>(
                &PlainEvent {
                    args,
                    ..plain(EventType::SliceBegin, cat, n)
                },
                mask,
            );
        }
        _ => {
            let mut data = EventData::new(EventType::SliceBegin, Some(cat), Timestamp::now());
            data.name = name;
            data.args = args;
            write(&data, mask, None);
        }
    }
    SliceGuard {
        category: Some(cat),
        track: None,
    }
}

#[doc(hidden)]
// Out of line and cold, as in Perfetto's SDK: what a trace point inlines is
// its enabled check alone, laid out so that a disabled trace point falls
// through (no taken branch) and the emitting call sits out of the way.
#[inline(never)]
#[cold]
pub fn __event(cat: &'static Category, kind: EventType, name: EventName<'_>, args: &[Arg<'_>]) {
    let mask = cat.enabled_instances();
    if mask == 0 {
        return;
    }
    event_at(cat, mask, kind, name, args, crate::clock::now_ns());
}

/// [`__event`] stamped `ns` (BOOTTIME), for callers that read the clock
/// themselves (the `tracing` layer keeps the time of a span's first
/// slice).
#[cfg_attr(not(feature = "tracing"), allow(dead_code))]
#[inline(never)]
pub(crate) fn __event_at(
    cat: &'static Category,
    kind: EventType,
    name: EventName<'_>,
    args: &[Arg<'_>],
    ns: u64,
) {
    let mask = cat.enabled_instances();
    if mask != 0 {
        event_at(cat, mask, kind, name, args, ns);
    }
}

/// An instant or a slice begin (`KIND`, an [`EventType`] as `u8`) named
/// `name` on the thread's track, stamped `ns` (BOOTTIME), with the
/// annotations of `args` (the `tracing` layer's events and slices: no
/// [`Arg`]s built), into the instances of `mask`.
#[cfg(feature = "tracing")]
#[inline(never)]
pub(crate) fn __flat_event_in<const KIND: u8>(
    cat: &'static Category,
    mask: u8,
    site: usize,
    name: &'static str,
    args: &crate::encoding::annotation::FlatArgs<'_>,
    ns: u64,
) {
    if mask == 0 {
        return;
    }
    track_event_type().with_writers(mask, |inner, instance| {
        if !inner
            .seq
            .write_flat::<KIND, _>(&mut inner.out, site, cat, name, args, ns)
        {
            count_drop(instance);
        }
    });
}

/// [`__flat_event_in`] for annotations handed over one by one, into the
/// instances of `mask` (those enabling `cat`, as the caller read them):
/// the head
/// annotation of the trace point `site` (as its pre-encoded head has it),
/// then `fields`, encoded into each enabled instance's chunk as they come
/// (`SequenceState::write_flat_streamed`). Returns the instances that
/// declined it, into which nothing was written: the caller collects the
/// fields and writes them there with [`__flat_event_in`].
#[cfg(feature = "tracing")]
#[inline(always)]
pub(crate) fn __streamed_event<const KIND: u8, F: crate::encoding::event::FlatFields>(
    cat: &'static Category,
    mask: u8,
    site: usize,
    fields: &F,
    ns: u64,
) -> u8 {
    // Instances without a writer here are accounted for (or inactive) by
    // `with_writers` itself, as on the other paths.
    let mut declined = 0;
    track_event_type().with_writers(mask, |inner, instance| {
        use crate::encoding::event::Streamed;
        let seq = &mut inner.seq;
        match seq.write_flat_streamed::<KIND, _, F>(&mut inner.out, site, cat, fields, ns) {
            Streamed::Written => {}
            Streamed::Dropped => count_drop(instance),
            Streamed::Declined => declined |= 1 << instance.slot,
        }
    });
    declined
}

/// Writes the event into the instances of `mask`, by the dedicated
/// encoders where its shape allows.
#[inline(always)]
fn event_at(
    cat: &'static Category,
    mask: u8,
    kind: EventType,
    name: EventName<'_>,
    args: &[Arg<'_>],
    ns: u64,
) {
    let plain = |kind, cat, n| PlainEvent {
        ns,
        ..plain_unstamped(kind, cat, n)
    };
    match (kind, name) {
        (EventType::SliceEnd, EventName::None) if args.is_empty() => {
            write_plain::<{ EventType::SliceEnd as u8 }>(&plain(kind, cat, ""), mask);
        }
        (EventType::Instant, EventName::Static(n)) if args.is_empty() => {
            write_plain::<{ EventType::Instant as u8 }>(&plain(kind, cat, n), mask);
        }
        (EventType::SliceBegin, EventName::Static(n)) if args.is_empty() => {
            write_plain::<{ EventType::SliceBegin as u8 }>(&plain(kind, cat, n), mask);
        }
        (EventType::Instant, EventName::Static(n)) => {
            let ev = PlainEvent {
                args,
                ..plain(kind, cat, n)
            };
            write_plain_args::<{ EventType::Instant as u8 }>(&ev, mask);
        }
        (EventType::SliceBegin, EventName::Static(n)) => {
            let ev = PlainEvent {
                args,
                ..plain(kind, cat, n)
            };
            write_plain_args::<{ EventType::SliceBegin as u8 }>(&ev, mask);
        }
        _ => {
            let mut data = EventData::new(kind, Some(cat), Timestamp::boottime(ns));
            data.name = name;
            data.args = args;
            write(&data, mask, None);
        }
    }
}

#[doc(hidden)]
// Out of line and cold, as in Perfetto's SDK: what a trace point inlines is
// its enabled check alone, laid out so that a disabled trace point falls
// through (no taken branch) and the emitting call sits out of the way.
#[inline(never)]
#[cold]
pub fn __counter(cat: &'static Category, track: &CounterTrack<'_>, value: CounterValue) {
    let mask = cat.enabled_instances();
    if mask == 0 {
        return;
    }
    match value {
        CounterValue::Int(v) => {
            let mut ev = plain(EventType::Counter, cat, "");
            ev.track = Some(track.track());
            ev.value = v;
            write_plain::<{ EventType::Counter as u8 }>(&ev, mask);
        }
        CounterValue::Double(_) => cat.counter(track, value).emit(),
    }
}

/// A scoped slice on the calling thread's track: returns a guard that ends
/// the slice when dropped. Up to any number of `"name" => value` debug
/// annotations.
///
/// ```
/// # use shmtrace_producer::{trace_event, Category};
/// static CAT: Category = Category::new("cat");
/// let _guard = trace_event!(CAT, "Work", "items" => 3, "label" => "x");
/// ```
#[macro_export]
macro_rules! trace_event {
    ($cat:expr, $name:expr $(, $k:literal => $v:expr)* $(,)?) => {{
        let __cat = $crate::track_event::IntoCategory::into_category(&$cat);
        if __cat.is_enabled() {
            $crate::track_event::__scoped_slice(__cat, $crate::EventName::from($name), &[$($crate::Arg::new($k, $v)),*])
        } else {
            $crate::track_event::SliceGuard::disabled()
        }
    }};
}

/// Begins a slice on the calling thread's track (end it with
/// [`trace_event_end!`](crate::trace_event_end)).
#[macro_export]
macro_rules! trace_event_begin {
    ($cat:expr, $name:expr $(, $k:literal => $v:expr)* $(,)?) => {{
        let __cat = $crate::track_event::IntoCategory::into_category(&$cat);
        if __cat.is_enabled() {
            $crate::track_event::__event(__cat, $crate::EventType::SliceBegin, $crate::EventName::from($name), &[$($crate::Arg::new($k, $v)),*]);
        }
    }};
}

/// Ends the innermost slice on the calling thread's track.
#[macro_export]
macro_rules! trace_event_end {
    ($cat:expr) => {{
        let __cat = $crate::track_event::IntoCategory::into_category(&$cat);
        if __cat.is_enabled() {
            $crate::track_event::__event(
                __cat,
                $crate::EventType::SliceEnd,
                $crate::EventName::None,
                &[],
            );
        }
    }};
}

/// An instant event on the calling thread's track.
#[macro_export]
macro_rules! trace_instant {
    ($cat:expr, $name:expr $(, $k:literal => $v:expr)* $(,)?) => {{
        let __cat = $crate::track_event::IntoCategory::into_category(&$cat);
        if __cat.is_enabled() {
            $crate::track_event::__event(__cat, $crate::EventType::Instant, $crate::EventName::from($name), &[$($crate::Arg::new($k, $v)),*]);
        }
    }};
}

/// A counter sample: `trace_counter!(CAT, "Name", value)` on a counter
/// track of that name under the process track, or
/// `trace_counter!(CAT, &counter_track, value)`. Integer values are int64
/// counters, floating-point values double counters.
#[macro_export]
macro_rules! trace_counter {
    ($cat:expr, $name:literal, $value:expr $(,)?) => {{
        let __cat = $crate::track_event::IntoCategory::into_category(&$cat);
        if __cat.is_enabled() {
            let __track = $crate::CounterTrack::new($name);
            $crate::track_event::__counter(__cat, &__track, $crate::CounterValue::from($value));
        }
    }};
    ($cat:expr, $track:expr, $value:expr $(,)?) => {{
        let __cat = $crate::track_event::IntoCategory::into_category(&$cat);
        if __cat.is_enabled() {
            $crate::track_event::__counter(__cat, $track, $crate::CounterValue::from($value));
        }
    }};
}
