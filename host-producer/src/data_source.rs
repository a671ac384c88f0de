//! Data sources: the types a program registers, their instances (one per
//! tracing session that asked for them, at most [`MAX_INSTANCES`] at a
//! time), and the per-thread writers that serve each instance.
//!
//! # Fast path
//!
//! `DataSource::is_enabled` (and a category's `is_enabled`) is one relaxed
//! load of a bitmask of running instance slots. When enabled, each set bit
//! costs: a thread-local lookup, one acquire load of the slot's generation
//! (compared with the one the thread's writer was made for), and the
//! writer's owner lock (with membarrier: two plain stores and a load, no
//! atomic read-modify-write; see `writer`). A writer is
//! created on a thread's first event for an instance (slow path: locks,
//! allocation, `RegisterTraceWriter`).
//!
//! # Invariants
//!
//! * A slot's generation changes when an instance is set up in it and when
//!   that instance stops; a thread-local writer is used only while the
//!   generation it was created under is current.
//! * An instance's writer list and its `stopped` flag share one lock:
//!   writers are only added to an instance that has not stopped, and
//!   stopping takes the whole list, so every writer of an instance is
//!   flushed and retired exactly once (by the stop, or by its thread's exit,
//!   whichever removes it from the list first).
//! * Events emitted from inside an event callback on the same thread
//!   (re-entrancy) are dropped rather than deadlocking on the thread's own
//!   writer lock.
//!
//! The slot mask, generations, hand-over word, locks and the threads'
//! writers are [`crate::sync`]'s: under `RUSTFLAGS="--cfg loom"`,
//! `loom_model` races an event with a startup adoption
//! ([`DataSourceType::start_replacing`]) on this code.

pub(crate) mod forward;
pub(crate) mod registry;

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use shmtrace_abi::proto::Message;
use shmtrace_abi::writer::TraceWriter;

use crate::connection::outbox::Outgoing;
use crate::data_source::registry::registry;
use crate::smb::arbiter::{Arbiter, BufferExhaustedPolicy};
use crate::smb::writer::{
    request_all, wait_deferred, ProducerSink, WriterCell, WriterInner, FLAG_CLEAR, FLAG_DEAD,
    FLAG_FLUSH, FLAG_RETIRE,
};
use crate::sync::{self, AtomicU32, AtomicU64, AtomicU8, Mutex, MutexGuard};
use crate::track_event::category::MAX_INSTANCES;
use crate::track_event::filter::TrackEventConfig;

/// The instance id of the startup tracing instance (`track_event::startup`),
/// which the program sets up itself: the service's ids count up from 1 and
/// never reach it.
pub(crate) const STARTUP_INSTANCE_ID: u64 = u64::MAX;

/// How long a writer stalls for a chunk when a session's config asks for a
/// stalling policy.
pub const CONFIG_STALL_LIMIT: Duration = Duration::from_secs(2);

/// How long a flush or a stop waits, in all, for writers busy in an event
/// to do what it asked (flush, retire) before it reports done anyway;
/// those writers then do it when their event ends (`writer` module docs,
/// deferred work). A writer stalling for a chunk may take seconds.
const HOUSEKEEPING_WAIT: Duration = Duration::from_millis(100);

/// The parts of a `DataSourceConfig` this crate uses, plus the whole
/// serialized message for data sources that read their own fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataSourceConfig {
    /// `name` (1).
    pub name: String,
    /// `target_buffer` (2): global id of the buffer to write into.
    pub target_buffer: u32,
    /// `trace_duration_ms` (3).
    pub trace_duration_ms: u32,
    /// `tracing_session_id` (4).
    pub tracing_session_id: u64,
    /// `track_event_config` (113), decoded, if present.
    pub track_event_config: Option<TrackEventConfig>,
    /// `buffer_exhausted_policy` (9): `Some(true)` for the stalling ones
    /// (`STALL_THEN_DROP`, `STALL_THEN_ABORT`), `Some(false)` for `DROP`.
    pub stall_when_exhausted: Option<bool>,
    /// The serialized `DataSourceConfig` as the service sent it.
    pub raw: Vec<u8>,
}

