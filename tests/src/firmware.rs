//! The Cortex-M4 firmware example (`abi/firmware`, its `attach` and `stream`
//! binaries) under QEMU (`mps2-an386`), as the `firmware_*` tests run it,
//! and the Cortex-M0 firmware (`abi/firmware/m0`, QEMU `microbit`).
//!
//! * [`build`] builds the firmware once per test process (`cargo build
//!   --release` in `abi/firmware`, its own workspace and target dir) and
//!   fails with what to install when the `thumbv7em-none-eabihf` target or
//!   `qemu-system-arm` is missing: no test is skipped silently. [`build_m0`]
//!   does the same for `abi/firmware/m0` (`thumbv6m-none-eabi`).
//! * [`Qemu`] runs one binary with its PSRAM backed by a file in the test's
//!   directory (`-object memory-backend-file,share=on`: the firmware's region
//!   and mailbox are visible in it) and its semihosting output as the
//!   process's JSON event lines (see `abi/firmware/src/live.rs`), UART0
//!   either unconnected or a TCP server for `shmtrace bridge`.
//! * [`Mailbox`] drives the session through the file (one-byte `pwrite`s and
//!   `pread`s): host marks with the BOOTTIME window around each, finish,
//!   exit.
//! * [`timeline`] runs `checker/timeline.py`: every track event's resolved
//!   time, per producer, and the marks' instants.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;

use crate::error::{HarnessError, Result};
use crate::process::ChildProcess;
use crate::scenario;

/// The firmware's target.
pub const TARGET: &str = "thumbv7em-none-eabihf";
/// Where PSRAM starts in the firmware's address space (offset 0 of the
/// backing file).
pub const PSRAM_BASE: u64 = 0x2100_0000;
/// The PSRAM size QEMU's `mps2-an386` has (the backing file's size).
const PSRAM_SIZE: &str = "16M";
/// How long QEMU may take to start and the firmware to report `ready`.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Mailbox bytes (see `abi/firmware/src/live/mailbox.rs`).
const MARK: u64 = 0;
const ACK: u64 = 1;
const COMMAND: u64 = 2;
/// `command` values.
const FINISH: u8 = 1;
const EXIT: u8 = 2;

fn firmware_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("abi")
        .join("firmware")
}

/// Builds the firmware example (release) once per process; returns the
/// directory holding its ELF files. Errors say what is missing.
pub fn build() -> Result<PathBuf> {
    static BUILT: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| build_workspace(&firmware_dir(), TARGET))
        .clone()
        .map_err(HarnessError::Scenario)
}

/// The Cortex-M0 firmware's target (`abi/firmware/m0`).
pub const M0_TARGET: &str = "thumbv6m-none-eabi";

/// Builds the Cortex-M0 firmware (`abi/firmware/m0`, release) once per
/// process; returns its ELF file. Errors say what is missing.
pub fn build_m0() -> Result<PathBuf> {
    static BUILT: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            build_workspace(&firmware_dir().join("m0"), M0_TARGET).map(|dir| dir.join("m0-stream"))
        })
        .clone()
        .map_err(HarnessError::Scenario)
}

/// `cargo build --release --bins` in the firmware workspace `dir` (its own
/// target dir), whose .cargo/config.toml builds for `target`; the
/// directory holding the ELF files.
fn build_workspace(dir: &Path, target: &str) -> std::result::Result<PathBuf, String> {
    check_qemu()?;
    let target_dir = dir.join("target");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // The firmware's own workspace: its .cargo/config.toml sets the
    // target and the linker script flag, which RUSTFLAGS from the
    // environment would replace.
    let output = Command::new(&cargo)
        .args(["build", "--release", "--bins"])
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", &target_dir)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", Path::new(&cargo).display()))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let hint = if stderr.contains("target may not be installed")
            || stderr.contains("can't find crate for `core`")
        {
            format!(
                "\nthe {target} target is missing: `rustup target add {target}` \
                 (.ci/run installs it)"
            )
        } else {
            String::new()
        };
        return Err(format!(
            "building the firmware (cargo build --release in {}) failed:{hint}\n{stderr}",
            dir.display()
        ));
    }
    Ok(target_dir.join(target).join("release"))
}

