#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| shmtrace_fuzz::writer_roundtrip(data));