/// Arguments of [`DataSourceHandler::on_setup`].
#[derive(Debug)]
pub struct SetupArgs<'a> {
    /// Instance slot (0..8); stable for the instance's life.
    pub instance_index: usize,
    /// The service's id for this instance.
    pub instance_id: u64,
    /// The instance's config.
    pub config: &'a DataSourceConfig,
}

/// Arguments of [`DataSourceHandler::on_start`] and
/// [`DataSourceHandler::on_stop`].
#[derive(Debug)]
pub struct InstanceArgs<'a> {
    /// Instance slot (0..8).
    pub instance_index: usize,
    /// The service's id for this instance.
    pub instance_id: u64,
    /// The instance's config.
    pub config: &'a DataSourceConfig,
}

/// Callbacks of a data source. All run on the producer's connection
/// thread; events may be emitted from `on_start` and `on_stop` (they are
/// recorded), not from `on_setup`.
pub trait DataSourceHandler: Send + Sync + 'static {
    /// A session configured an instance (not started yet).
    fn on_setup(&self, _args: &SetupArgs<'_>) {}
    /// The instance started: tracing is enabled for it.
    fn on_start(&self, _args: &InstanceArgs<'_>) {}
    /// The instance is stopping: tracing is still enabled during the call.
    fn on_stop(&self, _args: &InstanceArgs<'_>) {}
    /// The service asked for a flush; the instance's writers are flushed
    /// right after this returns.
    fn on_flush(&self, _args: &InstanceArgs<'_>) {}
    /// The service asked the instance to clear its incremental state
    /// (`ClearIncrementalState`). The instance's own writers re-emit their
    /// state by themselves (see
    /// [`TraceContext::take_incremental_state_cleared`]); a data source
    /// whose packets are written elsewhere (a firmware, a relay) passes the
    /// request on from here.
    fn on_clear_incremental_state(&self, _args: &InstanceArgs<'_>) {}
}

/// A handler that does nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopHandler;

impl DataSourceHandler for NoopHandler {}

/// How a data source is advertised and how its writers behave.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataSourceOptions {
    /// What writers do when the SMB is full.
    pub buffer_exhausted_policy: BufferExhaustedPolicy,
    /// Let a session's `DataSourceConfig.buffer_exhausted_policy` override
    /// [`Self::buffer_exhausted_policy`] (stalls are bounded by
    /// [`CONFIG_STALL_LIMIT`]; "stall then abort" stalls then drops: a
    /// producer never aborts the program). Off by default, as in Perfetto's
    /// SDK (`kBufferExhaustedPolicyConfigurable = false`): a session must
    /// not be able to make the program's threads wait unless the program
    /// agreed. Track events follow the same default.
    pub policy_configurable: bool,
    /// Advertise `no_flush` (the service will not send Flush for it).
    pub no_flush: bool,
    /// Extra serialized `DataSourceDescriptor` fields merged into the
    /// descriptor (e.g. a `gpu_counter_descriptor`, field 5, or an
    /// `ftrace_descriptor`, field 8). The name, id and notification flags
    /// are always the producer's own.
    pub extra_descriptor_fields: Vec<u8>,
}

pub(crate) struct InstanceState {
    pub started: bool,
    pub stopped: bool,
    pub cells: Vec<Arc<WriterCell>>,
}

/// One running instance of a data source.
pub(crate) struct Instance {
    pub id: u64,
    /// What its writers do when the SMB is full.
    pub policy: BufferExhaustedPolicy,
    pub slot: usize,
    pub generation: u32,
    pub config: Arc<DataSourceConfig>,
    pub arbiter: Arc<Arbiter>,
    /// The slot and generation of the startup instance this one adopted
    /// (set before it starts): a thread's slices open in that one go on
    /// in this one's sequence.
    pub adopted_from: OnceLock<(usize, u32)>,
    state: Mutex<InstanceState>,
}

impl Instance {
    pub(crate) fn state(&self) -> MutexGuard<'_, InstanceState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn target_buffer(&self) -> u16 {
        u16::try_from(self.config.target_buffer).unwrap_or(0)
    }

    fn args(&self) -> InstanceArgs<'_> {
        InstanceArgs {
            instance_index: self.slot,
            instance_id: self.id,
            config: &self.config,
        }
    }

    /// The startup tracing instance (`startup`), which the service does
    /// not know.
    pub(crate) fn is_startup(&self) -> bool {
        self.id == STARTUP_INSTANCE_ID
    }

    /// Started and not stopping.
    pub(crate) fn is_live(&self) -> bool {
        let st = self.state();
        st.started && !st.stopped
    }

    /// A snapshot of the instance's writers.
    pub(crate) fn cells(&self) -> Vec<Arc<WriterCell>> {
        self.state().cells.clone()
    }
}

#[derive(Default)]
struct InstanceSlot {
    generation: AtomicU32,
    current: Mutex<Option<Arc<Instance>>>,
}

impl InstanceSlot {
    fn current(&self) -> MutexGuard<'_, Option<Arc<Instance>>> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A data source type's buffer-exhausted policy settings.
#[derive(Debug, Clone, Copy)]
struct PolicyChoice {
    /// Used unless a session's config chooses (and may choose).
    default: BufferExhaustedPolicy,
    /// Sessions' `DataSourceConfig.buffer_exhausted_policy` takes precedence.
    configurable: bool,
}

/// A registered data source type.
pub(crate) struct DataSourceType {
    pub index: usize,
    pub id: u64,
    pub name: String,
    pub options: DataSourceOptions,
    /// Reserved by the crate itself ([`TypeRegistry::reserve`](registry::TypeRegistry::reserve): track
    /// events) rather than registered by the program: advertised only
    /// once [`TypeRegistry::advertise`](registry::TypeRegistry::advertise) is called, and its name yields to
    /// a type the program registers before that.
    pub reserved: bool,
    /// Advertised to the service (from the start, unless reserved).
    pub(crate) advertised: AtomicBool,
    /// Computes the serialized `TrackEventDescriptor` each time the type
    /// is advertised (the track event data source's, listing the
    /// categories registered by then).
    pub describe: Option<fn() -> Vec<u8>>,
    enabled: AtomicU8,
    /// The default policy and whether sessions may override it (start as
    /// `options`).
    policy: Mutex<PolicyChoice>,
    slots: [InstanceSlot; MAX_INSTANCES],
    handler: Arc<dyn DataSourceHandler>,
    /// Events dropped because they were emitted re-entrantly: the
    /// process-wide counter reported as
    /// [`ProducerStats::reentrant_drops`](crate::ProducerStats::reentrant_drops).
    pub reentrant_drops: &'static std::sync::atomic::AtomicU64,
    /// The last startup hand-over ([`DataSourceType::start_replacing`]),
    /// packed by [`pack_handover`]; 0 for none. An event that read its
    /// category's bits before the hand-over and finds the startup
    /// instance gone goes to the adopting instance instead, while that one
    /// runs and the startup slot was not set up again.
    handover: AtomicU64,
}

/// `(from slot, to slot, to's generation)` in one word, with a valid bit.
fn pack_handover(from: usize, to: usize, generation: u32) -> u64 {
    1 << 63 | (from as u64) << 40 | (to as u64) << 32 | u64::from(generation)
}

impl DataSourceType {
    /// A type the program registers (`reserved`: false) or the crate
    /// reserves (see [`DataSourceType::reserved`]).
    pub(crate) fn new(
        index: usize,
        id: u64,
        name: String,
        options: DataSourceOptions,
        handler: Arc<dyn DataSourceHandler>,
        reserved: bool,
        describe: Option<fn() -> Vec<u8>>,
    ) -> Self {
        let policy = PolicyChoice {
            default: options.buffer_exhausted_policy,
            configurable: options.policy_configurable,
        };
        DataSourceType {
            index,
            id,
            name,
            options,
            reserved,
            advertised: AtomicBool::new(!reserved),
            describe,
            enabled: AtomicU8::new(0),
            policy: Mutex::new(policy),
            slots: Default::default(),
            handler,
            reentrant_drops: &crate::stats::COUNTERS.reentrant_drops,
            handover: AtomicU64::new(0),
        }
    }

    /// Bitmask of started instance slots (one relaxed load).
    #[inline(always)]
    pub(crate) fn enabled_mask(&self) -> u8 {
        self.enabled.load(Ordering::Relaxed)
    }

    /// The instance with service id `id`, if this type has it.
    pub(crate) fn find(&self, id: u64) -> Option<Arc<Instance>> {
        self.slots
            .iter()
            .find_map(|s| s.current().as_ref().filter(|i| i.id == id).cloned())
    }

    /// Every current instance.
    pub(crate) fn instances(&self) -> Vec<Arc<Instance>> {
        self.slots
            .iter()
            .filter_map(|s| s.current().clone())
            .collect()
    }

    /// Sets up a new instance in a free slot. `None` if all 8 are taken.
    pub(crate) fn setup(
        &self,
        id: u64,
        config: DataSourceConfig,
        arbiter: Arc<Arbiter>,
    ) -> Option<Arc<Instance>> {
        for (slot, s) in self.slots.iter().enumerate() {
            let mut current = s.current();
            if current.is_some() {
                continue;
            }
            let generation = s.generation.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
            // Events of a startup instance once in this slot go nowhere now.
            let _ = self
                .handover
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                    (h != 0 && (h >> 40) & 0xFF == slot as u64).then_some(0)
                });
            let policy = self.policy_for(&config);
            let inst = Arc::new(Instance {
                policy,
                id,
                slot,
                generation,
                config: Arc::new(config),
                arbiter,
                adopted_from: OnceLock::new(),
                state: Mutex::new(InstanceState {
                    started: false,
                    stopped: false,
                    cells: Vec::new(),
                }),
            });
            *current = Some(inst.clone());
            drop(current);
            self.handler.on_setup(&SetupArgs {
                instance_index: slot,
                instance_id: id,
                config: &inst.config,
            });
            return Some(inst);
        }
        None
    }

    fn policy_choice(&self) -> MutexGuard<'_, PolicyChoice> {
        self.policy.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes the default policy of instances set up from now on.
    pub(crate) fn set_policy(&self, policy: BufferExhaustedPolicy) {
        self.policy_choice().default = policy;
    }

    /// Lets (or stops letting) the configs of sessions set up from now on
    /// choose the policy
    /// ([`DataSourceOptions::policy_configurable`]).
    pub(crate) fn set_policy_configurable(&self, configurable: bool) {
        self.policy_choice().configurable = configurable;
    }

    fn policy_for(&self, config: &DataSourceConfig) -> BufferExhaustedPolicy {
        let choice = *self.policy_choice();
        match config.stall_when_exhausted {
            Some(true) if choice.configurable => {
                BufferExhaustedPolicy::StallThenDrop(CONFIG_STALL_LIMIT)
            }
            Some(false) if choice.configurable => BufferExhaustedPolicy::Drop,
            _ => choice.default,
        }
    }

    /// Starts `inst`: enables tracing for its slot.
    pub(crate) fn start(&self, inst: &Instance) {
        {
            let mut st = inst.state();
            if st.started || st.stopped {
                return;
            }
            st.started = true;
        }
        self.enabled.fetch_or(1 << inst.slot, Ordering::Relaxed);
        self.handler.on_start(&inst.args());
    }

    /// Starts `inst` in place of `from` (the startup instance), then stops
    /// `from`: `move_enablement` moves what selects events for `from` over
    /// to `inst` (track events: the categories' bits, one store each), and
    /// this type's slot mask moves in one store, so every event goes to
    /// exactly one of them. Returns `from`'s writers still busy in an event
    /// ([`Self::stop`]).
    pub(crate) fn start_replacing(
        &self,
        inst: &Instance,
        from: &Arc<Instance>,
        move_enablement: impl FnOnce(),
    ) -> Vec<Arc<WriterCell>> {
        {
            let mut st = inst.state();
            if st.started || st.stopped {
                return Vec::new();
            }
            st.started = true;
        }
        let _ = inst.adopted_from.set((from.slot, from.generation));
        self.handover.store(
            pack_handover(from.slot, inst.slot, inst.generation),
            Ordering::Release,
        );
        move_enablement();
        let (off, on) = (1u8 << from.slot, 1u8 << inst.slot);
        let _ = self
            .enabled
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| {
                Some((m & !off) | on)
            });
        self.handler.on_start(&inst.args());
        self.stop(from)
    }

    /// Stops `inst`: calls `on_stop`, disables its slot, flushes and
    /// retires its writers, frees the slot. Returns the writers still busy
    /// in an event ([`retire_all`]).
    pub(crate) fn stop(&self, inst: &Arc<Instance>) -> Vec<Arc<WriterCell>> {
        let was_started = inst.state().started;
        if was_started {
            self.handler.on_stop(&inst.args());
        }
        self.enabled.fetch_and(!(1 << inst.slot), Ordering::Relaxed);
        let slot = &self.slots[inst.slot];
        slot.generation.fetch_add(1, Ordering::AcqRel);
        let cells = {
            let mut st = inst.state();
            st.stopped = true;
            std::mem::take(&mut st.cells)
        };
        let busy = retire_all(&cells, &inst.arbiter);
        let mut current = slot.current();
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, inst)) {
            *current = None;
        }
        busy
    }

    /// Runs the flush callback of `inst` and asks its writers to flush:
    /// idle ones flush now, busy ones when their event ends. Returns the
    /// writers still busy (see [`wait_for_flushes`]).
    pub(crate) fn flush(&self, inst: &Instance) -> Vec<Arc<WriterCell>> {
        self.handler.on_flush(&inst.args());
        let mut cells = inst.cells();
        if request_all(&cells, FLAG_FLUSH) == cells.len() {
            cells.clear();
        }
        cells
    }

    /// Asks every writer of `inst` to reset its incremental state, then
    /// tells the handler.
    pub(crate) fn clear_incremental_state(&self, inst: &Instance) {
        for cell in inst.cells() {
            cell.request(FLAG_CLEAR);
        }
        self.handler.on_clear_incremental_state(&inst.args());
    }

    /// The slot an event meant for slot `from` goes to instead: the
    /// instance that adopted the startup instance in `from`, if it still
    /// runs (its generation unchanged).
    fn handed_over(&self, from: usize) -> Option<usize> {
        let h = self.handover.load(Ordering::Acquire);
        let (to, generation) = (((h >> 32) & 0xFF) as usize, h as u32);
        (h != 0
            && (h >> 40) & 0xFF == from as u64
            && self.slots.get(to)?.generation.load(Ordering::Acquire) == generation)
            .then_some(to)
    }

    /// Creates the calling thread's writer for slot `slot` under
    /// `generation`.
    #[cold]
    fn new_writer(&self, slot: usize, generation: u32) -> Result<TlsEntry, NoWriter> {
        let inst = self
            .slots
            .get(slot)
            .and_then(|s| s.current().clone())
            .ok_or(NoWriter::Inactive)?;
        if inst.generation != generation {
            return Err(NoWriter::Inactive);
        }
        let mut st = inst.state();
        if st.stopped || !st.started {
            return Err(NoWriter::Inactive);
        }
        let arbiter = &inst.arbiter;
        let id = arbiter.alloc_writer_id().ok_or(NoWriter::NoId)?;
        let policy = inst.policy;
        let Ok(writer) = TraceWriter::new(arbiter.writer_arbiter(policy), id, inst.target_buffer())
        else {
            arbiter.free_writer_id(id);
            return Err(NoWriter::NoId);
        };
        let cell = Arc::new(WriterCell::new(writer, arbiter.clone()));
        arbiter.outbox().push(Outgoing::RegisterTraceWriter {
            writer_id: u32::from(id),
            target_buffer: inst.config.target_buffer,
        });
        st.cells.push(cell.clone());
        arbiter.add_cell(cell.clone());
        drop(st);
        Ok(TlsEntry {
            generation,
            cell,
            instance: inst,
        })
    }

    /// Runs `f` once per instance in `mask` with the calling thread's
    /// writer for it (created on first use). Returns how many instances
    /// were written to.
    #[inline]
    pub(crate) fn with_writers(
        &self,
        mask: u8,
        mut f: impl FnMut(&mut WriterInner, &Instance),
    ) -> usize {
        THREAD_WRITERS
            .try_with(|tw| {
                let Ok(mut per_type) = tw.per_type.try_borrow_mut() else {
                    self.reentrant_drops.fetch_add(1, Ordering::Relaxed);
                    return 0;
                };
                let entries = per_type.entries(self.index);
                let mut written = 0;
                let mut m = mask;
                // An event that read its category's bits just before a
                // startup hand-over reaches the adopting instance.
                // An event that read its category's bits just before a
                // startup hand-over reaches the adopting instance (the
                // thread's startup writer is kept until its slices moved:
                // `continue_adopted_slices`).
                let redirect = |m: &mut u8, slot: usize| {
                    let to = self.handed_over(slot).filter(|&to| mask & (1 << to) == 0);
                    if let Some(to) = to {
                        *m |= 1 << to;
                    }
                    to.is_some()
                };
                while m != 0 {
                    let slot = m.trailing_zeros() as usize;
                    m &= m - 1;
                    let generation = self.slots[slot].generation.load(Ordering::Acquire);
                    if entries[slot]
                        .as_ref()
                        .is_none_or(|e| e.generation != generation)
                    {
                        match self.new_writer(slot, generation) {
                            Ok(e) => {
                                entries[slot] = Some(e);
                                continue_adopted_slices(entries, slot);
                            }
                            Err(NoWriter::Inactive) => {
                                if !redirect(&mut m, slot) {
                                    entries[slot] = None;
                                }
                                continue;
                            }
                            Err(NoWriter::NoId) => {
                                count_writerless(1);
                                entries[slot] = None;
                                continue;
                            }
                        }
                    }
                    let Some(e) = &entries[slot] else { continue };
                    let mut g = e.cell.lock_owner();
                    // One load for both flags (a clear is rare: it loads
                    // them again).
                    let flags = g.flags();
                    if flags & FLAG_DEAD != 0 {
                        drop(g);
                        if !redirect(&mut m, slot) {
                            entries[slot] = None;
                        }
                        continue;
                    }
                    if flags & FLAG_CLEAR != 0 {
                        g.apply_clear();
                    }
                    f(g.inner(), &e.instance);
                    written += 1;
                }
                written
            })
            .unwrap_or_else(|_| {
                // This thread's writers are gone: an event from another
                // thread-local's destructor as the thread exits.
                count_writerless(mask.count_ones());
                0
            })
    }
}

