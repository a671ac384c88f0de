//! What the service core needs from the machine: clocks, randomness,
//! shared memory buffers and trace files.
//!
//! The core never calls the operating system itself; it asks its
//! [`Environment`]. The real one ([`SystemEnvironment`]) reads the kernel
//! clocks; tests use a fake one whose time only moves when the test says so,
//! which makes every timeout and period deterministic. Both create and map
//! SMBs and open trace files with the provided methods (memfds, `mmap`,
//! files); an environment may override them.
//!
//! File descriptors pass through the core as opaque [`OwnedFd`] handles:
//! received with a call (a producer's SMB, a consumer's trace file), sent
//! with a reply (the SMB the service made), and only ever used here or in
//! [`shmtrace_ipc::shm`].
// `unsafe` here: the rdtsc instruction (clock snapshots).
#![allow(unsafe_code)]

use std::cell::Cell;
use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::time::ClockId;

use super::shm::{self, SharedMemory, ShmError};

/// A boot-clock timestamp in nanoseconds (`CLOCK_BOOTTIME`): the service's
/// time base for timers and the packets it writes.
pub type Nanos = u64;

/// Builtin clock ids (`BuiltinClock`).
pub use shmtrace_abi::trace::builtin_clock as clock_id;

/// Clocks, randomness, shared memory buffers and trace files.
pub trait Environment {
    /// Now, on the boot clock.
    fn now(&self) -> Nanos;
    /// A snapshot of the clocks a trace processor aligns: `(clock id,
    /// timestamp)`, BOOTTIME first, all read as close together as possible.
    /// Timestamps are nanoseconds, except [`clock_id::TSC`] (ticks).
    fn clock_snapshot(&self) -> Vec<(u32, u64)>;
    /// Random bits (trace UUIDs).
    fn random_u64(&self) -> u64;

    /// A new SMB of `size` bytes with pages of `page_size` bytes (a pair
    /// [`ensure_valid_sizes`](super::shm::ensure_valid_sizes) returned), and
    /// a descriptor of it to send to its producer.
    fn create_smb(&self, size: usize, page_size: usize) -> Result<NewSmb, ShmError> {
        let shm = shm::create(size, page_size)?;
        let fd = shm.dup_fd()?;
        Ok(NewSmb { shm, fd })
    }

    /// The SMB a producer created and sent as `fd`, with pages of
    /// `page_size_hint` bytes, if it is sealed and sized as the service
    /// would have made it.
    fn adopt_smb(&self, fd: OwnedFd, page_size_hint: u32) -> Result<SharedMemory, ShmError> {
        shm::adopt(fd, page_size_hint)
    }

    /// The file a `write_into_file` session writes: the descriptor the
    /// consumer sent, or `output_path` created anew (never an existing
    /// file). A descriptor must be a regular file: the service writes on
    /// its one thread, and a pipe or socket whose reader stops would stop
    /// it for every peer.
    fn open_trace_file(&self, target: FileTarget<'_>) -> std::io::Result<Box<dyn TraceFile>> {
        let file = match target {
            FileTarget::Fd(fd) => {
                let file = File::from(fd);
                if !file.metadata()?.file_type().is_file() {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        "not a regular file (a pipe, socket or device, which the service \
                         could block on); pass a file",
                    ));
                }
                file
            }
            // Readable too: a clone of the session copies it.
            FileTarget::Path(path) => std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(path)?,
        };
        Ok(Box::new(TimedFile(file)))
    }
}

/// An SMB the service created.
#[derive(Debug)]
pub struct NewSmb {
    /// The mapping.
    pub shm: SharedMemory,
    /// A descriptor of it for the producer (`SetupTracing`).
    pub fd: OwnedFd,
}

/// Where a `write_into_file` session's trace goes.
#[derive(Debug)]
pub enum FileTarget<'a> {
    /// A descriptor the consumer passed with `EnableTracing`.
    Fd(OwnedFd),
    /// `TraceConfig.output_path`.
    Path(&'a str),
}

