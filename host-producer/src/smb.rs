//! The shared memory buffer and its writers.

pub(crate) mod arbiter;
pub(crate) mod cell_lock;
pub(crate) mod shm;
pub(crate) mod writer;