/// The thread's new writer in `slot`: if its instance adopted the startup
/// trace, the slices this thread has open in its startup writer go on in
/// it (their ends are written there), and that writer's entry is let go.
#[cold]
fn continue_adopted_slices(entries: &mut [Option<TlsEntry>; MAX_INSTANCES], slot: usize) {
    let Some(&(from, generation)) = entries[slot]
        .as_ref()
        .and_then(|e| e.instance.adopted_from.get())
    else {
        return;
    };
    let Some(old) = entries
        .get_mut(from)
        .and_then(|e| e.take_if(|e| e.generation == generation))
    else {
        return;
    };
    let open = old.cell.lock_owner().inner().seq.take_open_slices();
    if let Some(new) = &entries[slot] {
        new.cell.lock_owner().inner().seq.continue_slices(open);
    }
}

/// Why [`DataSourceType::new_writer`] made no writer.
enum NoWriter {
    /// The instance is stopping, or gone (not a loss: its session is).
    Inactive,
    /// Every writer id of the SMB is in use.
    NoId,
}

/// Counts `n` events or packets that instances enabling them did not get
/// because the thread had no writer for them
/// ([`ProducerStats::writerless_drops`](crate::ProducerStats::writerless_drops)).
#[cold]
fn count_writerless(n: u32) {
    crate::stats::COUNTERS
        .writerless_drops
        .fetch_add(u64::from(n), Ordering::Relaxed);
}

