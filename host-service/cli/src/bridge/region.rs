//! A firmware region in shared memory (`--input region:FILE[@OFFSET]`,
//! `serve --attach`): a file QEMU backs guest RAM with
//! (`memory-backend-file,share=on`), a UIO device, a dual-core MCU's
//! shared SRAM window. The [`FirmwareSource`] over abi's hostile
//! [`RegionReader`](shmtrace_abi::region::RegionReader), polled.
//!
//! * **Waiting.** A file that does not exist yet, is too short, or holds no
//!   valid magic at the offset (QEMU not started, the firmware not
//!   initialized) is waited for: attach is retried every
//!   [`ATTACH_RETRY`]. A region that says something wrong (a version, sizes
//!   or names this reader refuses, stream mode) is refused with the
//!   reader's error, logged, counted, and retried with a backoff from
//!   [`BACKOFF_MIN`] to [`BACKOFF_MAX`]; so is a region whose header turns
//!   bad while attached. A file that is replaced or shrinks (QEMU
//!   restarted) is let go and attached again. Only the host's own
//!   failures (the file cannot be opened for writing or mapped) end the
//!   source.
//! * **One reader.** A region has one reader: the source claims it (a lock
//!   over its header's bytes, see `map`) when it is created if the file is
//!   there, else once it appears, and holds the claim while the file stays
//!   the same (across detaches and firmware restarts). A region another
//!   reader holds, in this process or another, ends the source with
//!   [`SourceError::Busy`] before it touches the region.
//! * **Records.** The header's identity is the hello; each chunk is copied
//!   out; patch slots are grouped per chunk ([`PatchGrouper`]); the
//!   firmware's counters are reported when they change; a firmware reset
//!   (new boot id) or a detach is a [`FirmwareEvent::Reset`], then the new
//!   boot's hello.
//! * **Control.** Enable/disable, clear, flush and sync requests are the
//!   host's control words. A sync's answer is read back as a two-way clock
//!   sample (the source watches for it every [`SYNC_POLL`], giving up after
//!   [`SYNC_WAIT`]); a flush is done once the firmware stored its id in
//!   `flush_ack` and the ring is drained ([`FLUSH_WAIT`] at most). The
//!   wanted `trace_enabled` is written again after every (re)attach.
//! * **Polling.** Records are taken as fast as they come; when the ring is
//!   empty the source sleeps `poll_interval` (1 ms by default: the attach
//!   latency).

mod map;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use shmtrace_abi::region::{HeaderError, ReaderError, ReaderStats, Record};

use self::map::{MapError, MappedRegion, RegionFile};
use super::patches::PatchGrouper;
use super::{ClockSample, FirmwareEvent, FirmwareSource, Hello, Request, SourceError};

/// How often attaching is tried while waiting for the file or the firmware.
pub const ATTACH_RETRY: Duration = Duration::from_millis(100);
/// First wait after a refused region.
pub const BACKOFF_MIN: Duration = Duration::from_secs(1);
/// Longest wait after refused regions.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How often the file is checked for a replacement or a shrink.
const FILE_CHECK: Duration = Duration::from_millis(250);
/// How often a pending sync's answer is looked for.
pub const SYNC_POLL: Duration = Duration::from_micros(50);
/// How long a sync's answer is waited for.
pub const SYNC_WAIT: Duration = Duration::from_millis(100);
/// How long a flush waits for the firmware's `flush_ack`.
pub const FLUSH_WAIT: Duration = Duration::from_millis(400);
/// Default sleep while the ring is empty.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(1);
/// How often the "still waiting" message is repeated.
const WAIT_LOG_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy)]
struct Flush {
    id: u32,
    deadline: Instant,
    acked: bool,
}

#[derive(Debug, Default, Clone, Copy)]
struct Totals {
    attaches: u64,
    refused: u64,
    detaches: u64,
    sync_timeouts: u64,
    flush_timeouts: u64,
}

/// The region source. See the module docs.
pub struct RegionSource {
    path: PathBuf,
    offset: u64,
    poll_interval: Duration,
    /// The file, with this source's claim on the region.
    file: Option<RegionFile>,
    region: Option<MappedRegion>,
    buf: Vec<u8>,
    events: VecDeque<FirmwareEvent>,
    patches: PatchGrouper,
    /// When to try attaching next, and how long to wait after the next
    /// refusal.
    next_attach: Instant,
    backoff: Duration,
    /// Why it waits, and when that was last logged.
    waiting: Option<(String, Instant)>,
    last_file_check: Instant,
    /// The firmware counters last reported.
    counters: Option<(u32, u32, u32)>,
    enabled: Option<bool>,
    sync: Option<(u32, Instant)>,
    flush: Option<Flush>,
    /// Reader counters of earlier attachments.
    past: ReaderStats,
    totals: Totals,
}

