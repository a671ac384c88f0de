//! The bridge's sans-IO core: [`FirmwareEvent`]s in (each with the host's
//! BOOTTIME when it was read), calls on an [`Output`] and [`Request`]s for
//! the firmware out.
//!
//! # Invariants
//!
//! * **A boot is a boot.** A hello with a new boot id (or a reset) ends
//!   every sequence of the old boot (their writers unregistered): the new
//!   run's chunks go into new sequences, never mixed with the old ones,
//!   even where writer and chunk ids repeat.
//! * **Nothing before its hello.** Chunks and patches arriving with no
//!   boot announced (before the first hello, after a reset) are dropped
//!   and counted: nothing tells which data source or clock they belong to.
//! * **Chunks are validated** before anything is forwarded: a header
//!   (writer id 1..=32767) and fragments that parse (the abi reader, in the
//!   forwarder); anything else is dropped and counted.
//! * **Clock before packets.** When the firmware stamps a sequence-scoped
//!   clock (64..=127), every sequence carries a snapshot relating it to
//!   BOOTTIME ([`clock`](super::clock)) before its first packet in a
//!   session: until the first clock sample of a boot, its chunks and
//!   patches wait (at most [`HOLD_EVENTS`] of them, at most [`HOLD_NS`]);
//!   past that they go without one (counted, and logged by the shell).
//!   Those that came while no session had the data source started go
//!   into none, also if one started while they waited (counted as
//!   `chunks_no_session`): they were written before its clear and enable
//!   reached the firmware. (Before, a booting firmware's first second,
//!   held while its clock was not known, went into a session that
//!   started meanwhile: events a second before the session began.)
//!   After that a snapshot goes into every sequence whenever one is due
//!   ([`ClockSync::due`]: every
//!   [`SNAPSHOT_PERIOD_NS`](super::clock::SNAPSHOT_PERIOD_NS), or when the
//!   estimate moved).
//! * **A relation survives a ring buffer.** A session recording into a
//!   ring buffer overwrites its oldest chunks, and with them the snapshot
//!   its surviving packets need: so the relation stated last (the same
//!   packet, the same readings: not a new relation, not a step) is put
//!   into a sequence again before its next chunk once the boot forwarded
//!   [`SNAPSHOT_PERIOD_BYTES`] since the chunk of that sequence that
//!   carried its last snapshot (counted over the boot's sequences, not
//!   the one: the ring overwrites
//!   in commit order, whichever sequence wrote; a sequence that writes
//!   rarely still gets one near its chunks). What a wrapped ring loses
//!   then is at most the data of a sequence up to its first surviving
//!   snapshot: about [`SNAPSHOT_PERIOD_BYTES`] of the boot's.
//! * **Every loss is counted** ([`EngineStats`]); the firmware's own
//!   counters and the source's transport losses are kept for the summary.
//! * **Trailing losses are marked.** A firmware writer marks its drops on
//!   its next packet (`previous_packet_dropped`); drops that are the last
//!   thing it does before a session ends (an SMB that filled with nobody
//!   draining it, a dump taken then) have no next packet. So when a
//!   session ends ([`Engine::session_ending`]), the input ends or the
//!   bridge stops ([`Engine::finish`]), or a boot ends, and the
//!   firmware's loss counters (every counter but [`FIRMWARE_NO_LOSS`]),
//!   or the link's that no later chunk reveals (what the shell reports
//!   with [`Engine::link_loss`]: the last frame of a board reset
//!   mid-frame, or of an input that ended mid-frame; a flush given up on,
//!   which leaves what it committed for after the session), grew
//!   since the session started (or was last marked), every sequence
//!   of that boot gets one more chunk holding a packet
//!   `previous_packet_dropped` in that session
//!   ([`Output::mark_loss`]). The counters are the firmware's, not per
//!   writer: every sequence is marked, also one whose drops its writer
//!   marked already (over-marking, never silence).
//! * **A boot cut mid-session is marked.** A boot that ends (a reset, a
//!   new boot's hello) while a session has the data source started
//!   ([`Engine::session_started`] until [`Engine::session_ending`]) lost
//!   what its writers held in their open chunks and what its ring held
//!   undrained: no frame, no region and no counter of the old boot
//!   tells it any more, and writes after its last frame leave no trace at
//!   all, so no counter the firmware reported before could show that
//!   nothing was pending. So every sequence of that boot gets the loss
//!   mark in every such session, counted in
//!   [`EngineStats::restarts_mid_session`]. Outside sessions the firmware
//!   is kept quiet ([`run`](super::run): the last session's stop
//!   disables tracing, then flushes, and the session ends once that flush
//!   is done), so a restart when no session runs cut nothing of theirs
//!   and is not marked. A clean restart in a session (a firmware that
//!   flushed before it reset itself) is marked too: over-marking, never
//!   silence.
//! * **A link lost mid-session is marked.** A two-way link that ends (a
//!   TCP peer gone, a serial device hung up: [`Engine::finish`] with
//!   `link_lost`) while a session has the data source started cut the
//!   firmware off as a reset does: the bridge keeps a firmware it can
//!   talk to quiet outside sessions, so in one it was writing, and what
//!   its writers held in open chunks never came. Every sequence of the
//!   boot gets the mark in every such session, counted in
//!   [`EngineStats::links_lost_mid_session`]. A one-way input (a file, a
//!   FIFO) ends where its recording ends, and a firmware meant to be
//!   captured flushes its writers itself: only the counters mark it. A
//!   bridge that stops while a session runs quiets and flushes the
//!   firmware first ([`run`](super::run)), so nothing is cut, unless
//!   that flush runs out of time: then it is marked as a lost link is.

