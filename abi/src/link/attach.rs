//! The shared-RAM service: the control words a firmware answers while a
//! host consumes its region.

use crate::region::{Control, RegionHandles};
use crate::track_event::Clock;

/// Serves a host attached to the region (shared RAM): flush and sync
/// requests. See the [module docs](super).
///
/// The rules it keeps (the region's control protocol,
/// [`crate::region`]):
///
/// * Flush: when `flush_request` differs from the last value served, it
///   calls the firmware's flush (which commits every chunk the writers
///   hold), then stores that value in `flush_ack`. A host that sees its
///   request acknowledged finds everything written before it in the ring.
/// * Sync: a non-zero `sync_request` not answered yet is answered with the
///   clock, read right then ([`Control::answer_sync`]).
/// * Each poll increments the region's `heartbeat`.
///
/// ```
/// use shmtrace_abi::link::AttachService;
/// use shmtrace_abi::region::{RegionConfig, RegionStorage};
///
/// let mut storage = Box::new(RegionStorage::<4096, 4>::new());
/// let handles = storage.init(&RegionConfig::new("track_event")).unwrap();
/// let mut link = AttachService::new(&handles);
///
/// // The host asks for a flush and the firmware clock.
/// let id = handles.control.request_flush();
/// handles.control.request_sync(7);
///
/// let mut flushes = 0;
/// let served = link.poll(|| flushes += 1, || 5_000_000u64);
/// assert!(served.flushed && served.synced);
/// assert_eq!(flushes, 1);
/// assert_eq!(handles.control.flush_ack(), id);
/// assert_eq!(handles.control.sync_response(), Some((7, 5_000_000)));
///
/// // Nothing new: nothing to do.
/// assert_eq!(link.poll(|| flushes += 1, || 0u64), Default::default());
/// assert_eq!(flushes, 1);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct AttachService<'m> {
    control: Control<'m>,
    /// The last flush request served.
    flushed: u32,
}

/// What one [`AttachService::poll`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Served {
    /// Flushed the writers for a new flush request (and acknowledged it).
    pub flushed: bool,
    /// Answered a new sync request.
    pub synced: bool,
}

impl<'m> AttachService<'m> {
    /// The service of the region behind `handles` (taken in shared-RAM
    /// mode, so a host may consume it).
    pub fn new(handles: &RegionHandles<'m>) -> Self {
        let control = handles.control;
        AttachService {
            flushed: control.flush_request(),
            control,
        }
    }

    /// Serves the host's requests once; never waits. `flush` commits what
    /// every writer holds (called only for a new flush request); `clock` is
    /// the firmware's clock (read only for a new sync request).
    pub fn poll(&mut self, flush: impl FnOnce(), mut clock: impl Clock) -> Served {
        let control = self.control;
        let request = control.flush_request();
        let flushed = request != self.flushed;
        if flushed {
            flush();
            control.ack_flush(request);
            self.flushed = request;
        }
        let synced = control.answer_sync(|| clock.now_ns());
        control.beat();
        Served { flushed, synced }
    }

    /// The region's control words.
    pub fn control(&self) -> Control<'m> {
        self.control
    }
}