/// Fails with what to install if `qemu-system-arm` cannot run.
pub fn check_qemu() -> std::result::Result<(), String> {
    match Command::new("qemu-system-arm").arg("--version").output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "qemu-system-arm --version failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )),
        Err(e) => Err(format!(
            "qemu-system-arm is needed to run the firmware ({e}): `apt-get install \
             qemu-system-arm` (.ci/run installs it)"
        )),
    }
}

/// Host BOOTTIME, nanoseconds (the clock trace timestamps are on).
pub fn boottime_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

/// Where UART0 goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Uart {
    /// Nowhere (`-serial none`).
    None,
    /// A TCP server on 127.0.0.1 at this port that QEMU waits on before it
    /// starts the firmware (`-serial tcp:...,server=on,wait=on,nodelay=on`).
    TcpServer(u16),
    /// A TCP server QEMU does not wait on (`wait=off`): what the firmware
    /// sends before a client connects is lost, as on a board that boots
    /// before its host listens.
    TcpServerNoWait(u16),
}

/// A firmware binary running under QEMU; dropping it kills QEMU.
#[derive(Debug)]
pub struct Qemu {
    /// The QEMU process: its stdout is the firmware's event lines.
    pub process: ChildProcess,
    /// The file backing PSRAM.
    pub psram: PathBuf,
    /// QEMU's monitor socket ([`Qemu::system_reset`]).
    monitor: PathBuf,
}

impl Qemu {
    /// Starts firmware binary `bin` (from [`build`]'s directory `elf_dir`)
    /// with PSRAM backed by `<dir>/psram` and UART0 on `uart`. With a TCP
    /// server, returns once QEMU listens (the firmware starts when a client
    /// connects).
    pub fn start(elf_dir: &Path, bin: &str, dir: &Path, uart: Uart) -> Result<Self> {
        let psram = dir.join("psram");
        let monitor = dir.join("monitor.sock");
        let mut command = Command::new("qemu-system-arm");
        command
            .args(["-M", "mps2-an386", "-cpu", "cortex-m4"])
            .args(["-display", "none", "-monitor"])
            .arg(format!("unix:{},server=on,wait=off", monitor.display()))
            .args(["-semihosting-config", "enable=on,target=native"])
            .arg("-object")
            .arg(format!(
                "memory-backend-file,id=psram,size={PSRAM_SIZE},mem-path={},share=on",
                psram.display()
            ))
            .args(["-machine", "memory-backend=psram"])
            .arg("-serial")
            .arg(match uart {
                Uart::None => "none".to_string(),
                // nodelay: without it Nagle's algorithm holds the
                // firmware's small frames (a CLOCK answer) back until the
                // peer's delayed ACK, ~40 ms, which skews the bridge's clock
                // relation by half of that.
                Uart::TcpServer(port) => {
                    format!("tcp:127.0.0.1:{port},server=on,wait=on,nodelay=on")
                }
                Uart::TcpServerNoWait(port) => {
                    format!("tcp:127.0.0.1:{port},server=on,wait=off,nodelay=on")
                }
            })
            .arg("-kernel")
            .arg(elf_dir.join(bin));
        let process = ChildProcess::spawn(&format!("qemu {bin}"), command, dir)?;
        let mut qemu = Qemu {
            process,
            psram,
            monitor,
        };
        match uart {
            Uart::TcpServer(port) => qemu.await_listening(port)?,
            // QEMU binds before it starts the firmware: one whose bind
            // failed has exited within moments.
            Uart::TcpServerNoWait(port) => qemu.await_running(port)?,
            Uart::None => {}
        }
        Ok(qemu)
    }

    /// [`Qemu::start`] with UART0 on a TCP server at a free port, which it
    /// returns: a port taken by another process between its pick and
    /// QEMU's bind is picked anew (a few times). With `wait`, the firmware
    /// starts when a client connects; without, at once.
    pub fn start_serving(elf_dir: &Path, bin: &str, dir: &Path, wait: bool) -> Result<(Self, u16)> {
        scenario::with_free_port("QEMU", |port| {
            let uart = if wait {
                Uart::TcpServer(port)
            } else {
                Uart::TcpServerNoWait(port)
            };
            Qemu::start(elf_dir, bin, dir, uart)
        })
    }