/// Waits at most [`HOUSEKEEPING_WAIT`] in all for the busy writers of a
/// flush ([`DataSourceType::flush`]) to flush; those still busy then flush
/// when their event ends, after the flush was acknowledged.
pub(crate) fn wait_for_flushes(busy: &[Arc<WriterCell>]) {
    if !busy.is_empty() {
        wait_deferred(busy, FLAG_FLUSH, Instant::now() + HOUSEKEEPING_WAIT);
    }
}

/// Flushes a writer and takes it out of service ([`retire_all`]).
pub(crate) fn retire(cell: &Arc<WriterCell>, arbiter: &Arbiter) {
    let _ = retire_all(std::slice::from_ref(cell), arbiter);
}

/// Takes writers out of service: marks them dead, removes them from the
/// arbiter's sweep list, and has each flushed, unregistered and its id
/// freed, in that order: idle ones now, busy ones when their event ends.
/// Waits at most [`HOUSEKEEPING_WAIT`] in all for the busy ones (not at
/// all once the connection is gone), so a stop's `NotifyDataSourceStopped`
/// follows their last chunks unless an event outlasts that (a writer
/// stalling for a chunk). Upstream notifies without flushing its
/// thread-local writers at all; their chunks come when the thread next
/// writes or exits, or through the service's SMB scraping.
///
/// Returns the writers still busy after the wait: their last chunks are
/// committed when their events end, for whoever reads `arbiter` to pick up
/// (startup tracing's hand-over waits for them).
pub(crate) fn retire_all(cells: &[Arc<WriterCell>], arbiter: &Arbiter) -> Vec<Arc<WriterCell>> {
    for cell in cells {
        arbiter.remove_cell(cell);
    }
    let done = request_all(cells, FLAG_DEAD | FLAG_RETIRE);
    if done < cells.len() && !arbiter.is_closed() {
        wait_deferred(cells, FLAG_RETIRE, Instant::now() + HOUSEKEEPING_WAIT);
    }
    busy_with(cells, FLAG_RETIRE)
}