/// A trace file being written.
pub trait TraceFile: Write + std::fmt::Debug {
    /// Starts handing the written data to the storage device
    /// (`fdatasync`), at the end of the session. It may return before the
    /// data is on the device: what was written is already readable.
    fn start_sync(&mut self) -> std::io::Result<()>;
    /// Copies everything written to this file so far, from its start, to
    /// the end of `dst`; the number of bytes copied (a clone of a
    /// `write_into_file` session starts its file with the source's,
    /// upstream's `base::CopyFileContents` in `FlushAndCloneSession`,
    /// src/tracing/service/tracing_service_impl.cc). Fails if this file
    /// cannot be read.
    fn copy_to(&mut self, dst: &mut dyn TraceFile) -> std::io::Result<u64>;
    /// Whether `fd` is this very file (same device and inode): a clone
    /// asked into the session's own file would overwrite the trace being
    /// written (upstream does not check).
    fn is_same_file(&self, fd: &OwnedFd) -> bool;
}

/// See [`trace_file_write_ns`].
static TRACE_FILE_WRITE_NS: AtomicU64 = AtomicU64::new(0);

/// Wall time spent in trace-file writes since the service started (every
/// file [`Environment::open_trace_file`] opened), in nanoseconds. A slow
/// turn of the service's loop names its share: a write that waits for the
/// disk (the kernel throttling dirty pages) keeps every client waiting.
pub fn trace_file_write_ns() -> u64 {
    TRACE_FILE_WRITE_NS.load(Ordering::Relaxed)
}

/// A trace file whose writes are timed ([`trace_file_write_ns`]).
#[derive(Debug)]
struct TimedFile(File);

impl TimedFile {
    fn timed<T>(&mut self, op: impl FnOnce(&mut File) -> T) -> T {
        let start = std::time::Instant::now();
        let result = op(&mut self.0);
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        TRACE_FILE_WRITE_NS.fetch_add(ns, Ordering::Relaxed);
        result
    }
}

impl Write for TimedFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.timed(|f| f.write(buf))
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.timed(|f| f.write_all(buf))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.timed(|f| f.flush())
    }
}

impl TraceFile for TimedFile {
    /// `fdatasync` on a thread of its own: on a busy disk it takes from
    /// tens of milliseconds to seconds, and the service's loop, which every
    /// producer and consumer waits on, must not wait for it.
    fn start_sync(&mut self) -> std::io::Result<()> {
        let file = self.0.try_clone()?;
        std::thread::Builder::new()
            .name("trace-file-sync".into())
            .spawn(move || {
                if let Err(e) = file.sync_data() {
                    log::warn!("fdatasync of a finished trace file failed: {e}");
                }
            })?;
        Ok(())
    }

    fn is_same_file(&self, fd: &OwnedFd) -> bool {
        match (rustix::fs::fstat(&self.0), rustix::fs::fstat(fd)) {
            (Ok(a), Ok(b)) => a.st_dev == b.st_dev && a.st_ino == b.st_ino,
            _ => false,
        }
    }

    fn copy_to(&mut self, dst: &mut dyn TraceFile) -> std::io::Result<u64> {
        use std::os::unix::fs::FileExt;
        self.flush()?;
        // What was written so far, and no more: `dst` may be this very
        // file, growing as it is copied.
        let len = self.0.metadata()?.len();
        let mut buf = vec![0u8; 1 << 20];
        let mut offset = 0u64;
        while offset < len {
            let want = usize::try_from(len - offset).map_or(buf.len(), |n| n.min(buf.len()));
            let n = self.timed(|f| f.read_at(&mut buf[..want], offset))?;
            if n == 0 {
                break;
            }
            dst.write_all(&buf[..n])?;
            offset += n as u64;
        }
        Ok(offset)
    }
}

