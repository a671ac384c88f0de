//! Tracks (timelines events belong to), their uuids and descriptors, flows
//! and timestamps.
//!
//! Uuids follow the C++ SDK's scheme so traces look alike: the process
//! track has a random per-process uuid, a thread track's uuid is its tid
//! xor the process uuid, a child track's uuid is its id xor its parent's
//! uuid, and a named track's id is the FNV-1a hash of its name.
//!
//! A track's descriptor (`TrackDescriptor`, TracePacket field 60) is
//! written on a sequence before the first event that uses the track, and
//! again after every incremental-state reset of that sequence. So are the
//! descriptors of its custom ancestors: a track made a parent
//! ([`Track::child_of`] and the other `child_of`s) is recorded in a
//! process-wide registry of ancestors (uuid, parent uuid, encoded
//! descriptor; the first registration of a uuid wins), as upstream's SDK
//! does with its track registry, so an event on a nested track leaves every
//! level described.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use shmtrace_abi::proto::{Message, Sink};
use shmtrace_abi::trace::{
    counter_descriptor, process_descriptor, thread_descriptor, track_descriptor as desc_field,
};
use shmtrace_ipc::protos::vec_sink::encode_to_vec;

use crate::sys;
use crate::track_event::category::Category;

pub use shmtrace_abi::trace::counter_descriptor::Unit as CounterUnit;
pub use shmtrace_abi::trace::track_descriptor::ChildTracksOrdering as ChildOrdering;

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum TrackKind<'a> {
    Custom,
    Process,
    Thread { tid: i64 },
    Counter(CounterSpec<'a>),
}

/// What a counter track's `CounterDescriptor` says.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CounterSpec<'a> {
    unit: CounterUnit,
    unit_name: Option<&'a str>,
    multiplier: i64,
    incremental: bool,
    /// `categories` (2): the category named on the track (counter events
    /// carry none).
    category: Option<&'static str>,
}

/// A timeline events are placed on. Cheap to copy; build it where you use
/// it (`Track::new(request_id)`) or keep one in a `static`/field.
///
/// ```
/// use shmtrace_producer::{ChildOrdering, Track};
/// let root = Track::global(10).with_name("Root").with_child_ordering(ChildOrdering::Explicit);
/// let child = Track::child_of(&root, 1).with_name("B").with_sibling_order_rank(1);
/// assert_eq!(child.uuid(), 1 ^ 10);
/// assert_eq!(child.parent_uuid(), Some(10));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Track<'a> {
    uuid: u64,
    parent_uuid: u64,
    name: Option<&'a str>,
    description: Option<&'a str>,
    child_ordering: ChildOrdering,
    sibling_order_rank: Option<i32>,
    pub(crate) kind: TrackKind<'a>,
}

/// FNV-1a, 64 bit (named track ids).
pub const fn fnv1a(s: &str) -> u64 {
    let bytes = s.as_bytes();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    h
}

const NAMED_TRACK_MAGIC: u64 = 0xCD57_1EC5_EAD3_7024;
const COUNTER_TRACK_MAGIC: u64 = 0x8E2A_4D19_5B0C_66F3;

impl Track<'static> {
    /// A track with uuid `uuid` and no parent (unique in the whole trace).
    pub const fn global(uuid: u64) -> Self {
        Track {
            uuid,
            parent_uuid: 0,
            name: None,
            description: None,
            child_ordering: ChildOrdering::Unknown,
            sibling_order_rank: None,
            kind: TrackKind::Custom,
        }
    }
}

impl<'a> Track<'a> {
    /// A track identified by `id` under this process's track (like the C++
    /// SDK's `Track(id)`): uuid `id ^ process uuid`.
    pub fn new(id: u64) -> Self {
        Self::child_of(&ProcessTrack::current(), id)
    }

    /// A track identified by `id` under `parent`: uuid `id ^ parent.uuid()`.
    /// A custom `parent` is described in the trace too, before the first
    /// event on this track (see the module docs).
    pub fn child_of(parent: &Track<'_>, id: u64) -> Self {
        parent.register_as_ancestor();
        Track {
            uuid: id ^ parent.uuid,
            parent_uuid: parent.uuid,
            ..Track::global(0)
        }
    }

    /// A named track under this process's track; `id` tells apart several
    /// tracks with the same name.
    pub fn named(name: &'a str, id: u64) -> Self {
        Self::named_child_of(&ProcessTrack::current(), name, id)
    }

