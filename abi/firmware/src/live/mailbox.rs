//! The mailbox: four bytes in host-visible RAM (a static in `.hostmail`,
//! PSRAM after the region) through which a host test harness drives a live
//! session and measures the clock alignment.
//!
//! | offset | byte | written by | meaning |
//! |---|---|---|---|
//! | 0 | `mark` | host | a new value asks for a `host_mark` instant stamped when the firmware reads it |
//! | 1 | `ack` | firmware | the last `mark` value it read (stored right after reading its clock) |
//! | 2 | `command` | host | 0 run, 1 finish writing ([`COMMAND_FINISH`]), 2 exit ([`COMMAND_EXIT`]) |
//! | 3 | `state` | firmware | 0 waiting for the host to enable tracing, 1 writing, 2 done |
//!
//! Single bytes, so a host writing the backing file with `pwrite` (one
//! byte) and the firmware never see a torn value.

use core::sync::atomic::{
    AtomicU8,
    Ordering::{Acquire, Release},
};

/// `command`: stop writing events, report the counts.
pub const COMMAND_FINISH: u8 = 1;
/// `command`: end the run (after finishing).
pub const COMMAND_EXIT: u8 = 2;
/// `state`: writing events.
pub const STATE_WRITING: u8 = 1;
/// `state`: done writing.
pub const STATE_DONE: u8 = 2;

/// See the module docs.
#[repr(C)]
#[derive(Debug)]
pub struct Mailbox {
    mark: AtomicU8,
    ack: AtomicU8,
    command: AtomicU8,
    state: AtomicU8,
}

impl Mailbox {
    /// A zeroed mailbox (usable in a `static`).
    pub const fn new() -> Self {
        Mailbox {
            mark: AtomicU8::new(0),
            ack: AtomicU8::new(0),
            command: AtomicU8::new(0),
            state: AtomicU8::new(0),
        }
    }

    /// Zeroes every byte (the mailbox sits in RAM nothing clears at
    /// reset).
    pub fn reset(&self) {
        for b in [&self.mark, &self.ack, &self.command, &self.state] {
            b.store(0, Release);
        }
    }

    /// The host's `mark`.
    pub fn mark(&self) -> u8 {
        self.mark.load(Acquire)
    }

    /// Tells the host `mark` was read.
    pub fn acknowledge(&self, mark: u8) {
        self.ack.store(mark, Release);
    }

    /// The host's `command`.
    pub fn command(&self) -> u8 {
        self.command.load(Acquire)
    }

    /// Publishes the session's `state`.
    pub fn set_state(&self, state: u8) {
        self.state.store(state, Release);
    }
}

impl Default for Mailbox {
    fn default() -> Self {
        Self::new()
    }
}
