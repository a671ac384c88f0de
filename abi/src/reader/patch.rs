//! Applying out-of-band patches (`CommitDataRequest.ChunkToPatch`) to a
//! stored chunk payload.
//!
//! A patch is `(offset, data)`: `data` must be exactly [`PATCH_SIZE`] bytes
//! and lands at `offset` bytes after the start of the chunk payload (just
//! after the 8-byte chunk header). The accounting follows the Perfetto
//! service: a patch with the wrong data length is skipped and counted as
//! discarded while the others still apply; a patch pointing outside the
//! payload fails and aborts the rest of its group (patches before it stay
//! applied); a group of more than [`MAX_PATCHES_PER_GROUP`] patches is
//! discarded whole.

/// Size of every patch's data: one 4-byte redundant varint.
pub const PATCH_SIZE: usize = 4;

/// Largest group (one `ChunkToPatch`) the service applies.
pub const MAX_PATCHES_PER_GROUP: usize = 1024;

/// Why a single patch was not applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PatchError {
    /// `data` is not exactly 4 bytes (service: `patches_discarded`).
    WrongDataLength {
        /// Length received.
        len: usize,
    },
    /// `offset + 4` lies past the end of the payload (service:
    /// `patches_failed`).
    OffsetOutOfRange {
        /// Offset received.
        offset: u32,
        /// Length of the payload being patched.
        payload_len: usize,
    },
}

impl core::fmt::Display for PatchError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Self::WrongDataLength { len } => {
                write!(f, "patch data is {len} bytes, expected {PATCH_SIZE}")
            }
            Self::OffsetOutOfRange {
                offset,
                payload_len,
            } => write!(
                f,
                "patch at offset {offset} does not fit a {payload_len}-byte chunk payload"
            ),
        }
    }
}

impl core::error::Error for PatchError {}

/// Applies one patch to `payload`.
pub fn apply_patch(payload: &mut [u8], offset: u32, data: &[u8]) -> Result<(), PatchError> {
    let data: &[u8; PATCH_SIZE] = data
        .try_into()
        .map_err(|_| PatchError::WrongDataLength { len: data.len() })?;
    let start = offset as usize;
    match payload.get_mut(start..start.saturating_add(PATCH_SIZE)) {
        Some(dst) => {
            dst.copy_from_slice(data);
            Ok(())
        }
        None => Err(PatchError::OffsetOutOfRange {
            offset,
            payload_len: payload.len(),
        }),
    }
}

/// The group held more than [`MAX_PATCHES_PER_GROUP`] patches; none applied
/// (service: all counted in `patches_discarded`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyPatches {
    /// Patches in the group.
    pub count: usize,
}

impl core::fmt::Display for TooManyPatches {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "{} patches in one group, limit {MAX_PATCHES_PER_GROUP}",
            self.count
        )
    }
}

impl core::error::Error for TooManyPatches {}

/// The patch that stopped a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatchFailure {
    /// Index of the patch within its group.
    pub index: usize,
    /// Why it failed (always [`PatchError::OffsetOutOfRange`]).
    pub error: PatchError,
}

/// Result of [`apply_patches`] on one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PatchOutcome {
    /// Patches written into the payload (service: `patches_succeeded`).
    pub applied: u32,
    /// Patches skipped for a wrong data length (service: `patches_discarded`).
    pub discarded: u32,
    /// The patch that aborted the group, if any (service: `patches_failed`
    /// += 1; later patches of the group were not looked at).
    pub failed: Option<PatchFailure>,
}

