//! Reading back what a [`TrackEventWriter`] wrote: an arbiter that collects
//! the chunks it commits (through a real `Smb`: acquired, released as
//! complete, read and freed as a service does), the chunks' packets (with
//! abi's hostile-input reader), and a replay of the packet sequence the way
//! a trace processor reads it, which fails on anything a reader could not
//! resolve. (`tests/tests/firmware_encoding.rs` includes this file and
//! `schema.rs` by path.)
//!
//! [`TrackEventWriter`]: shmtrace_abi::track_event::TrackEventWriter

#![allow(dead_code)] // each includer uses a different subset

use std::cell::Cell;
use std::collections::BTreeSet;
use std::rc::Rc;

use prost::Message;
use shmtrace_abi::layout::{ChunkFlags, ChunkHeaderRepr, PageLayout, PageSize};
use shmtrace_abi::reader::{FragmentEvent, Fragments};
use shmtrace_abi::smb::{ChunkLocation, Smb, SmbStorage, WritableChunk};
use shmtrace_abi::track_event::{Clock, SequenceConfig, TrackEventWriter};
use shmtrace_abi::writer::{BufferId, ChunkArbiter, InPlaceWriter, PatchGroup, PatchesDeferred};

use super::schema::{SnapshotClock, TracePacket, TrackDescriptor};

/// The buffer every test writer commits to.
pub const TARGET_BUFFER: BufferId = 3;
/// The writer id of test writers.
pub const WRITER_ID: u16 = 7;
/// The sequence-scoped incremental clock events are stamped on.
pub const INCREMENTAL: u32 = 64;
/// Bytes of the test SMBs: 4 pages of 4 KiB, 1 KiB chunks (`Div4`).
pub const SMB_BYTES: usize = 16 * 1024;
/// `SEQ_INCREMENTAL_STATE_CLEARED`.
pub const CLEARED: u32 = 1;
/// `SEQ_NEEDS_INCREMENTAL_STATE`.
pub const NEEDS_STATE: u32 = 2;

/// A clock the test sets; clones share the time.
#[derive(Clone, Default)]
pub struct ManualClock(Rc<Cell<u64>>);

impl ManualClock {
    /// A clock reading `ns`.
    pub fn at(ns: u64) -> Self {
        Self(Rc::new(Cell::new(ns)))
    }
    /// Now.
    pub fn get(&self) -> u64 {
        self.0.get()
    }
    /// Sets the time (it may go backwards).
    pub fn set(&self, ns: u64) {
        self.0.set(ns);
    }
    /// Moves the time forward by `ns`.
    pub fn advance(&self, ns: u64) -> u64 {
        self.0.set(self.0.get() + ns);
        self.0.get()
    }
}

impl Clock for ManualClock {
    fn now_ns(&mut self) -> u64 {
        self.0.get()
    }
}

/// A service in the same program: takes the chunks a writer commits out of
/// the SMB (or holds them there, filling it), and plays the consumer's
/// switches a firmware region has (recording on/off, clear requests).
pub struct Collector<'s> {
    smb: &'s Smb<'s>,
    layout: PageLayout,
    /// No chunk to give (as if every chunk were taken).
    pub full: bool,
    /// What `tracing_enabled` answers.
    pub enabled: bool,
    /// What `clear_epoch` answers.
    pub epoch: u32,
    /// Leave committed chunks in the SMB (until [`Collector::drain`]), so
    /// it fills up for real.
    pub hold: bool,
    held: Vec<ChunkLocation>,
    /// Whole chunks (header and payload) in commit order.
    pub chunks: Vec<Vec<u8>>,
    /// Patch groups received (an in-place writer sends none).
    pub patch_groups: usize,
    /// `flush` calls.
    pub flushes: usize,
}

impl<'s> Collector<'s> {
    /// A collector over `smb`, partitioning pages with `layout`.
    pub fn new(smb: &'s Smb<'s>, layout: PageLayout) -> Self {
        Self {
            smb,
            layout,
            full: false,
            enabled: true,
            epoch: 0,
            hold: false,
            held: Vec::new(),
            chunks: Vec::new(),
            patch_groups: 0,
            flushes: 0,
        }
    }

    /// Reads out and frees the chunks held so far.
    pub fn drain(&mut self) {
        for loc in std::mem::take(&mut self.held) {
            self.read(loc);
        }
    }

