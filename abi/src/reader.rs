//! Service side: parsing a copied chunk and applying patches to it.
//!
//! Everything here works on bytes the service has already copied out of
//! shared memory (or received over IPC in emulation mode), so the producer
//! cannot change them while they are parsed. The bytes are still untrusted:
//! every size is bounds-checked, every malformation is a typed error with one
//! variant per cause, and nothing here panics or allocates.
//!
//! * [`Fragments`] iterates the fragments of a chunk payload.
//! * [`apply_patch`] / [`apply_patches`] apply out-of-band patches to a
//!   stored payload with the service's accounting rules.
// Hostile input: no index that can panic, no arithmetic that can wrap.
#![deny(clippy::indexing_slicing, clippy::arithmetic_side_effects)]

mod fragments;
mod patch;

pub use fragments::{ChunkError, DroppedPacket, Fragment, FragmentEvent, Fragments};
pub use patch::{
    apply_patch, apply_patches, PatchError, PatchFailure, PatchOutcome, TooManyPatches,
    MAX_PATCHES_PER_GROUP, PATCH_SIZE,
};