use std::collections::{HashMap, VecDeque};

use shmtrace_abi::layout::{ChunkHeaderRepr, CHUNK_HEADER_SIZE};
use shmtrace_producer::ForwardError;

use super::clock::{snapshot_packet, ClockSync, Estimate, Rate, MAX_DRIFT_PPM};
use super::output::Output;
use super::{FirmwareEvent, Hello, PatchGroup, Request};

/// Chunks and patch groups held at most while a boot waits for its first
/// clock sample.
pub const HOLD_EVENTS: usize = 4096;
/// How long a boot's chunks wait at most for its first clock sample.
pub const HOLD_NS: u64 = 2_000_000_000;
/// Bytes a boot forwards at most before a sequence gets the relation
/// stated last again (module docs). A snapshot packet is at most 48
/// bytes: at most 48 / 16384 = 0.29% more per sequence, and a ring
/// buffer of 64 KiB (the smallest sensible) still holds about four of a
/// sequence's snapshots, one of 256 KiB sixteen, leaving at most
/// 16 KiB / 64 KiB = 25% (6.25%) of its data before its first surviving
/// snapshot. Counted in bytes of firmware chunks as received (a copy in
/// the ring may take more: the smallest chunk of the SMB's page layouts
/// that holds it), so a ring holds fewer than that, not more.
pub const SNAPSHOT_PERIOD_BYTES: u64 = 16 * 1024;
/// How often a two-way source is asked for the firmware's time.
pub const SYNC_PERIOD_NS: u64 = 1_000_000_000;
/// How often it is asked at the start of a boot, until [`START_SYNCS`]
/// requests went out: the first relation rests on one exchange, whose
/// bound (half its round trip) is widest while the link is busiest, so a
/// few more soon after let the estimate narrow within tens of
/// milliseconds rather than a second.
pub const START_SYNC_PERIOD_NS: u64 = 10_000_000;
/// Requests asked at [`START_SYNC_PERIOD_NS`] (a window's worth of
/// samples, [`clock::WINDOW`](super::clock::WINDOW) at most).
pub const START_SYNCS: u32 = 8;
/// How long a sync request may go unanswered before the next one is
/// asked. One request is in flight at a time: a firmware answers its
/// commands in order, so a request asked while an earlier one waits
/// (behind a busy link, behind a flush) waits behind it too, and its round
/// trip (twice its bound) measures that wait rather than the link. Eight
/// start requests 10 ms apart all queued behind a boot's quieting flush
/// came back a second later with bounds of 0.5 s each, and the relation
/// first stated was 0.5 s off.
pub const SYNC_ANSWER_WAIT_NS: u64 = SYNC_PERIOD_NS;
/// First sequence-scoped clock id; ids from 128 are reserved.
const FIRST_SEQUENCE_CLOCK: u32 = 64;
const FIRST_RESERVED_CLOCK: u32 = 128;

