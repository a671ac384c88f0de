//! # shmtrace-abi
//!
//! A `#![no_std]`, allocation-free implementation of Perfetto's shared-memory
//! buffer (SMB) ABI, version 1: the bytes a producer and the tracing service
//! exchange through shared memory.
//!
//! Module plan (each module states its own invariants):
//!
//! * [`layout`]: constants, page sizes, page layouts and the checked byte
//!   views of the page header and chunk header (smoltcp `wire/` style).
//! * [`state`]: the 2-bit chunk state machine as pure `const fn`s over the
//!   page header bitmap.
//! * [`sync`]: the atomic-word shim (`core` atomics normally, loom under
//!   `--cfg loom`) and the small traits the state-machine operations are
//!   generic over.
//! * [`smb`]: the view over shared memory the crate does not own; the only
//!   `unsafe` code lives in its `raw` submodule.
//! * [`proto`]: the zero-alloc protobuf encoder.
//! * [`writer`]: the producer-side `TraceWriter` (fragmentation, patches,
//!   drop mode).
//! * [`reader`]: the service-side parser of a copied (untrusted) chunk and
//!   patch application.
#![no_std]
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

#[cfg(any(test, loom))]
extern crate std;

pub mod layout;
pub mod proto;
pub mod reader;
pub mod smb;
pub mod state;
pub mod sync;
pub mod writer;