    /// A named track under `parent`.
    pub fn named_child_of(parent: &Track<'_>, name: &'a str, id: u64) -> Self {
        Track::child_of(parent, id ^ fnv1a(name) ^ NAMED_TRACK_MAGIC).with_name(name)
    }

    /// Sets the name shown in the UI.
    pub fn with_name(self, name: &'a str) -> Self {
        Track {
            name: Some(name),
            ..self
        }
    }

    /// Sets the description.
    pub fn with_description(self, description: &'a str) -> Self {
        Track {
            description: Some(description),
            ..self
        }
    }

    /// Sets how the UI orders this track's children.
    pub fn with_child_ordering(self, ordering: ChildOrdering) -> Self {
        Track {
            child_ordering: ordering,
            ..self
        }
    }

    /// Sets the rank among siblings (for a parent with
    /// [`ChildOrdering::Explicit`]).
    pub fn with_sibling_order_rank(self, rank: i32) -> Self {
        Track {
            sibling_order_rank: Some(rank),
            ..self
        }
    }

    /// The uuid.
    pub fn uuid(&self) -> u64 {
        self.uuid
    }

    /// The parent's uuid, if any.
    pub fn parent_uuid(&self) -> Option<u64> {
        (self.parent_uuid != 0).then_some(self.parent_uuid)
    }

    /// The name, if any.
    pub fn name(&self) -> Option<&'a str> {
        self.name
    }

    /// Records this track's descriptor for its descendants (module docs);
    /// the process track, thread tracks and uuid 0 (no parent) need none.
    fn register_as_ancestor(&self) {
        thread_local! {
            /// The uuid this thread registered last: most children are
            /// made under the same parent again and again.
            static LAST: Cell<u64> = const { Cell::new(0) };
        }
        if self.uuid == 0 || matches!(self.kind, TrackKind::Process | TrackKind::Thread { .. }) {
            return;
        }
        if LAST.try_with(|last| last.replace(self.uuid)) == Ok(self.uuid) {
            return;
        }
        let mut ancestors = ANCESTORS.lock().unwrap_or_else(PoisonError::into_inner);
        ancestors.entry(self.uuid).or_insert_with(|| {
            let mut bytes = Vec::new();
            // Constant field numbers, strings far below the 256 MiB limit,
            // one level of nesting: nothing for the encoder to refuse.
            let _ = encode_to_vec(&mut bytes, |d| self.write_descriptor(d));
            Ancestor {
                parent_uuid: self.parent_uuid,
                descriptor: bytes.into(),
            }
        });
    }

    /// Writes this track's `TrackDescriptor` fields into `desc`.
    pub(crate) fn write_descriptor<S: Sink>(&self, desc: &mut Message<'_, S>) {
        desc.uint64(desc_field::UUID, self.uuid);
        if self.parent_uuid != 0 {
            desc.uint64(desc_field::PARENT_UUID, self.parent_uuid);
        }
        if let Some(name) = self.name {
            desc.string(desc_field::NAME, name);
        }
        if let Some(d) = self.description {
            desc.string(desc_field::DESCRIPTION, d);
        }
        if self.child_ordering != ChildOrdering::Unknown {
            desc.enumeration(desc_field::CHILD_ORDERING, self.child_ordering as i32);
        }
        if let Some(rank) = self.sibling_order_rank {
            desc.int32(desc_field::SIBLING_ORDER_RANK, rank);
        }
        match self.kind {
            TrackKind::Custom => {}
            TrackKind::Process => {
                let info = process_info();
                desc.nested(desc_field::PROCESS, |p| {
                    p.int32(process_descriptor::PID, info.pid);
                    for arg in &info.cmdline {
                        p.string(process_descriptor::CMDLINE, arg);
                    }
                    let name = process_name();
                    if !name.is_empty() {
                        p.string(process_descriptor::PROCESS_NAME, &name);
                    }
                });
            }
            TrackKind::Thread { tid } => {
                desc.nested(desc_field::THREAD, |t| {
                    t.int32(thread_descriptor::PID, process_info().pid);
                    t.int64(thread_descriptor::TID, tid);
                    if tid == sys::current_tid() {
                        sys::with_thread_name(|name| {
                            if let Some(name) = name {
                                t.string(thread_descriptor::THREAD_NAME, name);
                            }
                        });
                    }
                });
            }
            TrackKind::Counter(CounterSpec {
                unit,
                unit_name,
                multiplier,
                incremental,
                category,
            }) => {
                desc.nested(desc_field::COUNTER, |c| {
                    if let Some(category) = category {
                        c.string(counter_descriptor::CATEGORIES, category);
                    }
                    if unit != CounterUnit::Unspecified {
                        c.enumeration(counter_descriptor::UNIT, unit as i32);
                    }
                    if multiplier != 1 {
                        c.int64(counter_descriptor::UNIT_MULTIPLIER, multiplier);
                    }
                    if incremental {
                        c.bool(counter_descriptor::IS_INCREMENTAL, true);
                    }
                    if let Some(u) = unit_name {
                        c.string(counter_descriptor::UNIT_NAME, u);
                    }
                });
            }
        }
    }
}

