//! Measurements of the firmware bridge (issue 17, "Verification"), printed
//! as numbers, asserted nowhere:
//!
//! * events/s `shmtrace bridge` sustains from a TCP stream (the simulated
//!   firmware writes as fast as it can; what is written gets through, the
//!   rest is dropped in the firmware and counted);
//! * events/s through a UART-speed stream (a FIFO paced to 115200 and
//!   921600 baud by the firmware: what gets through);
//! * the attach poll latency (a firmware commit to the host taking it from
//!   the ring: `sim-firmware region --flush-each`), at the default 1 ms poll
//!   interval and at 100 us;
//! * the CPU the service and the bridge spend per firmware producer at a
//!   given event rate, reading a region (what `serve --attach` runs per
//!   region) and a TCP stream;
//! * the clock alignment: the bridge's estimate against the simulated
//!   firmware's true offset, and the bound it claims.
//!
//! ```text
//! cargo build --release -p shmtrace-cli --bin shmtrace -p shmtrace-tests --bin sim-firmware --bin bridge-bench
//! target/release/bridge-bench [--quick] [--only tcp|uart|latency|cpu]
//! ```
//!
//! Uses `shmtrace` and `sim-firmware` next to itself, `shmtrace serve` as
//! the service and `shmtrace record` as the consumer.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use shmtrace_tests::process::{cpu_seconds, make_fifo, ChildProcess};
use shmtrace_tests::scenario::sibling_binary;

const TIMEOUT: Duration = Duration::from_secs(300);

/// Command-line arguments.
#[derive(Debug, clap::Parser)]
#[command(about = "The firmware bridge's throughput, latency and CPU (see the module docs)")]
struct Args {
    /// Shorter runs.
    #[arg(long)]
    quick: bool,
    /// Run one kind only.
    #[arg(long, value_parser = ["tcp", "uart", "latency", "cpu"])]
    only: Option<String>,
}

fn main() {
    let Args { quick, only } = clap::Parser::parse();
    let runs = |kind: &str| only.as_deref().is_none_or(|o| o == kind);
    let bench = Bench::new();
    println!("bridge bench ({}):", if quick { "quick" } else { "full" });
    let secs = if quick { 2.0 } else { 5.0 };
    if runs("tcp") {
        bench.tcp_throughput(if quick { 100_000 } else { 2_000_000 });
    }
    if runs("uart") {
        for baud in [115_200u64, 921_600] {
            bench.uart_throughput(baud, secs);
        }
    }
    if runs("latency") {
        for poll_us in [1000u64, 100] {
            bench.attach_latency(poll_us, if quick { 300 } else { 2000 });
        }
    }
    if runs("cpu") {
        for rate in [3_000u64, 30_000] {
            bench.cpu_per_producer(rate, secs, true);
            bench.cpu_per_producer(rate, secs, false);
        }
    }
}

struct Bench {
    shmtrace: PathBuf,
    firmware: PathBuf,
}

/// A service, its sockets and its directory.
struct Run {
    dir: tempfile::TempDir,
    service: ChildProcess,
}

impl Run {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn events(done: &Value) -> u64 {
    ["slice_begin", "slice_end", "instant"]
        .iter()
        .map(|k| done["emitted"][k].as_u64().unwrap_or(0))
        .sum()
}

fn clock_line(done: &Value, summary: &Value) -> String {
    let truth = -done["fw_minus_boottime_ns"].as_i64().unwrap_or(0);
    let clock = &summary["clock"];
    match (clock["offset_ns"].as_i64(), clock["bound_ns"].as_u64()) {
        (Some(offset), Some(bound)) => format!(
            "clock error {:.1} us (bound {:.1} us, {})",
            offset.abs_diff(truth) as f64 / 1e3,
            bound as f64 / 1e3,
            if clock["two_way"] == true {
                "two-way"
            } else {
                "one-way"
            }
        ),
        _ => "clock not measured".into(),
    }
}

impl Bench {
    fn new() -> Self {
        let find = |name: &str| sibling_binary(name).unwrap_or_else(|e| panic!("{e}"));
        Bench {
            shmtrace: find("shmtrace"),
            firmware: find("sim-firmware"),
        }
    }

    fn service(&self, extra: &[String]) -> Run {
        let dir = tempfile::Builder::new()
            .prefix("shmtrace-bridge-bench-")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let mut command = Command::new(&self.shmtrace);
        command
            .args(["serve", "--notify-ready", "--log-level", "warn"])
            .arg("--producer-socket")
            .arg(dir.path().join("p.sock"))
            .arg("--consumer-socket")
            .arg(dir.path().join("c.sock"))
            .arg("--exit-on-stdin-eof")
            .args(extra);
        let mut service = ChildProcess::spawn("service", command, dir.path()).expect("service");
        service.expect_event("ready", TIMEOUT).expect("ready");
        Run { dir, service }
    }

    fn firmware(&self, run: &Run, name: &str, args: &[String]) -> ChildProcess {
        let mut command = Command::new(&self.firmware);
        command.args(args);
        ChildProcess::spawn(name, command, run.dir.path()).expect("sim-firmware")
    }

