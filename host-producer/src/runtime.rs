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
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use shmtrace_abi::layout::PageLayout;
use shmtrace_ipc::shm::SharedMemory;

use crate::connection::outbox::{DescriptorInfo, Outbox, Outgoing};
use crate::data_source::registry::{registry, TypeRegistry};
use crate::data_source::DataSourceConfig;
use crate::smb::arbiter::Arbiter;
use crate::stats::ProducerStats;

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
    /// Keeps `names` until `expiry`, after dropping the triggers expired
    /// at `now` to make room: how many of `names` did not fit, and how
    /// many expired ones were dropped (the caller counts both).
    pub(crate) fn keep(
        &mut self,
        names: &[&str],
        expiry: Option<Instant>,
        now: Instant,
    ) -> (usize, usize) {
        let expired = self.drop_expired(now);
        let room = MAX_PENDING_TRIGGERS - self.triggers.len();
        let kept = names.len().min(room);
        self.triggers
            .extend(names[..kept].iter().map(|n| ((*n).to_owned(), expiry)));
        (names.len() - kept, expired)
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

/// The process-wide producer state: the data source types (the
/// [`TypeRegistry`], which the layers below reach directly), the current
/// SMB's arbiter and the triggers waiting for a connection.
pub(crate) struct Runtime {
    types: &'static TypeRegistry,
    arbiter: Mutex<Option<Arc<Arbiter>>>,
    /// Triggers waiting for a connection. Its lock also orders
    /// [`Runtime::activate_triggers`] with a connection's opening, so a
    /// trigger is either sent on the new connection or kept, never lost
    /// in between.
    triggers: Mutex<PendingTriggers>,
}

pub(crate) fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(Runtime::new)
}

impl Runtime {
    /// The runtime over the process's data source types.
    fn new() -> Self {
        // Whatever caches category enablement (the `tracing` layer's
        // callsite interest) hears when it may have changed. Installed
        // here, before any session can enable a category.
        #[cfg(feature = "tracing")]
        crate::track_event::category::on_enabled_set_changed(
            crate::integrations::tracing_layer::enabled_categories_changed,
        );
        Runtime {
            types: registry(),
            arbiter: Mutex::new(None),
            triggers: Mutex::new(PendingTriggers::default()),
        }
    }

    fn arbiter_slot(&self) -> MutexGuard<'_, Option<Arc<Arbiter>>> {
        self.arbiter.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn outbox(&self) -> &Arc<Outbox> {
        self.types.outbox()
    }

    /// Advertises the track event data source (the `tracing` layer and
    /// the `log` logger call it when made: see
    /// [`track_event::data_source::advertise`](crate::track_event::data_source::advertise)).
    #[cfg(any(feature = "tracing", feature = "log"))]
    pub(crate) fn advertise_track_event(&self, changed: bool) {
        crate::track_event::data_source::advertise(changed);
    }

    /// The registration generation: a connection whose `Sync` replies
    /// reached it has had every registration queued so far handled by
    /// the service, and the commands they prompted (a running session's
    /// `SetupDataSource` and `StartDataSource`) read.
    pub(crate) fn registrations(&self) -> u64 {
        self.types.registrations()
    }

    /// Data source instances that sessions started and have not stopped
    /// (the startup instance not counted).
    pub(crate) fn started_instances(&self) -> usize {
        self.types
            .types()
            .iter()
            .flat_map(|t| t.instances())
            .filter(|i| !i.is_startup() && i.is_live())
            .count()
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
        let _order = self.types.registration_order();
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
        self.outbox().open_with(
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
        if self.outbox().push(msg) {
            return;
        }
        let now = Instant::now();
        let (dropped, expired) = pending.keep(&names, now.checked_add(ttl), now);
        drop(pending);
        if expired > 0 {
            note_expired(expired);
        }
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
        self.types.descriptors()
    }

    /// A connection without registrations (the loopback tests'): the
    /// outbox accepts messages again.
    #[cfg(test)]
    pub(crate) fn connected(&self) {
        self.outbox().set_closed(false);
    }

    /// SetupTracing: from now on writers use `shm` (`emulated`: shmem
    /// emulation, its chunks travel inside `CommitData`).
    pub(crate) fn setup_smb(
        &self,
        shm: SharedMemory,
        emulated: bool,
        layout: PageLayout,
    ) -> Arc<Arbiter> {
        let chunks = shm.smb().num_pages() * layout.num_chunks();
        self.outbox().reserve(chunks);
        let arbiter = Arbiter::new(shm, emulated, layout, self.outbox().clone());
        if let Some(old) = self.arbiter_slot().replace(arbiter.clone()) {
            old.close();
        }
        arbiter
    }

    /// The current SMB's arbiter, if any.
    pub(crate) fn arbiter(&self) -> Option<Arc<Arbiter>> {
        self.arbiter_slot().clone()
    }

    /// SetupDataSource. Returns `false` if it cannot be set up (unknown
    /// name, no SMB yet, or all 8 instance slots busy).
    pub(crate) fn setup_data_source(&self, instance_id: u64, config: DataSourceConfig) -> bool {
        if self.types.find(instance_id).is_some() {
            return true;
        }
        let Some(arbiter) = self.arbiter() else {
            return false;
        };
        let Some(ty) = self.types.type_named(&config.name) else {
            return false;
        };
        ty.setup(instance_id, config, arbiter).is_some()
    }

    /// StartDataSource: enables tracing, then NotifyDataSourceStarted.
    pub(crate) fn start_data_source(&self, instance_id: u64) {
        if let Some((ty, inst)) = self.types.find(instance_id) {
            // A track event session may take over the startup trace.
            if !crate::track_event::startup::adopt(&ty, &inst) {
                ty.start(&inst);
            }
        }
        // Acknowledged even for unknown ids, so the service never waits.
        self.outbox()
            .push(Outgoing::DataSourceStarted { instance_id });
    }

    /// StopDataSource: flushes and retires the instance's writers, then
    /// NotifyDataSourceStopped.
    pub(crate) fn stop_data_source(&self, instance_id: u64) {
        if let Some((ty, inst)) = self.types.find(instance_id) {
            ty.stop(&inst);
        }
        self.outbox()
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
        for ty in self.types.types() {
            for inst in ty.instances() {
                if instance_ids.is_empty() || instance_ids.contains(&inst.id) {
                    busy.extend(ty.flush(&inst));
                }
            }
        }
        crate::data_source::wait_for_flushes(&busy);
        if request_id != 0 {
            self.outbox().ack_flush(request_id);
        } else {
            self.outbox().kick();
        }
    }

    /// ClearIncrementalState for the listed instances (each once, however
    /// often listed; the service's list is walked once per instance, not
    /// searched once per entry).
    pub(crate) fn clear_incremental_state(&self, instance_ids: &[u64]) {
        for ty in self.types.types() {
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
        let unsent = self.outbox().set_closed(true);
        if let Some(a) = &arbiter {
            a.note_undelivered(unsent);
        }
        for ty in self.types.types() {
            // The startup instance waits for a session on any connection.
            for inst in ty.instances().into_iter().filter(|i| !i.is_startup()) {
                ty.stop(&inst);
            }
        }
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