    fn read(&mut self, loc: ChunkLocation) {
        let chunk = self
            .smb
            .try_acquire_chunk_for_reading(loc.page, loc.chunk)
            .expect("a committed chunk is complete");
        let mut bytes = vec![0u8; chunk.chunk_size()];
        chunk.copy_out(&mut bytes).expect("a valid chunk header");
        chunk.release_as_free().expect("the chunk is ours to free");
        self.chunks.push(bytes);
    }
}

impl<'s> ChunkArbiter<'s> for Collector<'s> {
    fn acquire_chunk(&mut self, header: ChunkHeaderRepr) -> Option<WritableChunk<'s>> {
        if self.full {
            return None;
        }
        self.smb
            .try_acquire_any_chunk_for_writing(0, self.layout, header)
            .ok()
    }

    fn commit_chunk(&mut self, chunk: WritableChunk<'s>, target_buffer: BufferId) {
        assert_eq!(target_buffer, TARGET_BUFFER);
        let loc = chunk.release_as_complete().expect("release as complete");
        if self.hold {
            self.held.push(loc);
        } else {
            self.read(loc);
        }
    }

    fn send_patches(&mut self, _group: &PatchGroup<'_>) -> Result<(), PatchesDeferred> {
        self.patch_groups += 1;
        Ok(())
    }

    fn flush(&mut self) {
        self.flushes += 1;
    }

    fn tracing_enabled(&self) -> bool {
        self.enabled
    }

    fn clear_epoch(&self) -> u32 {
        self.epoch
    }
}

/// A test writer's type: `N` interned strings, `T` remembered tracks.
pub type Writer<'s, const N: usize = 16, const T: usize = 4> =
    TrackEventWriter<'s, Collector<'s>, ManualClock, N, T>;

/// Boxed zeroed storage for a test SMB.
pub fn storage() -> Box<SmbStorage<SMB_BYTES>> {
    Box::new(SmbStorage::new())
}

/// An SMB over `storage` with 4 KiB pages.
pub fn smb(storage: &mut SmbStorage<SMB_BYTES>) -> Smb<'_> {
    Smb::new(storage, PageSize::DEFAULT).expect("a valid SMB")
}

/// A writer (id [`WRITER_ID`]) into `smb`, timed by `clock`.
pub fn writer<'s, const N: usize, const T: usize>(
    smb: &'s Smb<'s>,
    clock: &ManualClock,
    config: SequenceConfig,
) -> Writer<'s, N, T> {
    writer_with_id(smb, clock, config, WRITER_ID)
}

/// A writer with id `writer_id` into `smb`, timed by `clock`.
pub fn writer_with_id<'s, const N: usize, const T: usize>(
    smb: &'s Smb<'s>,
    clock: &ManualClock,
    config: SequenceConfig,
    writer_id: u16,
) -> Writer<'s, N, T> {
    let out = InPlaceWriter::new(
        Collector::new(smb, PageLayout::Div4),
        writer_id,
        TARGET_BUFFER,
    )
    .expect("a valid writer id");
    TrackEventWriter::new(out, clock.clone(), config)
}

/// Flushes `w` and takes the chunks its collector has read so far.
pub fn take_chunks<const N: usize, const T: usize>(w: &mut Writer<'_, N, T>) -> Vec<Vec<u8>> {
    w.flush();
    let arbiter = w.arbiter_mut();
    arbiter.drain();
    assert_eq!(
        arbiter.patch_groups, 0,
        "an in-place writer sends no patches"
    );
    std::mem::take(&mut arbiter.chunks)
}

/// The packets in `chunks` (whole chunks in commit order) of writer
/// `writer_id`, read with abi's reader. Every chunk must be complete and
/// hold whole packets only (in-place writers never fragment), with ids
/// from `first_chunk_id` on.
pub fn packets_of(
    chunks: &[Vec<u8>],
    writer_id: u16,
    first_chunk_id: u32,
) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    for (i, chunk) in chunks.iter().enumerate() {
        let (header, fragments) =
            Fragments::from_chunk(chunk).map_err(|e| format!("chunk {i}: {e}"))?;
        if header.writer_id != writer_id {
            return Err(format!("chunk {i}: writer {}", header.writer_id));
        }
        let want = first_chunk_id.wrapping_add(i as u32);
        if header.chunk_id != want {
            return Err(format!("chunk {i}: id {} (want {want})", header.chunk_id));
        }
        if header.packets.flags() != ChunkFlags::EMPTY {
            return Err(format!("chunk {i}: flags {:?}", header.packets.flags()));
        }
        for fragment in fragments {
            match fragment.map_err(|e| format!("chunk {i}: {e}"))? {
                FragmentEvent::Data(f) if f.is_whole_packet() => out.push(f.data.to_vec()),
                FragmentEvent::Data(f) => return Err(format!("chunk {i}: fragment {f:?}")),
                FragmentEvent::Dropped(d) => return Err(format!("chunk {i}: dropped {d:?}")),
            }
        }
    }
    Ok(out)
}

