#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| shmtrace_fuzz::patch_apply(data));