/// A track some other track was made a child of (module docs).
struct Ancestor {
    parent_uuid: u64,
    /// Its `TrackDescriptor`, encoded.
    descriptor: Arc<[u8]>,
}

static ANCESTORS: Mutex<BTreeMap<u64, Ancestor>> = Mutex::new(BTreeMap::new());

/// The registered ancestor `uuid`: its parent's uuid (0: none) and its
/// encoded `TrackDescriptor` (shared: the registry's lock is not held
/// while a writer uses it).
pub(crate) fn ancestor(uuid: u64) -> Option<(u64, Arc<[u8]>)> {
    let ancestors = ANCESTORS.lock().unwrap_or_else(PoisonError::into_inner);
    ancestors
        .get(&uuid)
        .map(|a| (a.parent_uuid, a.descriptor.clone()))
}

/// The track of the current process.
#[derive(Debug, Clone, Copy)]
pub struct ProcessTrack;

impl ProcessTrack {
    /// This process's track (random uuid, process descriptor with pid, name
    /// and command line).
    pub fn current() -> Track<'static> {
        Track {
            kind: TrackKind::Process,
            ..Track::global(process_uuid())
        }
    }
}

/// The track of a thread of this process.
#[derive(Debug, Clone, Copy)]
pub struct ThreadTrack;

impl ThreadTrack {
    /// The calling thread's track (the default track of events).
    pub fn current() -> Track<'static> {
        Self::for_thread(sys::current_tid())
    }

    /// Names the calling thread's track `name` in traces (default: the
    /// kernel's thread name, which `std::thread::Builder::name` sets and
    /// the kernel cuts to 15 bytes). Takes effect on each sequence's next
    /// incremental-state reset, like [`set_process_name`]; what upstream's
    /// C++ SDK does with `SetTrackDescriptor(ThreadTrack::Current(), …)`.
    pub fn set_current_name(name: &str) {
        sys::set_thread_name(name);
    }

    /// The track of thread `tid` of this process: a child of the process
    /// track (its descriptor names the process track as its parent, as
    /// upstream's does).
    pub fn for_thread(tid: i64) -> Track<'static> {
        Track {
            kind: TrackKind::Thread { tid },
            ..Track::child_of(&ProcessTrack::current(), tid as u64)
        }
    }
}

/// A counter track: a named timeline of numeric samples.
///
/// ```
/// use shmtrace_producer::{CounterTrack, CounterUnit};
/// let memory = CounterTrack::new("Memory").with_unit(CounterUnit::SizeBytes).with_multiplier(1024);
/// let fps = CounterTrack::new("Framerate").with_unit_name("fps");
/// assert_ne!(memory.track().uuid(), fps.track().uuid());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CounterTrack<'a> {
    track: Track<'a>,
}

impl<'a> CounterTrack<'a> {
    /// A counter track called `name` under this process's track.
    pub fn new(name: &'a str) -> Self {
        Self::child_of(&ProcessTrack::current(), name)
    }

    /// A counter track called `name` under `parent`.
    pub fn child_of(parent: &Track<'_>, name: &'a str) -> Self {
        let base = Track::child_of(parent, fnv1a(name) ^ COUNTER_TRACK_MAGIC).with_name(name);
        CounterTrack {
            track: Track {
                kind: TrackKind::Counter(CounterSpec {
                    unit: CounterUnit::Unspecified,
                    unit_name: None,
                    multiplier: 1,
                    incremental: false,
                    category: None,
                }),
                ..base
            },
        }
    }

