#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| shmtrace_fuzz::frame_decoder(data));
