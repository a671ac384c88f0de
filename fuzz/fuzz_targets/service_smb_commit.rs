#![no_main]

// A hostile producer scribbling over its SMB and committing it next to
// an honest one; the logic lives in
// `shmtrace_service::service::fuzzing::smb_commit`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| shmtrace_service::service::fuzzing::smb_commit(data));