    fn map_counter(self, f: impl FnOnce(&mut CounterSpec<'a>)) -> Self {
        let mut t = self.track;
        if let TrackKind::Counter(spec) = &mut t.kind {
            f(spec);
        }
        CounterTrack { track: t }
    }

    /// Sets the unit.
    pub fn with_unit(self, unit: CounterUnit) -> Self {
        self.map_counter(|c| c.unit = unit)
    }

    /// Sets a free-form unit name ("fps").
    pub fn with_unit_name(self, name: &'a str) -> Self {
        self.map_counter(|c| c.unit_name = Some(name))
    }

    /// Values are multiplied by `multiplier` (e.g. 1024 for KiB samples of
    /// a byte counter).
    pub fn with_multiplier(self, multiplier: i64) -> Self {
        self.map_counter(|c| c.multiplier = multiplier)
    }

    /// Values are deltas to add up.
    pub fn with_incremental(self, incremental: bool) -> Self {
        self.map_counter(|c| c.incremental = incremental)
    }

    /// Names `category` in the track's descriptor
    /// (`CounterDescriptor.categories`), as the C++ SDK's
    /// `CounterTrack::set_category` does: counter events carry no category,
    /// so this is where a trace shows one. Off by default, as upstream.
    pub fn with_category(self, category: &'static Category) -> Self {
        self.map_counter(|c| c.category = Some(category.name()))
    }

    /// The underlying track.
    pub fn track(&self) -> &Track<'a> {
        &self.track
    }
}

/// A flow: links events (on any tracks) into one chain of arrows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Flow(u64);

impl Flow {
    /// A flow id unique in this process (xor-ed with the process uuid).
    pub fn process_scoped(id: u64) -> Self {
        Flow(id ^ process_uuid())
    }

    /// A flow id used as is (unique in the whole trace).
    pub const fn global(id: u64) -> Self {
        Flow(id)
    }

    /// A process-scoped flow identified by a pointer.
    pub fn from_pointer<T>(ptr: *const T) -> Self {
        Self::process_scoped(ptr as usize as u64)
    }

    /// The id written into `flow_ids` / `terminating_flow_ids`.
    pub const fn id(self) -> u64 {
        self.0
    }
}

/// Clock of an explicit timestamp (Perfetto `BuiltinClock` ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// `CLOCK_BOOTTIME` (6), the trace's default clock.
    Boottime,
    /// `CLOCK_MONOTONIC` (3).
    Monotonic,
    /// `CLOCK_REALTIME` (1).
    Realtime,
    /// Any other clock id (builtin 1..=63, or 65..=127 sequence-scoped:
    /// track event sequences use 64 for their own incremental clock, so a
    /// value on `Other(64)` is read as a delta).
    Other(u32),
}

impl Clock {
    /// The `timestamp_clock_id` value.
    pub const fn id(self) -> u32 {
        match self {
            Clock::Boottime => 6,
            Clock::Monotonic => 3,
            Clock::Realtime => 1,
            Clock::Other(id) => id,
        }
    }
}

/// An explicit event timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timestamp {
    /// The clock.
    pub clock: Clock,
    /// Nanoseconds on that clock.
    pub ns: u64,
}

impl Timestamp {
    /// Now, on the trace clock (boot time).
    #[inline]
    pub fn now() -> Self {
        Timestamp {
            clock: Clock::Boottime,
            ns: crate::clock::now_ns(),
        }
    }

    /// `ns` nanoseconds of boot time.
    pub const fn boottime(ns: u64) -> Self {
        Timestamp {
            clock: Clock::Boottime,
            ns,
        }
    }
}

struct ProcessInfo {
    pid: i32,
    cmdline: Vec<String>,
    default_name: Arc<str>,
}

fn process_info() -> &'static ProcessInfo {
    static INFO: OnceLock<ProcessInfo> = OnceLock::new();
    INFO.get_or_init(|| {
        let cmdline = std::fs::read("/proc/self/cmdline")
            .map(|raw| {
                raw.split(|&b| b == 0)
                    .filter(|a| !a.is_empty())
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect()
            })
            .unwrap_or_default();
        let cmdline: Vec<String> = cmdline;
        let default_name = Arc::from(cmdline.first().map_or("", String::as_str));
        ProcessInfo {
            pid: rustix::process::getpid().as_raw_nonzero().get(),
            cmdline,
            default_name,
        }
    })
}

/// The first word of the command line (`argv[0]` as the kernel keeps
/// it; empty where `/proc/self/cmdline` cannot be read).
pub(crate) fn command_name() -> Arc<str> {
    process_info().default_name.clone()
}

static PROCESS_NAME: Mutex<Option<Arc<str>>> = Mutex::new(None);

/// Overrides the process name written into the process track descriptor
/// (default: the first word of the command line). Takes effect on each
/// sequence's next incremental-state reset.
pub fn set_process_name(name: &str) {
    *PROCESS_NAME.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::from(name));
}

