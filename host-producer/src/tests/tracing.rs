//! The `tracing` layer against the loopback service: callsite interest
//! follows sessions, and the hot path does not allocate (counted by the
//! counting allocator of [`super::alloc`], per thread).

use prost::Message as _;
use shmtrace_abi::layout::PageLayout;
use tracing::Level;
use tracing_subscriber::layer::SubscriberExt as _;

use super::alloc::allocations;
use super::changing::{texts_in, Changing};
use super::loopback::{serial, Loopback};
use crate::runtime::runtime;
use crate::test_schema::{self as ts, Interned};
use crate::track_event::filter::TrackEventConfig;
use crate::TracingLayer;

/// Calls `f` with every track event of the loopback's sequences, in
/// order, and the sequence's interned strings as of that packet.
fn each_track_event(lb: &Loopback, mut f: impl FnMut(&Interned, &ts::TrackEvent)) {
    for seq in lb.sequences().values() {
        let mut interned = Interned::default();
        for bytes in &seq.packets {
            let p = ts::TracePacket::decode(&bytes[..]).expect("valid TracePacket");
            interned.update(&p);
            if let Some(te) = &p.track_event {
                f(&interned, te);
            }
        }
    }
}

/// Every track event of the loopback's sequences in the category
/// `category`, and every slice end (which carries no category): (type,
/// name, annotation names).
fn events_in(lb: &Loopback, category: &str) -> Vec<(i32, String, Vec<String>)> {
    let mut out = Vec::new();
    each_track_event(lb, |interned, te| {
        let end = te.r#type == Some(crate::EventType::SliceEnd as i32);
        if end || interned.event_categories(te) == [category] {
            out.push((
                te.r#type.unwrap_or(0),
                interned.event_name(te).unwrap_or_default(),
                te.debug_annotations
                    .iter()
                    .filter_map(|a| interned.arg_name(a))
                    .collect(),
            ));
        }
    });
    out
}

fn subscriber() -> impl tracing::Subscriber {
    tracing_subscriber::registry().with(TracingLayer::new())
}

/// A callsite's interest is `never` while no session enables its target,
/// and `always` while one does: `tracing` rebuilds its interest cache when
/// a session starts and stops, and only the event emitted in between is
/// recorded.
#[test]
fn callsite_interest_follows_sessions() {
    let _s = serial();
    let lb = Loopback::new(1 << 20, PageLayout::Div1, false);
    tracing::subscriber::with_default(subscriber(), || {
        let emit = |phase: &'static str| {
            tracing::info!(target: "tl.interest", phase);
            tracing::enabled!(target: "tl.interest", Level::INFO)
        };
        assert!(!emit("before"), "no session: never");
        lb.start_track_event(401, 1, TrackEventConfig::default());
        assert!(emit("during"), "a session enables the target: always");
        runtime().stop_data_source(401);
        assert!(!emit("after"), "stopped: never again");
        let off = TrackEventConfig {
            disabled_categories: vec!["tl.interest".into()],
            ..Default::default()
        };
        lb.start_track_event(402, 1, off);
        assert!(!emit("disabled"), "a session disabling the target: never");
        runtime().stop_data_source(402);
    });
    let events = events_in(&lb, "tl.interest");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].2, ["level", "phase"]);
    lb.shutdown();
}