/// The cells of `cells` whose deferred `work` is still pending.
pub(crate) fn busy_with(cells: &[Arc<WriterCell>], work: u8) -> Vec<Arc<WriterCell>> {
    cells
        .iter()
        .filter(|c| c.has_flags(work))
        .cloned()
        .collect()
}

struct TlsEntry {
    generation: u32,
    cell: Arc<WriterCell>,
    instance: Arc<Instance>,
}

#[derive(Default)]
struct ThreadWriters {
    per_type: RefCell<PerType>,
}

/// A thread's writers, by data source type and instance slot.
#[derive(Default)]
struct PerType {
    /// The writers of the type of index 0, found without the vector: the
    /// type made first, the track event type unless the program registered
    /// a data source of its own before it used track events (or made a
    /// `TracingLayer`, or started startup tracing).
    first: [Option<TlsEntry>; MAX_INSTANCES],
    /// The writers of the types of index 1 and up.
    rest: Vec<[Option<TlsEntry>; MAX_INSTANCES]>,
}

impl PerType {
    /// The writers of the type of index `index`.
    #[inline(always)]
    fn entries(&mut self, index: usize) -> &mut [Option<TlsEntry>; MAX_INSTANCES] {
        let Some(i) = index.checked_sub(1) else {
            return &mut self.first;
        };
        if self.rest.len() <= i {
            self.rest.resize_with(i + 1, Default::default);
        }
        &mut self.rest[i]
    }