/// The process name (no allocation: descriptors are re-emitted on every
/// incremental-state reset).
fn process_name() -> Arc<str> {
    if let Some(n) = PROCESS_NAME
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
    {
        return n;
    }
    process_info().default_name.clone()
}

/// This process's pid.
pub fn current_pid() -> i32 {
    process_info().pid
}

/// The random uuid of this process's track.
pub fn process_uuid() -> u64 {
    static UUID: AtomicU64 = AtomicU64::new(0);
    let u = UUID.load(Ordering::Relaxed);
    if u != 0 {
        return u;
    }
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_i32(current_pid());
    h.write_u64(sys::boottime_ns());
    let fresh = h.finish() | 1;
    match UUID.compare_exchange(0, fresh, Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => fresh,
        Err(existing) => existing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_scheme() {
        let p = ProcessTrack::current();
        assert_eq!(p.uuid(), process_uuid());
        assert_eq!(p.parent_uuid(), None);
        let t = Track::new(1234);
        assert_eq!(t.uuid(), 1234 ^ process_uuid());
        assert_eq!(t.parent_uuid(), Some(process_uuid()));
        let th = ThreadTrack::for_thread(77);
        assert_eq!(th.uuid(), 77 ^ process_uuid());
        // Upstream's thread tracks are children of the process track.
        assert_eq!(th.parent_uuid(), Some(process_uuid()));
        assert_ne!(Track::named("a", 0).uuid(), Track::named("b", 0).uuid());
        assert_ne!(Track::named("a", 0).uuid(), Track::named("a", 1).uuid());
        assert_eq!(Flow::process_scoped(5).id(), 5 ^ process_uuid());
        assert_eq!(Flow::global(5).id(), 5);
        assert_eq!(fnv1a(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a("a"), 0xaf63_dc4c_8601_ec8c);
    }

    /// `TrackDescriptor.counter` (8) with `CounterDescriptor.categories`
    /// (2), the one field the shared test schema lacks.
    #[derive(Clone, PartialEq, prost::Message)]
    struct CounterCategories {
        #[prost(message, optional, tag = "8")]
        counter: Option<Categories>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct Categories {
        #[prost(string, repeated, tag = "2")]
        categories: Vec<String>,
        #[prost(int32, optional, tag = "3")]
        unit: Option<i32>,
    }

    fn counter_descriptor(t: &CounterTrack<'_>) -> Categories {
        let mut buf = [0u8; 256];
        let n = shmtrace_abi::proto::encode_to_slice(&mut buf, |d| t.track().write_descriptor(d))
            .unwrap();
        let d: CounterCategories = prost::Message::decode(&buf[..n]).unwrap();
        d.counter.expect("a counter descriptor")
    }

    /// Upstream's thread track descriptors carry `parent_uuid` (5), the
    /// process track's uuid, besides the `ThreadDescriptor`.
    #[test]
    fn thread_track_descriptors_name_the_process_track_as_parent() {
        let mut buf = [0u8; 256];
        let track = ThreadTrack::for_thread(4321);
        let n =
            shmtrace_abi::proto::encode_to_slice(&mut buf, |d| track.write_descriptor(d)).unwrap();
        let d: crate::test_schema::TrackDescriptor = prost::Message::decode(&buf[..n]).unwrap();
        assert_eq!(d.uuid, Some(4321 ^ process_uuid()));
        assert_eq!(d.parent_uuid, Some(process_uuid()));
        let thread = d.thread.expect("a thread descriptor");
        assert_eq!(thread.tid, Some(4321));
        assert_eq!(thread.pid, Some(current_pid()));
    }

    #[test]
    fn counter_tracks_name_their_category_only_when_asked() {
        static MEM: Category = Category::new("memory");
        let plain = CounterTrack::new("rss").with_unit(CounterUnit::SizeBytes);
        let d = counter_descriptor(&plain);
        assert!(
            d.categories.is_empty(),
            "none unless asked (upstream default)"
        );
        assert_eq!(d.unit, Some(CounterUnit::SizeBytes as i32));
        let tagged = plain.with_category(&MEM);
        let d = counter_descriptor(&tagged);
        assert_eq!(d.categories, ["memory"]);
        assert_eq!(
            d.unit,
            Some(CounterUnit::SizeBytes as i32),
            "other fields kept"
        );
        assert_eq!(tagged.track().uuid(), plain.track().uuid(), "same track");
    }
}
