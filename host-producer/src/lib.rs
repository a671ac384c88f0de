//! The shmtrace producer library. Lands with its own issue.
