//! Report lines over semihosting, and the end of the run.
//!
//! Every line is written with `SYS_WRITE` to the host's stdout (QEMU:
//! `-semihosting-config enable=on,target=native`); [`exit`] ends QEMU with
//! the run's status.

use core::fmt::{self, Write};

use cortex_m_semihosting::debug::{self, EXIT_FAILURE, EXIT_SUCCESS};
use cortex_m_semihosting::hio::{self, HostStream};

use crate::events::Moved;

/// Bytes of a chunk encoded per semihosting call.
const HEX_BLOCK: usize = 32;

/// The host's stdout.
pub struct Out {
    stream: HostStream,
}

impl Out {
    /// Opens the host's stdout; ends the run if there is no semihosting
    /// host.
    pub fn open() -> Self {
        match hio::hstdout() {
            Ok(stream) => Out { stream },
            Err(()) => exit(false),
        }
    }

    /// Writes one whole line.
    pub fn line(&mut self, args: fmt::Arguments<'_>) {
        let _ = self.stream.write_fmt(args);
        self.end_line();
    }

    /// Starts a line with its first word.
    pub fn start_line(&mut self, word: &str) {
        let _ = self.stream.write_str(word);
    }

    /// Appends a space and `args` to the line.
    pub fn word(&mut self, args: fmt::Arguments<'_>) {
        let _ = self.stream.write_str(" ");
        let _ = self.stream.write_fmt(args);
    }

    /// Ends the line.
    pub fn end_line(&mut self) {
        let _ = self.stream.write_str("\n");
    }

    /// Writes a `chunk` or `patch` line.
    pub fn moved(&mut self, moved: Moved<'_>) {
        match moved {
            Moved::Chunk(bytes) => {
                self.start_line("chunk");
                self.word(format_args!("{} ", bytes.len()));
                let used = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
                for block in bytes[..used].chunks(HEX_BLOCK) {
                    self.hex(block);
                }
                self.end_line();
            }
            Moved::Patch {
                writer_id,
                chunk_id,
                offset,
                data,
                has_more,
            } => {
                self.start_line("patch");
                self.word(format_args!("{writer_id} {chunk_id} {offset} "));
                self.hex(&data);
                self.word(format_args!("{}", u8::from(has_more)));
                self.end_line();
            }
        }
    }

    fn hex(&mut self, bytes: &[u8]) {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut buf = [0u8; 2 * HEX_BLOCK];
        for (pair, &b) in buf.chunks_exact_mut(2).zip(bytes) {
            pair[0] = DIGITS[usize::from(b >> 4)];
            pair[1] = DIGITS[usize::from(b & 0xf)];
        }
        let _ = self
            .stream
            .write_all(&buf[..2 * bytes.len().min(HEX_BLOCK)]);
    }
}

/// Ends the QEMU run with success or failure.
pub fn exit(success: bool) -> ! {
    debug::exit(if success { EXIT_SUCCESS } else { EXIT_FAILURE });
    // Only reached without a semihosting host.
    loop {
        cortex_m::asm::wfi();
    }
}

/// Prints `error WHAT` and ends the run with failure.
pub fn fail(what: &str) -> ! {
    if let Ok(mut stream) = hio::hstdout() {
        let _ = writeln!(stream, "error {what}");
    }
    exit(false)
}
