#![no_main]

// The packet validator against a reference parser, over arbitrary
// slicings; the logic lives in
// `shmtrace_service::service::fuzzing::packet_validator`.
libfuzzer_sys::fuzz_target!(
    |data: &[u8]| shmtrace_service::service::fuzzing::packet_validator(data)
);
