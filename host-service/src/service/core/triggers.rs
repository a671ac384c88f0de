//! Triggers: `TraceConfig.trigger_config` and `ProducerPort.ActivateTriggers`
//! (upstream: `TracingServiceImpl::ActivateTriggers`,
//! src/tracing/service/tracing_service_impl.cc).
//!
//! * **START_TRACING**: the session is set up but not started. The first
//!   matching trigger while it is still configured starts it, with
//!   `duration_ms` replaced by the trigger's `stop_delay_ms` (0: until the
//!   consumer stops it). If none comes within `trigger_timeout_ms`, the
//!   session is disabled.
//! * **STOP_TRACING**: the session starts at once with `duration_ms =
//!   trigger_timeout_ms`. The first matching trigger replaces that deadline:
//!   `stop_delay_ms` later the session flushes and stops; later triggers are
//!   recorded but change nothing.
//! * A trigger matches a session that lists its name, if the optional
//!   `producer_name_regex` fully matches the sending producer's name, a random
//!   draw is not below `skip_probability`, and the name fired fewer than
//!   `max_per_24_h` times in the last 24 hours (service-wide history of
//!   matched triggers). As upstream, `skip_probability` is not validated: 1
//!   or more always skips, 0 or less (or NaN) never does.
//! * Each matched trigger takes a clock snapshot and is emitted once as a
//!   `trigger` packet (field 46; unless `disable_trace_config`). A session
//!   that lists triggers returns no data at all — neither `ReadBuffers` nor
//!   `write_into_file` — until one matched.
//! * **CLONE_SNAPSHOT** (or STOP_TRACING with
//!   `use_clone_snapshot_if_available`): the session starts at once with
//!   `duration_ms = trigger_timeout_ms` and is only ever read through clones
//!   (`ReadBuffers` and files get nothing). Each matching trigger, after its
//!   `stop_delay_ms`, is reported to the session's consumer as a
//!   `clone_trigger_hit` ObservableEvent (if it observes CLONE_TRIGGER_HIT);
//!   the consumer then clones the session ([`super::clone`]), naming the
//!   trigger, which the clone's trace records as `clone_snapshot_trigger`.
//!   The session runs on. Cloned sessions never match triggers.
//!
//! Memory: a session keeps at most [`MAX_PENDING_TRIGGERS`] triggers not yet
//! emitted, and the 24-hour history at most [`MAX_HISTORY`] entries (the
//! oldest go first), so a producer spamming triggers bounds what it costs.
//! Upstream keeps every trigger and has no stat for this; triggers beyond
//! the cap are counted per session and logged at powers of two, and only a
//! session's first trigger is logged at info level, so a producer cannot
//! flood the log either.

use std::collections::{HashMap, VecDeque};

use regex::Regex;

use super::session::{flush_flags, SessionState, MAX_DURATION_MS};
use super::timers::Timer;
use super::{ConfigError, ProducerId, SessionId, TracingService};
use crate::protos::{trace_config::trigger_config::TriggerMode as ProtoMode, TraceConfig};
use crate::service::env::Nanos;

/// Triggers of one session kept until emitted; more are counted, not kept.
pub const MAX_PENDING_TRIGGERS: usize = 1024;

/// Entries of the 24-hour trigger history.
pub const MAX_HISTORY: usize = 65536;

const DAY_NS: Nanos = 24 * 3600 * 1_000_000_000;

/// What triggers do to a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TriggerMode {
    /// No mode: triggers (if any are listed) are only recorded, and gate
    /// reads.
    Unspecified,
    /// A trigger starts the session.
    StartTracing,
    /// A trigger stops the session.
    StopTracing,
    /// A trigger asks the consumer to clone the session.
    CloneSnapshot,
}

/// A session's trigger setup, validated at `EnableTracing`.
#[derive(Debug)]
pub struct TriggerSetup {
    /// The mode.
    pub mode: TriggerMode,
    /// `trigger_timeout_ms` (0 without a mode).
    pub timeout_ms: u32,
    /// Per configured trigger, its compiled `producer_name_regex`.
    pub regexes: Vec<Option<Regex>>,
}