/// Counts the events and span entries it sees.
#[derive(Clone, Default)]
struct Counter(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Counter {
    fn on_event(&self, _: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn on_enter(&self, _: &tracing::Id, _: tracing_subscriber::layer::Context<'_, S>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The layer's filter is its own: a target no session enables is still
/// seen by a layer beside it (a plain layer's `Interest::never` would hide
/// it from every layer), and what a session enables is recorded while the
/// other layer sees it too.
#[test]
fn other_layers_see_what_no_session_enables() {
    let _s = serial();
    let lb = Loopback::new(1 << 20, PageLayout::Div1, false);
    let counter = Counter::default();
    let seen = || counter.0.load(std::sync::atomic::Ordering::Relaxed);
    let subscriber = tracing_subscriber::registry()
        .with(TracingLayer::new())
        .with(counter.clone());
    tracing::subscriber::with_default(subscriber, || {
        let emit = || {
            let _span = tracing::info_span!(target: "tl.beside", "work").entered();
            tracing::info!(target: "tl.beside", n = 1u64);
        };
        emit();
        assert_eq!(
            seen(),
            2,
            "no session: the other layer sees the span and the event"
        );
        lb.start_track_event(421, 1, TrackEventConfig::default());
        emit();
        assert_eq!(seen(), 4, "with a session: the other layer still sees both");
        runtime().stop_data_source(421);
    });
    let events = events_in(&lb, "tl.beside");
    let kinds: Vec<i32> = events.iter().map(|e| e.0).collect();
    use crate::EventType as T;
    assert_eq!(
        kinds,
        [T::SliceBegin as i32, T::Instant as i32, T::SliceEnd as i32],
        "only the second round is recorded: {events:?}"
    );
    lb.shutdown();
}

/// Rounds measured after the warm-up.
const ROUNDS: u64 = 10_000;

fn one_round(i: u64, span: &tracing::Span) {
    // Events with static names and primitive fields, with and without a
    // message (formatted into the thread's reused buffer).
    tracing::info!(target: "tl.alloc", a = i, b = true);
    tracing::warn!(target: "tl.alloc", x = -1.5, n = -7i64, "static message");
    // A span made before, entered and exited again; a field recorded
    // while it is entered rides on its end.
    {
        let _entered = span.enter();
        span.record("count", i);
        tracing::debug!(target: "tl.alloc", inside = true);
    }
    // A span made, entered, exited and closed, with a primitive and a
    // text field (its state's slot and buffers are reused).
    {
        let _made =
            tracing::info_span!(target: "tl.alloc", "made", n = i, label = "text").entered();
    }
    // A target the session disables.
    tracing::info!(target: "tl.alloc.off", never = 1u64);
}

/// The layer's hot path does not allocate: events with static names and
/// primitive fields, a message, entering and exiting a live span and
/// recording into it, making and closing a span with fields, after
/// warm-up.
#[test]
fn layer_hot_path_does_not_allocate() {
    let _s = serial();
    let lb = Loopback::new(8 << 20, PageLayout::Div1, false);
    let cfg = TrackEventConfig {
        disabled_categories: vec!["tl.alloc.off".into()],
        ..Default::default()
    };
    lb.start_track_event(411, 1, cfg);
    let (before, after) = tracing::subscriber::with_default(subscriber(), || {
        let span = tracing::info_span!(target: "tl.alloc", "live", count = 0u64);
        for i in 0..2000 {
            one_round(i, &span);
        }
        lb.drain();
        let before = allocations();
        for i in 0..ROUNDS {
            one_round(i, &span);
            if i % 250 == 0 {
                // Let the service free chunks (on the pump thread, not
                // counted).
                std::thread::yield_now();
            }
        }
        (before, allocations())
    });
    let dropped = crate::stats().packets_dropped;
    runtime().stop_data_source(411);
    let events = events_in(&lb, "tl.alloc");
    // Three instants, a begin and an end per round (minus drops).
    let rounds = ROUNDS + 2000;
    assert!(
        events.len() as u64 + dropped >= rounds * 5,
        "{} events, {dropped} dropped: {:?}",
        events.len(),
        {
            let mut kinds = std::collections::BTreeMap::new();
            for (kind, name, args) in &events {
                *kinds.entry((kind, name, args)).or_insert(0) += 1;
            }
            kinds
        }
    );
    let instant = crate::EventType::Instant as i32;
    let with_message = events
        .iter()
        .filter(|(kind, _, args)| *kind == instant && args == &["level", "message", "x", "n"])
        .count() as u64;
    assert!(
        with_message + dropped >= rounds,
        "{with_message} events with a message"
    );
    let ends_with_count = events
        .iter()
        .filter(|(kind, _, args)| *kind == crate::EventType::SliceEnd as i32 && args == &["count"])
        .count() as u64;
    assert!(
        ends_with_count + dropped >= rounds,
        "{ends_with_count} slice ends carry the recorded field"
    );
    assert!(events_in(&lb, "tl.alloc.off")
        .iter()
        .all(|(kind, _, _)| *kind == crate::EventType::SliceEnd as i32));
    assert_eq!(
        after - before,
        0,
        "allocations on the hot path ({dropped} packets dropped)"
    );
    lb.shutdown();
}

/// What a span's close writes: nothing for a span entered once whose
/// fields its slice carried, an instant with the fields no slice carried
/// (a span never entered; a field recorded twice after its only slice,
/// which it carries once), and a whole-life slice on a track of its own
/// for a span entered twice.
#[test]
fn a_close_writes_only_what_no_slice_carried() {
    let _s = serial();
    let lb = Loopback::new(1 << 20, PageLayout::Div1, false);
    tracing::subscriber::with_default(subscriber(), || {
        lb.start_track_event(422, 1, TrackEventConfig::default());
        // Entered once, fields carried by its slice: the close writes nothing.
        drop(tracing::info_span!(target: "tl.close", "once", a = 1u64).entered());
        // Never entered: its fields on an instant at close.
        drop(tracing::info_span!(target: "tl.close", "never", b = 2u64));
        // A field recorded after its slice: on an instant at close.
        let late = tracing::info_span!(target: "tl.close", "late", c = tracing::field::Empty);
        drop(late.enter());
        late.record("c", 3u64);
        // Recorded again: the value is replaced, not added.
        late.record("c", 4u64);
        drop(late);
        // Entered twice: a whole-life slice (begin and end) at close.
        let twice = tracing::info_span!(target: "tl.close", "twice", d = 4u64);
        drop(twice.enter());
        drop(twice.enter());
        drop(twice);
        runtime().stop_data_source(422);
    });
    let events = events_in(&lb, "tl.close");
    use crate::EventType as T;
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let (b, e, i) = (T::SliceBegin as i32, T::SliceEnd as i32, T::Instant as i32);
    assert_eq!(
        events,
        [
            (b, "once".into(), s(&["level", "a"])),
            (e, String::new(), s(&[])),
            (i, "never".into(), s(&["level", "b"])),
            (b, "late".into(), s(&["level"])),
            (e, String::new(), s(&[])),
            (i, "late".into(), s(&["level", "c"])),
            (b, "twice".into(), s(&["level", "d"])),
            (e, String::new(), s(&[])),
            (b, "twice".into(), s(&["level"])),
            (e, String::new(), s(&[])),
            (b, "twice".into(), s(&["level", "d"])),
            (e, String::new(), s(&[])),
        ],
        "{events:#?}"
    );
    lb.shutdown();
}

/// A span callsite whose fields are not all given every time (an `Option`
/// field is recorded only when `Some`): each slice begin names the fields
/// it carries, whatever the callsite's earlier begins carried (their
/// pre-encoded starts are kept by the field's index in the callsite, not
/// by its place among those given), with their values.
#[test]
fn a_span_s_fields_keep_their_names_whichever_are_given() {
    let _s = serial();
    let lb = Loopback::new(1 << 20, PageLayout::Div1, false);
    tracing::subscriber::with_default(subscriber(), || {
        lb.start_track_event(423, 1, TrackEventConfig::default());
        for first in [None, Some(7u64), None, Some(8), Some(9), None, Some(10)] {
            let span = tracing::info_span!(target: "tl.given", "given", first, second = 2u64);
            drop(span.entered());
        }
        runtime().stop_data_source(423);
    });
    let mut begins = Vec::new();
    each_track_event(&lb, |interned, te| {
        if interned.event_categories(te) == ["tl.given"] {
            let args: Vec<(String, Option<u64>)> = te
                .debug_annotations
                .iter()
                .map(|a| (interned.arg_name(a).unwrap_or_default(), a.uint_value))
                .collect();
            begins.push(args);
        }
    });
    let level = ("level".to_string(), None);
    let second = ("second".to_string(), Some(2));
    let first = |v: u64| ("first".to_string(), Some(v));
    assert_eq!(
        begins,
        [
            vec![level.clone(), second.clone()],
            vec![level.clone(), first(7), second.clone()],
            vec![level.clone(), second.clone()],
            vec![level.clone(), first(8), second.clone()],
            vec![level.clone(), first(9), second.clone()],
            vec![level.clone(), second.clone()],
            vec![level, first(10), second],
        ],
    );
    lb.shutdown();
}

/// A value recorded into a span before its first slice replaces the value
/// it was made with: the first slice carries the recorded one alone, and so
/// does the whole-life slice of a span entered twice; a given value never
/// replaced rides on the first slice (or, never entered or first entered
/// while no session recorded it, on its close).
#[test]
fn a_recorded_value_replaces_the_given_one() {
    let _s = serial();
    let lb = Loopback::new(1 << 20, PageLayout::Div1, false);
    tracing::subscriber::with_default(subscriber(), || {
        lb.start_track_event(423, 1, TrackEventConfig::default());
        let early = tracing::info_span!(target: "tl.replace", "early", a = 1u64, b = 2u64);
        early.record("a", 10u64);
        drop(early.enter());
        drop(early);
        let twice = tracing::info_span!(target: "tl.replace", "twice", c = 3u64);
        drop(twice.enter());
        twice.record("c", 30u64);
        drop(twice.enter());
        drop(twice);
        drop(tracing::info_span!(target: "tl.replace", "never", d = 4u64));
        // Entered once while no session records its category: its given
        // fields ride on its close.
        let off = tracing::info_span!(target: "tl.replace", "off", e = 5u64);
        runtime().stop_data_source(423);
        drop(off.enter());
        lb.start_track_event(427, 1, TrackEventConfig::default());
        drop(off);
        runtime().stop_data_source(427);
    });
    // (type, name, annotations with their uint values) of the category's
    // slice begins and instants.
    let mut seen = Vec::new();
    each_track_event(&lb, |interned, te| {
        if interned.event_categories(te) != ["tl.replace"] {
            return;
        }
        let args: Vec<(String, Option<u64>)> = te
            .debug_annotations
            .iter()
            .filter_map(|a| Some((interned.arg_name(a)?, a.uint_value)))
            .filter(|(n, _)| n != "level")
            .collect();
        seen.push((
            te.r#type.unwrap_or(0),
            interned.event_name(te).unwrap_or_default(),
            args,
        ));
    });
    use crate::EventType as T;
    let (b, i) = (T::SliceBegin as i32, T::Instant as i32);
    let a = |v: &[(&str, u64)]| {
        v.iter()
            .map(|(n, x)| (n.to_string(), Some(*x)))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        seen,
        [
            (b, "early".into(), a(&[("b", 2), ("a", 10)])),
            (b, "twice".into(), a(&[("c", 3)])),
            (b, "twice".into(), a(&[("c", 30)])),
            (b, "twice".into(), a(&[("c", 30)])),
            (i, "never".into(), a(&[("d", 4)])),
            (i, "off".into(), a(&[("e", 5)])),
        ],
        "{seen:#?}"
    );
    lb.shutdown();
}

thread_local! {
    /// The subscriber [`Emits`] hands its event to.
    static INNER: std::cell::RefCell<Option<tracing::Dispatch>> = const { std::cell::RefCell::new(None) };
}

/// A field whose `Debug` emits an event if it holds `true`, straight to
/// the subscriber of [`INNER`]: as with a global default subscriber, where
/// `tracing` does not guard against re-entry (a scoped one would drop the
/// inner event).
struct Emits(bool);

thread_local! {
    /// Calls of [`Emits`]' `Debug` on this thread.
    static EMITS_CALLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl std::fmt::Debug for Emits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use tracing::callsite::Callsite as _;
        EMITS_CALLS.with(|c| c.set(c.get() + 1));
        let callsite = tracing::callsite!(
            name: "inner",
            kind: tracing::metadata::Kind::EVENT,
            target: "tl.reenter",
            level: Level::INFO,
            fields: inner
        );
        if !self.0 {
            return f.write_str("quiet");
        }
        let meta = callsite.metadata();
        let field = meta.fields().field("inner").expect("the field");
        let values = [(&field, Some(&1u64 as &dyn tracing::Value))];
        let values = meta.fields().value_set(&values);
        INNER.with(|d| {
            if let Some(d) = &*d.borrow() {
                d.event(&tracing::Event::new(meta, &values));
            }
        });
        f.write_str("emits")
    }
}

/// A field whose `Debug` panics if it holds `true`.
struct Panics(bool);

impl std::fmt::Debug for Panics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        assert!(!self.0, "a field's Debug panicked (on purpose)");
        f.write_str("fine")
    }
}

/// A field's `Debug` that panics while its event is streamed into the
/// chunk (its trace point made recent by the events before it), the panic
/// caught as a runtime would, costs that event only: the thread's later
/// events are written, none taken for a re-entered one, each with the
/// text its own `Debug` wrote (not the one formatted before the panic).
#[test]
fn a_panicking_field_costs_its_own_event_only() {
    let _s = serial();
    let lb = Loopback::new(1 << 20, PageLayout::Div1, false);
    let dispatch = tracing::Dispatch::new(subscriber());
    tracing::dispatcher::with_default(&dispatch, || {
        lb.start_track_event(425, 1, TrackEventConfig::default());
        let before = crate::stats().reentrant_drops;
        let event = |n: usize, panics: bool| {
            let text = Changing::from_call(n);
            tracing::info!(target: "tl.panics", text = ?text, v = ?Panics(panics));
        };
        event(0, false);
        event(1, false);
        let caught = std::panic::catch_unwind(|| event(2, true));
        assert!(caught.is_err(), "the field's Debug did not panic");
        event(3, false);
        event(4, false);
        assert_eq!(
            crate::stats().reentrant_drops,
            before,
            "events dropped as re-entrant"
        );
        runtime().stop_data_source(425);
    });
    let want: Vec<String> = [0, 1, 3, 4].into_iter().map(Changing::text).collect();
    assert_eq!(texts_in(&lb, "tl.panics", "text"), [want]);
    lb.shutdown();
}

/// An event emitted by a field's `Debug` while the layer writes the outer
/// event is recorded once, after the outer one: the outer event's fields
/// are streamed into the chunk (its trace point's first two events, whose
/// field emits nothing, made it recent) with the thread's writer taken, so
/// the inner event is collected then and written once the outer one is.
/// The outer field's `Debug` runs once per event.
#[test]
fn an_event_from_a_field_s_debug_is_recorded() {
    let _s = serial();
    let lb = Loopback::new(1 << 20, PageLayout::Div1, false);
    let dispatch = tracing::Dispatch::new(subscriber());
    INNER.with(|d| *d.borrow_mut() = Some(dispatch.clone()));
    let calls = EMITS_CALLS.with(|c| c.get());
    tracing::dispatcher::with_default(&dispatch, || {
        lb.start_track_event(424, 1, TrackEventConfig::default());
        let before = crate::stats().reentrant_drops;
        for i in 0..4 {
            tracing::info!(target: "tl.reenter", outer = ?Emits(i >= 2));
        }
        assert_eq!(
            crate::stats().reentrant_drops,
            before,
            "events dropped as re-entrant"
        );
        runtime().stop_data_source(424);
    });
    INNER.with(|d| d.borrow_mut().take());
    assert_eq!(EMITS_CALLS.with(|c| c.get()) - calls, 4, "`Debug` calls");
    let events = events_in(&lb, "tl.reenter");
    let i = crate::EventType::Instant as i32;
    let kinds: Vec<(i32, Vec<String>)> = events.into_iter().map(|(k, _, a)| (k, a)).collect();
    let one = |a: &str| (i, vec!["level".to_string(), a.to_string()]);
    assert_eq!(
        kinds,
        [
            one("outer"),
            one("outer"),
            one("outer"),
            one("inner"),
            one("outer"),
            one("inner")
        ],
        "{kinds:#?}"
    );
    lb.shutdown();
}

/// An event field's `Debug` runs once per event, however the event is
/// written: in place, through the scratch buffer after its text turned out
/// too long for a window, collected for the general path (the trace
/// point's first events, a field whose name was not interned yet), into
/// each of two sessions. Each packet decodes, with the text of the call.
#[test]
fn an_event_field_s_debug_runs_once() {
    let _s = serial();
    let lb = Loopback::new(1 << 20, PageLayout::Div1, false);
    tracing::subscriber::with_default(subscriber(), || {
        lb.start_track_event(428, 1, TrackEventConfig::default());
        lb.start_track_event(429, 2, TrackEventConfig::default());
        for i in 0..20 {
            let value = Changing::from_call(i);
            // A field given from the eighth event on: its name is not
            // interned when the trace point's head is recent.
            let late = (i >= 8).then_some(i as u64);
            tracing::info!(target: "tl.once", count = i as u64, v = ?value, late, "event");
            assert_eq!(value.calls.get(), i + 1, "`Debug` calls of event {i}");
        }
        runtime().stop_data_source(428);
        runtime().stop_data_source(429);
    });
    let want: Vec<String> = (0..20).map(Changing::text).collect();
    assert_eq!(texts_in(&lb, "tl.once", "v"), [want.clone(), want]);
    lb.shutdown();
}

/// A span field's `Debug` runs once when the span is made and once per
/// `record`, however many slices carry the value (a span entered twice:
/// its first slice, and its whole-life slice at close; a recorded value
/// on the end of the slice it was recorded in, and on the whole-life
/// slice), into each of two sessions.
#[test]
fn a_span_field_s_debug_runs_once() {
    let _s = serial();
    let lb = Loopback::new(1 << 20, PageLayout::Div1, false);
    tracing::subscriber::with_default(subscriber(), || {
        lb.start_track_event(430, 1, TrackEventConfig::default());
        lb.start_track_event(431, 2, TrackEventConfig::default());
        for i in 0..5 {
            let given = Changing::from_call(i);
            let recorded = Changing::from_call(i + 10);
            let span = tracing::info_span!(target: "tl.span_once", "s", g = ?given, r = tracing::field::Empty);
            assert_eq!(given.calls.get(), i + 1, "`Debug` calls of span {i}");
            {
                let _entered = span.enter();
                span.record("r", tracing::field::debug(&recorded));
            }
            drop(span.enter());
            drop(span);
            assert_eq!(given.calls.get(), i + 1, "`Debug` calls of span {i}");
            assert_eq!(recorded.calls.get(), i + 11, "`Debug` calls of span {i}");
        }
        runtime().stop_data_source(430);
        runtime().stop_data_source(431);
    });
    // Each span: its given value on its first slice and its whole-life
    // slice, the recorded one on its first slice's end and the whole-life
    // slice.
    let given: Vec<String> = (0..5)
        .flat_map(|i| std::iter::repeat_n(Changing::text(i), 2))
        .collect();
    let recorded: Vec<String> = (0..5)
        .flat_map(|i| std::iter::repeat_n(Changing::text(i + 10), 2))
        .collect();
    assert_eq!(texts_in(&lb, "tl.span_once", "g"), [given.clone(), given]);
    assert_eq!(
        texts_in(&lb, "tl.span_once", "r"),
        [recorded.clone(), recorded]
    );
    lb.shutdown();
}

/// What the trace holds of one span of [`spans_crossing_threads`].
#[derive(Default, Debug)]
struct SpanSeen {
    /// Its slices on threads' tracks.
    slices: Vec<Slice>,
    /// Its whole-life slices: (`k`, `r`, begin time).
    whole: Vec<(Option<u64>, Option<u64>, u64)>,
}

/// A span's slice on a thread's track.
#[derive(Debug)]
struct Slice {
    /// Who entered (the `step` of the `inside` instant in it).
    step: u64,
    /// Whether its begin carried the span's given field `k`.
    given: bool,
    /// Its begin's time (BOOTTIME ns).
    begin_ns: u64,
    /// Its end's `r`.
    end_r: Option<u64>,
}

/// The slice begun on a thread's track and not ended yet.
struct Open {
    /// Its begin's `k`.
    k: Option<u64>,
    begin_ns: u64,
    /// The span and step of the `inside` instant in it.
    inside: Option<(u64, u64)>,
}

/// Spans made, handed between threads, entered, recorded into and closed
/// on more threads than the span table has lanes (so threads without one,
/// and shared keys), in two waves: the second's threads take the lanes the
/// first's gave back while spans the first made still hold keys, and
/// enter those. Span `k` is entered by the thread that made it not at all
/// (`k % 3 == 0`), before it hands it on (`1`) or while the next thread
/// may be entering it too (`2`); the next thread enters it, records `r`
/// into it and drops it; every fourth of the first wave is entered again
/// by a thread of the second. Every span's slices nest on their thread's
/// track (an `inside` instant in each names it); its given field rides on
/// its first slice (on the first two with `k % 3 == 2`, when both first
/// enters find the other's count still 0), `r` on the end of the slice it
/// was recorded in, or, entered more than once, both on its whole-life
/// slice, which starts when its first slice does; no span, slice or
/// packet is lost, and every key of the table is free after.
#[test]
fn spans_crossing_threads() {
    use std::sync::mpsc::{channel, Receiver, Sender};
    use tracing::field::Empty;
    /// More than the table's lanes (4).
    const THREADS: u64 = 8;
    const SPANS: u64 = 300;
    const WAVE: u64 = THREADS * SPANS;
    type Handed = (u64, tracing::Span);
    let _s = serial();
    let lb = Loopback::new(8 << 20, PageLayout::Div1, false);
    let dispatch = tracing::Dispatch::new(subscriber());
    lb.start_track_event(431, 1, TrackEventConfig::default());
    let dropped = crate::stats().packets_dropped;
    fn inside(k: u64, step: u64) {
        tracing::info!(target: "tl.stress", inside = k, step);
    }
    fn received((k, span): (u64, tracing::Span)) {
        let _in = span.enter();
        span.record("r", k);
        inside(k, 1);
    }
    // One thread of a wave: makes its spans and hands them to `next`,
    // enters what `rx` brings, then `parked` (first-wave spans).
    let worker = |wave: u64,
                  i: u64,
                  next: Sender<Handed>,
                  rx: Receiver<Handed>,
                  park: Option<Sender<Handed>>,
                  parked: Vec<Handed>| {
        let dispatch = dispatch.clone();
        std::thread::spawn(move || {
            tracing::dispatcher::with_default(&dispatch, || {
                for j in 0..SPANS {
                    let k = wave * WAVE + i * SPANS + j;
                    let span = tracing::info_span!(target: "tl.stress", "stress", k, r = Empty);
                    if k % 3 == 1 {
                        let _in = span.enter();
                        inside(k, 0);
                    }
                    if let Some(park) = park.as_ref().filter(|_| k % 4 == 0) {
                        park.send((k, span.clone())).expect("main parks it");
                    }
                    let again = (k % 3 == 2).then(|| span.clone());
                    next.send((k, span)).expect("the next thread");
                    if let Some(span) = again {
                        let _in = span.enter();
                        inside(k, 0);
                    }
                    while let Ok(handed) = rx.try_recv() {
                        received(handed);
                    }
                }
                drop(next);
                rx.into_iter().for_each(received);
                for (k, span) in parked {
                    let _in = span.enter();
                    inside(k, 2);
                }
            })
        })
    };
    // First-wave spans for the second (the first wave's threads hold the
    // senders).
    let (park, parked) = channel();
    let mut park = Some(park);
    for wave in 0..2 {
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..THREADS).map(|_| channel()).unzip();
        let mut shares: Vec<Vec<Handed>> = (0..THREADS).map(|_| Vec::new()).collect();
        if wave == 1 {
            for (n, handed) in parked.try_iter().enumerate() {
                shares[n % THREADS as usize].push(handed);
            }
        }
        let mut receivers: Vec<Option<Receiver<Handed>>> =
            receivers.into_iter().map(Some).collect();
        let threads: Vec<_> = (0..THREADS)
            .zip(shares)
            .map(|(i, share)| {
                let next = senders[((i + 1) % THREADS) as usize].clone();
                let rx = receivers[i as usize].take().expect("one receiver each");
                worker(wave, i, next, rx, park.clone(), share)
            })
            .collect();
        drop(senders);
        park = None;
        for t in threads {
            t.join().expect("a worker");
        }
    }
    let layer = dispatch
        .downcast_ref::<TracingLayer<tracing_subscriber::Registry>>()
        .expect("the layer");
    assert_eq!(layer.spans_held(), 0, "table keys still held");
    runtime().stop_data_source(431);
    assert_eq!(crate::stats().packets_dropped, dropped, "packets dropped");

    use crate::EventType as T;
    let (begin, end, instant) = (T::SliceBegin as i32, T::SliceEnd as i32, T::Instant as i32);
    let mut spans: std::collections::BTreeMap<u64, SpanSeen> = Default::default();
    let mut close_instants = 0;
    let sequences = lb.sequences();
    for seq in sequences.values() {
        assert_eq!((seq.dropped, seq.gaps), (0, 0), "packets lost");
        let mut interned = Interned::default();
        let mut open: Vec<Open> = Vec::new();
        let mut whole_open = std::collections::HashMap::new();
        // The sequence's clock 64 (`encoding::event`): BOOTTIME at the
        // last reset's snapshot, plus the deltas of the events since.
        let mut clock = 0;
        for bytes in &seq.packets {
            let p = ts::TracePacket::decode(&bytes[..]).expect("valid TracePacket");
            interned.update(&p);
            if let Some(snapshot) = &p.clock_snapshot {
                let c64 = snapshot.clocks.iter().find(|c| c.clock_id == Some(64));
                clock = c64.and_then(|c| c.timestamp).expect("clock 64's base");
            }
            let Some(te) = &p.track_event else { continue };
            let ns = match p.timestamp_clock_id {
                Some(id) if id != 64 => p.timestamp.expect("a time"),
                _ => {
                    clock += p.timestamp.expect("a time");
                    clock
                }
            };
            let arg = |name: &str| {
                te.debug_annotations
                    .iter()
                    .find(|a| interned.arg_name(a).as_deref() == Some(name))
                    .and_then(|a| a.uint_value)
            };
            let kind = te.r#type.unwrap_or(0);
            if let Some(track) = te.track_uuid {
                // A whole-life slice on a track of its own.
                let depth = whole_open.entry(track).or_insert(0);
                if kind == begin {
                    assert_eq!(*depth, 0, "two whole-life slices on one track");
                    *depth += 1;
                    let k = arg("k").expect("a whole-life slice carries k");
                    let whole = (arg("k"), arg("r"), ns);
                    spans.entry(k).or_default().whole.push(whole);
                } else {
                    assert_eq!((kind, *depth), (end, 1), "unbalanced whole-life track");
                    *depth -= 1;
                }
                continue;
            }
            if kind == begin {
                open.push(Open {
                    k: arg("k"),
                    begin_ns: ns,
                    inside: None,
                });
            } else if kind == instant {
                if let Some(k) = arg("inside") {
                    let top = open.last_mut().expect("an inside instant in no slice");
                    assert!(top.inside.is_none(), "two spans in one slice");
                    top.inside = Some((k, arg("step").expect("a step")));
                } else {
                    close_instants += 1;
                }
            } else if kind == end {
                let slice = open.pop().expect("an end without a begin");
                let (k, step) = slice.inside.expect("a slice without its inside instant");
                spans.entry(k).or_default().slices.push(Slice {
                    step,
                    given: slice.k == Some(k),
                    begin_ns: slice.begin_ns,
                    end_r: arg("r"),
                });
            }
        }
        assert!(open.is_empty(), "slices never ended");
        assert!(
            whole_open.values().all(|&d| d == 0),
            "whole-life slices never ended"
        );
    }
    assert_eq!(close_instants, 0, "instants at close");
    assert_eq!(spans.len() as u64, 2 * WAVE, "spans lost");
    for (&k, seen) in &spans {
        let parked = k < WAVE && k % 4 == 0;
        let mut steps: Vec<u64> = seen.slices.iter().map(|s| s.step).collect();
        steps.sort_unstable();
        let mut want = if k % 3 == 0 { vec![1] } else { vec![0, 1] };
        if parked {
            want.push(2);
        }
        assert_eq!(steps, want, "span {k}'s slices: {seen:?}");
        let firsts: Vec<&Slice> = seen.slices.iter().filter(|s| s.given).collect();
        let first_steps: Vec<u64> = firsts.iter().map(|s| s.step).collect();
        match k % 3 {
            // Entered in turn: only the first slice carries k.
            0 => assert_eq!(first_steps, [1], "span {k}: {seen:?}"),
            1 => assert_eq!(first_steps, [0], "span {k}: {seen:?}"),
            // Maybe at once: either first, or both.
            _ => assert!(
                (1..=2).contains(&first_steps.len()) && first_steps.iter().all(|&s| s < 2),
                "span {k}: {seen:?}"
            ),
        }
        if k % 3 != 2 {
            // `r` on the end of the slice it was recorded in.
            let ends_r: Vec<_> = seen
                .slices
                .iter()
                .filter(|s| s.step == 1)
                .map(|s| s.end_r)
                .collect();
            assert_eq!(ends_r, [Some(k)], "span {k}: {seen:?}");
        }
        let whole = if want.len() > 1 {
            let start = firsts.iter().map(|s| s.begin_ns).min();
            vec![(Some(k), Some(k), start.expect("a first slice"))]
        } else {
            vec![]
        };
        assert_eq!(seen.whole, whole, "span {k}'s whole-life slices");
    }
    lb.shutdown();
}
