//! The two nRF51 peripherals the firmware uses, as QEMU's `microbit`
//! board models them (nRF51 Series Reference Manual v3.0; QEMU
//! `hw/char/nrf51_uart.c`, `hw/timer/nrf51_timer.c`): UART0, the stream
//! link's [`ByteIo`], and TIMER0, the clock.
//!
//! | block | base | registers used (offset) |
//! |---|---|---|
//! | UART0 | `0x4000_2000` | `STARTRX` 0x000, `STARTTX` 0x008, `EVENTS_RXDRDY` 0x108, `EVENTS_TXDRDY` 0x11C, `ENABLE` 0x500 (4: on), `RXD` 0x518, `TXD` 0x51C |
//! | TIMER0 | `0x4000_8000` | `START` 0x000, `CAPTURE[0]` 0x040, `MODE` 0x504, `BITMODE` 0x508 (3: 32 bits), `PRESCALER` 0x510, `CC[0]` 0x540 |
//!
//! Every access is one aligned 32-bit volatile load or store of a register
//! of these two blocks, which this module alone touches.

use core::cell::Cell;

use cortex_m::interrupt::{self, Mutex};
use shmtrace_abi::link::ByteIo;
use shmtrace_abi::track_event::{Extend32, TickRate};

const UART0: usize = 0x4000_2000;
const TIMER0: usize = 0x4000_8000;

const STARTRX: usize = 0x000;
const STARTTX: usize = 0x008;
const EVENTS_RXDRDY: usize = 0x108;
const EVENTS_TXDRDY: usize = 0x11C;
const UART_ENABLE: usize = 0x500;
const RXD: usize = 0x518;
const TXD: usize = 0x51C;

const TASKS_START: usize = 0x000;
const TASKS_CAPTURE0: usize = 0x040;
const MODE: usize = 0x504;
const BITMODE: usize = 0x508;
const PRESCALER: usize = 0x510;
const CC0: usize = 0x540;

/// TIMER0's rate with prescaler 0: the 16 MHz peripheral clock.
const TIMER_HZ: u32 = 16_000_000;

fn load(address: usize) -> u32 {
    // SAFETY: `address` is one of the UART0/TIMER0 registers above
    // (aligned, always mapped device memory); reading RXD takes the byte
    // received, which only `Uart0::read` does.
    unsafe { core::ptr::read_volatile(address as *const u32) }
}

fn store(address: usize, value: u32) {
    // SAFETY: as in `load`: a register of UART0 or TIMER0, whose effects
    // (starting the timer, sending a byte) belong to this module.
    unsafe { core::ptr::write_volatile(address as *mut u32, value) }
}

/// UART0, polled, transmitter and receiver started. QEMU's model sends a
/// byte written to `TXD` at once (or when its backend takes it) and then
/// raises `EVENTS_TXDRDY`; a byte written while one is pending is lost,
/// so [`ByteIo::write`] waits for the event after every byte.
pub struct Uart0(());

impl Uart0 {
    /// Enables UART0 both ways. Call once.
    pub fn start() -> Self {
        store(UART0 + UART_ENABLE, 4);
        store(UART0 + STARTTX, 1);
        store(UART0 + STARTRX, 1);
        Uart0(())
    }
}

impl ByteIo for Uart0 {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            store(UART0 + EVENTS_TXDRDY, 0);
            store(UART0 + TXD, u32::from(b));
            while load(UART0 + EVENTS_TXDRDY) == 0 {}
        }
    }

    fn read(&mut self) -> Option<u8> {
        if load(UART0 + EVENTS_RXDRDY) == 0 {
            return None;
        }
        // Clear the event first: reading RXD raises it again if more
        // bytes wait.
        store(UART0 + EVENTS_RXDRDY, 0);
        Some(load(UART0 + RXD) as u8)
    }
}

/// Starts TIMER0 as a free-running 32-bit counter at 16 MHz. QEMU runs it
/// on its virtual clock: the host's pace, unless `-icount`.
pub fn start_timer() {
    store(TIMER0 + MODE, 0);
    store(TIMER0 + BITMODE, 3);
    store(TIMER0 + PRESCALER, 0);
    store(TIMER0 + TASKS_START, 1);
}

/// The clock hook, in nanoseconds: TIMER0's count (captured into `CC[0]`)
/// widened to 64 bits. The main loop and the `SysTick` handler both read
/// it, so the widening runs with interrupts masked.
pub fn now_ns() -> u64 {
    static WIDE: Mutex<Cell<Extend32>> = Mutex::new(Cell::new(Extend32::new()));
    const RATE: TickRate = TickRate::new(TIMER_HZ);
    interrupt::free(|cs| {
        store(TIMER0 + TASKS_CAPTURE0, 1);
        let count = load(TIMER0 + CC0);
        let wide = WIDE.borrow(cs);
        let mut w = wide.get();
        let ticks = w.extend(count);
        wide.set(w);
        RATE.ns(ticks)
    })
}