    /// Every writer, by type.
    fn iter_mut(&mut self) -> impl Iterator<Item = &mut [Option<TlsEntry>; MAX_INSTANCES]> {
        std::iter::once(&mut self.first).chain(self.rest.iter_mut())
    }
}

impl Drop for ThreadWriters {
    fn drop(&mut self) {
        for entry in self
            .per_type
            .get_mut()
            .iter_mut()
            .flat_map(|e| e.iter_mut())
            .filter_map(Option::take)
        {
            let removed = {
                let mut st = entry.instance.state();
                let before = st.cells.len();
                st.cells.retain(|c| !Arc::ptr_eq(c, &entry.cell));
                st.cells.len() != before
            };
            if removed {
                retire(&entry.cell, &entry.instance.arbiter);
            }
        }
    }
}

sync::thread_local! {
    static THREAD_WRITERS: ThreadWriters = ThreadWriters::default();
}

/// A custom data source: register it once, then write packets from any
/// thread while a session has it enabled.
///
/// ```no_run
/// use shmtrace_abi::trace::trace_packet;
/// use shmtrace_producer::{DataSource, NoopHandler};
/// let ds = DataSource::register("com.example.my_source", NoopHandler).unwrap();
/// if ds.is_enabled() {
///     ds.trace(|ctx| {
///         ctx.packet(|p| {
///             p.uint64(trace_packet::TIMESTAMP, 42);
///             p.bytes(trace_packet::FOR_TESTING, b"payload");
///         });
///     });
/// }
/// ```
#[derive(Clone)]
pub struct DataSource {
    pub(crate) ty: Arc<DataSourceType>,
}

