//! Operating-system facts the producer needs: the trace clock, thread ids
//! and names.

use std::cell::Cell;

use rustix::time::{clock_gettime, ClockId};

/// Nanoseconds of `CLOCK_BOOTTIME`, Perfetto's default trace clock (a vDSO
/// call, no system call).
#[inline]
pub fn boottime_ns() -> u64 {
    clock_ns(ClockId::Boottime)
}

/// Nanoseconds of `CLOCK_MONOTONIC` (BOOTTIME's rate, without suspend).
#[inline]
pub fn monotonic_ns() -> u64 {
    clock_ns(ClockId::Monotonic)
}

#[inline]
fn clock_ns(id: ClockId) -> u64 {
    let ts = clock_gettime(id);
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

thread_local! {
    static TID: Cell<i64> = const { Cell::new(0) };
}

/// The calling thread's kernel thread id (cached per thread).
#[inline]
pub fn current_tid() -> i64 {
    TID.try_with(|c| {
        let t = c.get();
        if t != 0 {
            return t;
        }
        let t = i64::from(rustix::thread::gettid().as_raw_nonzero().get());
        c.set(t);
        t
    })
    .unwrap_or_else(|_| i64::from(rustix::thread::gettid().as_raw_nonzero().get()))
}

thread_local! {
    /// The thread's name, read once (`None` inside: the thread has none).
    static THREAD_NAME: std::cell::OnceCell<Option<String>> = const { std::cell::OnceCell::new() };
}

/// Calls `f` with the calling thread's name as the kernel knows it
/// (`comm`), read once per thread, so later calls do not allocate.
pub fn with_thread_name<R>(mut f: impl FnMut(Option<&str>) -> R) -> R {
    let read = || {
        let name = rustix::thread::name().ok()?;
        let name = name.to_string_lossy().into_owned();
        (!name.is_empty()).then_some(name)
    };
    THREAD_NAME
        .try_with(|cell| f(cell.get_or_init(read).as_deref()))
        // Thread-local storage is being torn down: read it uncached.
        .unwrap_or_else(|_| f(read().as_deref()))
}
