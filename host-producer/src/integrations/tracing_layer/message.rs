//! Literal messages: the text of a `fmt::Arguments` without arguments,
//! which `tracing` hands over as a `&dyn Debug`, read without formatting.
//!
//! `tracing`'s macros pass an event's message (`info!("drawn")`) as a
//! `fmt::Arguments`, and its `Value` impl hands that to a visitor as a
//! `&dyn Debug`: formatting it runs `core::fmt`'s machinery twice (our
//! `{:?}`, then the arguments' own pieces) for text known at compile time.
//! [`literal_if_learnt`] recognises such a value by its vtable, the one
//! `tracing_core`'s `Value` impl for `fmt::Arguments` makes, learnt once
//! by handing that impl an `Arguments` of our own ([`learn_once`]);
//! `Arguments::as_str` then
//! has the text of a message without arguments.
//!
//! # Invariants
//!
//! * A vtable pointer equal to the learnt one is a `fmt::Arguments`'s
//!   `Debug` vtable (see the `SAFETY` comment in `literal_learnt`). The learnt
//!   pointer's address is never read.
//! * Whatever is not recognised (a vtable emitted more than once compares
//!   unequal, a message with arguments has no `as_str`) is formatted as
//!   before, to the same text.
// `unsafe` here: a trait object's lifetime erased (raw pointers, never
// dereferenced), and a `&dyn Debug` read as the `fmt::Arguments` it is.
#![allow(unsafe_code)]

use std::fmt;
use std::sync::OnceLock;

use tracing_core::field::{Field, Value, Visit};

/// A pointer carrying the vtable of a `fmt::Arguments` handed over by
/// `tracing`; its address (of a value long gone) is never read.
struct ArgsVtable(*const (dyn fmt::Debug + 'static));

// SAFETY: the pointer is never dereferenced, only its vtable compared
// (vtables are immutable statics).
unsafe impl Send for ArgsVtable {}
// SAFETY: as for `Send`.
unsafe impl Sync for ArgsVtable {}

/// The learnt vtable (`None`: `tracing` handed a probe over otherwise).
static ARGS: OnceLock<Option<ArgsVtable>> = OnceLock::new();

/// The text of `value` if it is a `fmt::Arguments` without arguments as
/// `tracing` hands one over; [`Literal::Unknown`] until [`learn_once`]
/// learnt the vtable (a caller keeps the learning out of its hot path).
#[inline(always)]
pub(super) fn literal_if_learnt(value: &dyn fmt::Debug) -> Literal {
    match ARGS.get() {
        None => Literal::Unknown,
        Some(None) => Literal::Not,
        Some(Some(known)) => match literal_learnt(known, value) {
            Some(text) => Literal::Text(text),
            None => Literal::Not,
        },
    }
}

/// What [`literal_if_learnt`] makes of a value.
pub(super) enum Literal {
    /// A message without arguments: its text.
    Text(&'static str),
    /// Anything else.
    Not,
    /// Not known yet: see [`learn_once`].
    Unknown,
}

/// Learns the vtable (from `tracing`'s handing over of a probe to the
/// visitor of `field`), if not done yet.
#[cold]
#[inline(never)]
pub(super) fn learn_once(field: &Field) {
    ARGS.get_or_init(|| learn(field));
}

/// The text of `value` if it is a `fmt::Arguments` without arguments as
/// `tracing` hands one over, by the learnt vtable `known`; else `None`.
#[inline(always)]
fn literal_learnt(known: &ArgsVtable, value: &dyn fmt::Debug) -> Option<&'static str> {
    let p: *const dyn fmt::Debug = value;
    // The learnt vtable with `value`'s address: equal to `p` iff the
    // vtables are.
    let probe = known.0.with_addr(p.addr());
    // Comparing the vtables is the point.
    #[allow(ambiguous_wide_pointer_comparisons)]
    if !std::ptr::eq(probe, p) {
        return None;
    }
    // SAFETY: `p` has the vtable rustc made for `fmt::Arguments` as
    // `dyn Debug` (`learn` took it from a `fmt::Arguments` coerced by the
    // same code). A vtable belongs to one type; rustc may give two types
    // one vtable only if the two are identical (size, alignment, drop and
    // the very same `fmt` code, which reads the value's bytes as a
    // `fmt::Arguments`). So `p` points to a `fmt::Arguments` borrowed for
    // as long as `value`.
    let args = unsafe { &*p.cast::<fmt::Arguments<'_>>() };
    args.as_str()
}

/// Hands `tracing_core`'s `Value` impl for `fmt::Arguments` an
/// `Arguments` of ours and keeps the vtable it comes back with.
#[cold]
fn learn(field: &Field) -> Option<ArgsVtable> {
    struct Probe(Option<ArgsVtable>);
    impl Visit for Probe {
        fn record_debug(&mut self, _field: &Field, value: &dyn fmt::Debug) {
            let p: *const dyn fmt::Debug = value;
            // SAFETY: only the trait object's lifetime changes, on a raw
            // pointer that is never dereferenced (`ArgsVtable`).
            let p = unsafe {
                std::mem::transmute::<*const (dyn fmt::Debug + '_), *const (dyn fmt::Debug + 'static)>(
                    p,
                )
            };
            self.0 = Some(ArgsVtable(p));
        }
    }
    let mut probe = Probe(None);
    Value::record(&format_args!("probe"), field, &mut probe);
    probe.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Collects what `literal` makes of each field.
    struct Literals(Vec<Option<&'static str>>);

    impl Visit for Literals {
        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            learn_once(field);
            self.0.push(match literal_if_learnt(value) {
                Literal::Text(text) => Some(text),
                Literal::Not | Literal::Unknown => None,
            });
        }
    }

    #[test]
    fn only_a_message_without_arguments_is_literal() {
        type Seen = std::sync::Arc<std::sync::Mutex<Vec<Option<&'static str>>>>;
        struct Sub(Seen);
        impl tracing_core::Subscriber for Sub {
            fn enabled(&self, _: &tracing_core::Metadata<'_>) -> bool {
                true
            }
            fn new_span(&self, _: &tracing_core::span::Attributes<'_>) -> tracing_core::span::Id {
                tracing_core::span::Id::from_u64(1)
            }
            fn record(&self, _: &tracing_core::span::Id, _: &tracing_core::span::Record<'_>) {}
            fn record_follows_from(&self, _: &tracing_core::span::Id, _: &tracing_core::span::Id) {}
            fn event(&self, event: &tracing_core::Event<'_>) {
                let mut l = Literals(Vec::new());
                event.record(&mut l);
                self.0.lock().unwrap().extend(l.0);
            }
            fn enter(&self, _: &tracing_core::span::Id) {}
            fn exit(&self, _: &tracing_core::span::Id) {}
        }
        let n = 7;
        let collected = Seen::default();
        tracing::subscriber::with_default(Sub(collected.clone()), || {
            tracing::info!("plain text");
            tracing::info!("with {n} in it");
            tracing::info!(a = ?"debug", b = format_args!("args"), c = format_args!("{n}"), "last");
        });
        assert_eq!(
            *collected.lock().unwrap(),
            [
                Some("plain text"),
                None,
                // The message comes first.
                Some("last"),
                // `?"debug"`: a `&str`'s `Debug`, not an `Arguments`.
                None,
                Some("args"),
                None,
            ]
        );
    }
}
