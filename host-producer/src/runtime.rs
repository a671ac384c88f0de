//! The process-wide producer state and the service's commands, without any
//! I/O (the connection module feeds it, tests drive it directly).
//!
//! The service talks to a producer through a handful of commands
//! (SetupTracing, SetupDataSource, StartDataSource, StopDataSource, Flush,
//! ClearIncrementalState) and expects replies through the [`Outbox`]. Each
//! command is a method here; their effects on the outbox are ordered as the
//! protocol needs (e.g. the last chunks of an instance are committed before
//! `NotifyDataSourceStopped`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::{Duration, Instant};

use shmtrace_abi::layout::PageLayout;

use crate::connection::outbox::{DescriptorInfo, Outbox, Outgoing};
use crate::data_source::{
    DataSourceConfig, DataSourceHandler, DataSourceOptions, DataSourceType, Instance, Kind,
};
use crate::error::RegisterError;
use crate::smb::arbiter::Arbiter;
use crate::smb::shm::SharedMemory;
use crate::stats::ProducerStats;

/// Name of the track event data source.
pub const TRACK_EVENT_DATA_SOURCE: &str = "track_event";

/// Triggers [`activate_triggers`](crate::activate_triggers) keeps while no
/// connection is up (each until its time to live runs out). A program
/// that activates more before a connection opens loses the newest ones
/// (counted in
/// [`ProducerStats::triggers_dropped`](crate::ProducerStats::triggers_dropped)),
/// after expired ones have made room.
pub const MAX_PENDING_TRIGGERS: usize = 256;

/// How long a flush waits for a startup trace being handed over to a
/// session (a copy of at most the startup buffer into the session's
/// shared memory).
const HANDOVER_WAIT: Duration = Duration::from_secs(2);

/// Triggers activated while no connection was up, oldest first, each with
/// the time it expires (`None`: a time to live beyond the clock's range,
/// never); bounded by [`MAX_PENDING_TRIGGERS`].
#[derive(Debug, Default)]
pub(crate) struct PendingTriggers {
    triggers: VecDeque<(String, Option<Instant>)>,
}

impl PendingTriggers {
    /// Keeps `names` until `expiry`; how many did not fit.
    pub(crate) fn keep(&mut self, names: &[&str], expiry: Option<Instant>, now: Instant) -> usize {
        let expired = self.drop_expired(now);
        if expired > 0 {
            note_expired(expired);
        }
        let room = MAX_PENDING_TRIGGERS - self.triggers.len();
        let kept = names.len().min(room);
        self.triggers
            .extend(names[..kept].iter().map(|n| ((*n).to_owned(), expiry)));
        names.len() - kept
    }

    /// Drops the triggers expired at `now`; how many.
    fn drop_expired(&mut self, now: Instant) -> usize {
        let before = self.triggers.len();
        // As upstream: a trigger lives while its expiry is after now.
        self.triggers
            .retain(|(_, expiry)| expiry.is_none_or(|e| e > now));
        before - self.triggers.len()
    }

    /// Takes every trigger still alive at `now`, oldest first, and the
    /// number of expired ones dropped.
    pub(crate) fn take(&mut self, now: Instant) -> (Vec<String>, usize) {
        let expired = self.drop_expired(now);
        (self.triggers.drain(..).map(|(n, _)| n).collect(), expired)
    }
}

fn note_expired(n: usize) {
    crate::stats::COUNTERS
        .triggers_expired
        .fetch_add(n as u64, Ordering::Relaxed);
}

/// The process-wide producer state.
pub(crate) struct Runtime {
    types: RwLock<Vec<Arc<DataSourceType>>>,
    outbox: Arc<Outbox>,
    arbiter: Mutex<Option<Arc<Arbiter>>>,
    next_id: AtomicU64,
    /// The track event data source was advertised: the program registered
    /// categories or made a dynamic one (upstream registers it only when
    /// the program initializes track events, too).
    track_event_advertised: AtomicBool,
    /// Orders registrations and track_event's updates among themselves and
    /// with a new connection's opening ([`Runtime::connect`]): an update
    /// overtaking its registration would be dropped by the service, and a
    /// data source registered while a connection opens must reach it
    /// exactly once.
    registration: Mutex<()>,
    /// Triggers waiting for a connection. Its lock also orders
    /// [`Runtime::activate_triggers`] with a connection's opening, so a
    /// trigger is either sent on the new connection or kept, never lost
    /// in between.
    triggers: Mutex<PendingTriggers>,
    /// Bumped with every registration or update queued for the service
    /// (each is followed by an [`Outgoing::Sync`] carrying the new
    /// value; see [`Runtime::registrations`]).
    registrations: AtomicU64,
}

