//! The stream link: the firmware drains its own ring into frames on UART0
//! and obeys the host's frames from it.

use shmtrace_abi::frame::{Frame, FrameDecoder, FrameEncoder, FrameStats, Hello};
use shmtrace_abi::region::{Control, RegionHandles, RegionReader};

use super::{Link, Writers};
use crate::out;
use crate::uart::Uart;

/// The rate UART0 is set to (QEMU does not keep to it).
pub const BAUD: u32 = 115_200;
/// Largest chunk copy: a 4 KiB page's chunk without its header.
const CHUNK_COPY: usize = 4096 - 8;
/// Room for one host frame (the largest carries 4 payload bytes).
const COMMAND_BUFFER: usize = 64;
/// Time between two STATS frames.
const STATS_PERIOD_NS: u64 = 1_000_000_000;

/// A host frame the firmware obeys.
#[derive(Debug, Clone, Copy)]
enum Command {
    /// ENABLE (`true`) or DISABLE.
    Enable(bool),
    /// CLEAR.
    Clear,
    /// FLUSH.
    Flush,
    /// SYNC with its nonce.
    Sync(u32),
}

impl Command {
    /// The command a frame carries; `None` for firmware-to-host frames
    /// (an echo).
    fn of(frame: Frame<'_>) -> Option<Self> {
        Some(match frame {
            Frame::Enable => Command::Enable(true),
            Frame::Disable => Command::Enable(false),
            Frame::Clear => Command::Clear,
            Frame::Flush(_) => Command::Flush,
            Frame::Sync(nonce) => Command::Sync(nonce),
            Frame::Hello(_)
            | Frame::Chunk(_)
            | Frame::Patch(_)
            | Frame::Clock { .. }
            | Frame::Stats(_) => return None,
        })
    }
}

/// Streams the region over UART0 (see the [module docs](super)).
pub struct StreamLink {
    uart: Uart,
    reader: RegionReader<'static>,
    control: Control<'static>,
    encoder: FrameEncoder,
    decoder: FrameDecoder<[u8; COMMAND_BUFFER]>,
    copy: [u8; CHUNK_COPY],
    /// Polls of the ring that failed.
    errors: u64,
    /// When the last STATS frame went out.
    stats_at: Option<u64>,
}

impl StreamLink {
    /// The link of the stream-mode region behind `handles`; takes UART0.
    pub fn new(handles: &RegionHandles<'static>) -> Self {
        let Some(uart) = Uart::uart0(BAUD) else {
            out::fail("UART0 taken")
        };
        let Ok(reader) = RegionReader::attach(handles) else {
            out::fail("reader refused")
        };
        let mut link = StreamLink {
            uart,
            reader,
            control: handles.control,
            encoder: FrameEncoder::new(),
            decoder: FrameDecoder::new([0; COMMAND_BUFFER]),
            copy: [0; CHUNK_COPY],
            errors: 0,
            stats_at: None,
        };
        // Who this is, first (the reader announces only later boots).
        let uart = &mut link.uart;
        link.encoder
            .hello(&Hello::from_header(&handles.header), &mut |b: &[u8]| {
                uart.write(b)
            });
        link
    }

    /// Sends every record the ring holds (a reset as the HELLO of the new
    /// boot).
    fn drain(&mut self) {
        let uart = &mut self.uart;
        let mut sink = |b: &[u8]| uart.write(b);
        loop {
            match self.reader.poll(&mut self.copy) {
                Ok(Some(record)) => self.encoder.record(&record, &mut sink),
                Ok(None) => return,
                Err(_) => {
                    self.errors += 1;
                    return;
                }
            }
        }
    }

    /// Applies one host command.
    fn obey(&mut self, command: Command, writers: &mut Writers) {
        match command {
            Command::Enable(on) => self.control.set_trace_enabled(on),
            Command::Clear => {
                self.control.request_clear();
            }
            Command::Flush => {
                writers.flush();
                self.drain();
            }
            Command::Sync(nonce) => {
                // At once: the clock is read as close to the request as the
                // firmware can, and the answer leaves right after it (a
                // FLUSH before the SYNC drained what it committed already).
                let now = writers.now_ns();
                let uart = &mut self.uart;
                self.encoder
                    .clock(now, nonce, &mut |b: &[u8]| uart.write(b));
            }
        }
    }

    fn send_stats(&mut self) {
        let c = self.control.counters();
        let stats = FrameStats {
            packets_dropped: c.packets_dropped,
            ring_overflows: c.ring_overflows,
            chunks_lost: c.chunks_lost,
            frames_dropped: 0,
        };
        let uart = &mut self.uart;
        self.encoder.stats(&stats, &mut |b: &[u8]| uart.write(b));
    }
}

impl Link for StreamLink {
    fn serve(&mut self, writers: &mut Writers) {
        while let Some(byte) = self.uart.read() {
            let (_, frame) = self.decoder.push(&[byte]);
            if let Some(command) = frame.and_then(|raw| Command::of(raw.parse().ok()?)) {
                self.obey(command, writers);
            }
        }
        self.drain();
        let now = writers.now_ns();
        if self
            .stats_at
            .is_none_or(|t| now.saturating_sub(t) >= STATS_PERIOD_NS)
        {
            self.stats_at = Some(now);
            self.send_stats();
        }
    }

    fn lost(&self) -> u64 {
        let stats = self.reader.stats();
        let counters = self.reader.counters().unwrap_or_default();
        self.errors
            + stats.bad_slots
            + stats.invalid_chunks
            + stats.release_failures
            + u64::from(counters.chunks_lost)
    }

    fn mode(&self) -> &'static str {
        "stream"
    }
}
