//! Track events as a data source built on the generic layer
//! ([`crate::data_source`]): the `track_event` type, reserved in the
//! process's registry on first use and advertised once the program uses
//! track events (categories registered, a dynamic category made, the
//! `tracing` layer or `log` logger made); its handler, which installs each
//! session's category filter while it runs; its `TrackEventDescriptor`;
//! and the session observers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use shmtrace_abi::trace::{
    track_event_category as category_field, track_event_descriptor as descriptor,
};
use shmtrace_ipc::protos::vec_sink::encode_to_vec;

use crate::data_source::registry::{registry as types, Advertised, TypeRegistry};
use crate::data_source::{
    DataSourceHandler, DataSourceOptions, DataSourceType, InstanceArgs, SetupArgs,
};
use crate::track_event::category::registry;

/// Name of the track event data source.
pub const TRACK_EVENT_DATA_SOURCE: &str = "track_event";

/// Callbacks about track event sessions, run on the producer's connection
/// thread.
pub trait TrackEventSessionObserver: Send + Sync {
    /// A session configured track events (not started yet).
    fn on_setup(&self, _args: &SetupArgs<'_>) {}
    /// A session started; events emitted here are recorded.
    fn on_start(&self, _args: &InstanceArgs<'_>) {}
    /// A session is stopping; events emitted here are still recorded.
    fn on_stop(&self, _args: &InstanceArgs<'_>) {}
}

type Observers = Mutex<Vec<Arc<dyn TrackEventSessionObserver>>>;

fn observers() -> &'static Observers {
    static OBSERVERS: Observers = Mutex::new(Vec::new());
    &OBSERVERS
}

fn each_observer(f: impl Fn(&dyn TrackEventSessionObserver)) {
    let list = observers()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    for o in list {
        f(&*o);
    }
}

/// Adds a session observer.
pub fn add_session_observer(observer: Arc<dyn TrackEventSessionObserver>) {
    observers()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(observer);
}

/// Removes a session observer added with [`add_session_observer`].
pub fn remove_session_observer(observer: &Arc<dyn TrackEventSessionObserver>) {
    observers()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|o| !Arc::ptr_eq(o, observer));
}

/// The track event data source's callbacks: installs a session's category
/// filter while it runs, and tells the observers.
struct TrackEventHandler;

impl DataSourceHandler for TrackEventHandler {
    fn on_setup(&self, args: &SetupArgs<'_>) {
        each_observer(|o| o.on_setup(args));
    }
    /// The session's categories are enabled before its observers hear of
    /// it (an event they emit is recorded).
    fn on_start(&self, args: &InstanceArgs<'_>) {
        let filter = args.config.track_event_config.clone().unwrap_or_default();
        registry().set_filter(args.instance_index, Some(filter));
        each_observer(|o| o.on_start(args));
    }
    /// The observers hear of it while its categories are still enabled.
    fn on_stop(&self, args: &InstanceArgs<'_>) {
        each_observer(|o| o.on_stop(args));
        registry().set_filter(args.instance_index, None);
    }
}

/// The serialized `TrackEventDescriptor` advertising the registered
/// categories (`available_categories`: name, description, tags).
pub(crate) fn serialized_descriptor() -> Vec<u8> {
    let cats = registry().advertised();
    let mut buf = Vec::new();
    let written = encode_to_vec(&mut buf, |d| {
        // A group ("a,b") is not a category of its own: upstream leaves
        // groups out, and so do we.
        for c in cats.iter().filter(|c| !c.is_group()) {
            d.nested(descriptor::AVAILABLE_CATEGORIES, |e| {
                e.string(category_field::NAME, c.name());
                if !c.description().is_empty() {
                    e.string(category_field::DESCRIPTION, c.description());
                }
                for t in c.tags() {
                    e.string(category_field::TAGS, t);
                }
            });
        }
    });
    match written {
        Ok(()) => buf,
        Err(_) => Vec::new(),
    }
}

/// Reserves the track event data source in `types` (not advertised yet).
fn reserve(types: &TypeRegistry) -> Arc<DataSourceType> {
    types.reserve(
        TRACK_EVENT_DATA_SOURCE,
        // Sessions may not choose track_event's buffer-exhausted policy
        // (upstream's default): only the program can make its threads
        // stall.
        DataSourceOptions::default(),
        Arc::new(TrackEventHandler),
        Some(serialized_descriptor),
    )
}

/// The track event data source type (cached: one load per event).
#[inline]
pub(crate) fn track_event_type() -> &'static Arc<DataSourceType> {
    static TYPE: OnceLock<Arc<DataSourceType>> = OnceLock::new();
    TYPE.get_or_init(|| reserve(types()))
}

