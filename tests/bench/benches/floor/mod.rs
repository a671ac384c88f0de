//! The least a `tracing` layer that records spans and events can do: the
//! floor under every layer's added cost.
//!
//! [`Floor`] reads a TSC clock (`fastant`, fastrace's clock) when a span is
//! entered or exited and per event, and visits the fields of new spans and
//! events (`tracing` hands each to a visitor; this one drops it). It writes
//! nothing: any layer that records a span's times or an event's time and
//! fields does at least this much.

use std::fmt;
use std::hint::black_box;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// See the module docs.
pub struct Floor;

/// Takes each field `tracing` hands over, and drops it.
struct Ignore;

impl Visit for Ignore {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        black_box((field, value));
    }
}

impl<S: Subscriber> Layer<S> for Floor {
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        attrs.record(&mut Ignore);
    }
    fn on_enter(&self, _: &Id, _: Context<'_, S>) {
        black_box(fastant::Instant::now());
    }
    fn on_exit(&self, _: &Id, _: Context<'_, S>) {
        black_box(fastant::Instant::now());
    }
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        black_box(fastant::Instant::now());
        event.record(&mut Ignore);
    }
}
