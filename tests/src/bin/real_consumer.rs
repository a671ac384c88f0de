//! The real Perfetto consumer driver (see `tests/interop/real_consumer.cc`).

fn main() -> std::process::ExitCode {
    shmtrace_tests::drivers::run(shmtrace_tests::drivers::Driver::Consumer)
}
