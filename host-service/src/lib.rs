//! The shmtrace tracing service: what `traced` is to Perfetto, plus the IPC
//! library that producers and consumers use to talk to it (or to the real
//! Perfetto service).
//!
//! # Parts
//!
//! * [`service`] — the tracing service: a sans-IO core driven by events and
//!   a clock, and the epoll shell that runs it on UNIX sockets.
//! * [`ipc`] and [`protos`] — re-exports of the `shmtrace-ipc` crate (at
//!   `host-service/ipc/`): Perfetto's socket protocol and messages. They live
//!   in their own crate so that `shmtrace-producer` uses them without
//!   compiling service internals.
//!
//! The `shmtrace` command-line tool, which runs this service (`serve`,
//! `demo`), is the package `shmtrace-cli` at `host-service/cli/`.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub use shmtrace_ipc as ipc;
pub use shmtrace_ipc::protos;
pub mod service;