/// Advertises the track event data source the first time (the program
/// registered categories, made a dynamic one, or the `tracing` layer or
/// `log` logger), and again when its categories `changed`. Not if the
/// program registered a data source named `track_event` of its own: that
/// one is the process's `track_event` then (logged once).
pub(crate) fn advertise(changed: bool) {
    // A data source type's atomics are loom's under loom, which exist only
    // inside a model: there the process-wide type is never made (models
    // make the types they race; `data_source::loom_model`).
    if cfg!(loom) {
        return;
    }
    if types().advertise(track_event_type(), changed) == Advertised::NameTaken {
        static LOGGED: AtomicBool = AtomicBool::new(false);
        if !LOGGED.swap(true, Ordering::Relaxed) {
            log::warn!(
                "shmtrace-producer: track events stay off: this program registered a data \
                 source named {TRACK_EVENT_DATA_SOURCE:?} of its own"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::outbox::{Outbox, Outgoing};
    use crate::error::RegisterError;
    use crate::NoopHandler;

    /// A registry of its own, its outbox closed as the process's is before
    /// a connection.
    fn local() -> TypeRegistry {
        let outbox = Arc::new(Outbox::new());
        outbox.set_closed(true);
        TypeRegistry::new(outbox)
    }

    /// The data sources a new connection of `types` registers, and
    /// whatever else is queued: (name, id, whether it has a track event
    /// descriptor).
    fn registered(types: &TypeRegistry) -> Vec<(String, u64, bool)> {
        let descriptors = types.descriptors();
        types
            .outbox()
            .open_with(descriptors.into_iter().map(Outgoing::RegisterDataSource));
        let mut out = Vec::new();
        while let Some(msg) = types.outbox().try_next() {
            match msg {
                Outgoing::RegisterDataSource(d) => {
                    out.push((d.name, d.id, d.track_event_descriptor.is_some()))
                }
                other => panic!("unexpected message {other:?}"),
            }
        }
        out
    }

    fn custom(types: &TypeRegistry, name: &str) -> Result<Arc<DataSourceType>, RegisterError> {
        types.register(name, DataSourceOptions::default(), Arc::new(NoopHandler))
    }

    #[test]
    fn a_program_without_track_events_may_register_its_own_track_event() {
        let types = local();
        let te = reserve(&types);
        let own = custom(&types, TRACK_EVENT_DATA_SOURCE).expect("the name is free");
        assert_eq!(
            registered(&types),
            [(TRACK_EVENT_DATA_SOURCE.to_owned(), own.id, false)],
            "only the program's own track_event is advertised"
        );
        assert_eq!(
            types.type_named(TRACK_EVENT_DATA_SOURCE).map(|t| t.id),
            Some(own.id)
        );
        // Categories registered later do not bring the built-in one back.
        assert_eq!(types.advertise(&te, true), Advertised::NameTaken);
        assert!(types.outbox().try_next().is_none());
        assert!(matches!(
            custom(&types, TRACK_EVENT_DATA_SOURCE),
            Err(RegisterError::AlreadyRegistered(_))
        ));
    }

    #[test]
    fn a_track_event_registered_before_the_reservation_is_the_process_s() {
        let types = local();
        let own = custom(&types, TRACK_EVENT_DATA_SOURCE).expect("the name is free");
        let te = reserve(&types);
        assert_eq!(
            types.type_named(TRACK_EVENT_DATA_SOURCE).map(|t| t.id),
            Some(own.id)
        );
        assert_eq!(types.advertise(&te, false), Advertised::NameTaken);
        assert_eq!(
            registered(&types),
            [(TRACK_EVENT_DATA_SOURCE.to_owned(), own.id, false)]
        );
    }

    #[test]
    fn track_event_is_taken_once_track_events_are_advertised() {
        let types = local();
        let te = reserve(&types);
        assert_eq!(types.advertise(&te, false), Advertised::Done);
        assert!(matches!(
            custom(&types, TRACK_EVENT_DATA_SOURCE),
            Err(RegisterError::AlreadyRegistered(_))
        ));
        let registered = registered(&types);
        assert_eq!(registered.len(), 1);
        assert!(registered[0].2, "the built-in track event data source");
        assert_eq!(
            types.type_named(TRACK_EVENT_DATA_SOURCE).map(|t| t.id),
            Some(te.id)
        );
    }
}
