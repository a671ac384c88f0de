//! # shmtrace-firmware-example
//!
//! A Cortex-M4 firmware for QEMU's `mps2-an386` board that writes track
//! events with `shmtrace-abi` into a shared-memory region (header, commit
//! ring, SMB) a host can read, and (the demos) drains the committed chunks
//! itself, as a host would, and prints them over semihosting. `report.py`
//! builds it, runs it under QEMU and prints its size and the exact number of
//! instructions each kind of event costs.
//!
//! These binaries share this library:
//!
//! * `skeleton`: the same runtime, clock, loop and semihosting output with a
//!   tracer that does nothing: the size baseline and the marker overhead.
//! * `minimal`: the smallest useful producer: one writer (slices, instants,
//!   an integer counter) with the smallest tables, its region in
//!   `.shmtrace` (PSRAM at `0x2100_0000`, which QEMU can back with a host
//!   file), left to a host: the report reads the chunks from that file.
//! * `demo`: the [`tracer::ShmTracer`] with every event kind and a second
//!   writer in the `SysTick` interrupt, its region in `.shmtrace`, drained
//!   by the firmware itself.
//! * `demo-bss`: the same with the region as an ordinary static in `.bss`.
//! * `attach` and `stream`: live sessions a host's tools trace while the
//!   firmware runs, through shared RAM or UART0 frames (see [`live`]; the
//!   integration tests `tests/tests/firmware.rs` run them), served by
//!   `shmtrace_abi::link`. Their clock is the FPGA counter ([`fpgaio`]),
//!   their UART driver [`uart`].
//! * `frames`: the stream link's own cost, CHUNK frames (header and CRC)
//!   encoded between the markers ([`frames`]).
//!
//! Module plan: [`events`] is the table of event kinds and the [`Tracer`]
//! interface the loop calls; [`tracer`] and [`shm`] are the modules the
//! measured binaries use shmtrace-abi through ([`shm`] alone chooses how
//! their chunks travel); [`clocks`] holds the clock hooks; [`run`] is the
//! loop; [`markers`] and [`out`] are the measuring and printing helpers.
//! [`live`] is the live sessions' loop.
//!
//! # Output (semihosting stdout, one record per line)
//!
//! ```text
//! shmtrace-firmware-example VARIANT
//! kinds markers_only slice_begin ...
//! reps N
//! clear_at R              the round before which the main sequence restarts
//! chunk LEN HEX           a drained chunk: LEN bytes (header + the payload
//!                         in use), HEX without its trailing zero bytes
//! patch WRITER CHUNK_ID OFFSET HEX4 HAS_MORE
//! calls KIND=N ...        measured calls per kind
//! clean KIND=N ...        of them, calls no interrupt ran in
//! systick KIND=TICKS ...  SysTick ticks summed over each kind's clean calls
//! clock_end NS            the event clock at the end (tracers)
//! snapshots N             clock snapshots written (tracers)
//! irq instant=N counter=M events the interrupt's writer wrote (tracers)
//! state writer=B in_place=B arbiter=B interning=N tracks=T sites=S
//!                         RAM of the main writer and its parts (tracers)
//! dropped N               events, packets or chunks the tracer lost
//! done
//! ```
//!
//! The run ends with semihosting `exit`: success unless setup failed or
//! something was lost.
#![no_std]
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod clocks;
pub mod events;
pub mod fpgaio;
pub mod frames;
pub mod live;
pub mod markers;
pub mod out;
pub mod shm;
pub mod tracer;
pub mod uart;

pub use events::{Event, InstantsOnly, Moved, Tracer};

/// Rounds of the loop: each calls every measured [`Event`] once.
pub const REPS: u32 = 64;
/// The round before which the main sequence is cleared (as a consumer's
/// clear request would): its first events are then measured twice.
pub const CLEAR_AT: u32 = REPS / 2;

/// Runs the measured loop over `kinds` with `tracer`, prints the report
/// lines and ends the QEMU run.
pub fn run<T: Tracer>(variant: &str, kinds: &[Event], tracer: &mut T) -> ! {
    let mut out = out::Out::open();
    out.line(format_args!("shmtrace-firmware-example {variant}"));
    out.start_line("kinds");
    for event in kinds {
        out.word(format_args!("{}", event.name()));
    }
    out.end_line();
    out.line(format_args!("reps {REPS}"));
    out.line(format_args!("clear_at {CLEAR_AT}"));

    let Some(mut peripherals) = cortex_m::Peripherals::take() else {
        out::fail("cortex-m peripherals already taken")
    };
    clocks::start_systick(&mut peripherals.SYST);
    tracer.drain(&mut |moved| out.moved(moved));

    let mut calls = [0u32; Event::ALL.len()];
    let mut clean = [0u32; Event::ALL.len()];
    let mut ticks = [0u64; Event::ALL.len()];
    for rep in 0..REPS {
        if rep == CLEAR_AT {
            tracer.clear();
        }
        for (k, event) in kinds.iter().enumerate() {
            let reloads = clocks::reloads();
            let before = clocks::ticks();
            event.measure(tracer, rep);
            let after = clocks::ticks();
            if let (Some(n), Some(c), Some(t)) =
                (calls.get_mut(k), clean.get_mut(k), ticks.get_mut(k))
            {
                *n += 1;
                // A call the interrupt ran in counts the handler too.
                if clocks::reloads() == reloads {
                    *c += 1;
                    *t += after - before;
                }
            }
        }
        tracer.drain(&mut |moved| out.moved(moved));
    }
    // SysTick keeps running: it is the clock.
    tracer.stop();
    tracer.flush();
    tracer.drain(&mut |moved| out.moved(moved));

    for (word, values) in [("calls", &calls), ("clean", &clean)] {
        out.start_line(word);
        for (event, n) in kinds.iter().zip(values) {
            out.word(format_args!("{}={n}", event.name()));
        }
        out.end_line();
    }
    out.start_line("systick");
    for (event, n) in kinds.iter().zip(ticks) {
        out.word(format_args!("{}={n}", event.name()));
    }
    out.end_line();
    tracer.report(&mut out);
    let dropped = tracer.dropped();
    out.line(format_args!("dropped {dropped}"));
    out.line(format_args!("done"));
    out::exit(dropped == 0)
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    out::fail("panic")
}