pub(crate) fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(Runtime::new)
}

impl Runtime {
    /// A runtime with only the (not yet advertised) track event data
    /// source.
    fn new() -> Self {
        let outbox = Arc::new(Outbox::new());
        // Nothing is sent until a connection opens the outbox.
        outbox.set_closed(true);
        let track_event = Arc::new(DataSourceType::new(
            0,
            1,
            TRACK_EVENT_DATA_SOURCE.to_owned(),
            Kind::TrackEvent,
            // Sessions may not choose track_event's buffer-exhausted
            // policy (upstream's default): only the program can make its
            // threads stall.
            DataSourceOptions::default(),
            Arc::new(crate::track_event::TrackEventHandler),
        ));
        Runtime {
            types: RwLock::new(vec![track_event]),
            outbox,
            arbiter: Mutex::new(None),
            next_id: AtomicU64::new(2),
            track_event_advertised: AtomicBool::new(false),
            registration: Mutex::new(()),
            triggers: Mutex::new(PendingTriggers::default()),
            registrations: AtomicU64::new(1),
        }
    }

    fn types(&self) -> Vec<Arc<DataSourceType>> {
        self.types.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn arbiter_slot(&self) -> MutexGuard<'_, Option<Arc<Arbiter>>> {
        self.arbiter.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The track event data source type (always index 0).
    pub(crate) fn track_event(&self) -> Arc<DataSourceType> {
        self.types.read().unwrap_or_else(|e| e.into_inner())[0].clone()
    }

    pub(crate) fn outbox(&self) -> &Arc<Outbox> {
        &self.outbox
    }

    pub(crate) fn register_type(
        &self,
        name: &str,
        kind: Kind,
        options: DataSourceOptions,
        handler: Arc<dyn DataSourceHandler>,
    ) -> Result<Arc<DataSourceType>, RegisterError> {
        if name.is_empty() {
            return Err(RegisterError::EmptyName);
        }
        let _order = self.registration_order();
        let mut types = self.types.write().unwrap_or_else(|e| e.into_inner());
        // A program that never advertised track events (no categories: a
        // bridge forwarding a firmware's `track_event` chunks) may register
        // a data source of that name itself; the built-in one then never
        // is (see `advertise_track_event`).
        let claims_track_event = name == TRACK_EVENT_DATA_SOURCE
            && kind != Kind::TrackEvent
            && !self.track_event_advertised.load(Ordering::Acquire);
        if types
            .iter()
            .any(|t| t.name == name && !(claims_track_event && t.kind == Kind::TrackEvent))
        {
            return Err(RegisterError::AlreadyRegistered(name.to_owned()));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let ty = Arc::new(DataSourceType::new(
            types.len(),
            id,
            name.to_owned(),
            kind,
            options,
            handler,
        ));
        types.push(ty.clone());
        drop(types);
        self.push_registration(Outgoing::RegisterDataSource(descriptor(&ty)));
        Ok(ty)
    }

    /// Advertises the track event data source the first time (the program
    /// registered categories or made a dynamic one), and again when its
    /// categories `changed`.
    /// Not if the program registered a data source named `track_event`
    /// of its own: that one is the process's `track_event` then (logged
    /// once).
    pub(crate) fn advertise_track_event(&self, changed: bool) {
        if !changed && self.track_event_advertised.load(Ordering::Acquire) {
            return;
        }
        let _order = self.registration_order();
        if self.track_event_claimed() {
            static LOGGED: AtomicBool = AtomicBool::new(false);
            if !LOGGED.swap(true, Ordering::Relaxed) {
                log::warn!(
                    "shmtrace-producer: track events stay off: this program registered a data \
                     source named {TRACK_EVENT_DATA_SOURCE:?} of its own"
                );
            }
            return;
        }
        let d = descriptor(&self.track_event());
        if !self.track_event_advertised.swap(true, Ordering::AcqRel) {
            self.push_registration(Outgoing::RegisterDataSource(d));
        } else if changed {
            self.push_registration(Outgoing::UpdateDataSource(d));
        }
    }

    /// Queues a registration or update (under the registration lock),
    /// followed by a `Sync` whose reply tells when the service has handled
    /// it and sent the commands it prompted.
    fn push_registration(&self, msg: Outgoing) {
        let generation = self.registrations.fetch_add(1, Ordering::AcqRel) + 1;
        if self.outbox.push(msg) {
            self.outbox.push(Outgoing::Sync(generation));
        }
    }

    /// The registration generation: a connection whose `Sync` replies
    /// reached it has had every registration queued so far handled by
    /// the service, and the commands they prompted (a running session's
    /// `SetupDataSource` and `StartDataSource`) read.
    pub(crate) fn registrations(&self) -> u64 {
        self.registrations.load(Ordering::Acquire)
    }

    /// Data source instances that sessions started and have not stopped
    /// (the startup instance not counted).
    pub(crate) fn started_instances(&self) -> usize {
        self.types()
            .iter()
            .flat_map(|t| t.instances())
            .filter(|i| !i.is_startup() && i.is_live())
            .count()
    }

    /// Whether a data source the program registered is named
    /// `track_event`.
    fn track_event_claimed(&self) -> bool {
        self.types()
            .iter()
            .any(|t| t.kind != Kind::TrackEvent && t.name == TRACK_EVENT_DATA_SOURCE)
    }

    /// The data source a session's config names: the program's own
    /// `track_event`, if it registered one, before the built-in one.
    fn type_named(&self, name: &str) -> Option<Arc<DataSourceType>> {
        self.types().into_iter().rev().find(|t| t.name == name)
    }

    fn registration_order(&self) -> std::sync::MutexGuard<'_, ()> {
        self.registration.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new connection: the outbox accepts messages again, the data
    /// sources advertised so far queued in it first. The connection's
    /// sender registers them while its command thread reads the service's
    /// commands: a service that answers registrations with more commands
    /// than the IPC client queues, and blocks on its own full socket, never
    /// finds the producer busy sending instead of reading. One step under
    /// the registration lock, so a data source registered meanwhile is
    /// either among them or queued after them, never both, never neither.
    ///
    /// The triggers activated while no connection was up and not expired
    /// yet follow the registrations, in one `ActivateTriggers` (upstream
    /// sends them once connected, too); expired ones are dropped, counted
    /// and logged.
    pub(crate) fn connect(&self) {
        let _order = self.registration_order();
        let mut pending = self.pending_triggers();
        let (triggers, expired) = pending.take(Instant::now());
        if expired > 0 {
            note_expired(expired);
            log::info!(
                "shmtrace-producer: {expired} trigger(s) expired before a connection opened"
            );
        }
        let triggers = (!triggers.is_empty()).then_some(Outgoing::ActivateTriggers(triggers));
        let sync = Outgoing::Sync(self.registrations());
        self.outbox.open_with(
            self.descriptors()
                .into_iter()
                .map(Outgoing::RegisterDataSource)
                .chain(triggers)
                .chain([sync]),
        );
    }

    fn pending_triggers(&self) -> MutexGuard<'_, PendingTriggers> {
        self.triggers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`activate_triggers`](crate::activate_triggers): sent now if a
    /// connection is up, else kept until `ttl` from now.
    pub(crate) fn activate_triggers(&self, names: &[&str], ttl: Duration) {
        let names: Vec<&str> = names.iter().copied().filter(|n| !n.is_empty()).collect();
        if names.is_empty() {
            return;
        }
        let mut pending = self.pending_triggers();
        let msg = Outgoing::ActivateTriggers(names.iter().map(|n| (*n).to_owned()).collect());
        if self.outbox.push(msg) {
            return;
        }
        let now = Instant::now();
        let dropped = pending.keep(&names, now.checked_add(ttl), now);
        drop(pending);
        if dropped > 0 {
            crate::stats::COUNTERS
                .triggers_dropped
                .fetch_add(dropped as u64, Ordering::Relaxed);
            log::warn!(
                "shmtrace-producer: {dropped} trigger(s) dropped: {MAX_PENDING_TRIGGERS} already wait for a connection"
            );
        }
    }

    /// Every advertised data source, as the connection registers them.
    pub(crate) fn descriptors(&self) -> Vec<DescriptorInfo> {
        let track_event = self.track_event_advertised.load(Ordering::Acquire);
        self.types()
            .iter()
            .filter(|t| track_event || t.kind != Kind::TrackEvent)
            .map(|t| descriptor(t))
            .collect()
    }

    /// A connection without registrations (the loopback tests'): the
    /// outbox accepts messages again.
    #[cfg(test)]
    pub(crate) fn connected(&self) {
        self.outbox.set_closed(false);
    }

    /// SetupTracing: from now on writers use `shm`.
    pub(crate) fn setup_smb(&self, shm: SharedMemory, layout: PageLayout) -> Arc<Arbiter> {
        let chunks = shm.smb().num_pages() * layout.num_chunks();
        self.outbox.reserve(chunks);
        let arbiter = Arbiter::new(shm, layout, self.outbox.clone());
        if let Some(old) = self.arbiter_slot().replace(arbiter.clone()) {
            old.close();
        }
        arbiter
    }

    /// The current SMB's arbiter, if any.
    pub(crate) fn arbiter(&self) -> Option<Arc<Arbiter>> {
        self.arbiter_slot().clone()
    }

    /// The instance the service knows as `instance_id` (never the startup
    /// instance).
    fn find(&self, instance_id: u64) -> Option<(Arc<DataSourceType>, Arc<Instance>)> {
        if instance_id == crate::data_source::STARTUP_INSTANCE_ID {
            return None;
        }
        self.types()
            .into_iter()
            .find_map(|t| t.find(instance_id).map(|i| (t, i)))
    }

    /// SetupDataSource. Returns `false` if it cannot be set up (unknown
    /// name, no SMB yet, or all 8 instance slots busy).
    pub(crate) fn setup_data_source(&self, instance_id: u64, config: DataSourceConfig) -> bool {
        if self.find(instance_id).is_some() {
            return true;
        }
        let Some(arbiter) = self.arbiter() else {
            return false;
        };
        let Some(ty) = self.type_named(&config.name) else {
            return false;
        };
        ty.setup(instance_id, config, arbiter).is_some()
    }

    /// StartDataSource: enables tracing, then NotifyDataSourceStarted.
    pub(crate) fn start_data_source(&self, instance_id: u64) {
        if let Some((ty, inst)) = self.find(instance_id) {
            // A track event session may take over the startup trace.
            if ty.kind != Kind::TrackEvent || !crate::track_event::startup::adopt(&ty, &inst) {
                ty.start(&inst);
            }
        }
        // Acknowledged even for unknown ids, so the service never waits.
        self.outbox
            .push(Outgoing::DataSourceStarted { instance_id });
    }

    /// StopDataSource: flushes and retires the instance's writers, then
    /// NotifyDataSourceStopped.
    pub(crate) fn stop_data_source(&self, instance_id: u64) {
        if let Some((ty, inst)) = self.find(instance_id) {
            ty.stop(&inst);
        }
        self.outbox
            .push(Outgoing::DataSourceStopped { instance_id });
    }

    /// Flush: flushes the writers of the listed instances (all, if the list
    /// is empty), then acknowledges `request_id`. Writers busy in an event
    /// are given one short wait for all of them
    /// ([`wait_for_flushes`](crate::data_source::wait_for_flushes)); one
    /// still busy after it (stalling for a chunk) flushes when its event
    /// ends, after the acknowledgement.
    pub(crate) fn flush(&self, instance_ids: &[u64], request_id: u64) {
        // A startup trace being handed over precedes the acknowledgement.
        crate::track_event::startup::wait_handed_over(HANDOVER_WAIT);
        let mut busy = Vec::new();
        for ty in self.types() {
            for inst in ty.instances() {
                if instance_ids.is_empty() || instance_ids.contains(&inst.id) {
                    busy.extend(ty.flush(&inst));
                }
            }
        }
        crate::data_source::wait_for_flushes(&busy);
        if request_id != 0 {
            self.outbox.ack_flush(request_id);
        } else {
            self.outbox.kick();
        }
    }

    /// ClearIncrementalState for the listed instances (each once, however
    /// often listed; the service's list is walked once per instance, not
    /// searched once per entry).
    pub(crate) fn clear_incremental_state(&self, instance_ids: &[u64]) {
        for ty in self.types() {
            for inst in ty.instances() {
                if instance_ids.contains(&inst.id) {
                    ty.clear_incremental_state(&inst);
                }
            }
        }
    }

    /// Periodic housekeeping: flushes writers idle since the last call.
    pub(crate) fn sweep_idle(&self) -> usize {
        self.arbiter().map_or(0, |a| a.sweep_idle())
    }

    /// The connection is gone: every instance stops (without notifying),
    /// the SMB is released once its writers let go, nothing more is sent.
    pub(crate) fn disconnected(&self) {
        let arbiter = self.arbiter_slot().take();
        if let Some(a) = &arbiter {
            a.close();
        }
        self.outbox.set_closed(true);
        for ty in self.types() {
            // The startup instance waits for a session on any connection.
            for inst in ty.instances().into_iter().filter(|i| !i.is_startup()) {
                ty.stop(&inst);
            }
        }
    }
}

fn descriptor(ty: &DataSourceType) -> DescriptorInfo {
    DescriptorInfo {
        name: ty.name.clone(),
        id: ty.id,
        no_flush: ty.options.no_flush,
        track_event_descriptor: (ty.kind == Kind::TrackEvent)
            .then(crate::track_event::serialized_descriptor),
        extra_fields: ty.options.extra_descriptor_fields.clone(),
    }
}

/// Data-path counters of this process (chunks, stalls, drops), summed over
/// every connection so far.
pub fn stats() -> ProducerStats {
    let mut stats = ProducerStats::default();
    crate::smb::arbiter::COUNTERS.read_into(&mut stats);
    crate::stats::COUNTERS.read_into(&mut stats);
    stats
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NoopHandler;

    /// The data sources a new connection of `rt` registers, and whatever
    /// else is queued: (name, id, whether it is the track event type).
    fn registered(rt: &Runtime) -> Vec<(String, u64, bool)> {
        rt.connect();
        let mut out = Vec::new();
        while let Some(msg) = rt.outbox().try_next() {
            match msg {
                Outgoing::RegisterDataSource(d) => {
                    out.push((d.name, d.id, d.track_event_descriptor.is_some()))
                }
                Outgoing::Sync(_) => {}
                other => panic!("unexpected message {other:?}"),
            }
        }
        out
    }

    fn custom(rt: &Runtime, name: &str) -> Result<Arc<DataSourceType>, RegisterError> {
        rt.register_type(
            name,
            Kind::Custom,
            DataSourceOptions::default(),
            Arc::new(NoopHandler),
        )
    }

    #[test]
    fn a_program_without_track_events_may_register_its_own_track_event() {
        let rt = Runtime::new();
        let own = custom(&rt, TRACK_EVENT_DATA_SOURCE).expect("the name is free");
        assert_eq!(
            registered(&rt),
            [(TRACK_EVENT_DATA_SOURCE.to_owned(), own.id, false)],
            "only the program's own track_event is advertised"
        );
        assert_eq!(
            rt.type_named(TRACK_EVENT_DATA_SOURCE).map(|t| t.id),
            Some(own.id)
        );
        // Categories registered later do not bring the built-in one back.
        rt.advertise_track_event(true);
        assert!(rt.outbox().try_next().is_none());
        assert!(matches!(
            custom(&rt, TRACK_EVENT_DATA_SOURCE),
            Err(RegisterError::AlreadyRegistered(_))
        ));
    }

    #[test]
    fn track_event_is_taken_once_track_events_are_advertised() {
        let rt = Runtime::new();
        rt.advertise_track_event(false);
        assert!(matches!(
            custom(&rt, TRACK_EVENT_DATA_SOURCE),
            Err(RegisterError::AlreadyRegistered(_))
        ));
        let registered = registered(&rt);
        assert_eq!(registered.len(), 1);
        assert!(registered[0].2, "the built-in track event data source");
        assert_eq!(
            rt.type_named(TRACK_EVENT_DATA_SOURCE).map(|t| t.id),
            Some(rt.track_event().id)
        );
    }
}