/// A trigger a session received.
#[derive(Debug, Clone)]
pub struct ReceivedTrigger {
    /// Boot time it was received.
    pub time: Nanos,
    /// The trigger's name.
    pub name: String,
    /// Name of the producer that sent it.
    pub producer_name: String,
    /// That producer's uid.
    pub producer_uid: u32,
    /// The trigger's `stop_delay_ms`.
    pub stop_delay_ms: u32,
}

/// Per-session trigger state.
#[derive(Debug)]
pub struct SessionTriggers {
    /// The validated setup.
    pub setup: TriggerSetup,
    /// Triggers received and not yet emitted as packets.
    pub pending: Vec<ReceivedTrigger>,
    /// Triggers received and emitted already (the newest
    /// [`MAX_PENDING_TRIGGERS`]): a clone takes them with the pending ones
    /// and emits them all into its own trace.
    pub emitted: Vec<ReceivedTrigger>,
    /// Triggers received so far (emitted, pending or not kept).
    pub received: u64,
    /// Triggers not kept for emission (more than [`MAX_PENDING_TRIGGERS`]
    /// pending).
    pub not_emitted: u64,
    /// CLONE_SNAPSHOT triggers to report to the consumer, each when due (at
    /// most [`MAX_PENDING_TRIGGERS`]).
    pub clone_hits: Vec<(Nanos, ReceivedTrigger)>,
}

impl SessionTriggers {
    /// `triggers` were emitted into the trace: kept for a clone.
    pub fn mark_emitted(&mut self, triggers: Vec<ReceivedTrigger>) {
        self.emitted.extend(triggers);
        let over = self.emitted.len().saturating_sub(MAX_PENDING_TRIGGERS);
        self.emitted.drain(..over);
    }

    /// What a clone of the session gets (upstream:
    /// `TracingServiceImpl::FinishCloneSession` moves `received_triggers`):
    /// every trigger received, to emit again, and the count of those not
    /// kept. The session is left with none, so that a long CLONE_SNAPSHOT
    /// session does not emit old triggers into every snapshot; like
    /// upstream's, a session whose triggers gate its data then reads as
    /// one still waiting for a trigger.
    pub fn take_for_clone(&mut self) -> SessionTriggers {
        let mut pending = std::mem::take(&mut self.emitted);
        pending.append(&mut self.pending);
        self.received = 0;
        SessionTriggers {
            setup: TriggerSetup {
                mode: TriggerMode::Unspecified,
                timeout_ms: 0,
                regexes: Vec::new(),
            },
            received: pending.len() as u64,
            pending,
            emitted: Vec::new(),
            not_emitted: std::mem::take(&mut self.not_emitted),
            clone_hits: Vec::new(),
        }
    }

    /// The session yields no data: it lists triggers and none matched yet,
    /// or it is a CLONE_SNAPSHOT session (read only through clones).
    pub fn waiting(&self) -> bool {
        (!self.setup.regexes.is_empty() && self.received == 0)
            || self.setup.mode == TriggerMode::CloneSnapshot
    }
}

