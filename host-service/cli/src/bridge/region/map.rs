//! A region in a file mapped into this process, and abi's reader over it.
//!
//! # Invariants
//!
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
// `unsafe` here: the mapping of a firmware region and the reader over it.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
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

impl MappedRegion {
    /// Maps the region at `offset` (8-aligned) of `path` and checks its
    /// header.
    pub fn open(path: &Path, offset: u64) -> Result<Self, MapError> {
        let file = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(MapError::NotYet("the file does not exist yet".into()))
            }
            Err(e) => return Err(MapError::Io(e)),
        };
        let meta = file.metadata().map_err(MapError::Io)?;
        let size = meta.len();
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
        let mapping = map(&file, start, map_len)?;
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
            dev: meta.dev(),
            ino: meta.ino(),
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