impl std::fmt::Debug for RegionSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionSource")
            .field("path", &self.path)
            .field("offset", &self.offset)
            .finish_non_exhaustive()
    }
}

fn add(into: &mut ReaderStats, s: ReaderStats) {
    into.chunks += s.chunks;
    into.chunks_scanned += s.chunks_scanned;
    into.patches += s.patches;
    into.bad_slots += s.bad_slots;
    into.stale_commits += s.stale_commits;
    into.invalid_chunks += s.invalid_chunks;
    into.release_failures += s.release_failures;
    into.ring_overflows += s.ring_overflows;
    into.resets += s.resets;
}

fn hello(h: &shmtrace_abi::region::HeaderRepr) -> FirmwareEvent {
    FirmwareEvent::Hello(Hello {
        boot_id: h.boot_id,
        data_source: h.data_source.as_str().to_owned(),
        producer: h.producer.as_str().to_owned(),
        clock_id: h.clock_id,
    })
}

/// How the region at `offset` of `path` is named in messages
/// (`region:FILE@0xOFFSET`, as `--input` takes it).
pub fn region_name(path: &Path, offset: u64) -> String {
    format!("region:{}@{offset:#x}", path.display())
}

/// The error for a region another reader holds (`who`: see
/// [`MapError::Busy`]).
fn busy(who: &str) -> SourceError {
    let who = if who.is_empty() {
        String::new()
    } else {
        format!(" ({who})")
    };
    SourceError::Busy(format!(
        "the region is already being read by another reader{who}; a region has one reader"
    ))
}

/// Whether a reader error means "not initialized (yet, or again)": the
/// magic is not there.
fn not_initialized(e: &ReaderError) -> bool {
    matches!(e, ReaderError::Header(HeaderError::BadMagic(_)))
}

impl RegionSource {
    /// A source for the region at `offset` of `path`, sleeping
    /// `poll_interval` while its ring is empty. Fails at once only if the
    /// offset cannot be a region's (not 8-aligned), or if another reader
    /// holds the region ([`SourceError::Busy`]).
    pub fn new(path: &Path, offset: u64, poll_interval: Duration) -> Result<Self, SourceError> {
        if offset % 8 != 0 {
            return Err(SourceError::Failed(format!(
                "region offset {offset:#x} is not 8-aligned"
            )));
        }
        let file = match RegionFile::claim(path, offset) {
            Ok(f) => Some(f),
            Err(MapError::Busy(who)) => return Err(busy(&who)),
            // The rest is polling's to wait for or report.
            Err(_) => None,
        };
        let now = Instant::now();
        Ok(RegionSource {
            path: path.to_owned(),
            offset,
            poll_interval,
            file,
            region: None,
            buf: Vec::new(),
            events: VecDeque::new(),
            patches: PatchGrouper::new(),
            next_attach: now,
            backoff: BACKOFF_MIN,
            waiting: None,
            last_file_check: now,
            counters: None,
            enabled: None,
            sync: None,
            flush: None,
            past: ReaderStats::default(),
            totals: Totals::default(),
        })
    }

    /// Whether a region is attached (mapped, with a valid header seen).
    pub fn is_attached(&self) -> bool {
        self.region.is_some()
    }

    fn wait(&mut self, why: String) {
        let now = Instant::now();
        let repeat = match &self.waiting {
            Some((old, at)) => *old != why || now.duration_since(*at) >= WAIT_LOG_EVERY,
            None => true,
        };
        if repeat {
            log::info!("{}: waiting: {why}", self.describe());
            self.waiting = Some((why, now));
        }
        self.next_attach = now + ATTACH_RETRY;
    }

    fn refuse(&mut self, e: &ReaderError) {
        self.totals.refused += 1;
        log::error!(
            "{}: region refused: {}; trying again in {} s",
            self.describe(),
            refusal(e),
            self.backoff.as_secs_f32()
        );
        self.next_attach = Instant::now() + self.backoff;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
    }

    /// Lets the region go: its boot is over for the bridge.
    fn detach(&mut self) {
        if let Some(r) = self.region.take() {
            add(&mut self.past, r.stats());
            self.totals.detaches += 1;
            self.patches.finish(&mut self.events);
            self.events.push_back(FirmwareEvent::Reset);
        }
        self.sync = None;
        self.flush = None;
        self.counters = None;
    }

