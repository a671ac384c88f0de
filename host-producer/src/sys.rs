//! Operating-system facts the producer needs: the trace clock, thread ids
//! and names.

use std::cell::Cell;

use rustix::time::{clock_gettime, ClockId};

/// Nanoseconds of `CLOCK_BOOTTIME`, Perfetto's default trace clock (a vDSO
/// call, no system call).
#[inline]
pub fn boottime_ns() -> u64 {
    let ts = clock_gettime(ClockId::Boottime);
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

/// The calling thread's name as the kernel knows it (`comm`), if any.
pub fn current_thread_name() -> Option<String> {
    let name = rustix::thread::name().ok()?;
    let name = name.to_string_lossy().into_owned();
    (!name.is_empty()).then_some(name)
}
