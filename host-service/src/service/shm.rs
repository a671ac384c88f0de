//! The service's policy for shared memory buffers (SMBs): which sizes it
//! creates, and which producer-provided SMBs it accepts. The memory itself
//! (memfd, seals, mapping, the [`Smb`](shmtrace_abi::smb::Smb) view) is
//! [`shmtrace_ipc::shm`], shared with the producer.
//!
//! The service creates one SMB per producer, lazily, the first time it sets
//! up a data source on it, sized by [`ensure_valid_sizes`] from the
//! producer's hints. A producer may instead provide its own SMB (startup
//! tracing); it is accepted only if sealed by its creator and sized exactly
//! as [`ensure_valid_sizes`] would choose.

use std::os::fd::OwnedFd;

use shmtrace_abi::layout::{
    PageSize, DEFAULT_PAGE_SIZE, DEFAULT_SMB_SIZE, MAX_SMB_SIZE, SERVICE_MAX_PAGE_SIZE,
};
use shmtrace_ipc::shm::Adoption;
pub use shmtrace_ipc::shm::{SharedMemory, ShmError};

/// The SMB size and page size the service uses for hints `size` and `page`
/// (Perfetto's `EnsureValidShmSizes`, src/tracing/service/tracing_service_impl.cc):
/// 0 picks the default,
/// values are clamped to the maximum, and an inconsistent pair reverts both
/// to the defaults.
pub fn ensure_valid_sizes(size: usize, page: usize) -> (usize, usize) {
    let size = if size == 0 {
        DEFAULT_SMB_SIZE
    } else {
        size.min(MAX_SMB_SIZE)
    };
    let page = if page == 0 {
        DEFAULT_PAGE_SIZE
    } else {
        page.min(SERVICE_MAX_PAGE_SIZE)
    };
    let pages_ok = page % DEFAULT_PAGE_SIZE == 0 && (page / DEFAULT_PAGE_SIZE).is_power_of_two();
    if !pages_ok || size < page || size % page != 0 {
        return (DEFAULT_SMB_SIZE, DEFAULT_PAGE_SIZE);
    }
    (size, page)
}

/// A new SMB of `size` bytes with pages of `page_size` bytes (a pair
/// [`ensure_valid_sizes`] returned).
pub fn create(size: usize, page_size: usize) -> Result<SharedMemory, ShmError> {
    SharedMemory::create(size, PageSize::new_service(page_size)?)
}

/// The SMB a producer created and sent as `fd`, announced with pages of
/// `page_size_hint` bytes: sealed by the producer against shrinking,
/// growing and further sealing, with a page size the service uses and a
/// whole number of pages up to the maximum (the pairs
/// [`ensure_valid_sizes`] keeps as they are).
pub fn adopt(fd: OwnedFd, page_size_hint: u32) -> Result<SharedMemory, ShmError> {
    let page_size = usize::try_from(page_size_hint).unwrap_or(usize::MAX);
    SharedMemory::adopt(fd, PageSize::new_service(page_size)?, Adoption::ByService)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::{MemfdFlags, SealFlags};
    use shmtrace_abi::layout::PageSizeError;

    #[test]
    fn sizes_follow_upstream() {
        assert_eq!(ensure_valid_sizes(0, 0), (262_144, 4096));
        assert_eq!(ensure_valid_sizes(1 << 20, 16384), (1 << 20, 16384));
        // Clamped.
        assert_eq!(ensure_valid_sizes(64 << 20, 65536), (32 << 20, 32768));
        // Page not a power-of-two multiple of 4 KiB, size not a multiple of
        // the page, size below the page: both revert.
        assert_eq!(ensure_valid_sizes(1 << 20, 12288), (262_144, 4096));
        assert_eq!(ensure_valid_sizes(10_000, 4096), (262_144, 4096));
        assert_eq!(ensure_valid_sizes(4096, 8192), (262_144, 4096));
    }

    #[test]
    fn a_created_smb_has_the_chosen_geometry() {
        let shm = create(1 << 20, 16384).expect("memfd");
        assert_eq!((shm.len(), shm.page_size().get()), (1 << 20, 16384));
        assert_eq!(shm.smb().num_pages(), 64);
        // A page size the ABI allows but the service does not use.
        assert!(matches!(
            create(1 << 20, 65536),
            Err(ShmError::PageSize(PageSizeError::TooLarge(65536)))
        ));
    }

    #[test]
    fn producer_smbs_must_be_sealed_and_sized_as_the_service_would() {
        let fd =
            rustix::fs::memfd_create("x", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&fd, 65536).unwrap();
        assert!(matches!(
            adopt(fd.try_clone().unwrap(), 4096),
            Err(ShmError::NotSealed)
        ));
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .unwrap();
        // Every pair `ensure_valid_sizes` would change is refused.
        for (page, why) in [
            (12288, PageSizeError::NotPowerOfTwo(12288)),
            (65536, PageSizeError::TooLarge(65536)),
            (0, PageSizeError::TooSmall(0)),
        ] {
            assert_ne!(ensure_valid_sizes(65536, page), (65536, page));
            assert!(
                matches!(adopt(fd.try_clone().unwrap(), page as u32), Err(ShmError::PageSize(e)) if e == why),
                "{page}"
            );
        }
        // 64 KiB of 32 KiB pages is what the service would choose.
        assert_eq!(ensure_valid_sizes(65536, 32768), (65536, 32768));
        let shm = adopt(fd, 32768).expect("valid");
        assert_eq!(shm.smb().num_pages(), 2);
    }
}