/// Firmware counters that count no lost data: a chunk whose commit found
/// the ring full stays in the SMB, where the reader finds it.
pub const FIRMWARE_NO_LOSS: &[&str] = &["ring_overflows"];

/// The engine's counters (monotonic, across boots).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct EngineStats {
    /// Boots seen (hellos with a new boot id).
    pub boots: u64,
    /// Hellos refused (empty data source name, reserved clock id, a data
    /// source the producer cannot register).
    pub hellos_refused: u64,
    /// Resets announced by the source.
    pub resets: u64,
    /// Chunks received.
    pub chunks: u64,
    /// Chunks forwarded into at least one session.
    pub chunks_forwarded: u64,
    /// Chunks dropped: no session had the data source started.
    pub chunks_no_session: u64,
    /// Chunks dropped: malformed header or fragments.
    pub chunks_invalid: u64,
    /// Chunks dropped: no boot announced yet.
    pub chunks_before_hello: u64,
    /// Chunks whose every copy was dropped by the forwarder (no room in
    /// the SMB, too big, no writer id: see the forwarder's counters).
    pub chunks_dropped: u64,
    /// Chunks forwarded before any clock relation was known.
    pub chunks_without_clock: u64,
    /// Patch groups received.
    pub patch_groups: u64,
    /// Patch groups dropped: no boot, or a writer with no chunk forwarded.
    pub patch_groups_dropped: u64,
    /// Clock samples received.
    pub clock_samples: u64,
    /// Clock snapshots injected (each into every sequence of the boot).
    pub snapshots: u64,
    /// Snapshots of the relation stated last injected again into one
    /// sequence after [`SNAPSHOT_PERIOD_BYTES`] (module docs): the same
    /// relation, not counted in `snapshots`.
    pub snapshots_reinjected: u64,
    /// Snapshots put off because one of their clocks would have gone back
    /// from the previous one (a trace processor refuses a snapshot that
    /// moves the trace clock back, and stops converting from a clock that
    /// goes back): the estimate jumped by more than the time since.
    pub snapshots_deferred: u64,
    /// Sync requests sent to the firmware.
    pub sync_requests: u64,
    /// Loss marks put at the end of a sequence in a session (one per
    /// sequence and session) because the firmware's loss counters or the
    /// link's losses no later chunk reveals grew, or its boot ended
    /// mid-session (module docs).
    pub trailing_losses_marked: u64,
    /// Boots that ended (a reset, a new boot's hello) while a session had
    /// the data source started: what their writers held in open chunks
    /// and their ring held undrained is lost, and their sequences are
    /// marked (module docs).
    pub restarts_mid_session: u64,
    /// Two-way links that ended (a TCP peer gone, a serial device hung up)
    /// while a session had the data source started: what the firmware's
    /// writers held in open chunks never came, and the boot's sequences
    /// are marked (module docs).
    pub links_lost_mid_session: u64,
}

/// One forwarded sequence of a boot.
struct Sequence<S> {
    out: S,
    /// The boot's `forwarded` before the first chunk forwarded after this
    /// sequence's last snapshot (the chunk carrying it); `None` while that
    /// chunk is still to come.
    snapshot_at: Option<u64>,
    /// Chunks still to look into for the absolute clock its packets name
    /// ([`stamped_clock`]), until one names it.
    clock_checks_left: u8,
}

/// How many of a sequence's first chunks are looked into for the clock
/// its packets are stamped on.
const CLOCK_CHECKS: u8 = 4;

/// The absolute clock the first whole packet of `chunk` that names one
/// (`timestamp_clock_id`) is stamped on, if any: a track event writer's
/// first packet (its reset) and descriptors name theirs.
fn stamped_clock(chunk: &[u8]) -> Option<u32> {
    use prost::Message as _;
    let (_, fragments) = shmtrace_abi::reader::Fragments::from_chunk(chunk).ok()?;
    fragments
        .filter_map(|f| match f {
            Ok(shmtrace_abi::reader::FragmentEvent::Data(f)) if f.is_whole_packet() => Some(f.data),
            _ => None,
        })
        .find_map(|data| {
            shmtrace_ipc::protos::TracePacket::decode(data)
                .ok()?
                .timestamp_clock_id
        })
}

