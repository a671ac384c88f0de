//! Entry points of the real-Perfetto drivers (`interop/*.cc`), which the
//! `real-service`, `real-producer` and `real-consumer` binaries run.
//!
//! The drivers are compiled by `build.rs` into `libshmtrace_interop_drivers.a`
//! and link against `libperfetto_c.a` from perfetto-sdk-sys.
// `unsafe` here: the C++ drivers' entry points (FFI).
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, CString};
use std::os::unix::ffi::OsStrExt;
use std::process::ExitCode;

// Links libperfetto_c.a (the real Perfetto) after our drivers.
use perfetto_sdk_sys as _;

/// Which real-Perfetto driver a binary runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// The tracing service (`tests/interop/real_service.cc`).
    Service,
    /// The SDK producer (`tests/interop/real_producer.cc`).
    Producer,
    /// The consumer (`tests/interop/real_consumer.cc`).
    Consumer,
}

extern "C" {
    fn shmtrace_real_service_main(argc: c_int, argv: *mut *mut c_char) -> c_int;
    fn shmtrace_real_producer_main(argc: c_int, argv: *mut *mut c_char) -> c_int;
    fn shmtrace_real_consumer_main(argc: c_int, argv: *mut *mut c_char) -> c_int;
}

/// Runs `driver` with this process's command line and returns its status.
pub fn run(driver: Driver) -> ExitCode {
    // Arguments cannot contain NUL bytes on Unix, so this never fails; keep
    // the error path anyway rather than unwrap.
    let args: Result<Vec<CString>, _> = std::env::args_os()
        .map(|arg| CString::new(arg.as_bytes()))
        .collect();
    let Ok(args) = args else {
        eprintln!("{driver:?}: an argument contains a NUL byte");
        return ExitCode::from(2);
    };
    let mut argv: Vec<*mut c_char> = args.iter().map(|a| a.as_ptr().cast_mut()).collect();
    let argc = c_int::try_from(argv.len()).unwrap_or(c_int::MAX);
    argv.push(std::ptr::null_mut());
    let entry = match driver {
        Driver::Service => shmtrace_real_service_main,
        Driver::Producer => shmtrace_real_producer_main,
        Driver::Consumer => shmtrace_real_consumer_main,
    };
    // SAFETY: `argv` holds `argc` pointers to NUL-terminated strings owned by
    // `args`, followed by a null pointer, as a C `main` expects; `args` and
    // `argv` outlive the call. The drivers never write through argv (they copy
    // the strings) and never keep the pointers after returning.
    let status = unsafe { entry(argc, argv.as_mut_ptr()) };
    ExitCode::from(u8::try_from(status).unwrap_or(u8::MAX))
}