    /// Waits until QEMU says it waits for a connection on `port`.
    fn await_listening(&mut self, port: u16) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if self
                .process
                .stderr_tail()
                .contains("waiting for connection")
            {
                return Ok(());
            }
            if !self.process.is_running() || Instant::now() >= deadline {
                return Err(HarnessError::Driver {
                    name: self.process.name().into(),
                    message: format!("did not listen on 127.0.0.1:{port}"),
                    stderr_tail: self.process.stderr_tail(),
                });
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Fails if QEMU exits within its first half second (its bind of
    /// `port` failed: it reports that and exits at once).
    fn await_running(&mut self, port: u16) -> Result<()> {
        thread::sleep(Duration::from_millis(500));
        if self.process.is_running() {
            return Ok(());
        }
        Err(HarnessError::Driver {
            name: self.process.name().into(),
            message: format!("exited instead of listening on 127.0.0.1:{port}"),
            stderr_tail: self.process.stderr_tail(),
        })
    }

    /// Resets the board, as its reset button would (QEMU's monitor command
    /// `system_reset`): the firmware starts again from its reset vector,
    /// PSRAM (the file) and the UART's connection kept. Returns once QEMU
    /// took the command.
    pub fn system_reset(&self) -> Result<()> {
        use std::io::{Read, Write};
        let io = |action: &'static str| {
            let path = self.monitor.clone();
            move |source| HarnessError::Io {
                action,
                path,
                source,
            }
        };
        let mut monitor =
            std::os::unix::net::UnixStream::connect(&self.monitor).map_err(io("connect to"))?;
        monitor
            .set_read_timeout(Some(START_TIMEOUT))
            .map_err(io("set a timeout on"))?;
        // The banner ends with a prompt, and so does the command's answer.
        for command in [&b""[..], b"system_reset\n"] {
            monitor.write_all(command).map_err(io("write"))?;
            let mut said = Vec::new();
            let mut buf = [0u8; 512];
            while !said.ends_with(b"(qemu) ") {
                let n = monitor.read(&mut buf).map_err(io("read"))?;
                if n == 0 {
                    return Err(HarnessError::Scenario(
                        "QEMU's monitor closed before its prompt".into(),
                    ));
                }
                said.extend_from_slice(&buf[..n]);
            }
        }
        Ok(())
    }

    /// Waits for the firmware's `ready` line; returns its mailbox.
    pub fn ready(&mut self) -> Result<(Ready, Mailbox)> {
        let line = self.process.expect_event("ready", START_TIMEOUT)?;
        let ready: Ready = serde_json::from_value(line.clone()).map_err(|e| {
            HarnessError::Scenario(format!("the firmware's ready line {line}: {e}"))
        })?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.psram)
            .map_err(|source| HarnessError::Io {
                action: "open",
                path: self.psram.clone(),
                source,
            })?;
        let offset = ready
            .mailbox
            .checked_sub(PSRAM_BASE)
            .ok_or_else(|| HarnessError::Scenario(format!("mailbox outside PSRAM: {line}")))?;
        Ok((
            ready,
            Mailbox {
                file,
                offset,
                path: self.psram.clone(),
            },
        ))
    }
}

/// The firmware's `ready` line.
#[derive(Debug, Clone, Deserialize)]
pub struct Ready {
    /// `attach` or `stream`.
    pub mode: String,
    /// Address of the region.
    pub region: u64,
    /// Its size.
    pub region_size: u64,
    /// Address of the mailbox.
    pub mailbox: u64,
}

impl Ready {
    /// The region's offset in the PSRAM file.
    pub fn region_offset(&self) -> u64 {
        self.region - PSRAM_BASE
    }
}

/// The host's side of the firmware's mailbox (see
/// `abi/firmware/src/live/mailbox.rs`), through the PSRAM file.
#[derive(Debug)]
pub struct Mailbox {
    file: File,
    offset: u64,
    path: PathBuf,
}