impl std::fmt::Debug for DataSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataSource")
            .field("name", &self.ty.name)
            .finish()
    }
}

impl DataSource {
    /// Registers data source `name` with default options.
    pub fn register(
        name: &str,
        handler: impl DataSourceHandler,
    ) -> Result<Self, crate::RegisterError> {
        Self::register_with(name, DataSourceOptions::default(), handler)
    }

    /// Registers data source `name` with `options`.
    pub fn register_with(
        name: &str,
        options: DataSourceOptions,
        handler: impl DataSourceHandler,
    ) -> Result<Self, crate::RegisterError> {
        let ty = registry().register(name, options, Arc::new(handler))?;
        Ok(DataSource { ty })
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.ty.name
    }

    /// Whether any session has this data source started: one relaxed load.
    #[inline(always)]
    pub fn is_enabled(&self) -> bool {
        self.ty.enabled_mask() != 0
    }

    /// Calls `f` once for each started instance, with the calling thread's
    /// writer for it. Does nothing (beyond one load) when disabled.
    #[inline]
    pub fn trace(&self, mut f: impl FnMut(&mut TraceContext<'_>)) {
        let mask = self.ty.enabled_mask();
        if mask == 0 {
            return;
        }
        self.ty.with_writers(mask, |inner, instance| {
            f(&mut TraceContext { inner, instance })
        });
    }
}

/// One instance's writer, inside [`DataSource::trace`].
pub struct TraceContext<'a> {
    inner: &'a mut WriterInner,
    instance: &'a Instance,
}

