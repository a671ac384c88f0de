//! The shmtrace tracing service: what `traced` is to Perfetto, plus the IPC
//! library that producers and consumers use to talk to it (or to the real
//! Perfetto service).
//!
//! # Parts and features
//!
//! * [`protos`] — the protocol messages (`perfetto.protos`, upstream's names
//!   and field numbers), compiled from `proto/` at build time with `protox`
//!   and `prost-build` (no system `protoc` needed), and the canonical encoder
//!   that reproduces the real Perfetto's bytes.
//! * [`ipc`] — the socket protocol: framing, fd passing, the RPC host and
//!   client, addresses and peer credentials.
//!
//! Both are always built and depend only on `prost`, `bytes`, `rustix`,
//! `libc`, `thiserror` and `log`. The tracing service itself (and the
//! `shmtrace` binary) sits behind the default feature `service`, which adds
//! the SMB ABI crate. `shmtrace-producer` depends on this crate with
//! `default-features = false`, so a producer never compiles service
//! internals.
//!
//! # Status
//!
//! The IPC layer and the messages are complete: golden tests against frames
//! recorded from Perfetto v59 (`tests/ipc_golden.rs`), socket tests
//! (`tests/ipc_socket.rs`) and a fuzz target (`fuzz/fuzz_targets/ipc_frame.rs`).
//! The service core lands with its own issue.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod ipc;
pub mod protos;

#[doc(hidden)]
pub mod fuzzing;
