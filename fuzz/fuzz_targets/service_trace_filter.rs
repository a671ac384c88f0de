#![no_main]

// A trace filter from arbitrary bytecode, overlay and string rules on an
// arbitrary packet; the logic lives in
// `shmtrace_service::service::fuzzing::trace_filter`.
libfuzzer_sys::fuzz_target!(
    |data: &[u8]| shmtrace_service::service::fuzzing::trace_filter(data)
);
