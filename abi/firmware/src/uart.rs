//! A polled driver for the CMSDK APB UART (Arm Cortex-M System Design Kit,
//! DDI 0479), the UARTs of QEMU's `mps2-an386` board (UART0 at
//! `0x4000_4000`).
//!
//! | offset | register | bits used here |
//! |---|---|---|
//! | `0x00` | DATA | write: the byte to send; read: the byte received (clears RX full) |
//! | `0x04` | STATE | bit 0 TX buffer full, bit 1 RX buffer full |
//! | `0x08` | CTRL | bit 0 TX enable, bit 1 RX enable |
//! | `0x10` | BAUDDIV | PCLK / baud rate, at least 16 |
//!
//! It is the live `stream` binary's [`ByteIo`]: the line
//! `shmtrace_abi::link::StreamService` sends frames on. The UART buffers
//! one byte each way: [`ByteIo::write`] waits for the TX buffer,
//! [`ByteIo::read`] takes the received byte if there is one. QEMU
//! hands the UART its next input byte only once the previous one was read,
//! so input waits on the host side (a TCP connection's buffers), it is not
//! lost.
//!
//! The registers are the only memory this module touches, always with one
//! aligned 32-bit volatile access; [`Uart::uart0`] hands out UART0 once per
//! program, so no two drivers share its buffers.

use core::sync::atomic::{AtomicBool, Ordering::Relaxed};

use shmtrace_abi::link::ByteIo;

/// UART0's registers on `mps2-an386` (QEMU: `-serial` number 0).
pub const UART0_BASE: usize = 0x4000_4000;
/// The APB clock the UARTs count BAUDDIV in (25 MHz on the mps2 boards).
pub const PCLK_HZ: u32 = 25_000_000;

const DATA: usize = 0x00;
const STATE: usize = 0x04;
const CTRL: usize = 0x08;
const BAUDDIV: usize = 0x10;

const STATE_TX_FULL: u32 = 1 << 0;
const STATE_RX_FULL: u32 = 1 << 1;
const CTRL_TX_ENABLE: u32 = 1 << 0;
const CTRL_RX_ENABLE: u32 = 1 << 1;

/// Set once UART0 was handed out.
static UART0_TAKEN: AtomicBool = AtomicBool::new(false);

/// A CMSDK APB UART, transmitter and receiver enabled.
#[derive(Debug)]
pub struct Uart {
    base: usize,
}

impl Uart {
    /// UART0, set up for `baud` bits/s and enabled both ways; `None` if it
    /// was taken already. (QEMU sends bytes as fast as its backend takes
    /// them, whatever the rate; real hardware keeps to it.)
    pub fn uart0(baud: u32) -> Option<Self> {
        if UART0_TAKEN.swap(true, Relaxed) {
            return None;
        }
        let uart = Uart { base: UART0_BASE };
        uart.store(BAUDDIV, (PCLK_HZ / baud.max(1)).max(16));
        uart.store(CTRL, CTRL_TX_ENABLE | CTRL_RX_ENABLE);
        Some(uart)
    }

    fn load(&self, register: usize) -> u32 {
        // SAFETY: `base` is the base of a CMSDK APB UART's register block
        // (`uart0`: the board's memory map) and `register` one of its
        // 32-bit registers, so the address is aligned device memory that is
        // always mapped; a volatile read of it touches no memory Rust
        // knows, and its only side effect (reading DATA empties the RX
        // buffer) belongs to this driver, the only one for this UART.
        #[allow(unsafe_code)]
        unsafe {
            core::ptr::read_volatile((self.base + register) as *const u32)
        }
    }

    fn store(&self, register: usize, value: u32) {
        // SAFETY: as in `load`: an aligned, mapped device register of this
        // driver's UART; the write changes only that UART's state.
        #[allow(unsafe_code)]
        unsafe {
            core::ptr::write_volatile((self.base + register) as *mut u32, value)
        }
    }
}

impl ByteIo for Uart {
    /// Sends `bytes`, waiting for room before each.
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            while self.load(STATE) & STATE_TX_FULL != 0 {}
            self.store(DATA, u32::from(b));
        }
    }

    /// The byte received, if any.
    fn read(&mut self) -> Option<u8> {
        if self.load(STATE) & STATE_RX_FULL == 0 {
            return None;
        }
        Some(self.load(DATA) as u8)
    }
}
