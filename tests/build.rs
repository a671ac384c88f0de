//! Builds the C++ drivers of the real Perfetto used as the interop oracle.
//!
//! The real Perfetto (v59 client library and tracing service, amalgamated into
//! one translation unit) is compiled exactly once, by the build script of our
//! dependency `perfetto-sdk-sys`, into `libperfetto_c.a`; cargo links that
//! archive into every binary of this package that uses the crate. This script
//! only compiles our three small drivers (`interop/*.cc`) into the static
//! library `shmtrace_interop_drivers`, which the `real-*` binaries call into.
//!
//! The producer driver uses the public C API (`perfetto_c.h`). The service and
//! consumer drivers need internal C++ classes (`ServiceIPCHost`,
//! `ConsumerIPCClient`, `base::UnixTaskRunner`, `TraceConfig`) whose
//! declarations exist only inside the amalgamated `perfetto_c.cc`. We rebuild
//! them as a header: every `// gen_amalgamated begin header:` section of the
//! amalgamation, from its marker to the `#endif` that closes its include guard,
//! in file order, with the source bodies left out. The generated header
//! declares (and defines inline) what `libperfetto_c.a` implements, so it must
//! be compiled with the same ABI-relevant macros as that archive: `NDEBUG`
//! unless `PERFETTO_SYS_LIB_DEBUG=true` (the switch of perfetto-sdk-sys).

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

/// The exact perfetto-sdk-sys release pinned in Cargo.toml (`=1.4.0`).
const SDK_SYS_DIR_NAME: &str = "perfetto-sdk-sys-1.4.0";
/// Overrides the lookup of the perfetto-sdk-sys sources (e.g. `cargo vendor`).
const SDK_SYS_DIR_ENV: &str = "SHMTRACE_PERFETTO_SDK_SYS_DIR";
const DRIVER_SOURCES: [&str; 3] = [
    "interop/real_service.cc",
    "interop/real_producer.cc",
    "interop/real_consumer.cc",
];

fn main() {
    if let Err(message) = run() {
        // A build script reports failure by exiting non-zero; the message is
        // shown verbatim by cargo.
        eprintln!("error: {message}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=interop");
    println!("cargo:rerun-if-env-changed={SDK_SYS_DIR_ENV}");
    println!("cargo:rerun-if-env-changed=PERFETTO_SYS_LIB_DEBUG");
    println!("cargo:rerun-if-env-changed=CXX");

    let sdk_dir = locate_sdk_sys()?;
    let amalgamation_dir = sdk_dir.join("libperfetto_c");
    let amalgamation = amalgamation_dir.join("perfetto_c.cc");
    println!("cargo:rerun-if-changed={}", amalgamation.display());

    let out_dir = PathBuf::from(env::var("OUT_DIR").map_err(|e| format!("OUT_DIR: {e}"))?);
    let source = fs::read_to_string(&amalgamation)
        .map_err(|e| format!("cannot read {}: {e}", amalgamation.display()))?;
    let header =
        internal_header(&source).map_err(|e| format!("{}: {e}", amalgamation.display()))?;
    write_if_changed(&out_dir.join("perfetto_internal.h"), &header)?;

    let mut build = cc::Build::new();
    // Same compiler choice as perfetto-sdk-sys: clang++ when present, unless
    // CXX says otherwise.
    if env::var_os("CXX").is_none() && which("clang++") {
        build.compiler("clang++");
    }
    if env::var("PERFETTO_SYS_LIB_DEBUG").as_deref() != Ok("true") {
        build.define("NDEBUG", None);
    }
    build
        .cpp(true)
        .std("c++17")
        .include(&amalgamation_dir)
        .include(&out_dir)
        .include("interop")
        .debug(false)
        .warnings(true)
        .extra_warnings(true);
    for file in DRIVER_SOURCES {
        build.file(file);
    }
    build
        .try_compile("shmtrace_interop_drivers")
        .map_err(|e| format!("compiling the interop drivers failed: {e}"))?;
    Ok(())
}

/// Finds the unpacked perfetto-sdk-sys sources. Cargo has downloaded and
/// unpacked them before any build script runs, because the crate is a
/// dependency of this package.
fn locate_sdk_sys() -> Result<PathBuf, String> {
    if let Some(dir) = env::var_os(SDK_SYS_DIR_ENV) {
        let dir = PathBuf::from(dir);
        return if dir.join("libperfetto_c/perfetto_c.cc").is_file() {
            Ok(dir)
        } else {
            Err(format!(
                "{SDK_SYS_DIR_ENV}={} has no libperfetto_c/perfetto_c.cc",
                dir.display()
            ))
        };
    }
    let cargo_home = match env::var_os("CARGO_HOME") {
        Some(home) => PathBuf::from(home),
        None => PathBuf::from(env::var_os("HOME").ok_or("neither CARGO_HOME nor HOME is set")?)
            .join(".cargo"),
    };
    let registry_src = cargo_home.join("registry").join("src");
    let mut candidates: Vec<PathBuf> = fs::read_dir(&registry_src)
        .map_err(|e| format!("cannot list {}: {e}", registry_src.display()))?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.path().join(SDK_SYS_DIR_NAME))
        .filter(|dir| dir.join("libperfetto_c/perfetto_c.cc").is_file())
        .collect();
    candidates.sort();
    candidates.into_iter().next().ok_or_else(|| {
        format!(
            "{SDK_SYS_DIR_NAME} not found under {}; set {SDK_SYS_DIR_ENV} to its directory \
             (the one holding libperfetto_c/perfetto_c.cc)",
            registry_src.display()
        )
    })
}

