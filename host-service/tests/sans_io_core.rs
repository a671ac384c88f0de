//! The service core (`src/service/core/`) is sans-IO: it makes no system
//! call of its own. Clocks, randomness, shared memory buffers and trace
//! files come from its `Environment` (`src/service/env.rs`), sockets and
//! the event loop from the shell. This test reads the core's sources and
//! fails on any name of an OS crate or call, so that a new `std::fs::File`
//! or `rustix::` in the core is caught where it is written.
//!
//! Allowed: `std::os::fd::OwnedFd`, the opaque handle in which descriptors
//! pass through the core (received with a call, sent with a reply), and
//! `std::io`'s traits and error type. The core's own tests
//! (`core/tests.rs`, `core/tests/`) may use the OS: they are not the core.

use std::path::{Path, PathBuf};

/// Names that mean the core would touch the OS itself.
const FORBIDDEN: &[&str] = &[
    "std::fs",
    "std::os",
    "std::net",
    "std::process",
    "std::thread",
    "std::env",
    "std::time::Instant",
    "SystemTime",
    "rustix",
    "libc",
    "File::",
    "OpenOptions",
    "memfd",
    "mmap",
    "SharedMemory::create",
    "SharedMemory::adopt",
    "dup_fd",
    "try_clone",
];

/// The one allowed use of `std::os`.
const ALLOWED: &str = "use std::os::fd::OwnedFd;";

fn core_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/service/core")
}

/// The core's source files, its tests excluded.
fn core_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read the core's directory") {
        let path = entry.expect("directory entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name != "tests" {
                core_sources(&path, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" {
            out.push(path);
        }
    }
}

/// `(file:line, line)` of every code line (comments skipped) naming a
/// forbidden item.
fn violations(files: &[PathBuf]) -> Vec<String> {
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).expect("read a core source");
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("").trim();
            if code == ALLOWED {
                continue;
            }
            for name in FORBIDDEN {
                if code.contains(name) {
                    found.push(format!("{}:{}: {name}: {line}", file.display(), i + 1));
                }
            }
        }
    }
    found
}

#[test]
fn the_core_names_no_os_crate_or_call() {
    let mut files = Vec::new();
    core_sources(&core_dir(), &mut files);
    // The core's main files are all there (a moved directory must not make
    // this test pass vacuously).
    let names: Vec<_> = files
        .iter()
        .filter_map(|f| f.file_name()?.to_str())
        .collect();
    for expected in ["mod.rs", "commit.rs", "readback.rs", "producer.rs"] {
        assert!(
            names.contains(&expected),
            "{expected} not found in {names:?}"
        );
    }
    let found = violations(&files);
    assert!(
        found.is_empty(),
        "the core touches the OS:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_finds_what_it_looks_for() {
    let dir = std::env::temp_dir().join(format!("sans-io-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.rs");
    std::fs::write(
        &bad,
        "use std::os::fd::OwnedFd;\n// std::fs in a comment is fine\nlet f = std::fs::File::open(p);\n",
    )
    .unwrap();
    let found = violations(std::slice::from_ref(&bad));
    std::fs::remove_dir_all(&dir).unwrap();
    // Line 3 only: std::fs and File:: (the allowed import and the comment
    // pass).
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found.iter().all(|f| f.contains("bad.rs:3:")), "{found:?}");
}
