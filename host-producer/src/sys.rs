//! Operating-system facts the producer needs: the trace clock, thread ids
//! and names.

use std::cell::{Cell, RefCell};

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
    /// The name written for the thread's track: `None` until first read
    /// (or set); `Some(None)` if the thread has none.
    static THREAD_NAME: RefCell<Option<Option<Box<str>>>> = const { RefCell::new(None) };
}

/// The kernel's name of the calling thread (`comm`, at most 15 bytes).
fn kernel_thread_name() -> Option<Box<str>> {
    let name = rustix::thread::name().ok()?;
    let name = name.to_string_lossy();
    (!name.is_empty()).then(|| name.into())
}

/// Calls `f` with the calling thread's name: the one given to
/// [`set_thread_name`], else the kernel's (`comm`, which
/// `std::thread::Builder::name` sets), read once per thread so later calls
/// do not allocate. A rename through the OS after the first read is not
/// seen; upstream's C SDK re-reads `comm` for every descriptor it writes.
pub fn with_thread_name<R>(mut f: impl FnMut(Option<&str>) -> R) -> R {
    let cached = THREAD_NAME.try_with(|cell| {
        let mut slot = cell.try_borrow_mut().ok()?;
        Some(f(slot.get_or_insert_with(kernel_thread_name).as_deref()))
    });
    match cached {
        Ok(Some(r)) => r,
        // Thread-local storage is being torn down (or `f` re-entered):
        // read it uncached.
        _ => f(kernel_thread_name().as_deref()),
    }
}

/// Sets the name written for the calling thread's track (any length; the
/// kernel's name is left alone).
pub fn set_thread_name(name: &str) {
    let _ = THREAD_NAME.try_with(|cell| {
        if let Ok(mut slot) = cell.try_borrow_mut() {
            *slot = Some(Some(name.into()));
        }
    });
}