/// Marker that opens a header section in the amalgamation.
const HEADER_MARKER: &str = "// gen_amalgamated begin header:";
/// Marker that opens a source section; never legal inside a header section.
const SOURCE_MARKER: &str = "// gen_amalgamated begin source:";

/// Builds the internal header: the prelude the amalgamation itself starts
/// with, then every header section in file order.
///
/// Header sections nest (a header's marker is followed by the sections of the
/// headers it includes first), so open sections are kept on a stack; each one
/// ends at the `#endif` that brings the conditional depth back to where its
/// include guard (its first directive, which must be `#ifndef`) opened.
fn internal_header(source: &str) -> Result<String, String> {
    struct Open<'a> {
        marker: &'a str,
        guard_depth: Option<usize>,
    }
    let mut out = String::with_capacity(source.len() / 2);
    out.push_str(
        "// Generated by tests/build.rs from the perfetto-sdk-sys amalgamation: its header\n\
         // sections only. Do not edit.\n\
         #pragma once\n\
         #pragma GCC system_header\n\
         #define PERFETTO_IMPLEMENTATION\n\
         #include \"perfetto_c.h\"\n",
    );
    let mut stack: Vec<Open<'_>> = Vec::new();
    let mut depth = 0usize;
    let mut sections = 0usize;
    for (index, line) in source.lines().enumerate() {
        if line.starts_with(HEADER_MARKER) {
            stack.push(Open {
                marker: line,
                guard_depth: None,
            });
            sections += 1;
        } else if stack.is_empty() {
            continue;
        } else if line.starts_with(SOURCE_MARKER) {
            return Err(format!(
                "line {}: source section inside a header section",
                index + 1
            ));
        }
        out.push_str(line);
        out.push('\n');
        let Some(top) = stack.last_mut() else {
            continue;
        };
        match directive(line) {
            Some(Directive::If { is_ifndef }) => {
                if top.guard_depth.is_none() {
                    if !is_ifndef {
                        return Err(format!(
                            "line {}: `{}` does not start with an include guard",
                            index + 1,
                            top.marker
                        ));
                    }
                    top.guard_depth = Some(depth);
                }
                depth += 1;
            }
            Some(Directive::Endif) => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| format!("line {}: unbalanced #endif", index + 1))?;
                if top.guard_depth == Some(depth) {
                    stack.pop();
                }
            }
            None => {}
        }
    }
    if let Some(open) = stack.last() {
        return Err(format!("`{}` is never closed", open.marker));
    }
    if sections == 0 {
        return Err("no header sections found (not an amalgamation?)".into());
    }
    Ok(out)
}

enum Directive {
    If { is_ifndef: bool },
    Endif,
}

/// Classifies conditional preprocessor directives (`#if`, `#ifdef`,
/// `#ifndef`, `#endif`); everything else is `None`.
fn directive(line: &str) -> Option<Directive> {
    let rest = line.trim_start().strip_prefix('#')?.trim_start();
    let word: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    match word.as_str() {
        "if" | "ifdef" => Some(Directive::If { is_ifndef: false }),
        "ifndef" => Some(Directive::If { is_ifndef: true }),
        "endif" => Some(Directive::Endif),
        _ => None,
    }
}

/// Writes `contents` unless the file already holds exactly that, so an
/// unchanged header keeps its timestamp.
fn write_if_changed(path: &Path, contents: &str) -> Result<(), String> {
    if fs::read_to_string(path).is_ok_and(|old| old == contents) {
        return Ok(());
    }
    fs::write(path, contents).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Mirrors perfetto-sdk-sys's probe: a compiler counts as present when it can
/// be spawned at all.
fn which(program: &str) -> bool {
    std::process::Command::new(program)
        .arg("--version")
        .output()
        .is_ok()
}