    fn try_attach(&mut self) -> Result<(), SourceError> {
        if self
            .file
            .as_ref()
            .is_some_and(|f| !f.is_current(&self.path))
        {
            // Replaced or removed: the claim went with the old file.
            self.file = None;
        }
        let opened = match &self.file {
            Some(file) => MappedRegion::open(file, self.offset),
            None => RegionFile::claim(&self.path, self.offset).and_then(|file| {
                let file = self.file.insert(file);
                MappedRegion::open(file, self.offset)
            }),
        };
        match opened {
            Ok(region) => {
                if let Some(h) = region.header() {
                    log::info!(
                        "{}: attached: data source {:?}, boot {:#x}, clock {}, {} ring slots, \
                         {} KiB SMB in {}-byte pages",
                        self.describe(),
                        h.data_source.as_str(),
                        h.boot_id,
                        h.clock_id,
                        h.ring.slots,
                        h.smb.size / 1024,
                        h.smb.page_size.get()
                    );
                    self.events.push_back(hello(h));
                }
                self.buf = vec![0; region.chunk_buffer_len()];
                self.region = Some(region);
                // Counters the firmware has at attach are reported at once.
                self.counters = Some((0, 0, 0));
                self.totals.attaches += 1;
                self.waiting = None;
                self.backoff = BACKOFF_MIN;
                self.last_file_check = Instant::now();
                self.apply_enabled();
                Ok(())
            }
            Err(MapError::NotYet(why)) => {
                self.wait(why);
                Ok(())
            }
            Err(MapError::Region(e)) if not_initialized(&e) => {
                self.wait(
                    "no region magic at the offset yet (is the firmware running, and the \
                     offset right?)"
                        .into(),
                );
                Ok(())
            }
            Err(MapError::Region(e)) => {
                self.refuse(&e);
                Ok(())
            }
            Err(MapError::Busy(who)) => Err(busy(&who)),
            Err(MapError::Io(e)) => Err(SourceError::Failed(format!(
                "{}: cannot map: {e}",
                self.path.display()
            ))),
        }
    }

    fn apply_enabled(&self) {
        if let (Some(on), Some(c)) = (
            self.enabled,
            self.region.as_ref().and_then(MappedRegion::control),
        ) {
            c.set_trace_enabled(on);
        }
    }

    /// One round of work; `true` if it queued events or took a record.
    fn step(&mut self) -> Result<bool, SourceError> {
        let now = Instant::now();
        if self.region.is_none() {
            if now >= self.next_attach {
                self.try_attach()?;
            }
            return Ok(!self.events.is_empty());
        }
        if now.duration_since(self.last_file_check) >= FILE_CHECK {
            self.last_file_check = now;
            if self
                .region
                .as_ref()
                .is_some_and(|r| r.file_changed(&self.path))
            {
                log::warn!(
                    "{}: the file was replaced or shrank: attaching again",
                    self.describe()
                );
                self.detach();
                return Ok(true);
            }
        }
        self.check_sync(now);
        let Some(region) = self.region.as_mut() else {
            return Ok(false);
        };
        if let (Some(f), Some(c)) = (&mut self.flush, region.control()) {
            if !f.acked && c.flush_ack().wrapping_sub(f.id) as i32 >= 0 {
                f.acked = true;
            }
        }
        match region.poll(&mut self.buf) {
            Ok(Some(Record::Chunk(c))) => {
                self.patches.finish(&mut self.events);
                self.events
                    .push_back(FirmwareEvent::Chunk(c.bytes.to_vec()));
                Ok(true)
            }
            Ok(Some(Record::Patch(p))) => {
                self.patches.push(p, &mut self.events);
                Ok(true)
            }
            Ok(Some(Record::Reset(h))) => {
                self.patches.finish(&mut self.events);
                log::info!(
                    "{}: the firmware restarted (boot {:#x})",
                    self.describe(),
                    h.boot_id
                );
                self.events.push_back(FirmwareEvent::Reset);
                self.events.push_back(hello(&h));
                self.sync = None;
                self.flush = None;
                self.counters = Some((0, 0, 0));
                self.apply_enabled();
                Ok(true)
            }
            Ok(None) => {
                self.patches.finish(&mut self.events);
                if self.flush.is_some_and(|f| f.acked) {
                    self.flush = None;
                }
                self.report_counters();
                Ok(!self.events.is_empty())
            }
            Err(e) if not_initialized(&e) => {
                // Being initialized again (or wiped): the reader reports
                // the reset once the header is valid again.
                Ok(false)
            }
            Err(e) => {
                self.detach();
                self.refuse(&e);
                Ok(true)
            }
        }
    }

