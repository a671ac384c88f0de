//! The shared memory buffer and its writers.

pub(crate) mod arbiter;
pub(crate) mod shm;
pub(crate) mod writer;
