#![no_main]

// A script of trace buffer operations (commits, scrapes, patches, writer
// and producer events, reads); the logic lives in
// `shmtrace_service::service::fuzzing::trace_buffer_ops`.
libfuzzer_sys::fuzz_target!(
    |data: &[u8]| shmtrace_service::service::fuzzing::trace_buffer_ops(data)
);
