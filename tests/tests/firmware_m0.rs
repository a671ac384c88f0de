//! The Cortex-M0 firmware (`abi/firmware/m0`: `thumbv6m-none-eabi`, no
//! compare-and-swap, shmtrace-abi built with its `portable-atomic`
//! feature and portable-atomic's single-core fallback) under QEMU's
//! `microbit` board (nRF51822, 16 KiB of RAM): it streams its region as
//! frames on UART0, which QEMU writes into a file (`-serial file:`), and
//! `shmtrace import --frames` turns the capture into a trace. The checker
//! must find exactly the events the firmware says it wrote (slices,
//! instants, integer and floating-point counters, uint and string
//! annotations, the SysTick interrupt's instants through its `WriterCell`),
//! with no loss, and `shmtrace inspect --check` must pass. The firmware
//! exits with failure on a hard fault (QEMU traps unaligned accesses on
//! ARMv6-M) or a panic. The run is deterministic: no host answers the
//! firmware, it writes a fixed number of loop turns and exits.

mod sim_bridge;

use std::process::Command;

use shmtrace_tests::checker::Loss;
use shmtrace_tests::firmware;
use shmtrace_tests::process::ChildProcess;
use shmtrace_tests::scenario;
use sim_bridge::*;

/// Turns of the firmware's loop (`ITERATIONS` in `abi/firmware/m0`), each a
/// slice, two counter samples, an instant and an annotated instant.
const ITERATIONS: u64 = 300;

#[test]
fn m0_firmware_frames_captured_and_imported() {
    firmware::check_qemu().unwrap_or_else(|e| panic!("{e}"));
    let elf = firmware::build_m0().expect("the M0 firmware builds");
    let env = Env::new("shmtrace-firmware-m0-");
    let frames = env.path("uart0.frames");

    let mut qemu = Command::new("qemu-system-arm");
    qemu.args(["-M", "microbit", "-display", "none", "-monitor", "none"])
        .args(["-semihosting-config", "enable=on,target=native"])
        .arg("-serial")
        .arg(format!("file:{}", frames.display()))
        .arg("-kernel")
        .arg(&elf);
    let mut qemu = ChildProcess::spawn("qemu m0-stream", qemu, env.dir.path()).expect("QEMU");
    let done = qemu
        .expect_event("done", TIMEOUT)
        .expect("the firmware's counts");
    qemu.expect_success(TIMEOUT)
        .expect("the firmware exits with success");
    assert_eq!(done["lost"], 0, "{done}");
    let emitted = emitted(&done);
    assert_eq!(
        (emitted.slice_begin, emitted.slice_end),
        (ITERATIONS, ITERATIONS)
    );
    assert_eq!(
        (emitted.counter_int, emitted.counter_double),
        (ITERATIONS, ITERATIONS)
    );
    assert_eq!(
        (emitted.arg_uint, emitted.arg_string),
        (ITERATIONS, ITERATIONS)
    );
    let irq = done["irq_instants"].as_u64().expect("irq_instants");
    assert!(irq >= 10, "the interrupt wrote: {done}");
    assert_eq!(emitted.instant, 2 * ITERATIONS + irq);

    let trace = env.path("m0.pftrace");
    let output = Command::new(scenario::shmtrace_binary().expect("shmtrace"))
        .args(["import", "--frames"])
        .arg(&frames)
        .arg("-o")
        .arg(&trace)
        .output()
        .expect("run shmtrace import");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("bad_crc 0") && stderr.contains("frames_lost 0"),
        "{stderr}"
    );

    let report = check(&env, &trace, emitted, Loss::None, "firmware-m0");
    report.assert_ok("firmware-m0");
    assert_eq!(report.events_by_name.get("work"), Some(&ITERATIONS));
    assert_eq!(report.events_by_name.get("sample"), Some(&ITERATIONS));
    assert_eq!(report.events_by_category.get("irq"), Some(&irq));
    assert_eq!(
        report.sequences.len(),
        2,
        "the main loop's and the interrupt's"
    );
    inspect_passes(&trace);
}
