//! A region in a file mapped into this process, and abi's reader over it.
//!
//! # Invariants
//!
//! * A region has one reader (abi's `region` module: one consumer), and
//!   readers write it (`ring_tail`, the control words): a second reader
//!   would steal the first one's records and answers. [`RegionFile`] claims
//!   the region before anything maps it: a non-blocking write lock of its
//!   open file description (`F_OFD_SETLK`) over the region's header bytes,
//!   where the consumer's words lie. It conflicts with every other open of
//!   the file, in this process or another, and with no other region of
//!   the file (a dual-core firmware's regions are read side by side); the
//!   kernel drops it when the descriptor closes, however the process ends.
//! * [`MappedRegion`] owns a `MAP_SHARED` mapping of the file and the
//!   [`RegionReader`] over it; the reader is declared first, so it is
//!   dropped before the mapping is unmapped, and never leaves the struct:
//!   what it lends (records, control words) borrows the `MappedRegion`.
//! * This process never makes a Rust reference into the mapping: only the
//!   reader's atomics and `Smb` touch it. The firmware (QEMU's guest, a
//!   probe) writes it at any time; the reader treats every byte as hostile.
//! * A file shrunk under a mapping makes the pages past its end fault
//!   (SIGBUS). [`MappedRegion::file_changed`] sees a shrink or a replaced
//!   file before the next poll touches the memory; the window between the
//!   check and the access stays (a process boundary contains it: `serve
//!   --attach` runs each region in a child of its own).
// `unsafe` here: the mapping of a firmware region, the reader over it, and
// the lock claiming it.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::ptr::NonNull;

use rustix::mm::{MapFlags, ProtFlags};
use shmtrace_abi::region::{
    Control, Counters, HeaderRepr, ReaderError, ReaderStats, Record, RegionReader, HEADER_SIZE,
};

/// Why a mapping could not be made.
#[derive(Debug)]
pub enum MapError {
    /// The file does not exist, or does not yet reach past the header at
    /// the offset: wait for it.
    NotYet(String),
    /// The region is not (or no longer) usable: the reader's error.
    Region(ReaderError),
    /// Another reader holds the region: who, as far as it can be seen
    /// (`pid 1234`, or empty).
    Busy(String),
    /// The file cannot be opened or mapped.
    Io(io::Error),
}

struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory, valid until `Drop` unmaps
// it, whichever thread uses or unmaps it.
unsafe impl Send for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` is the mapping `MappedRegion::open` made,
        // unmapped only here. The reader over it was dropped first (field
        // order of `MappedRegion`) and nothing else points into it.
        if let Err(e) = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) } {
            log::warn!("munmap of a firmware region failed: {e}");
        }
    }
}

/// A region mapped from a file. See the module docs.
pub struct MappedRegion {
    // Dropped before `_mapping`, which it points into (and which is only
    // there to be unmapped after it).
    reader: RegionReader<'static>,
    _mapping: Mapping,
    /// Bytes of the file from the region's start, when mapped.
    len: u64,
    offset: u64,
    dev: u64,
    ino: u64,
}

impl std::fmt::Debug for MappedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedRegion")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// The largest region a header can describe (`region_size` is a u32).
const MAX_REGION: u64 = u32::MAX as u64;

/// The file of a region, open for reading and writing, and this reader's
/// claim on the region. See the module docs.
#[derive(Debug)]
pub struct RegionFile {
    file: File,
    dev: u64,
    ino: u64,
}

impl RegionFile {
    /// Opens `path` and claims the region at `offset` of it: [`MapError::Busy`]
    /// if another reader holds it. A file system without byte-range locks
    /// leaves the region unclaimed (logged).
    pub fn claim(path: &Path, offset: u64) -> Result<Self, MapError> {
        let file = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(MapError::NotYet("the file does not exist yet".into()))
            }
            Err(e) => return Err(MapError::Io(e)),
        };
        let meta = file.metadata().map_err(MapError::Io)?;
        let (dev, ino) = (meta.dev(), meta.ino());
        match lock_header(&file, offset) {
            Ok(()) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => {
                let end = offset.saturating_add(HEADER_SIZE as u64 - 1);
                let holders: Vec<String> = lock_holders(dev, ino, offset, end)
                    .into_iter()
                    .map(|pid| {
                        if pid == std::process::id() {
                            format!("{pid}: this process")
                        } else {
                            pid.to_string()
                        }
                    })
                    .collect();
                return Err(MapError::Busy(match holders.len() {
                    0 => String::new(),
                    1 => format!("pid {}", holders[0]),
                    _ => format!("pids {}", holders.join(", ")),
                }));
            }
            Err(e) => log::warn!(
                "{}: cannot lock the region's header ({e}): a second reader would not be refused",
                path.display()
            ),
        }
        Ok(RegionFile { file, dev, ino })
    }

    /// Whether `path` still names this file (not replaced or removed).
    pub fn is_current(&self, path: &Path) -> bool {
        std::fs::metadata(path).is_ok_and(|m| m.dev() == self.dev && m.ino() == self.ino)
    }
}

/// Write-locks the header bytes of the region at `offset` of `file`, for
/// `file`'s open file description, without waiting.
fn lock_header(file: &File, offset: u64) -> io::Result<()> {
    let start = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::other("the region offset is out of range"))?;
    // SAFETY: `flock` is plain integers: all zeros is a valid value.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as _;
    lock.l_whence = libc::SEEK_SET as _;
    lock.l_start = start;
    lock.l_len = HEADER_SIZE as libc::off_t;
    // SAFETY: the descriptor is `file`'s, open for the call; the kernel
    // only reads `lock`, which lives across it.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &lock) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The processes with a descriptor of the file `dev`/`ino` holding a lock
/// over bytes `start..=end` of it, from `/proc/*/fdinfo` (an OFD lock
/// tells no pid: `F_OFD_GETLK` and `/proc/locks` say -1). Processes this
/// one may not look into (another user's) are missing.
fn lock_holders(dev: u64, ino: u64, start: u64, end: u64) -> Vec<u32> {
    let mut pids = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for process in procs.flatten() {
        let Some(pid) = process.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(process.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::metadata(fd.path()).is_ok_and(|m| m.dev() == dev && m.ino() == ino)
                && std::fs::read_to_string(process.path().join("fdinfo").join(fd.file_name()))
                    .is_ok_and(|info| locks_range(&info, dev, ino, start, end))
        });
        if holds {
            pids.push(pid);
        }
    }
    pids
}

/// Whether a `/proc/PID/fdinfo/FD` text lists a lock on the file
/// `dev`/`ino` overlapping bytes `start..=end`: lines such as
/// `lock:\t1: OFDLCK ADVISORY  WRITE -1 fe:00:10011634 64 319` (device
/// major and minor in hex, inode, first and last byte or `EOF`).
fn locks_range(info: &str, dev: u64, ino: u64, start: u64, end: u64) -> bool {
    let file = format!(
        "{:02x}:{:02x}:{ino}",
        rustix::fs::major(dev),
        rustix::fs::minor(dev)
    );
    info.lines()
        .filter_map(|l| l.strip_prefix("lock:"))
        .any(|l| {
            let mut words = l.split_whitespace().skip_while(|w| *w != file).skip(1);
            let first = words.next().and_then(|w| w.parse::<u64>().ok());
            let last = words.next().and_then(|w| {
                if w == "EOF" {
                    Some(u64::MAX)
                } else {
                    w.parse().ok()
                }
            });
            matches!((first, last), (Some(a), Some(b)) if a <= end && b >= start)
        })
}

impl MappedRegion {
    /// Maps the region at `offset` (8-aligned) of the claimed `file` and
    /// checks its header.
    pub fn open(file: &RegionFile, offset: u64) -> Result<Self, MapError> {
        let size = file.file.metadata().map_err(MapError::Io)?.len();
        if size < offset.saturating_add(HEADER_SIZE as u64) {
            return Err(MapError::NotYet(format!(
                "the file has {size} bytes, the region's header would end at {}",
                offset.saturating_add(HEADER_SIZE as u64)
            )));
        }
        let len = (size - offset).min(MAX_REGION);
        let page = rustix::param::page_size() as u64;
        let start = offset - offset % page;
        let delta = (offset - start) as usize;
        let map_len = usize::try_from(len)
            .ok()
            .and_then(|l| l.checked_add(delta))
            .ok_or_else(|| MapError::Io(io::Error::other("the region does not fit in memory")))?;
        let mapping = map(&file.file, start, map_len)?;
        // SAFETY: `delta < page <= map_len`, inside the mapping.
        let region = unsafe { mapping.base.as_ptr().add(delta) };
        // SAFETY: `region..region + len` lies in the shared mapping, valid
        // for reads and writes until `mapping` is unmapped, which happens
        // only after the reader is dropped (field order, module
        // invariants); no Rust reference into it exists or is ever made, and
        // within this process only this reader touches it.
        let reader = unsafe { RegionReader::from_raw_parts(region, len as usize) }
            .map_err(MapError::Region)?;
        Ok(MappedRegion {
            reader,
            _mapping: mapping,
            len,
            offset,
            dev: file.dev,
            ino: file.ino,
        })
    }

    /// Whether the file at `path` is no longer the one mapped, or shrank
    /// below the mapping (QEMU restarted with a new file, a truncation):
    /// the mapping must be dropped.
    pub fn file_changed(&self, path: &Path) -> bool {
        match std::fs::metadata(path) {
            Ok(m) => m.dev() != self.dev || m.ino() != self.ino || m.len() < self.offset + self.len,
            Err(_) => true,
        }
    }

    /// The next record, if any; see [`RegionReader::poll`].
    pub fn poll<'b>(&mut self, buf: &'b mut [u8]) -> Result<Option<Record<'b>>, ReaderError> {
        self.reader.poll(buf)
    }

    /// The header last validated.
    pub fn header(&self) -> Option<&HeaderRepr> {
        self.reader.header()
    }

    /// The control words (`None` while the header is invalid).
    pub fn control(&self) -> Option<Control<'_>> {
        self.reader.control()
    }

    /// The firmware's counters (`None` while the header is invalid).
    pub fn counters(&self) -> Option<Counters> {
        self.reader.counters()
    }

    /// The reader's counters.
    pub fn stats(&self) -> ReaderStats {
        self.reader.stats()
    }

    /// Bytes a poll's buffer needs.
    pub fn chunk_buffer_len(&self) -> usize {
        self.reader.chunk_buffer_len()
    }
}

fn map(file: &File, start: u64, len: usize) -> Result<Mapping, MapError> {
    // SAFETY: a fresh shared mapping of `len` bytes of the file at an
    // address the kernel chooses: it aliases no Rust object.
    let ptr = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            file,
            start,
        )
    }
    .map_err(|e| MapError::Io(e.into()))?;
    let base = NonNull::new(ptr.cast::<u8>())
        .ok_or_else(|| MapError::Io(io::Error::other("mmap returned a null mapping")))?;
    Ok(Mapping { base, len })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fdinfo_lock_lines_are_matched_by_file_and_overlapping_range() {
        let dev = rustix::fs::makedev(0xfe, 0);
        let info = "pos:\t0\nflags:\t02100002\nmnt_id:\t27\nino:\t10011634\n\
                    lock:\t1: OFDLCK ADVISORY  WRITE -1 fe:00:10011634 8192 8447\n\
                    lock:\t2: POSIX  ADVISORY  READ 77 fe:00:10011634 65536 EOF\n";
        let holds = |ino, start, end| locks_range(info, dev, ino, start, end);
        assert!(holds(10011634, 8192, 8447));
        assert!(holds(10011634, 8000, 8192));
        assert!(holds(10011634, 8447, 9000));
        assert!(!holds(10011634, 8448, 8703), "the next region");
        assert!(!holds(10011634, 0, 8191));
        assert!(holds(10011634, 1 << 40, (1 << 40) + 255), "to EOF");
        assert!(!holds(10011635, 8192, 8447), "another file");
        assert!(!locks_range(
            info,
            rustix::fs::makedev(0xfe, 1),
            10011634,
            8192,
            8447
        ));
        assert!(!locks_range("lock:\t1: OFDLCK", dev, 10011634, 0, 10));
    }
}