/// One firmware boot.
struct Boot<S> {
    hello: Hello,
    sequences: HashMap<u16, Sequence<S>>,
    /// Bytes of chunks forwarded (received, into at least one session).
    forwarded: u64,
    clock: ClockSync,
    /// The clock must be related to BOOTTIME (a sequence-scoped clock).
    needs_clock: bool,
    /// The snapshot packet of the latest estimate.
    snapshot: Option<Vec<u8>>,
    /// The clock readings it holds `(firmware, boot)`.
    injected: Option<(u64, u64)>,
    /// Events waiting for the first clock sample (each with whether a
    /// session had the data source started when it came), and since when.
    held: VecDeque<(FirmwareEvent, bool)>,
    held_since: Option<u64>,
    /// Holding gave up: later chunks go as they come.
    hold_expired: bool,
    last_sync: Option<u64>,
    /// Sync requests asked in this boot.
    syncs: u32,
    firmware: Vec<(String, u64)>,
    /// The user was told that the firmware clock's rate is not the host's.
    rate_noted: bool,
    /// The user was told that a writer stamps a clock the host does not
    /// relate.
    clock_id_noted: bool,
}

/// The latest clock relation, for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockStatus {
    /// The firmware's clock id.
    pub clock_id: u32,
    /// The relation, if measured.
    pub estimate: Option<Estimate>,
    /// Samples in the window.
    pub samples: usize,
    /// Samples refused.
    pub rejected: u64,
    /// The relation was given, not measured.
    pub fixed: bool,
    /// The firmware clock's rate against the host's, if measured.
    pub rate: Option<Rate>,
    /// The widest bound of a relation put into the trace
    /// ([`ClockSync::loosest_injected`]).
    pub loosest_stated_ns: Option<u64>,
}

/// What the user is told when a boot's clock does not run at the host's
/// rate ([`Rate::beyond_drift`]).
fn rate_note(hello: &Hello, rate: &Rate) -> String {
    format!(
        "the firmware's clock {} (boot {:#x}) runs at {:.4}x the host's ({:.3} s of it in {:.3} s), \
         beyond the {MAX_DRIFT_PPM} ppm of drift the clock relation allows for: its events are \
         placed on the host's timeline only near each clock snapshot, and the error bound does \
         not hold. Is the clock hook's tick rate right? (Under QEMU's -icount the guest's \
         clocks run on virtual time.)",
        hello.clock_id,
        hello.boot_id,
        rate.ratio(),
        rate.firmware_span_ns as f64 / 1e9,
        rate.host_span_ns as f64 / 1e9,
    )
}

/// A pair of readings `(firmware, boot)` stating `est`: for a measured
/// relation, the firmware time `now - offset` is BOOTTIME `now` (so the
/// readings of successive snapshots grow with time); a given relation is
/// stated where the smaller clock reads 0.
fn relation_point(est: &Estimate, measured: bool, now: u64) -> (u64, u64) {
    let offset = i128::from(est.offset_ns);
    if measured {
        if let Ok(fw) = u64::try_from(i128::from(now) - offset) {
            return (fw, now);
        }
    }
    if offset >= 0 {
        (0, offset as u64)
    } else {
        (offset.unsigned_abs() as u64, 0)
    }
}

/// The engine. See the module docs.
pub struct Engine<O: Output> {
    out: O,
    boot: Option<Boot<O::Sequence>>,
    /// A fixed relation instead of measured ones (offline import).
    fixed_offset: Option<i64>,
    stats: EngineStats,
    /// Firmware counters of earlier boots (their last values, summed).
    firmware_past: Vec<(String, u64)>,
    /// Things to tell the shell (logged once each).
    notes: Vec<String>,
    /// Per running session (instance id): the loss total (firmware and
    /// link) when it started or was last marked.
    sessions: HashMap<u64, u64>,
    /// The link's losses so far, as the shell last reported them.
    link_loss: u64,
    /// The boot id and data source of the hello refused last: the
    /// firmware says hello again every second, and its refusal is noted
    /// once (it is counted, and tried again, each time).
    refused: Option<(u32, String)>,
}

fn add_counters(into: &mut Vec<(String, u64)>, from: &[(String, u64)]) {
    for (name, v) in from {
        match into.iter_mut().find(|(n, _)| n == name) {
            Some((_, total)) => *total = total.saturating_add(*v),
            None => into.push((name.clone(), *v)),
        }
    }
}

