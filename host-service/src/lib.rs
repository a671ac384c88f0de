//! The shmtrace tracing service: what `traced` is to Perfetto.
//!
//! Lands with the IPC and service issues.