    fn bridge(&self, run: &Run, input: &str, extra: &[String]) -> ChildProcess {
        let mut command = Command::new(&self.shmtrace);
        command
            .args([
                "bridge",
                "--json",
                "--exit-on-stdin-eof",
                "--log-level",
                "warn",
                "--input",
                input,
            ])
            .arg("--socket")
            .arg(run.path("p.sock"))
            .args(["--smb-size", &(4 * 1024 * 1024).to_string()])
            .args(extra);
        ChildProcess::spawn("bridge", command, run.dir.path()).expect("bridge")
    }

    /// `shmtrace record` of the firmware's data source; once started.
    fn record(&self, run: &Run) -> ChildProcess {
        std::fs::write(
            run.path("config.txt"),
            "buffers { size_kb: 262144 fill_policy: RING_BUFFER } \
             data_sources { config { name: \"sim.firmware\" } } duration_ms: 600000",
        )
        .expect("config");
        let mut command = Command::new(&self.shmtrace);
        command
            .args(["record", "--progress", "json", "--txt", "--socket"])
            .arg(run.path("c.sock"))
            .arg("-c")
            .arg(run.path("config.txt"))
            .arg("-o")
            .arg(run.path("trace.pftrace"));
        let mut record = ChildProcess::spawn("record", command, run.dir.path()).expect("record");
        record.expect_event("started", TIMEOUT).expect("started");
        record
    }

    fn stop_record(&self, mut record: ChildProcess) -> Value {
        let pid = rustix::process::Pid::from_raw(record.pid() as i32).expect("pid");
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
        record.expect_event("done", TIMEOUT).expect("done")
    }

