//! Track event encoding.

pub(crate) mod annotation;
pub(crate) mod event;
pub(crate) mod intern;
