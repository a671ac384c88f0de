//! The span table's synchronization types: `std`'s normally, `loom`'s
//! under `RUSTFLAGS="--cfg loom"` (as `shmtrace_abi::sync::atomic` does),
//! so that the loom model of the table (`loom_model`) runs its own code.
//!
//! [`UnsafeCell`] is `loom`'s interface over `std`'s cell: a closure gets
//! the pointer, so loom sees each access (and reports two threads' accesses
//! that no synchronization orders). `thread_local!` takes `std`'s `const`
//! form; loom's thread-locals are made on first use.

#[cfg(loom)]
pub(super) use loom::{
    cell::UnsafeCell,
    sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize},
    sync::{Mutex, MutexGuard},
};
#[cfg(not(loom))]
pub(super) use std::{
    sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize},
    sync::{Mutex, MutexGuard},
    thread_local,
};

/// `loom::thread_local!` for a `std` declaration with a `const` value.
#[cfg(loom)]
macro_rules! loom_thread_local {
    ($(#[$attr:meta])* static $name:ident: $t:ty = const { $init:expr };) => {
        loom::thread_local!($(#[$attr])* static $name: $t = $init;);
    };
}
#[cfg(loom)]
pub(super) use loom_thread_local as thread_local;

/// `std`'s `UnsafeCell` with `loom`'s interface (see the module docs).
#[cfg(not(loom))]
#[derive(Default)]
pub(super) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    /// Calls `f` with a pointer to the value, for reading.
    #[inline(always)]
    pub(super) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Calls `f` with a pointer to the value, for writing.
    #[inline(always)]
    pub(super) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}