    fn wait_registered(&self, run: &Run) {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let out = Command::new(&self.shmtrace)
                .args(["query", "--json", "--socket"])
                .arg(run.path("c.sock"))
                .output()
                .expect("query");
            let state: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            if state["data_sources"]
                .as_array()
                .is_some_and(|d| d.iter().any(|d| d["name"] == "sim.firmware"))
            {
                return;
            }
            assert!(Instant::now() < deadline, "the firmware never registered");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn recorded(summary: &Value) -> u64 {
        summary["summary"]["track_events"].as_u64().unwrap_or(0)
    }

    fn tcp_throughput(&self, iterations: u64) {
        let run = self.service(&[]);
        let mut fw = self.firmware(
            &run,
            "tcp",
            &args(&[
                "stream",
                "--listen",
                "0",
                "--wait-enabled",
                "--close-when-done",
                "--iterations",
                &iterations.to_string(),
            ]),
        );
        let port = fw.expect_event("listening", TIMEOUT).expect("port")["port"].clone();
        let mut bridge = self.bridge(&run, &format!("tcp:127.0.0.1:{port}"), &[]);
        self.wait_registered(&run);
        let record = self.record(&run);
        fw.expect_event("enabled", TIMEOUT).expect("enabled");
        let t0 = Instant::now();
        let cpu0 = (cpu_seconds(bridge.pid()), cpu_seconds(run.service.pid()));
        let done = fw.expect_event("done", TIMEOUT).expect("done");
        // The stream ends after its last frame: the bridge has forwarded
        // everything when it reports its summary.
        let summary = bridge.expect_event("summary", TIMEOUT).expect("summary");
        let cpu1 = (cpu_seconds(bridge.pid()), cpu_seconds(run.service.pid()));
        let secs = t0.elapsed().as_secs_f64();
        let recorded = self.stop_record(record);
        fw.close_stdin();
        println!(
            "  TCP stream: {:.0} events/s through the bridge ({} events in {:.2} s, {} dropped \
             in the firmware, {} in the trace); CPU over the run: bridge {:.0} %, service {:.0} \
             %; {}",
            events(&done) as f64 / secs,
            events(&done),
            secs,
            done["dropped"],
            Self::recorded(&recorded),
            (cpu1.0 - cpu0.0) / secs * 100.0,
            (cpu1.1 - cpu0.1) / secs * 100.0,
            clock_line(&done, &summary),
        );
    }

    fn uart_throughput(&self, baud: u64, secs: f64) {
        let run = self.service(&[]);
        let fifo = run.path("uart");
        make_fifo(&fifo).expect("mkfifo");
        let go = run.path("go");
        // Iterations at 20000/s for `secs`: far more than the link takes.
        let rate = 20_000.0;
        let mut bridge = self.bridge(
            &run,
            fifo.to_str().unwrap(),
            &args(&["--baud", &baud.to_string()]),
        );
        let mut fw = self.firmware(
            &run,
            "uart",
            &args(&[
                "stream",
                "--out",
                fifo.to_str().unwrap(),
                "--baud",
                &baud.to_string(),
                "--go-file",
                go.to_str().unwrap(),
                "--rate",
                &rate.to_string(),
                "--iterations",
                &((rate * secs) as u64).to_string(),
                "--exit-when-done",
            ]),
        );
        self.wait_registered(&run);
        let record = self.record(&run);
        bridge.expect_event("enabled", TIMEOUT).expect("enabled");
        std::fs::write(&go, b"").expect("go");
        let done = fw.expect_event("done", TIMEOUT).expect("done");
        let recorded = self.stop_record(record);
        let summary = bridge.expect_event("summary", TIMEOUT).expect("summary");
        let run_secs = done["run_us"].as_f64().unwrap_or(1.0) / 1e6;
        println!(
            "  UART {baud} baud: {:.0} events/s through ({} events in {:.2} s; {} dropped in \
             the firmware, {:.0} % of what it tried; {} in the trace; {} frames); {}",
            events(&done) as f64 / run_secs,
            events(&done),
            run_secs,
            done["dropped"],
            done["dropped"].as_f64().unwrap_or(0.0)
                / (done["dropped"].as_f64().unwrap_or(0.0) + events(&done) as f64)
                * 100.0,
            Self::recorded(&recorded),
            done["faults"]["frames"],
            clock_line(&done, &summary),
        );
    }

    fn attach_latency(&self, poll_us: u64, iterations: u64) {
        let ram_dir = tempfile::tempdir_in("/tmp").expect("tempdir");
        let ram = ram_dir.path().join("ram");
        let run = self.service(&args(&[
            "--attach",
            &format!("{}@0x10000", ram.display()),
            "--attach-poll-us",
            &poll_us.to_string(),
        ]));
        let mut fw = self.firmware(
            &run,
            "latency",
            &args(&[
                "region",
                "--file",
                ram.to_str().unwrap(),
                "--offset",
                "65536",
                "--wait-enabled",
                "--flush-each",
                "--rate",
                "500",
                "--iterations",
                &iterations.to_string(),
            ]),
        );
        self.wait_registered(&run);
        let record = self.record(&run);
        let done = fw.expect_event("done", TIMEOUT).expect("done");
        self.stop_record(record);
        fw.close_stdin();
        let l = &done["latency_ns"];
        let us = |k: &str| l[k].as_f64().unwrap_or(0.0) / 1e3;
        println!(
            "  attach poll latency, poll every {poll_us} us: commit to taken from the ring p50 \
             {:.0} us, p90 {:.0} us, p99 {:.0} us, max {:.0} us ({} commits)",
            us("p50"),
            us("p90"),
            us("p99"),
            us("max"),
            l["samples"]
        );
    }

    /// `region`: the firmware's region read by `shmtrace bridge --input
    /// region:` (the command `serve --attach` runs for each region);
    /// else its frames over TCP.
    fn cpu_per_producer(&self, events_per_s: u64, secs: f64, region: bool) {
        let iterations_per_s = events_per_s / 3;
        let iterations = (iterations_per_s as f64 * secs) as u64;
        let run = self.service(&[]);
        let ram = run.path("ram");
        let rate = iterations_per_s.to_string();
        let count = iterations.to_string();
        let (mut fw, mut bridge) = if region {
            let mut fw = self.firmware(
                &run,
                "cpu",
                &args(&[
                    "region",
                    "--file",
                    ram.to_str().unwrap(),
                    "--offset",
                    "65536",
                    "--wait-enabled",
                    "--rate",
                    &rate,
                    "--iterations",
                    &count,
                ]),
            );
            fw.expect_event("ready", TIMEOUT).expect("ready");
            let bridge = self.bridge(&run, &format!("region:{}@0x10000", ram.display()), &[]);
            (fw, bridge)
        } else {
            let mut fw = self.firmware(
                &run,
                "cpu",
                &args(&[
                    "stream",
                    "--listen",
                    "0",
                    "--wait-enabled",
                    "--rate",
                    &rate,
                    "--iterations",
                    &count,
                ]),
            );
            let port = fw.expect_event("listening", TIMEOUT).expect("port")["port"].clone();
            let bridge = self.bridge(&run, &format!("tcp:127.0.0.1:{port}"), &[]);
            (fw, bridge)
        };
        self.wait_registered(&run);
        let record = self.record(&run);
        fw.expect_event("enabled", TIMEOUT).expect("enabled");
        let t0 = Instant::now();
        let cpu0 = (cpu_seconds(bridge.pid()), cpu_seconds(run.service.pid()));
        let done = fw.expect_event("done", TIMEOUT).expect("done");
        let cpu1 = (cpu_seconds(bridge.pid()), cpu_seconds(run.service.pid()));
        let wall = t0.elapsed().as_secs_f64();
        self.stop_record(record);
        bridge.close_stdin();
        let summary = bridge.expect_event("summary", TIMEOUT).expect("summary");
        fw.close_stdin();
        println!(
            "  CPU per firmware producer at {:.0} events/s ({}): bridge {:.1} %, service {:.1} % \
             of one core ({} events, {} dropped); {}",
            events(&done) as f64 / wall,
            if region {
                "region, 1 ms poll, as serve --attach runs it"
            } else {
                "TCP bridge"
            },
            (cpu1.0 - cpu0.0) / wall * 100.0,
            (cpu1.1 - cpu0.1) / wall * 100.0,
            events(&done),
            done["dropped"],
            clock_line(&done, &summary),
        );
    }
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}