/// Validates `config.trigger_config` (upstream's checks and wording where
/// they apply, in `TracingServiceImpl::EnableTracing`,
/// src/tracing/service/tracing_service_impl.cc).
pub fn validate(config: &TraceConfig) -> Result<TriggerSetup, ConfigError> {
    let Some(t) = &config.trigger_config else {
        return Ok(TriggerSetup {
            mode: TriggerMode::Unspecified,
            timeout_ms: 0,
            regexes: Vec::new(),
        });
    };
    let raw_mode = t.trigger_mode.unwrap_or(0);
    let if_available = t.use_clone_snapshot_if_available.unwrap_or(false);
    let mode = match ProtoMode::try_from(raw_mode) {
        Ok(ProtoMode::StopTracing) if if_available => TriggerMode::CloneSnapshot,
        _ if if_available => return Err(ConfigError::CloneSnapshotIfAvailable),
        Ok(ProtoMode::Unspecified) => TriggerMode::Unspecified,
        Ok(ProtoMode::StartTracing) => TriggerMode::StartTracing,
        Ok(ProtoMode::StopTracing) => TriggerMode::StopTracing,
        Ok(ProtoMode::CloneSnapshot) => TriggerMode::CloneSnapshot,
        _ => return Err(ConfigError::TriggerMode(raw_mode)),
    };
    let timeout_ms = t.trigger_timeout_ms.unwrap_or(0);
    if mode != TriggerMode::Unspecified {
        if timeout_ms == 0 || timeout_ms > MAX_DURATION_MS {
            return Err(ConfigError::TriggerTimeout(timeout_ms));
        }
        if config.duration_ms.unwrap_or(0) != 0 {
            return Err(ConfigError::DurationWithTriggers);
        }
    }
    if config.write_into_file.unwrap_or(false) {
        match mode {
            TriggerMode::StopTracing => return Err(ConfigError::TriggersIntoFile("STOP_TRACING")),
            TriggerMode::CloneSnapshot => {
                return Err(ConfigError::TriggersIntoFile("CLONE_SNAPSHOT"))
            }
            _ => {}
        }
    }
    let mut names = std::collections::BTreeSet::new();
    let mut regexes = Vec::new();
    for trigger in &t.triggers {
        let name = trigger.name.as_deref().unwrap_or("");
        if !names.insert(name) {
            return Err(ConfigError::DuplicateTrigger(name.to_owned()));
        }
        // Like upstream, any value is accepted: it is only compared with a
        // draw in [0, 1), so >= 1 always skips and <= 0 (or NaN) never does.
        let p = trigger.skip_probability.unwrap_or(0.0);
        if !(0.0..=1.0).contains(&p) {
            log::warn!("trigger {name:?}: skip_probability {p} is outside [0, 1]");
        }
        let regex = match trigger.producer_name_regex.as_deref() {
            None | Some("") => None,
            Some(pattern) => Some(Regex::new(&format!("^(?:{pattern})$")).map_err(|source| {
                ConfigError::TriggerRegex {
                    trigger: name.to_owned(),
                    pattern: pattern.to_owned(),
                    source,
                }
            })?),
        };
        regexes.push(regex);
    }
    Ok(TriggerSetup {
        mode,
        timeout_ms,
        regexes,
    })
}

/// Matched triggers of the last 24 hours, by name hash (for
/// `max_per_24_h`), oldest first, with a count per hash so that a lookup
/// costs O(1) however many triggers a producer sends.
#[derive(Debug, Default)]
pub struct TriggerHistory {
    entries: VecDeque<(Nanos, u64)>,
    counts: HashMap<u64, usize>,
}

impl TriggerHistory {
    /// Forgets entries older than 24 hours; counts those of `hash` left.
    fn count_in_window(&mut self, now: Nanos, hash: u64) -> usize {
        while self
            .entries
            .front()
            .is_some_and(|&(t, _)| t.saturating_add(DAY_NS) < now)
        {
            self.pop_oldest();
        }
        self.counts.get(&hash).copied().unwrap_or(0)
    }

    fn record(&mut self, now: Nanos, hash: u64) {
        if self.entries.len() == MAX_HISTORY {
            self.pop_oldest();
        }
        self.entries.push_back((now, hash));
        *self.counts.entry(hash).or_insert(0) += 1;
    }

    fn pop_oldest(&mut self) {
        let Some((_, hash)) = self.entries.pop_front() else {
            return;
        };
        if let Some(n) = self.counts.get_mut(&hash) {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(&hash);
            }
        }
    }
}

