//! The core's timers: a queue of deadlines on the boot clock.
//!
//! Timers are never cancelled: each names what it is for, and when it fires
//! the core checks that this still applies (the session exists and is in
//! the state the timer was armed for).

use std::collections::BTreeMap;

use super::SessionId;
use crate::service::env::Nanos;

/// What a timer does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    /// A flush did not complete in time.
    FlushTimeout { session: SessionId, flush: u64 },
    /// Data sources did not acknowledge a stop in time.
    StopTimeout { session: SessionId, epoch: u64 },
    /// `duration_ms` elapsed.
    Duration { session: SessionId },
    /// `flush_period_ms` elapsed.
    PeriodicFlush { session: SessionId },
    /// `incremental_state_config.clear_period_ms` elapsed.
    ClearIncrementalState { session: SessionId },
    /// `file_write_period_ms` elapsed.
    WriteIntoFile { session: SessionId },
    /// The clock snapshot / sync marker / stats period elapsed.
    Snapshot { session: SessionId },
    /// `trigger_timeout_ms` of a START_TRACING session elapsed.
    TriggerTimeout { session: SessionId },
    /// `stop_delay_ms` after a STOP_TRACING trigger elapsed.
    TriggerStop { session: SessionId },
    /// `stop_delay_ms` after a CLONE_SNAPSHOT trigger elapsed.
    CloneTriggerHit { session: SessionId },
    /// The data sources had their time to start.
    SlowStart { session: SessionId },
}

/// Pending timers by deadline (ties in arming order).
#[derive(Debug, Default)]
pub struct Timers {
    queue: BTreeMap<(Nanos, u64), Timer>,
    seq: u64,
}

impl Timers {
    /// Arms `timer` for `deadline`.
    pub fn arm(&mut self, deadline: Nanos, timer: Timer) {
        self.seq += 1;
        self.queue.insert((deadline, self.seq), timer);
    }

    /// The earliest deadline.
    pub fn next_deadline(&self) -> Option<Nanos> {
        self.queue.keys().next().map(|&(d, _)| d)
    }

    /// Removes and returns a timer due at `now`.
    pub fn pop_due(&mut self, now: Nanos) -> Option<Timer> {
        let (&key, _) = self.queue.iter().next()?;
        if key.0 > now {
            return None;
        }
        self.queue.remove(&key)
    }

    /// Drops every timer of a session.
    pub fn forget_session(&mut self, session: SessionId) {
        self.queue.retain(|_, t| t.session() != session);
    }
}

impl Timer {
    fn session(&self) -> SessionId {
        match *self {
            Timer::FlushTimeout { session, .. }
            | Timer::StopTimeout { session, .. }
            | Timer::Duration { session }
            | Timer::PeriodicFlush { session }
            | Timer::ClearIncrementalState { session }
            | Timer::WriteIntoFile { session }
            | Timer::Snapshot { session }
            | Timer::TriggerTimeout { session }
            | Timer::TriggerStop { session }
            | Timer::CloneTriggerHit { session }
            | Timer::SlowStart { session } => session,
        }
    }
}

/// The delay until the next multiple of `period_ms` of the wall clock,
/// so periodic work of all sessions lines up (upstream aligns its periodic
/// tasks the same way).
pub fn aligned_delay_ns(now: Nanos, period_ms: u32) -> Nanos {
    let period = u64::from(period_ms.max(1)) * 1_000_000;
    period - now % period
}
