//! Issue 21 item 3: the README's first code block (the tour's "Instrument
//! an app"), copied as it is into a new crate and run while `shmtrace
//! record` records, lands its events. The block is read from README.md
//! (so the test breaks when the README drifts), built as a crate of its
//! own that depends on host-producer by path, and run against `shmtrace
//! serve` while a `shmtrace record` session with the README's
//! `--app-categories rendering` runs; the trace must pass `inspect --check`
//! and hold the slice and the instant, with its annotation.
//! The snippet's events are written before its data source starts (in its
//! startup buffer), then handed to the session. Before that, run with no
//! session, it must report that the service confirmed there is none.
//! Against our service and the real one.
//!
//! The README's `tracing` and `log` section is built the same way, from
//! its TOML and its code block (see its test).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use shmtrace_tests::checker;
use shmtrace_tests::process::ChildProcess;
use shmtrace_tests::real_binaries;
use shmtrace_tests::scenario::{self, ServiceImpl};

/// How long building the snippet may take (host-producer and those of its
/// dependencies the workspace's tests did not build with the same features).
const BUILD_TIMEOUT: Duration = Duration::from_secs(600);
/// How long any other step may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The first ```rust block of `readme`, its list indentation removed.
fn first_rust_block(readme: &str) -> String {
    first_block(readme, "rust")
}

/// The first ```<lang> block of `readme`, its list indentation removed.
fn first_block(readme: &str, lang: &str) -> String {
    let fence = format!("```{lang}");
    let mut lines = readme.lines();
    let open = lines
        .by_ref()
        .find(|l| l.trim_start() == fence)
        .unwrap_or_else(|| panic!("a {fence} block in README.md"));
    let indent = open.len() - open.trim_start().len();
    let mut code = String::new();
    for line in lines {
        if line.trim_start() == "```" {
            return code;
        }
        code.push_str(line.get(indent..).unwrap_or(line.trim_start()));
        code.push('\n');
    }
    panic!("the README's first {fence} block never ends");
}

/// Makes the crate in `dir` and builds it: the path of its binary.
fn build_snippet(repo: &Path, dir: &Path) -> PathBuf {
    let code = first_rust_block(&std::fs::read_to_string(repo.join("README.md")).unwrap());
    assert!(code.contains("fn main()"), "{code}");
    let dependencies = format!(
        "shmtrace-producer = {{ path = \"{}\" }}\n",
        repo.join("host-producer").display()
    );
    build_crate(repo, dir, "readme-snippet", &dependencies, &code)
}

/// Makes a crate `name` in `dir` with `dependencies` (the lines
/// of its `[dependencies]` table) and `main_rs`, and builds it: the path
/// of its binary.
///
/// The crates share a target directory, so each test's crate has a name
/// (and a binary) of its own: the tests run at the same time.
fn build_crate(repo: &Path, dir: &Path, name: &str, dependencies: &str, main_rs: &str) -> PathBuf {
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
             [dependencies]\n{dependencies}\n[workspace]\n"
        ),
    )
    .unwrap();
    std::fs::write(dir.join("src/main.rs"), main_rs).unwrap();
    // The workspace's crate versions, and its target directory (this test's
    // `cargo test` holds no lock on it while tests run): dependencies built
    // with the same features are built once.
    std::fs::copy(repo.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("CARGO_TARGET_TMPDIR is <target dir>/tmp");
    let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    command
        .args(["build", "--quiet"])
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET");
    let mut build = ChildProcess::spawn("cargo build (README snippet)", command, dir).unwrap();
    build
        .expect_success(BUILD_TIMEOUT)
        .unwrap_or_else(|e| panic!("the README's snippet does not build: {e}"));
    target.join("debug").join(name)
}

/// Starts `shmtrace record` as the README's tour has it (`-t`, `-b`,
/// `--app-categories rendering`, `-o`) on `consumer_socket`.
fn start_record(consumer_socket: &Path, out: &Path, log_dir: &Path) -> ChildProcess {
    start_record_of(consumer_socket, out, log_dir, "rendering")
}

/// `shmtrace record` of the categories `categories` (`--app-categories`).
fn start_record_of(
    consumer_socket: &Path,
    out: &Path,
    log_dir: &Path,
    categories: &str,
) -> ChildProcess {
    let mut command = Command::new(scenario::shmtrace_binary().unwrap());
    command
        .args([
            "record",
            "-t",
            "4s",
            "-b",
            "32mb",
            "--app-categories",
            categories,
        ])
        .arg("--socket")
        .arg(consumer_socket)
        .arg("-o")
        .arg(out);
    ChildProcess::spawn("shmtrace record", command, log_dir).unwrap()
}

/// Waits for the service to list a started session.
fn wait_for_session(consumer_socket: &Path) {
    scenario::query_until(consumer_socket, "the session", |s| {
        s["sessions"]
            .as_array()
            .is_some_and(|a| a.iter().any(|s| s["state"] == "STARTED"))
    });
}

