//! End-to-end and interop test support for shmtrace, with the real Perfetto
//! (v59, from perfetto-sdk-sys 1.4.0) as the oracle.
//!
//! * [`drivers`]: the real service, producer and consumer, as the
//!   `real-service`, `real-producer` and `real-consumer` binaries of this
//!   package (C++ in `interop/`, linked against the real Perfetto).
//! * [`scenario`]: the interop matrix ([`scenario::Cell`]) and the scenarios
//!   run in each cell, with process guards and private socket paths.
//! * [`checker`]: the shared trace checker (`checker/check_trace.py`, official
//!   Perfetto protos) and its report.
//! * [`config`]: the TraceConfig messages the scenarios send.
//! * [`firmware`]: the Cortex-M4 firmware example and the Cortex-M0
//!   firmware under QEMU, for the `firmware_*` tests.
//! * [`netns`]: network namespaces and veth links for relayed "machines".
//! * [`test_events`]: the packets of the producer driver's custom data
//!   source, decoded from a trace.
//! * [`trace_file`]: a trace file's packets, decoded with prost.
//! * [`walkthrough`]: the README's walk-through blocks as steps a test runs.
//! * [`workload`]: one producer workload through one service, its CPU,
//!   peak memory and events kept measured (the service benchmarks).

pub mod checker;
pub mod config;
pub mod drivers;
pub mod error;
pub mod firmware;
pub mod netns;
pub mod process;
pub mod scenario;
pub mod test_events;
pub mod trace_file;
pub mod walkthrough;
pub mod workload;

pub use error::{HarnessError, Result};