    fn check_sync(&mut self, now: Instant) {
        let Some((nonce, asked)) = self.sync else {
            return;
        };
        let answer = self
            .region
            .as_ref()
            .and_then(MappedRegion::control)
            .and_then(|c| c.sync_response());
        match answer {
            Some((n, firmware_ns)) if n == nonce => {
                self.sync = None;
                self.events.push_back(FirmwareEvent::Clock(ClockSample {
                    firmware_ns,
                    nonce: Some(nonce),
                    transfer_ns: 0,
                }));
            }
            _ if now.duration_since(asked) >= SYNC_WAIT => {
                self.sync = None;
                self.totals.sync_timeouts += 1;
            }
            _ => {}
        }
    }

    fn report_counters(&mut self) {
        let Some(c) = self.region.as_ref().and_then(MappedRegion::counters) else {
            return;
        };
        let now = (c.packets_dropped, c.ring_overflows, c.chunks_lost);
        if self.counters == Some(now) {
            return;
        }
        self.counters = Some(now);
        self.events.push_back(FirmwareEvent::Stats(vec![
            ("packets_dropped".into(), u64::from(c.packets_dropped)),
            ("ring_overflows".into(), u64::from(c.ring_overflows)),
            ("chunks_lost".into(), u64::from(c.chunks_lost)),
        ]));
    }

    fn reader_stats(&self) -> ReaderStats {
        let mut s = self.past;
        if let Some(r) = &self.region {
            add(&mut s, r.stats());
        }
        s
    }
}

impl FirmwareSource for RegionSource {
    fn poll(&mut self, timeout: Duration) -> Result<Option<FirmwareEvent>, SourceError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.events.pop_front() {
                return Ok(Some(e));
            }
            if self.step()? {
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let nap = if self.sync.is_some() {
                SYNC_POLL
            } else if self.region.is_some() {
                self.poll_interval
            } else {
                ATTACH_RETRY
            };
            std::thread::sleep(nap.min(deadline - now));
        }
    }

    fn transport_loss(&self) -> Vec<(&'static str, u64)> {
        let s = self.reader_stats();
        vec![
            ("bad_slots", s.bad_slots),
            ("invalid_chunks", s.invalid_chunks),
            ("release_failures", s.release_failures),
            ("regions_refused", self.totals.refused),
        ]
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let s = self.reader_stats();
        vec![
            ("chunks", s.chunks),
            ("chunks_scanned", s.chunks_scanned),
            ("patches", s.patches),
            ("stale_commits", s.stale_commits),
            ("ring_overflows_seen", s.ring_overflows),
            ("resets", s.resets),
            ("attaches", self.totals.attaches),
            ("detaches", self.totals.detaches),
            ("sync_timeouts", self.totals.sync_timeouts),
            ("flush_timeouts", self.totals.flush_timeouts),
        ]
    }

    fn request(&mut self, request: Request) -> bool {
        if let Request::Enable(on) = request {
            self.enabled = Some(on);
            self.apply_enabled();
            return true;
        }
        let Some(c) = self.region.as_ref().and_then(MappedRegion::control) else {
            // Nothing attached: the boot attached next starts fresh, and
            // there is nothing to flush. (Syncs are asked for only while
            // attached: `can_sync`.)
            return !matches!(request, Request::Sync(_));
        };
        match request {
            Request::Clear => {
                c.request_clear();
            }
            Request::Flush => {
                let id = c.request_flush();
                self.flush = Some(Flush {
                    id,
                    deadline: Instant::now() + FLUSH_WAIT,
                    acked: false,
                });
            }
            Request::Sync(nonce) => {
                c.request_sync(nonce);
                self.sync = Some((nonce, Instant::now()));
            }
            Request::Enable(_) => {}
        }
        true
    }

    fn can_sync(&self) -> bool {
        self.region.is_some()
    }

    fn flush_pending(&mut self) -> bool {
        match self.flush {
            None => false,
            Some(f) if Instant::now() >= f.deadline => {
                self.flush = None;
                self.totals.flush_timeouts += 1;
                false
            }
            Some(_) => true,
        }
    }

    fn describe(&self) -> String {
        region_name(&self.path, self.offset)
    }
}

/// Why a region was refused, for the user: the reader's reason, and for a
/// stream-mode region where its data goes instead.
fn refusal(e: &ReaderError) -> String {
    match e {
        ReaderError::StreamMode => format!(
            "{e} (its region was taken in stream mode: it sends its chunks as frames over its \
             byte stream, a UART say, for `shmtrace bridge --input` to read)"
        ),
        e => e.to_string(),
    }
}