/// One host mark: BOOTTIME just before the host stored it and just after
/// it saw the firmware's acknowledgement. The firmware read its clock for
/// the mark's instant in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MarkWindow {
    /// The mark's value.
    pub mark: u8,
    /// Before the store, ns.
    pub before_ns: u64,
    /// After the acknowledgement was seen, ns.
    pub after_ns: u64,
}

impl Mailbox {
    fn put(&self, at: u64, value: u8) -> Result<()> {
        self.file
            .write_all_at(&[value], self.offset + at)
            .map_err(|source| HarnessError::Io {
                action: "write the mailbox in",
                path: self.path.clone(),
                source,
            })
    }

    fn get(&self, at: u64) -> Result<u8> {
        let mut b = [0u8];
        self.file
            .read_exact_at(&mut b, self.offset + at)
            .map_err(|source| HarnessError::Io {
                action: "read the mailbox in",
                path: self.path.clone(),
                source,
            })?;
        Ok(b[0])
    }

    /// Stores mark `mark` (non-zero, different from the last) and spins
    /// until the firmware acknowledged it (at most `timeout`).
    pub fn mark(&self, mark: u8, timeout: Duration) -> Result<MarkWindow> {
        let before_ns = boottime_ns();
        self.put(MARK, mark)?;
        let deadline = Instant::now() + timeout;
        while self.get(ACK)? != mark {
            if Instant::now() >= deadline {
                return Err(HarnessError::Scenario(format!(
                    "the firmware did not acknowledge mark {mark} within {timeout:?}"
                )));
            }
            std::hint::spin_loop();
        }
        Ok(MarkWindow {
            mark,
            before_ns,
            after_ns: boottime_ns(),
        })
    }

    /// Tells the firmware to stop writing and report its counts.
    pub fn finish(&self) -> Result<()> {
        self.put(COMMAND, FINISH)
    }

    /// Tells the firmware to end the run.
    pub fn exit(&self) -> Result<()> {
        self.put(COMMAND, EXIT)
    }
}

/// One producer's events in a [`Timeline`].
#[derive(Debug, Clone, Deserialize)]
pub struct ProducerTimes {
    /// Track events.
    pub events: u64,
    /// Of them, whose time did not resolve.
    pub unresolved: u64,
    /// The resolved times, sorted (ns, BOOTTIME).
    pub times: Vec<u64>,
}

/// A named event in a [`Timeline`].
#[derive(Debug, Clone, Deserialize)]
pub struct NamedEvent {
    /// Its producer.
    pub pid: u32,
    /// Its resolved time.
    pub ts: u64,
    /// Its flat debug annotations.
    pub args: BTreeMap<String, Value>,
}

/// Where a trace's track events lie in time (`checker/timeline.py`).
#[derive(Debug, Clone, Deserialize)]
pub struct Timeline {
    /// Per producer pid.
    pub producers: BTreeMap<u32, ProducerTimes>,
    /// The events of each name asked for.
    pub named: BTreeMap<String, Vec<NamedEvent>>,
}

/// Runs `checker/timeline.py` on `traces`, noting the events named
/// `names`; its report goes to `<work_dir>/<label>.timeline.json`.
pub fn timeline(
    traces: &[PathBuf],
    names: &[&str],
    work_dir: &Path,
    label: &str,
) -> Result<Timeline> {
    crate::checker::ensure_environment()?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("checker")
        .join("timeline.py");
    let report = work_dir.join(format!("{label}.timeline.json"));
    let python =
        std::env::var_os("SHMTRACE_PYTHON").map_or_else(|| PathBuf::from("python3"), PathBuf::from);
    let mut command = Command::new(&python);
    command.arg(&script);
    for trace in traces {
        command.arg("--trace").arg(trace);
    }
    for name in names {
        command.arg("--name").arg(name);
    }
    let output = command
        .arg("--report")
        .arg(&report)
        .output()
        .map_err(|e| HarnessError::Checker(format!("cannot run {}: {e}", python.display())))?;
    if !output.status.success() {
        return Err(HarnessError::Checker(format!(
            "{} failed ({}): {}",
            script.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    let bytes = std::fs::read(&report).map_err(|source| HarnessError::Io {
        action: "read",
        path: report.clone(),
        source,
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| HarnessError::Checker(format!("{}: {e}", report.display())))
}
