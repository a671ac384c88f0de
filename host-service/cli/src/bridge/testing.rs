//! Test support: a firmware region in a file, as a QEMU guest's RAM holds
//! it (abi's `RegionStorage` over a shared mapping of the file).

#![allow(unsafe_code)]

use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use shmtrace_abi::region::{RegionConfig, RegionHandles, RegionStorage};

/// SMB bytes of the test region.
pub const SMB: usize = 16 * 1024;
/// Ring slots of the test region.
pub const SLOTS: usize = 16;
/// The test region.
pub type Storage = RegionStorage<SMB, SLOTS>;
/// Where the region starts in its file.
pub const OFFSET: u64 = 0x2000;

/// The firmware's view: the file mapped, the storage at an offset in it
/// (`OFFSET` unless told otherwise).
pub struct Firmware {
    base: NonNull<u8>,
    len: usize,
    offset: usize,
}

impl Firmware {
    /// Maps `path` (created by [`create`]).
    pub fn map(path: &Path) -> Self {
        Self::map_at(path, OFFSET)
    }

    /// Maps `path`, the storage at `offset` (page aligned) in it.
    pub fn map_at(path: &Path, offset: u64) -> Self {
        assert_eq!(offset % 4096, 0);
        let offset = offset as usize;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        let len = offset + std::mem::size_of::<Storage>();
        assert!(file.metadata().unwrap().len() >= len as u64);
        // SAFETY: a fresh shared mapping chosen by the kernel.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                &file,
                0,
            )
        }
        .unwrap();
        Firmware {
            base: NonNull::new(ptr.cast()).unwrap(),
            len,
            offset,
        }
    }

    /// The storage, as a firmware's RAM holds it.
    pub fn storage(&mut self) -> &mut Storage {
        // SAFETY: the mapping holds a `Storage` at `offset` (page aligned,
        // so 8-aligned), every byte pattern is valid for it (byte arrays
        // and a `MaybeUninit`), and the exclusive borrow of `self` makes
        // this the only reference this test makes into it. The source under
        // test maps the file separately and never makes references.
        unsafe { &mut *self.base.as_ptr().add(self.offset).cast::<Storage>() }
    }

    /// Initializes the region (a boot).
    pub fn boot(&mut self, config: &RegionConfig<'_>) -> RegionHandles<'_> {
        self.storage().init(config).unwrap()
    }

    /// A byte of the region.
    pub fn peek(&mut self, at: usize) -> u8 {
        assert!(at < std::mem::size_of::<Storage>());
        // SAFETY: inside the mapping; a plain byte load from shared memory
        // (no reference is held over it).
        unsafe { self.base.as_ptr().add(self.offset + at).read_volatile() }
    }

    /// A byte of the region (as a probe scribbling would write it).
    pub fn poke(&mut self, at: usize, value: u8) {
        assert!(at < std::mem::size_of::<Storage>());
        // SAFETY: inside the mapping; a plain byte store into shared
        // memory, like a peer's scribble (no reference is held over it).
        unsafe {
            self.base
                .as_ptr()
                .add(self.offset + at)
                .write_volatile(value)
        };
    }
}

impl Drop for Firmware {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`; the storage borrows `self`.
        unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) }.unwrap();
    }
}

/// A path in this test process's directory.
pub fn file(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "shmtrace-region-test-{}-{name}",
        std::process::id()
    ))
}

/// Creates (or empties) `path` with room for the region.
pub fn create(path: &Path) {
    let f = std::fs::File::create(path).unwrap();
    f.set_len(OFFSET + std::mem::size_of::<Storage>() as u64 + 4096)
        .unwrap();
}