/// A decoded debug annotation value.
#[derive(Debug, Clone, PartialEq)]
pub enum ArgValue {
    Bool(bool),
    Uint(u64),
    Int(i64),
    Double(f64),
    Str(String),
    Pointer(u64),
}

/// A decoded counter value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CounterValue {
    Int(i64),
    Double(f64),
}

/// A track event as a reader resolves it.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Index of its packet in the sequence.
    pub packet: usize,
    /// `TrackEvent.type`.
    pub kind: i32,
    /// Its track (explicit, or the sequence's default).
    pub track: u64,
    /// Categories, resolved.
    pub categories: Vec<String>,
    /// The name, resolved.
    pub name: Option<String>,
    /// Debug annotations: name (resolved) and value.
    pub args: Vec<(String, ArgValue)>,
    /// `flow_ids`.
    pub flows: Vec<u64>,
    /// `terminating_flow_ids`.
    pub terminating: Vec<u64>,
    /// The counter value.
    pub counter: Option<CounterValue>,
    /// Its time on the writer's absolute clock.
    pub ts: u64,
    /// Stamped with an absolute time (not a delta on clock 64).
    pub absolute: bool,
    /// Strings written inline rather than by interned id.
    pub inline_strings: usize,
}

/// An interned string as defined on the sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interning {
    /// Index of the defining packet.
    pub packet: usize,
    /// 0 category, 1 event name, 2 annotation name.
    pub kind: usize,
    /// The id.
    pub iid: u64,
    /// The string.
    pub name: String,
}

/// A replayed sequence.
#[derive(Debug, Default)]
pub struct Sequence {
    /// Every packet, decoded.
    pub packets: Vec<TracePacket>,
    /// Every packet's bytes.
    pub bytes: Vec<Vec<u8>>,
    /// The track events, in order.
    pub events: Vec<Event>,
    /// Indices of the packets that clear incremental state.
    pub resets: Vec<usize>,
    /// Indices and values of `previous_packet_dropped`.
    pub loss_marks: Vec<(usize, u32)>,
    /// Track descriptors: packet index, descriptor, and whether it repeats
    /// one written since the last reset.
    pub descriptors: Vec<(usize, TrackDescriptor, bool)>,
    /// Interned strings as they were defined.
    pub interned: Vec<Interning>,
    /// Clock snapshots outside reset packets: packet index, time on the
    /// writer's clock, clocks.
    pub snapshots: Vec<(usize, u64, Vec<SnapshotClock>)>,
}

impl Sequence {
    /// The events of one type.
    pub fn of_kind(&self, kind: i32) -> impl Iterator<Item = &Event> {
        self.events.iter().filter(move |e| e.kind == kind)
    }

    /// Resets between packet `from` (exclusive) and `to` (exclusive).
    pub fn resets_between(&self, from: usize, to: usize) -> usize {
        self.resets.iter().filter(|&&r| r > from && r < to).count()
    }
}

/// Incremental state of the replay, valid between a reset and a loss.
#[derive(Default)]
struct State {
    valid: bool,
    names: [Vec<String>; 3],
    described: BTreeSet<u64>,
    counters: BTreeSet<u64>,
    clock64: u64,
}

