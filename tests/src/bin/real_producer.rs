//! The real Perfetto producer driver (see `tests/interop/real_producer.cc`).

fn main() -> std::process::ExitCode {
    shmtrace_tests::drivers::run(shmtrace_tests::drivers::Driver::Producer)
}
