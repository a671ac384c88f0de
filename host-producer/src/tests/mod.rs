//! Tests of the whole producer data path against an in-process loopback
//! service (see [`loopback`]): real SMB state machine, real commits and
//! patches, packets decoded with a prost schema.

mod abi_parity;
mod alloc;
#[cfg(any(feature = "tracing", feature = "log"))]
mod changing;
mod descriptor;
mod forward;
mod hostile;
#[cfg(feature = "log")]
mod logger;
mod loopback;
mod names;
mod perf;
mod runtime;
#[cfg(feature = "tracing")]
mod tracing;
mod triggers;
