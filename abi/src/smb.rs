//! Placeholder: this module lands with the abi core (issue 2).
