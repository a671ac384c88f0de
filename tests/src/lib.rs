//! End-to-end and interop test support. Lands with the interop-harness issue.