/// Replays `packets` of a sequence whose absolute clock is `clock_id` and
/// default track `default_track`, as a trace processor would, and fails on
/// anything it could not read exactly:
///
/// * a packet with unknown or repeated fields, or bytes prost would not
///   write (its re-encoded length differs: every size here is one byte);
/// * `first_packet_on_sequence` anywhere but on packet 0, or missing there;
/// * a reset packet (flags 1) without the defaults (clock 64, the default
///   track) or the snapshot defining clock 64 as the absolute clock at its
///   own time, on the absolute clock;
/// * a packet needing incremental state while it is invalid (before the
///   first reset, or after a loss mark and before the next reset);
/// * an interned id that is not the next of its kind (ids count from 1
///   per kind after each reset; a string is defined once), or a use of one
///   not defined since the last reset;
/// * an absolute time on another clock; a descriptor or snapshot not
///   stamped on the absolute clock;
/// * an event on a track (other than the default) or a counter on a
///   counter track not described since the last reset; an explicit
///   `track_uuid` equal to the default track.
pub fn replay(
    packets: Vec<Vec<u8>>,
    clock_id: u32,
    default_track: u64,
) -> Result<Sequence, String> {
    let mut seq = Sequence::default();
    let mut st = State::default();
    for (i, bytes) in packets.into_iter().enumerate() {
        let p = TracePacket::decode(&bytes[..]).map_err(|e| format!("packet {i}: {e}"))?;
        if p.encoded_len() != bytes.len() {
            return Err(format!(
                "packet {i}: {} bytes, re-encoded {}: {bytes:02x?}",
                bytes.len(),
                p.encoded_len()
            ));
        }
        let err = |what: String| format!("packet {i}: {what}: {p:?}");
        if p.first_packet_on_sequence != (i == 0).then_some(true) {
            return Err(err("first_packet_on_sequence".into()));
        }
        if let Some(loss) = p.previous_packet_dropped {
            seq.loss_marks.push((i, loss));
            st.valid = false;
        }
        let flags = p.sequence_flags.unwrap_or(0);
        match flags {
            0 => {}
            CLEARED => {
                let t = p
                    .timestamp
                    .ok_or_else(|| err("reset without time".into()))?;
                if p.timestamp_clock_id != Some(clock_id) {
                    return Err(err("reset not on the absolute clock".into()));
                }
                let d = p
                    .trace_packet_defaults
                    .as_ref()
                    .ok_or_else(|| err("reset without defaults".into()))?;
                let track = d.track_event_defaults.as_ref().and_then(|t| t.track_uuid);
                if d.timestamp_clock_id != Some(INCREMENTAL) || track != Some(default_track) {
                    return Err(err("wrong defaults".into()));
                }
                let clocks = p
                    .clock_snapshot
                    .as_ref()
                    .map(|s| s.clocks.clone())
                    .unwrap_or_default();
                let want = [
                    SnapshotClock {
                        clock_id: Some(clock_id),
                        timestamp: Some(t),
                        is_incremental: None,
                    },
                    SnapshotClock {
                        clock_id: Some(INCREMENTAL),
                        timestamp: Some(t),
                        is_incremental: Some(true),
                    },
                ];
                if clocks != want {
                    return Err(err("reset snapshot".into()));
                }
                if p.track_event.is_some()
                    || p.interned_data.is_some()
                    || p.track_descriptor.is_some()
                {
                    return Err(err("reset with payload".into()));
                }
                st = State {
                    valid: true,
                    clock64: t,
                    ..State::default()
                };
                seq.resets.push(i);
            }
            NEEDS_STATE if st.valid => {}
            NEEDS_STATE => return Err(err("needs incremental state, which is invalid".into())),
            other => return Err(err(format!("sequence_flags {other}"))),
        }
        if let Some(d) = &p.interned_data {
            if flags != NEEDS_STATE {
                return Err(err("interned data on a packet not needing state".into()));
            }
            let tables = [
                &d.event_categories,
                &d.event_names,
                &d.debug_annotation_names,
            ];
            for (kind, entries) in tables.into_iter().enumerate() {
                for e in entries {
                    let name = e
                        .name
                        .clone()
                        .ok_or_else(|| err("entry without name".into()))?;
                    let want = st.names[kind].len() as u64 + 1;
                    if e.iid != Some(want) {
                        return Err(err(format!("iid {:?} of kind {kind}, want {want}", e.iid)));
                    }
                    st.names[kind].push(name.clone());
                    seq.interned.push(Interning {
                        packet: i,
                        kind,
                        iid: want,
                        name,
                    });
                }
            }
        }
        // The packet's time on the absolute clock.
        let time = match (p.timestamp, p.timestamp_clock_id) {
            (Some(ts), Some(c)) if c == clock_id => Some((ts, true)),
            (Some(_), Some(c)) => return Err(err(format!("time on clock {c}"))),
            (Some(delta), None) => {
                if flags != NEEDS_STATE {
                    return Err(err("delta on a packet not needing state".into()));
                }
                st.clock64 += delta;
                Some((st.clock64, false))
            }
            (None, Some(_)) => return Err(err("clock id without time".into())),
            (None, None) => None,
        };
        if let Some(d) = &p.track_descriptor {
            if flags != 0 || time.is_none_or(|(_, abs)| !abs) {
                return Err(err("descriptor not stamped on the absolute clock".into()));
            }
            let uuid = d
                .uuid
                .ok_or_else(|| err("descriptor without uuid".into()))?;
            let repeat = !st.described.insert(uuid);
            if d.counter.is_some() {
                st.counters.insert(uuid);
            }
            seq.descriptors.push((i, d.clone(), repeat));
        }
        if flags == 0 {
            if let Some(s) = &p.clock_snapshot {
                let Some((ts, true)) = time else {
                    return Err(err("snapshot not stamped on the absolute clock".into()));
                };
                seq.snapshots.push((i, ts, s.clocks.clone()));
            }
        }
        if let Some(te) = &p.track_event {
            if flags != NEEDS_STATE {
                return Err(err("event without SEQ_NEEDS_INCREMENTAL_STATE".into()));
            }
            let (ts, absolute) = time.ok_or_else(|| err("event without time".into()))?;
            let mut inline = te.categories.len() + usize::from(te.name.is_some());
            let resolve = |kind: usize, iid: u64| {
                usize::try_from(iid)
                    .ok()
                    .and_then(|i| i.checked_sub(1))
                    .and_then(|i| st.names[kind].get(i))
                    .cloned()
                    .ok_or_else(|| err(format!("iid {iid} of kind {kind} unresolved")))
            };
            let mut categories = Vec::new();
            for &iid in &te.category_iids {
                categories.push(resolve(0, iid)?);
            }
            categories.extend(te.categories.iter().cloned());
            let name = match (te.name_iid, &te.name) {
                (Some(iid), None) => Some(resolve(1, iid)?),
                (None, name) => name.clone(),
                (Some(_), Some(_)) => return Err(err("name and name_iid".into())),
            };
            let mut args = Vec::new();
            for a in &te.debug_annotations {
                let name = match (a.name_iid, &a.name) {
                    (Some(iid), None) => resolve(2, iid)?,
                    (None, Some(n)) => {
                        inline += 1;
                        n.clone()
                    }
                    _ => return Err(err("annotation name".into())),
                };
                let values = [
                    a.bool_value.map(ArgValue::Bool),
                    a.uint_value.map(ArgValue::Uint),
                    a.int_value.map(ArgValue::Int),
                    a.double_value.map(ArgValue::Double),
                    a.string_value.clone().map(ArgValue::Str),
                    a.pointer_value.map(ArgValue::Pointer),
                ];
                let mut set = values.into_iter().flatten();
                let (Some(value), None) = (set.next(), set.next()) else {
                    return Err(err("annotation without exactly one value".into()));
                };
                args.push((name, value));
            }
            let track = match te.track_uuid {
                Some(t) if t == default_track => {
                    return Err(err("explicit track_uuid of the default track".into()))
                }
                Some(t) if !st.described.contains(&t) => {
                    return Err(err(format!("track {t} not described")))
                }
                Some(t) => t,
                None => default_track,
            };
            let kind = te.r#type.ok_or_else(|| err("event without type".into()))?;
            let counter = match (te.counter_value, te.double_counter_value) {
                (Some(v), None) => Some(CounterValue::Int(v)),
                (None, Some(v)) => Some(CounterValue::Double(v)),
                (None, None) => None,
                _ => return Err(err("two counter values".into())),
            };
            match kind {
                1 | 3 => {}
                2 if name.is_none() && categories.is_empty() => {}
                4 if counter.is_some() && st.counters.contains(&track) => {}
                _ => return Err(err("event type and fields disagree".into())),
            }
            if kind != 4 && counter.is_some() {
                return Err(err("counter value on a non-counter".into()));
            }
            seq.events.push(Event {
                packet: i,
                kind,
                track,
                categories,
                name,
                args,
                flows: te.flow_ids.clone(),
                terminating: te.terminating_flow_ids.clone(),
                counter,
                ts,
                absolute,
                inline_strings: inline,
            });
        }
        seq.packets.push(p);
        seq.bytes.push(bytes);
    }
    Ok(seq)
}

/// Everything in one call: flushes `w`, reads its chunks, replays them
/// (absolute clock `clock_id`, default track `default_track`); panics with
/// the replay's complaint.
pub fn read_back<const N: usize, const T: usize>(
    w: &mut Writer<'_, N, T>,
    clock_id: u32,
    default_track: u64,
) -> Sequence {
    let chunks = take_chunks(w);
    let packets = packets_of(&chunks, WRITER_ID, 0).unwrap_or_else(|e| panic!("{e}"));
    replay(packets, clock_id, default_track).unwrap_or_else(|e| panic!("{e}"))
}