/// 64-bit FNV-1a (upstream keys its trigger history by this hash).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl TracingService {
    /// `ProducerPort.ActivateTriggers` from `producer`.
    pub(super) fn activate_triggers(&mut self, producer: ProducerId, names: &[String]) {
        let Some(p) = self.producers.get(&producer) else {
            return;
        };
        let (producer_name, producer_uid) = (p.name.clone(), p.uid);
        let now = self.now();
        for name in names {
            let hash = fnv1a(name.as_bytes());
            let fired = self.trigger_history.count_in_window(now, hash);
            let sids: Vec<SessionId> = self.sessions.keys().copied().collect();
            let mut matched = false;
            for sid in sids {
                let Some(stop_delay_ms) = self.trigger_matches(sid, name, &producer_name, fired)
                else {
                    continue;
                };
                matched = true;
                let trigger = ReceivedTrigger {
                    time: now,
                    name: name.clone(),
                    producer_name: producer_name.clone(),
                    producer_uid,
                    stop_delay_ms,
                };
                self.receive_trigger(sid, trigger);
            }
            if matched {
                self.trigger_history.record(now, hash);
            } else {
                log::debug!("producer {producer}: trigger {name:?} matched no session");
            }
        }
    }

    /// Whether trigger `name` from `producer_name` fires for session `sid`,
    /// with its `stop_delay_ms`; `fired` is how often the name fired in the
    /// last 24 hours.
    fn trigger_matches(
        &mut self,
        sid: SessionId,
        name: &str,
        producer_name: &str,
        fired: usize,
    ) -> Option<u32> {
        // A clone is a snapshot: triggers are for the session it came from.
        let s = self
            .sessions
            .get(&sid)
            .filter(|s| s.state != SessionState::ClonedReadOnly)?;
        let t = s.config.trigger_config.as_ref()?;
        let index = t
            .triggers
            .iter()
            .position(|t| t.name.as_deref().unwrap_or("") == name)?;
        let trigger = &t.triggers[index];
        if let Some(re) = s.triggers.setup.regexes.get(index)?.as_ref() {
            if !re.is_match(producer_name) {
                return None;
            }
        }
        let skip = trigger.skip_probability.unwrap_or(0.0);
        let max = trigger.max_per_24_h.unwrap_or(0);
        let stop_delay_ms = trigger.stop_delay_ms.unwrap_or(0);
        if skip > 0.0 {
            // A uniform draw in [0, 1) from 53 random bits.
            let draw = (self.env.random_u64() >> 11) as f64 / (1u64 << 53) as f64;
            if draw < skip {
                log::debug!("session {sid}: trigger {name:?} skipped (skip_probability {skip})");
                return None;
            }
        }
        if max > 0 && fired >= max as usize {
            log::debug!("session {sid}: trigger {name:?} skipped (max_per_24_h {max})");
            return None;
        }
        Some(stop_delay_ms)
    }

    /// Session `sid` received a matching trigger.
    fn receive_trigger(&mut self, sid: SessionId, trigger: ReceivedTrigger) {
        let now = trigger.time;
        let snapshot = self.env.clock_snapshot();
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        if !s.builtin().disable_clock_snapshotting.unwrap_or(false) {
            s.add_snapshot(snapshot);
        }
        let first = s.triggers.received == 0;
        s.triggers.received += 1;
        let delay_ms = trigger.stop_delay_ms;
        let hit = (s.triggers.setup.mode == TriggerMode::CloneSnapshot).then(|| trigger.clone());
        // A producer may send triggers at any rate: only the first of a
        // session is worth an info line.
        let level = if first {
            log::Level::Info
        } else {
            log::Level::Debug
        };
        log::log!(
            level,
            "session {sid}: trigger {:?} from producer {:?}",
            trigger.name,
            trigger.producer_name
        );
        if s.triggers.pending.len() < MAX_PENDING_TRIGGERS {
            s.triggers.pending.push(trigger);
        } else {
            s.triggers.not_emitted += 1;
            if s.triggers.not_emitted.is_power_of_two() {
                log::warn!(
                    "session {sid}: {} triggers not emitted ({MAX_PENDING_TRIGGERS} pending already)",
                    s.triggers.not_emitted
                );
            }
        }
        match s.triggers.setup.mode {
            TriggerMode::StartTracing if s.state == SessionState::Configured => {
                s.set_duration_ms(delay_ms);
                self.start_tracing(sid);
            }
            TriggerMode::StopTracing if first => {
                self.timers.arm(
                    now + u64::from(delay_ms) * 1_000_000,
                    Timer::TriggerStop { session: sid },
                );
            }
            TriggerMode::CloneSnapshot => {
                let due = now + u64::from(delay_ms) * 1_000_000;
                if let Some(hit) =
                    hit.filter(|_| s.triggers.clone_hits.len() < MAX_PENDING_TRIGGERS)
                {
                    s.triggers.clone_hits.push((due, hit));
                    self.timers
                        .arm(due, Timer::CloneTriggerHit { session: sid });
                }
            }
            _ => {}
        }
    }

    /// `Timer::CloneTriggerHit`: tells the consumer of CLONE_SNAPSHOT
    /// session `sid` about the triggers whose `stop_delay_ms` passed
    /// (upstream: `ConsumerEndpointImpl::NotifyCloneSnapshotTrigger`).
    pub(super) fn clone_trigger_hits(&mut self, sid: SessionId) {
        let now = self.now();
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut s.triggers.clone_hits)
            .into_iter()
            .partition(|&(t, _)| t <= now);
        s.triggers.clone_hits = later;
        let Some(conn) = s.consumer else {
            return;
        };
        for (_, t) in due {
            let hit = crate::protos::observable_events::CloneTriggerHit {
                tracing_session_id: Some(sid as i64),
                trigger_name: Some(t.name),
                producer_name: Some(t.producer_name),
                producer_uid: Some(t.producer_uid),
                boot_time_ns: Some(t.time),
                trigger_delay_ms: Some(u64::from(t.stop_delay_ms)),
            };
            self.send_event(
                conn,
                crate::protos::observable_events::Type::CloneTriggerHit,
                crate::protos::ObservableEvents {
                    clone_trigger_hit: Some(hit),
                    ..Default::default()
                },
            );
        }
    }

    /// Arms what a session's trigger mode needs at `EnableTracing`; whether
    /// the session waits for a trigger to start.
    pub(super) fn arm_triggers(&mut self, sid: SessionId) -> bool {
        let now = self.now();
        let Some(s) = self.sessions.get_mut(&sid) else {
            return false;
        };
        let timeout_ms = s.triggers.setup.timeout_ms;
        match s.triggers.setup.mode {
            TriggerMode::Unspecified => false,
            TriggerMode::StartTracing => {
                self.timers.arm(
                    now + u64::from(timeout_ms) * 1_000_000,
                    Timer::TriggerTimeout { session: sid },
                );
                true
            }
            TriggerMode::StopTracing | TriggerMode::CloneSnapshot => {
                // Without a trigger, the session ends at the timeout.
                s.set_duration_ms(timeout_ms);
                false
            }
        }
    }

    /// `Timer::TriggerTimeout`: no START_TRACING trigger came in time.
    pub(super) fn start_trigger_timeout(&mut self, sid: SessionId) {
        if self
            .sessions
            .get(&sid)
            .is_some_and(|s| s.state == SessionState::Configured)
        {
            log::info!("session {sid}: no trigger started it in time; disabling it");
            self.disable_tracing(sid, false);
        }
    }

    /// `Timer::TriggerStop`: `stop_delay_ms` after a STOP_TRACING trigger.
    pub(super) fn trigger_stop(&mut self, sid: SessionId) {
        match self.sessions.get(&sid).map(|s| s.state) {
            Some(SessionState::Started) => {
                let flags = flush_flags::REASON_TRACE_STOP | flush_flags::INITIATOR_TRACED;
                self.flush(sid, 0, flags, super::session::FlushThen::Disable);
            }
            Some(SessionState::Configured) => self.disable_tracing(sid, false),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn the_history_forgets_after_a_day_and_stays_bounded() {
        let mut h = TriggerHistory::default();
        h.record(0, 1);
        h.record(10, 1);
        h.record(20, 2);
        assert_eq!(h.count_in_window(DAY_NS, 1), 2);
        assert_eq!(
            h.count_in_window(DAY_NS + 5, 1),
            1,
            "the entry at 0 expired"
        );
        assert_eq!(h.count_in_window(DAY_NS + 5, 2), 1);
        for _ in 0..MAX_HISTORY {
            h.record(DAY_NS + 6, 3);
        }
        assert_eq!(h.entries.len(), MAX_HISTORY);
        assert_eq!(h.count_in_window(DAY_NS + 6, 2), 0, "the oldest went first");
        assert_eq!(h.count_in_window(DAY_NS + 6, 3), MAX_HISTORY);
        assert_eq!(h.counts.len(), 1, "counts of forgotten names are dropped");
    }
}
