#![no_main]

// Consumers, producers and relays making arbitrary calls on one service
// core; the logic lives in
// `shmtrace_service::service::fuzzing::session_calls`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| shmtrace_service::service::fuzzing::session_calls(data));