impl<O: Output> Engine<O> {
    /// An engine forwarding into `out`.
    pub fn new(out: O) -> Self {
        Engine {
            out,
            boot: None,
            fixed_offset: None,
            stats: EngineStats::default(),
            firmware_past: Vec::new(),
            link_loss: 0,
            notes: Vec::new(),
            sessions: HashMap::new(),
            refused: None,
        }
    }

    /// An engine whose firmware clock is BOOTTIME minus `offset_ns`
    /// (`boot = firmware + offset`), not measured: for offline imports.
    pub fn with_fixed_clock(out: O, offset_ns: i64) -> Self {
        Engine {
            fixed_offset: Some(offset_ns),
            ..Self::new(out)
        }
    }

    /// The output.
    pub fn output(&self) -> &O {
        &self.out
    }

    /// The counters.
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// The current boot's hello.
    pub fn hello(&self) -> Option<&Hello> {
        self.boot.as_ref().map(|b| &b.hello)
    }

    /// The firmware's counters: earlier boots' last values plus the
    /// current boot's.
    pub fn firmware_counters(&self) -> Vec<(String, u64)> {
        let mut all = self.firmware_past.clone();
        if let Some(b) = &self.boot {
            add_counters(&mut all, &b.firmware);
        }
        all
    }

    /// The current boot's clock relation.
    pub fn clock(&self, now: u64) -> Option<ClockStatus> {
        self.boot.as_ref().map(|b| ClockStatus {
            clock_id: b.hello.clock_id,
            estimate: b.needs_clock.then(|| b.clock.estimate(now)).flatten(),
            samples: b.clock.samples(),
            rejected: b.clock.rejected,
            fixed: self.fixed_offset.is_some(),
            rate: b.needs_clock.then(|| b.clock.rate()).flatten(),
            loosest_stated_ns: b.clock.loosest_injected(),
        })
    }

    /// The firmware's loss counters (all but [`FIRMWARE_NO_LOSS`]),
    /// summed over boots.
    pub fn firmware_loss(&self) -> u64 {
        self.firmware_counters()
            .iter()
            .filter(|(n, _)| !FIRMWARE_NO_LOSS.contains(&n.as_str()))
            .fold(0u64, |t, (_, v)| t.saturating_add(*v))
    }

    /// The link's losses so far that no later chunk reveals (module docs),
    /// summed: what grew since a session started is marked as the
    /// firmware's own drops are. The shell reports it before events that
    /// may end a boot, and before a session ends.
    pub fn link_loss(&mut self, total: u64) {
        self.link_loss = total;
    }

    /// The firmware's and the link's losses, summed.
    fn loss(&self) -> u64 {
        self.firmware_loss().saturating_add(self.link_loss)
    }

    /// A session (instance `id`) started the data source: losses from
    /// now on are its own.
    pub fn session_started(&mut self, id: u64) {
        let loss = self.loss();
        self.sessions.insert(id, loss);
    }

    /// Session `id` is ending, and everything the firmware had was
    /// forwarded: marks the firmware's losses since it started on every
    /// sequence of the boot (module docs).
    pub fn session_ending(&mut self, id: u64) {
        self.mark_trailing_loss(Some(id), false);
        self.sessions.remove(&id);
    }

    /// The input ended or the bridge stops: events still held for a clock
    /// sample go without one (counted in
    /// [`EngineStats::chunks_without_clock`]), then the losses of every
    /// session still running are marked (module docs). `link_lost`: the
    /// input was a two-way link that ended (module docs, "A link lost
    /// mid-session is marked").
    pub fn finish(&mut self, link_lost: bool) {
        self.release_held(false);
        let cut = link_lost && self.boot.is_some() && !self.sessions.is_empty();
        if let (true, Some(b)) = (cut, &self.boot) {
            self.stats.links_lost_mid_session += 1;
            self.notes.push(format!(
                "the link to the firmware (boot {:#x}) ended while {} session(s) recorded it: \
                 what its writers held in open chunks is lost (marked in the trace)",
                b.hello.boot_id,
                self.sessions.len()
            ));
        }
        self.mark_trailing_loss(None, cut);
    }