/// The machine's real clocks and `getrandom`.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemEnvironment;

fn read(clock: ClockId) -> u64 {
    let t = rustix::time::clock_gettime(clock);
    (t.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(t.tv_nsec as u64)
}

/// The time-stamp counter, so that producers stamping packets with `rdtsc`
/// (clock id 9) can be converted to the trace clock.
#[cfg(target_arch = "x86_64")]
fn read_tsc() -> Option<u64> {
    // SAFETY: `rdtsc` exists on every x86-64 CPU (the TSC is part of the
    // architecture's baseline); it reads a counter and touches no memory.
    // (Only a kernel setting CR4.TSD would make it fault, and Linux does not
    // for ordinary processes.)
    Some(unsafe { core::arch::x86_64::_rdtsc() })
}

/// No time-stamp counter off x86-64 (upstream records it there only).
#[cfg(not(target_arch = "x86_64"))]
fn read_tsc() -> Option<u64> {
    None
}

impl Environment for SystemEnvironment {
    fn now(&self) -> Nanos {
        read(ClockId::Boottime)
    }

    fn clock_snapshot(&self) -> Vec<(u32, u64)> {
        // Upstream's order: BOOTTIME, REALTIME_COARSE, MONOTONIC_COARSE,
        // REALTIME, MONOTONIC, MONOTONIC_RAW, then (x86-64 only) TSC.
        let mut clocks = vec![
            (clock_id::BOOTTIME, read(ClockId::Boottime)),
            (clock_id::REALTIME_COARSE, read(ClockId::RealtimeCoarse)),
            (clock_id::MONOTONIC_COARSE, read(ClockId::MonotonicCoarse)),
            (clock_id::REALTIME, read(ClockId::Realtime)),
            (clock_id::MONOTONIC, read(ClockId::Monotonic)),
            (clock_id::MONOTONIC_RAW, read(ClockId::MonotonicRaw)),
        ];
        if let Some(tsc) = read_tsc() {
            clocks.push((clock_id::TSC, tsc));
        }
        clocks
    }

    fn random_u64(&self) -> u64 {
        let mut bytes = [0u8; 8];
        match rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty()) {
            Ok(8) => u64::from_le_bytes(bytes),
            // Only uniqueness matters (trace UUIDs): fall back to the clock.
            _ => read(ClockId::Realtime) ^ read(ClockId::Monotonic).rotate_left(32),
        }
    }
}

/// A clock that stands still until told to move: every clock reads the same
/// time plus a fixed offset. For deterministic tests.
#[derive(Debug, Clone, Default)]
pub struct FakeEnvironment {
    now: Rc<Cell<Nanos>>,
    random: Rc<Cell<u64>>,
}

impl FakeEnvironment {
    /// A fake clock at `start` ns.
    pub fn new(start: Nanos) -> Self {
        Self {
            now: Rc::new(Cell::new(start)),
            random: Rc::new(Cell::new(0x5EED)),
        }
    }

    /// Moves time forward by `ms` milliseconds.
    pub fn advance_ms(&self, ms: u64) {
        self.now.set(self.now.get() + ms * 1_000_000);
    }

    /// Sets the time.
    pub fn set(&self, now: Nanos) {
        self.now.set(now);
    }
}

impl Environment for FakeEnvironment {
    fn now(&self) -> Nanos {
        self.now.get()
    }

    fn clock_snapshot(&self) -> Vec<(u32, u64)> {
        let now = self.now.get();
        vec![
            (clock_id::BOOTTIME, now),
            (clock_id::REALTIME, now + 1_700_000_000_000_000_000),
            (clock_id::MONOTONIC, now),
        ]
    }

