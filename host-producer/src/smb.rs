//! The shared memory buffer's writers (the memory itself is
//! `shmtrace_ipc::shm::SharedMemory`).

pub(crate) mod arbiter;
pub(crate) mod cell_lock;
pub(crate) mod writer;