impl TraceContext<'_> {
    /// Writes one TracePacket with `f`; `false` if it was dropped (SMB
    /// full). Losses are marked on the next packet.
    #[inline]
    pub fn packet(&mut self, f: impl FnOnce(&mut Message<'_, ProducerSink>)) -> bool {
        use crate::encoding::event::PacketWriter;
        let ok = self.inner.out.write_packet(f);
        if !ok {
            self.instance
                .arbiter
                .counters
                .packets_dropped
                .fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// Writes one TracePacket from already serialized fields.
    pub fn raw_packet(&mut self, fields: &[u8]) -> bool {
        self.packet(|p| p.raw(fields))
    }

    /// The instance's config.
    pub fn config(&self) -> &DataSourceConfig {
        &self.instance.config
    }

    /// The instance slot (0..8).
    pub fn instance_index(&self) -> usize {
        self.instance.slot
    }

    /// `true` once after the writer started or the service asked to clear
    /// incremental state: re-emit whatever later packets depend on (and
    /// set `SEQ_INCREMENTAL_STATE_CLEARED`).
    pub fn take_incremental_state_cleared(&mut self) -> bool {
        std::mem::replace(&mut self.inner.custom_cleared, false)
    }

    /// Hands the current chunk to the service now.
    pub fn flush(&mut self) {
        self.inner.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_config_chooses_the_policy_only_if_allowed() {
        let stall = DataSourceConfig {
            stall_when_exhausted: Some(true),
            ..Default::default()
        };
        let drop = DataSourceConfig {
            stall_when_exhausted: Some(false),
            ..Default::default()
        };
        let unset = DataSourceConfig::default();
        let open = DataSourceType::new(
            9,
            9,
            "x".into(),
            DataSourceOptions {
                policy_configurable: true,
                ..Default::default()
            },
            Arc::new(NoopHandler),
            false,
            None,
        );
        assert_eq!(
            open.policy_for(&stall),
            BufferExhaustedPolicy::StallThenDrop(CONFIG_STALL_LIMIT)
        );
        assert_eq!(open.policy_for(&unset), BufferExhaustedPolicy::Drop);
        open.set_policy(BufferExhaustedPolicy::StallThenDrop(Duration::from_millis(
            5,
        )));
        assert_eq!(open.policy_for(&drop), BufferExhaustedPolicy::Drop);
        assert_eq!(
            open.policy_for(&unset),
            BufferExhaustedPolicy::StallThenDrop(Duration::from_millis(5))
        );
        let closed = DataSourceType::new(
            9,
            9,
            "y".into(),
            DataSourceOptions::default(),
            Arc::new(NoopHandler),
            false,
            None,
        );
        assert_eq!(closed.policy_for(&stall), BufferExhaustedPolicy::Drop);
    }
}

#[cfg(all(test, loom))]
mod loom_model;