/// Runs the snippet to its end: what it printed.
fn run_snippet(bin: &Path, producer_socket: &Path) -> String {
    let out = Command::new(bin)
        .env("PERFETTO_PRODUCER_SOCK_NAME", producer_socket)
        .output()
        .expect("run the snippet");
    assert!(
        out.status.success(),
        "the snippet failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The trace holds the snippet's slice and instant, once each, and passes
/// the check.
fn check_trace(trace: &Path) {
    let verdict = scenario::inspect(&[trace.to_path_buf()]).expect("inspect runs");
    let events = &verdict.analysis["track_events"];
    assert!(
        verdict.ok,
        "inspect --check: {}",
        verdict.analysis["problems"]
    );
    assert_eq!(events["by_name"]["DrawPlayer"], 1, "{events}");
    assert_eq!(events["by_name"]["PlayerDrawn"], 1, "{events}");
    assert_eq!(events["slice_begin"], 1, "{events}");
    assert_eq!(events["slice_end"], 1, "{events}");
    assert_eq!(events["open_slices"], 0, "{events}");
    assert_eq!(events["interned_unresolved"], 0, "{events}");
}

#[test]
fn the_readme_snippet_lands_its_events_in_a_shmtrace_record_session() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap();
    let dir = tempfile::Builder::new()
        .prefix("shmtrace-readme-snippet-")
        .tempdir_in("/tmp")
        .unwrap();
    let bin = build_snippet(&repo, &dir.path().join("app"));
    let bins = real_binaries!();
    // Our service, and the real one (whose Sync answers must come after
    // the commands a registration prompts, too).
    for (name, which) in [("ours", ServiceImpl::Ours), ("real", ServiceImpl::Real)] {
        let producer_socket = dir.path().join(format!("{name}-p.sock"));
        let consumer_socket = dir.path().join(format!("{name}-c.sock"));
        let _service =
            scenario::start_service(which, &bins, dir.path(), &producer_socket, &consumer_socket)
                .unwrap();
        // No session: the service confirms it has the snippet's data
        // source and none started it, so the snippet says so (not "did not
        // confirm") and exits.
        let said = run_snippet(&bin, &producer_socket);
        assert!(
            said.starts_with("connected, no session"),
            "{name}: the snippet said: {said}"
        );
        // The session first, as the tour has it; the snippet's events are
        // written before its data source starts, and wait for it.
        let trace = dir.path().join(format!("{name}.pftrace"));
        let mut record = start_record(&consumer_socket, &trace, dir.path());
        wait_for_session(&consumer_socket);
        let said = run_snippet(&bin, &producer_socket);
        assert!(
            said.starts_with("tracing: "),
            "{name}: the snippet said: {said}"
        );
        record.expect_success(TIMEOUT).unwrap();
        check_trace(&trace);
    }
}

/// The README's section on `tracing` and `log`: its `[dependencies]` and
/// its code, copied as they are into a new crate (with tracing-subscriber's
/// default features, as the README's TOML has it), then a few lines of the
/// test's own: wait for the session, one span, one `tracing` event and
/// one `log` record of the target `readme`. All three land, with their
/// annotations, and the trace passes the check.
#[test]
fn the_readme_tracing_and_log_snippet_records_both() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap();
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let section = readme
        .split("\n## Programs traced with `tracing` or `log`")
        .nth(1)
        .expect("the README's tracing section");
    let toml = first_block(section, "toml");
    let dependencies = toml
        .split_once("[dependencies]\n")
        .expect("a [dependencies] table")
        .1
        .replace(
            "…/host-producer",
            &repo.join("host-producer").display().to_string(),
        );
    let code = first_rust_block(section);
    assert!(code.contains("logger::init"), "{code}");
    let main_rs = format!(
        "fn main() {{\n{code}\n\
         let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);\n\
         while !shmtrace_producer::track_event::is_enabled() {{\n\
             assert!(std::time::Instant::now() < deadline, \"no session\");\n\
             std::thread::sleep(std::time::Duration::from_millis(10));\n\
         }}\n\
         {{\n\
             let _span = tracing::info_span!(target: \"readme\", \"work\", items = 3).entered();\n\
             tracing::info!(target: \"readme\", answer = 42, \"from tracing\");\n\
         }}\n\
         log::warn!(target: \"readme\", \"from log\");\n\
         shmtrace_producer::flush_all();\n\
         }}\n"
    );
    let dir = tempfile::Builder::new()
        .prefix("shmtrace-readme-tracing-")
        .tempdir_in("/tmp")
        .unwrap();
    let bin = build_crate(
        &repo,
        &dir.path().join("app"),
        "readme-tracing",
        &dependencies,
        &main_rs,
    );
    let bins = real_binaries!();
    let producer_socket = dir.path().join("p.sock");
    let consumer_socket = dir.path().join("c.sock");
    let _service = scenario::start_service(
        ServiceImpl::Ours,
        &bins,
        dir.path(),
        &producer_socket,
        &consumer_socket,
    )
    .unwrap();
    let trace = dir.path().join("tracing.pftrace");
    let mut record = start_record_of(&consumer_socket, &trace, dir.path(), "readme");
    wait_for_session(&consumer_socket);
    run_snippet(&bin, &producer_socket);
    record.expect_success(TIMEOUT).unwrap();
    let analysis = scenario::inspect_passes(&trace);
    let events = &analysis["track_events"];
    assert_eq!(events["by_name"]["work"], 1, "{events}");
    assert_eq!(events["by_name"]["log"], 1, "{events}");
    assert_eq!(events["slice_begin"], 1, "{events}");
    assert_eq!(events["slice_end"], 1, "{events}");
    assert_eq!(events["instant"], 2, "{events}");
    checker::ensure_environment().expect("the checker's python environment");
    let dump = checker::semantic_dump(&trace)
        .expect("the semantic dump")
        .to_string();
    for text in ["from tracing", "from log", "answer", "items", "WARN"] {
        assert!(dump.contains(text), "{text:?} missing from:\n{dump}");
    }
}
