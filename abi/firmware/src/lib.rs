//! # shmtrace-firmware-example
//!
//! A Cortex-M4 firmware for QEMU's `mps2-an386` board that writes track
//! events into a shared-memory buffer (SMB) with `shmtrace-abi`, drains the
//! committed chunks itself (as the tracing service would) and prints them over
//! semihosting. `report.py` builds it, runs it under QEMU and prints its size
//! and the exact number of instructions each kind of event costs.
//!
//! Three binaries share this library:
//!
//! * `skeleton`: the same runtime, loop and semihosting output with a tracer
//!   that does nothing: the size baseline and the marker overhead.
//! * `demo`: the [`tracer::ShmTracer`], its SMB in the `.shmtrace` section
//!   (PSRAM at `0x2100_0000`, which QEMU can back with a host file).
//! * `demo-bss`: the same with the SMB as an ordinary static in `.bss`.
//!
//! Module plan: [`events`] is the table of event kinds and the [`Tracer`]
//! interface the loop calls; [`tracer`] is the only module that uses
//! shmtrace-abi (swapping in another tracing API changes that module and the
//! storage statics of the two demo binaries); [`run`] is the loop;
//! [`markers`] and [`out`] are the measuring and printing helpers.
//!
//! # Output (semihosting stdout, one record per line)
//!
//! ```text
//! shmtrace-firmware-example VARIANT
//! kinds markers_only slice_begin slice_end instant counter
//! reps N
//! chunk LEN HEX           a drained chunk: LEN bytes (header + payload),
//!                         HEX without its trailing zero bytes
//! patch WRITER CHUNK_ID OFFSET HEX4 HAS_MORE
//! calls KIND=N ...        measured calls per kind
//! systick KIND=TICKS ...  SysTick ticks summed over each kind's calls
//! dropped N               packets the tracer lost
//! state BYTES             RAM the tracer keeps besides the SMB
//! done
//! ```
//!
//! The run ends with semihosting `exit`: success unless setup failed or a
//! packet was lost.
#![no_std]
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod events;
pub mod markers;
pub mod out;
pub mod tracer;

use cortex_m::peripheral::syst::SystClkSource;
use cortex_m::peripheral::SYST;

pub use events::{Event, Moved, Name, Tracer};

/// Rounds of the loop: each calls every [`Event`] once.
pub const REPS: u32 = 64;

/// Runs the measured loop with `tracer`, prints the report lines and ends
/// the QEMU run.
pub fn run<T: Tracer>(variant: &str, tracer: &mut T) -> ! {
    let mut out = out::Out::open();
    out.line(format_args!("shmtrace-firmware-example {variant}"));
    out.start_line("kinds");
    for event in Event::ALL {
        out.word(format_args!("{}", event.name()));
    }
    out.end_line();
    out.line(format_args!("reps {REPS}"));

    let _syst = start_systick();
    tracer.start();
    tracer.drain(&mut |moved| out.moved(moved));

    let mut calls = [0u32; Event::ALL.len()];
    let mut ticks = [0u32; Event::ALL.len()];
    // Timestamps (ns) are a counter, not a clock: 1 µs and a bit apart.
    let mut ts: u64 = 1_000_000;
    for rep in 0..REPS {
        for (k, event) in Event::ALL.into_iter().enumerate() {
            ts += 1_000 + u64::from(rep);
            let before = SYST::get_current();
            event.measure(tracer, ts, i64::from(rep) - 32);
            let after = SYST::get_current();
            // SysTick counts down, 24 bits wide.
            ticks[k] = ticks[k].wrapping_add(before.wrapping_sub(after) & 0x00FF_FFFF);
            calls[k] += 1;
        }
        tracer.drain(&mut |moved| out.moved(moved));
    }
    tracer.flush();
    tracer.drain(&mut |moved| out.moved(moved));

    out.start_line("calls");
    for (event, n) in Event::ALL.into_iter().zip(calls) {
        out.word(format_args!("{}={n}", event.name()));
    }
    out.end_line();
    out.start_line("systick");
    for (event, n) in Event::ALL.into_iter().zip(ticks) {
        out.word(format_args!("{}={n}", event.name()));
    }
    out.end_line();
    let dropped = tracer.dropped();
    out.line(format_args!("dropped {dropped}"));
    out.line(format_args!("state {}", tracer.state_bytes()));
    out.line(format_args!("done"));
    out::exit(dropped == 0)
}

/// SysTick free-running on the core clock, full 24-bit reload, no
/// interrupt. Under QEMU it counts instructions only with `-icount` (QEMU
/// 7.2 otherwise derives it from the host's clock).
fn start_systick() -> SYST {
    let Some(peripherals) = cortex_m::Peripherals::take() else {
        out::fail("cortex-m peripherals already taken")
    };
    let mut syst = peripherals.SYST;
    syst.set_clock_source(SystClkSource::Core);
    syst.set_reload(0x00FF_FFFF);
    syst.clear_current();
    syst.enable_counter();
    syst
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    out::fail("panic")
}