    /// Marks the losses since each session's mark in `only` (or every
    /// session; every one whatever its losses if the boot was `cut`) on
    /// every sequence of the current boot.
    fn mark_trailing_loss(&mut self, only: Option<u64>, cut: bool) {
        let loss = self.loss();
        let Some(b) = &mut self.boot else {
            return;
        };
        for (&id, mark) in self.sessions.iter_mut() {
            if only.is_some_and(|o| o != id) || (loss <= *mark && !cut) {
                continue;
            }
            *mark = loss;
            let mut n = 0u64;
            for seq in b.sequences.values_mut() {
                n += self.out.mark_loss(&mut seq.out, Some(id)) as u64;
            }
            self.stats.trailing_losses_marked += n;
        }
    }

    /// Messages for the user (taken once).
    pub fn take_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notes)
    }

    /// Handles one event read at host BOOTTIME `now`.
    pub fn handle(&mut self, event: FirmwareEvent, now: u64) {
        match event {
            FirmwareEvent::Hello(h) => self.hello_event(h, now),
            FirmwareEvent::Reset => {
                self.stats.resets += 1;
                self.end_boot();
            }
            FirmwareEvent::Clock(c) => {
                self.stats.clock_samples += 1;
                if let Some(b) = &mut self.boot {
                    b.clock.sample(c.firmware_ns, c.nonce, now, c.transfer_ns);
                    match b.clock.rate() {
                        Some(r) if r.beyond_drift && b.needs_clock && !b.rate_noted => {
                            b.rate_noted = true;
                            self.notes.push(rate_note(&b.hello, &r));
                        }
                        _ => {}
                    }
                }
                self.refresh_clock(now);
            }
            FirmwareEvent::Stats(counters) => {
                if let Some(b) = &mut self.boot {
                    b.firmware = counters;
                }
            }
            e @ (FirmwareEvent::Chunk(_) | FirmwareEvent::Patches(_)) => {
                let Some(b) = &mut self.boot else {
                    match e {
                        FirmwareEvent::Chunk(_) => {
                            self.stats.chunks += 1;
                            self.stats.chunks_before_hello += 1;
                        }
                        _ => {
                            self.stats.patch_groups += 1;
                            self.stats.patch_groups_dropped += 1;
                        }
                    }
                    return;
                };
                if b.needs_clock && b.snapshot.is_none() && !b.hold_expired {
                    b.held_since.get_or_insert(now);
                    b.held.push_back((e, !self.sessions.is_empty()));
                    if b.held.len() >= HOLD_EVENTS {
                        self.release_held(true);
                    }
                    return;
                }
                self.forward(e);
            }
        }
    }

    /// Periodic work at host BOOTTIME `now`: held events that waited too
    /// long go, snapshots due are injected, and (if the source can answer
    /// now, `can_sync`: not while the firmware is still busy with a flush)
    /// a sync request is due every [`SYNC_PERIOD_NS`] (every
    /// [`START_SYNC_PERIOD_NS`] for a boot's first [`START_SYNCS`]), once
    /// the one before was answered or [`SYNC_ANSWER_WAIT_NS`] passed.
    /// Returns what to ask the firmware.
    pub fn tick(&mut self, now: u64, can_sync: bool) -> Vec<Request> {
        let mut requests = Vec::new();
        let expired = self
            .boot
            .as_ref()
            .and_then(|b| b.held_since)
            .is_some_and(|since| now.saturating_sub(since) >= HOLD_NS);
        if expired {
            self.release_held(true);
        }
        self.refresh_clock(now);
        if let Some(b) = &mut self.boot {
            let period = if b.syncs < START_SYNCS {
                START_SYNC_PERIOD_NS
            } else {
                SYNC_PERIOD_NS
            };
            let due = b.last_sync.is_none_or(|t| now.saturating_sub(t) >= period)
                && b.clock
                    .unanswered_since()
                    .is_none_or(|t| now.saturating_sub(t) >= SYNC_ANSWER_WAIT_NS);
            if can_sync && b.needs_clock && self.fixed_offset.is_none() && due {
                b.last_sync = Some(now);
                b.syncs += 1;
                requests.push(Request::Sync(b.clock.request(now)));
                self.stats.sync_requests += 1;
            }
        }
        requests
    }

    fn hello_event(&mut self, h: Hello, now: u64) {
        if self
            .boot
            .as_ref()
            .is_some_and(|b| b.hello.boot_id == h.boot_id && b.hello.data_source == h.data_source)
        {
            // The same boot again (a transport re-attached): go on.
            return;
        }
        self.end_boot();
        let refusal = if h.data_source.is_empty() || h.clock_id >= FIRST_RESERVED_CLOCK {
            Some(format!(
                "refused the firmware's hello (boot {:#x}): {}",
                h.boot_id,
                if h.data_source.is_empty() {
                    "no data source name".to_string()
                } else {
                    format!("clock id {} is reserved", h.clock_id)
                }
            ))
        } else {
            self.out
                .register(&h.data_source)
                .err()
                .map(|e| format!("cannot register data source {:?}: {e}", h.data_source))
        };
        if let Some(note) = refusal {
            self.stats.hellos_refused += 1;
            let this = Some((h.boot_id, h.data_source));
            if self.refused != this {
                self.notes.push(note);
                self.refused = this;
            }
            return;
        }
        self.refused = None;
        self.stats.boots += 1;
        let clock = match self.fixed_offset {
            Some(o) => ClockSync::fixed(o),
            None => ClockSync::new(),
        };
        self.boot = Some(Boot {
            needs_clock: h.clock_id >= FIRST_SEQUENCE_CLOCK,
            hello: h,
            sequences: HashMap::new(),
            forwarded: 0,
            clock,
            snapshot: None,
            injected: None,
            held: VecDeque::new(),
            held_since: None,
            hold_expired: false,
            last_sync: None,
            syncs: 0,
            rate_noted: false,
            clock_id_noted: false,
            firmware: Vec::new(),
        });
        self.refresh_clock(now);
    }

    /// Ends the current boot: held events go first (they are the old
    /// boot's), then its sequences are marked (its losses; all of them if
    /// a session had the data source: module docs), then every sequence
    /// is dropped (unregistered).
    fn end_boot(&mut self) {
        self.release_held(false);
        let cut = self.boot.is_some() && !self.sessions.is_empty();
        self.stats.restarts_mid_session += u64::from(cut);
        self.mark_trailing_loss(None, cut);
        if let Some(b) = self.boot.take() {
            add_counters(&mut self.firmware_past, &b.firmware);
        }
    }

    /// Forwards the held events (`expired`: holding gave up for good).
    fn release_held(&mut self, expired: bool) {
        let Some(b) = &mut self.boot else {
            return;
        };
        let held = std::mem::take(&mut b.held);
        b.held_since = None;
        if expired && b.snapshot.is_none() {
            b.hold_expired = true;
            self.notes.push(format!(
                "no clock sample from the firmware (boot {:#x}) in time: forwarding without a \
                 clock snapshot; timestamps on its clock {} cannot be placed on the host's \
                 timeline",
                b.hello.boot_id, b.hello.clock_id
            ));
        }
        for (e, in_session) in held {
            if in_session {
                self.forward(e);
            } else {
                // It came while no session recorded: it belongs to none,
                // also if one started while it waited (it was written
                // before that session's clear and enable reached the
                // firmware). What the forwarder does with a chunk no
                // session wants, without asking it.
                match e {
                    FirmwareEvent::Chunk(_) => {
                        self.stats.chunks += 1;
                        self.stats.chunks_no_session += 1;
                    }
                    _ => self.stats.patch_groups += 1,
                }
            }
        }
    }

    /// Injects a new snapshot into every sequence if one is due; releases
    /// held events once the first one exists.
    fn refresh_clock(&mut self, now: u64) {
        let Some(b) = &mut self.boot else {
            return;
        };
        if !b.needs_clock {
            return;
        }
        let Some(measured) = b.clock.due(now) else {
            return;
        };
        // The relation stated so far stays while the measurement agrees
        // with it (within its error bound): every change of offset is a
        // step in the mapping from firmware time to BOOTTIME, and a step
        // back reorders the events around it.
        let est = match b.clock.last_injected() {
            Some(last) if last.offset_ns.abs_diff(measured.offset_ns) <= measured.bound_ns => {
                Estimate {
                    offset_ns: last.offset_ns,
                    ..measured
                }
            }
            _ => measured,
        };
        let (firmware_ns, boot_ns) = relation_point(&est, self.fixed_offset.is_none(), now);
        if b.injected
            .is_some_and(|(fw, boot)| firmware_ns < fw || boot_ns < boot)
        {
            self.stats.snapshots_deferred += 1;
            return;
        }
        log::debug!(
            "clock snapshot at {now}: offset {} ns, bound {} ns (measured {:?})",
            est.offset_ns,
            est.bound_ns,
            measured
        );
        b.clock.injected(est, now);
        b.injected = Some((firmware_ns, boot_ns));
        let packet = snapshot_packet(b.hello.clock_id, firmware_ns, boot_ns);
        for seq in b.sequences.values_mut() {
            self.out.set_injected_packet(&mut seq.out, &packet);
            seq.snapshot_at = None;
        }
        b.snapshot = Some(packet);
        self.stats.snapshots += 1;
        if !b.held.is_empty() {
            self.release_held(false);
        }
    }

    fn forward(&mut self, e: FirmwareEvent) {
        let Some(b) = &mut self.boot else {
            return;
        };
        match e {
            FirmwareEvent::Chunk(bytes) => {
                self.stats.chunks += 1;
                let header = bytes
                    .get(..CHUNK_HEADER_SIZE)
                    .and_then(|h| h.try_into().ok())
                    .map(ChunkHeaderRepr::from_bytes)
                    .filter(|h| h.validate().is_ok());
                let Some(header) = header else {
                    self.stats.chunks_invalid += 1;
                    return;
                };
                let seq = match b.sequences.entry(header.writer_id) {
                    std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                    std::collections::hash_map::Entry::Vacant(v) => {
                        let Some(mut out) = self.out.new_sequence(&b.hello.data_source) else {
                            self.stats.chunks_dropped += 1;
                            return;
                        };
                        if let Some(p) = &b.snapshot {
                            self.out.set_injected_packet(&mut out, p);
                        }
                        v.insert(Sequence {
                            out,
                            snapshot_at: None,
                            clock_checks_left: CLOCK_CHECKS,
                        })
                    }
                };
                if b.needs_clock && seq.clock_checks_left > 0 {
                    seq.clock_checks_left -= 1;
                    if let Some(id) = stamped_clock(&bytes) {
                        seq.clock_checks_left = 0;
                        if id != b.hello.clock_id && !b.clock_id_noted {
                            b.clock_id_noted = true;
                            self.notes.push(format!(
                                "writer {} of the firmware (boot {:#x}) stamps its packets on \
                                 clock {id}, but its region says its clock is {}: the host \
                                 relates only clock {} to its own, so those packets cannot be \
                                 placed on the timeline. Give the writer's SequenceConfig \
                                 .with_clock_id({}), or the region the writers' clock id.",
                                header.writer_id,
                                b.hello.boot_id,
                                b.hello.clock_id,
                                b.hello.clock_id,
                                b.hello.clock_id
                            ));
                        }
                    }
                }
                match (&b.snapshot, seq.snapshot_at) {
                    // The relation stated last, again (module docs).
                    (Some(p), Some(at)) if b.forwarded - at >= SNAPSHOT_PERIOD_BYTES => {
                        self.out.set_injected_packet(&mut seq.out, p);
                        seq.snapshot_at = None;
                        self.stats.snapshots_reinjected += 1;
                    }
                    (Some(_), _) => {}
                    (None, _) if b.needs_clock => self.stats.chunks_without_clock += 1,
                    (None, _) => {}
                }
                match self.out.forward_chunk(&mut seq.out, &bytes) {
                    Ok(f) if f.copies > 0 => {
                        self.stats.chunks_forwarded += 1;
                        seq.snapshot_at.get_or_insert(b.forwarded);
                        b.forwarded += bytes.len() as u64;
                    }
                    Ok(f) if f.dropped > 0 => self.stats.chunks_dropped += 1,
                    // Nothing of it belonged in the sessions (an orphan
                    // piece of a packet begun before they started).
                    Ok(_) => {}
                    Err(ForwardError::NoSession) => self.stats.chunks_no_session += 1,
                    Err(_) => self.stats.chunks_invalid += 1,
                }
            }
            FirmwareEvent::Patches(PatchGroup {
                writer_id,
                chunk_id,
                has_more,
                patches,
            }) => {
                self.stats.patch_groups += 1;
                let Some(seq) = b.sequences.get_mut(&writer_id) else {
                    self.stats.patch_groups_dropped += 1;
                    return;
                };
                if self
                    .out
                    .forward_patches(&mut seq.out, chunk_id, &patches, has_more)
                    == 0
                {
                    self.stats.patch_groups_dropped += 1;
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;
