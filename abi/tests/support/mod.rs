//! Helpers shared by the integration tests.

pub mod model;
pub mod schema;
pub mod sequence;
