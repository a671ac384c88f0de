//! Integrations with the `tracing` and `log` crates.

#[cfg(feature = "log")]
pub mod logger;
#[cfg(any(feature = "tracing", feature = "log"))]
pub(crate) mod target_category;
#[cfg(feature = "tracing")]
pub mod tracing_layer;