/// Applies a group of `(offset, data)` patches for one chunk, in order, with
/// the service's accounting (see the module docs).
///
/// ```
/// use shmtrace_abi::reader::apply_patches;
/// let mut payload = [0u8; 16];
/// let patches = [(4, &[0x85, 0x80, 0x80, 0x00][..]), (0, &[1, 2][..])];
/// let outcome = apply_patches(&mut payload, patches.iter().copied()).unwrap();
/// assert_eq!((outcome.applied, outcome.discarded), (1, 1));
/// assert_eq!(&payload[4..8], &[0x85, 0x80, 0x80, 0x00]);
/// ```
pub fn apply_patches<'p, I>(payload: &mut [u8], patches: I) -> Result<PatchOutcome, TooManyPatches>
where
    I: IntoIterator<Item = (u32, &'p [u8])>,
    I::IntoIter: ExactSizeIterator,
{
    let patches = patches.into_iter();
    let count = patches.len();
    if count > MAX_PATCHES_PER_GROUP {
        return Err(TooManyPatches { count });
    }
    let mut outcome = PatchOutcome::default();
    // At most MAX_PATCHES_PER_GROUP patches: the counts cannot wrap.
    for (index, (offset, data)) in patches.enumerate() {
        match apply_patch(payload, offset, data) {
            Ok(()) => outcome.applied = outcome.applied.saturating_add(1),
            Err(PatchError::WrongDataLength { .. }) => {
                outcome.discarded = outcome.discarded.saturating_add(1)
            }
            Err(error) => {
                outcome.failed = Some(PatchFailure { index, error });
                break;
            }
        }
    }
    Ok(outcome)
}

// Tests may panic: that is how they fail.
#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
mod tests {
    use super::*;
    use std::vec::Vec;

    #[test]
    fn single_patches_are_bounds_checked() {
        let mut p = [0u8; 8];
        assert_eq!(apply_patch(&mut p, 4, &[0x85, 0x80, 0x80, 0x00]), Ok(()));
        assert_eq!(p, [0, 0, 0, 0, 0x85, 0x80, 0x80, 0x00]);
        assert_eq!(
            apply_patch(&mut p, 5, &[1, 2, 3, 4]),
            Err(PatchError::OffsetOutOfRange {
                offset: 5,
                payload_len: 8
            })
        );
        assert_eq!(
            apply_patch(&mut p, u32::MAX, &[1, 2, 3, 4]),
            Err(PatchError::OffsetOutOfRange {
                offset: u32::MAX,
                payload_len: 8
            })
        );
        assert_eq!(
            apply_patch(&mut p, 0, &[1, 2, 3]),
            Err(PatchError::WrongDataLength { len: 3 })
        );
        assert_eq!(
            apply_patch(&mut p, 0, &[1, 2, 3, 4, 5]),
            Err(PatchError::WrongDataLength { len: 5 })
        );
        assert_eq!(
            apply_patch(&mut [0u8; 3], 0, &[1, 2, 3, 4]),
            Err(PatchError::OffsetOutOfRange {
                offset: 0,
                payload_len: 3
            })
        );
        // Nothing changed by the failures.
        assert_eq!(p, [0, 0, 0, 0, 0x85, 0x80, 0x80, 0x00]);
    }

    #[test]
    fn groups_follow_the_service_accounting() {
        let mut p = [0u8; 12];
        let group: [(u32, &[u8]); 4] = [
            (0, &[1, 1, 1, 1]),
            (4, &[2, 2]),
            (9, &[3, 3, 3, 3]),
            (4, &[4, 4, 4, 4]),
        ];
        let outcome = apply_patches(&mut p, group).expect("small group");
        assert_eq!(outcome.applied, 1);
        assert_eq!(outcome.discarded, 1);
        assert_eq!(
            outcome.failed,
            Some(PatchFailure {
                index: 2,
                error: PatchError::OffsetOutOfRange {
                    offset: 9,
                    payload_len: 12
                }
            })
        );
        // The patch after the failure was not applied.
        assert_eq!(p, [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn oversized_groups_are_rejected_whole() {
        let mut p = [0u8; 8];
        let data = [9u8; 4];
        let group: Vec<(u32, &[u8])> = (0..1025).map(|_| (0, &data[..])).collect();
        assert_eq!(
            apply_patches(&mut p, group.iter().copied()),
            Err(TooManyPatches { count: 1025 })
        );
        assert_eq!(p, [0; 8]);
        let outcome = apply_patches(&mut p, group[..1024].iter().copied()).expect("at the limit");
        assert_eq!(outcome.applied, 1024);
        assert_eq!(&p[..4], &data);
    }
}
