#![no_main]

// Frame decoder + host dispatcher + client matching on arbitrary bytes; the
// logic lives in `shmtrace_ipc::fuzzing::ipc_frame`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| shmtrace_ipc::fuzzing::ipc_frame(data));
