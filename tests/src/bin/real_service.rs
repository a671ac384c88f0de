//! The real Perfetto service driver (see `tests/interop/real_service.cc`).

fn main() -> std::process::ExitCode {
    shmtrace_tests::drivers::run(shmtrace_tests::drivers::Driver::Service)
}