    fn random_u64(&self) -> u64 {
        // SplitMix64: deterministic and well spread.
        let s = self.random.get().wrapping_add(0x9E37_79B9_7F4A_7C15);
        self.random.set(s);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clocks_are_read_in_upstreams_order() {
        let env = SystemEnvironment;
        let a = env.now();
        let snap = env.clock_snapshot();
        let ids: Vec<u32> = snap.iter().map(|&(id, _)| id).collect();
        let mut expect = vec![6, 2, 4, 1, 3, 5];
        if cfg!(target_arch = "x86_64") {
            expect.push(clock_id::TSC);
        }
        assert_eq!(ids, expect);
        assert!(snap[0].1 >= a);
        assert_ne!(env.random_u64(), env.random_u64());
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_tsc_counts_forward_between_snapshots() {
        let env = SystemEnvironment;
        let tsc = |s: &[(u32, u64)]| s.iter().find(|c| c.0 == clock_id::TSC).map(|c| c.1);
        let first = env.clock_snapshot();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let second = env.clock_snapshot();
        let (t0, t1) = (tsc(&first).expect("tsc"), tsc(&second).expect("tsc"));
        // At least 2 ms at any plausible TSC rate (>= 100 MHz): 200,000 ticks.
        assert!(t1 > t0 + 200_000, "tsc {t0} -> {t1}");
    }

    /// Trace files write through, and their writes are timed (the slow
    /// turn warning names the share of file writes).
    #[test]
    fn trace_file_writes_reach_the_file_and_are_timed() {
        let path = std::env::temp_dir().join(format!(
            "shmtrace-env-test-{}-{}.pftrace",
            std::process::id(),
            SystemEnvironment.random_u64()
        ));
        let before = trace_file_write_ns();
        let mut file = SystemEnvironment
            .open_trace_file(FileTarget::Path(path.to_str().expect("utf-8 path")))
            .expect("opens");
        file.write_all(&[7u8; 64 * 1024]).expect("writes");
        file.flush().expect("flushes");
        let timed = trace_file_write_ns() - before;
        let written = std::fs::read(&path).expect("reads");
        let _ = std::fs::remove_file(&path);
        assert_eq!(written.len(), 64 * 1024);
        assert!(written.iter().all(|&b| b == 7));
        assert!(timed > 0, "the write was timed");
    }

    /// A pipe (or socket) would block the service once its reader stops:
    /// refused, saying why.
    #[test]
    fn a_trace_file_descriptor_must_be_a_regular_file() {
        let (read, write) = std::io::pipe().expect("pipe");
        let err = SystemEnvironment
            .open_trace_file(FileTarget::Fd(write.into()))
            .expect_err("a pipe is refused");
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("not a regular file"), "{err}");
        drop(read);
    }

    /// Copying a file into itself (a clone given the source's own file)
    /// copies what was there, once, and ends.
    #[test]
    fn a_file_copied_into_itself_doubles_once() {
        let path = std::env::temp_dir().join(format!(
            "shmtrace-env-copy-{}-{}.pftrace",
            std::process::id(),
            SystemEnvironment.random_u64()
        ));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .expect("creates");
        let again = file.try_clone().expect("dup");
        let mut src = SystemEnvironment
            .open_trace_file(FileTarget::Fd(file.into()))
            .expect("opens");
        let mut dst = SystemEnvironment
            .open_trace_file(FileTarget::Fd(again.into()))
            .expect("opens");
        src.write_all(b"abc").expect("writes");
        assert_eq!(src.copy_to(&mut *dst).expect("copies"), 3);
        dst.flush().expect("flushes");
        let written = std::fs::read(&path).expect("reads");
        let _ = std::fs::remove_file(&path);
        assert_eq!(written, b"abcabc");
    }

    #[test]
    fn the_fake_clock_moves_only_when_told() {
        let env = FakeEnvironment::new(1000);
        assert_eq!(env.now(), 1000);
        env.advance_ms(5);
        assert_eq!(env.now(), 5_001_000);
        let shared = env.clone();
        shared.advance_ms(1);
        assert_eq!(env.now(), 6_001_000);
    }
}
