//! The byte-stream service: a stream-mode firmware drains its own ring
//! into frames and obeys the host's frames.

use crate::frame::{Frame, FrameDecoder, FrameEncoder, FrameStats, Hello};
use crate::layout::{PageSize, CHUNK_HEADER_SIZE};
use crate::region::{Control, ReaderError, RegionHandles, RegionReader};
use crate::track_event::Clock;

use super::ByteIo;

/// Bytes of a [`StreamService`]'s chunk buffer for a region with the
/// default page size ([`PageSize::DEFAULT`], 4 KiB): its largest chunk, a
/// page less the 8-byte chunk header.
pub const DEFAULT_CHUNK_BUFFER: usize = PageSize::DEFAULT.get() - CHUNK_HEADER_SIZE;
/// Firmware time between two STATS frames (one more follows every FLUSH).
pub const STATS_PERIOD_NS: u64 = 1_000_000_000;
/// Room for one host frame: the largest (FLUSH, SYNC) is 20 bytes; longer
/// ones are no command and are skipped as oversized.
const COMMAND_FRAME: usize = 32;
/// Bytes of host input one poll takes at most, so a poll ends whatever the
/// host sends (the rest waits for the next poll).
const INPUT_PER_POLL: usize = 256;

/// Why a [`StreamService`] could not start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StreamError {
    /// The region was taken without `stream_mode`: a host may consume its
    /// ring, and a ring has one consumer.
    NotStreamMode,
    /// The region reader refused the region, or the chunk buffer is
    /// smaller than the region's largest chunk
    /// ([`ReaderError::BufferTooSmall`]).
    Reader(ReaderError),
}

impl core::fmt::Display for StreamError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::NotStreamMode => f.write_str("the region is not in stream mode"),
            Self::Reader(e) => write!(f, "draining the region: {e}"),
        }
    }
}

impl core::error::Error for StreamError {}

/// A host frame the firmware obeys.
#[derive(Debug, Clone, Copy)]
enum Command {
    /// ENABLE (`true`) or DISABLE.
    Enable(bool),
    Clear,
    Flush,
    /// SYNC with its nonce.
    Sync(u32),
}

impl Command {
    /// The command a frame carries; `None` for the frames a firmware sends
    /// (an echo of its own, on a loop-back line).
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

/// Streams a region to a host over a [`ByteIo`]: the firmware end of
/// `shmtrace bridge --input tcp:HOST:PORT|PATH`. See the
/// [module docs](super).
///
/// What it sends, in this order:
///
/// 1. HELLO, when it is made ([`new`](Self::new)), and again with every
///    periodic STATS frame after the first (below), so a host that starts
///    listening late (a bridge started after the board, or restarted)
///    learns the boot within [`STATS_PERIOD_NS`].
/// 2. At each [`poll`](Self::poll): first the host's commands, each obeyed
///    completely before the next is read (the rule in [`crate::frame`]:
///    "Command order"): ENABLE/DISABLE set the region's `trace_enabled`,
///    CLEAR increments its `clear_request`, FLUSH calls the firmware's
///    flush, sends everything the ring then holds and a STATS frame, SYNC
///    sends a CLOCK frame with the nonce and the clock read right then.
///    Then every record the ring holds, as CHUNK and PATCH frames (a HELLO
///    if the region was taken anew), then STATS if [`STATS_PERIOD_NS`]
///    passed since the last (and at the first poll). Every such STATS but
///    the first follows a HELLO and, until a host frame arrives, an
///    unasked CLOCK (nonce 0), and asks the writers to restart their
///    sequences (as CLEAR does): over a link with no way back (a FIFO, a
///    UART's TX line alone, a probe's up-channel) a host that started
///    listening late decodes what follows within a period, and relates
///    the clocks one-way.
///
/// `B` is the buffer chunks are copied into on their way out of the SMB
/// (`[u8; N]`, `&mut [u8]`): at least the region's page size less 8
/// bytes ([`DEFAULT_CHUNK_BUFFER`] with the default page size). Where RAM
/// is short (a 16 KiB Cortex-M0), give it a `&mut [u8]` into a `static`
/// (`cortex_m::singleton!`): an array passed by value is moved into the
/// service, and the copies the moves make stay in the caller's stack frame
/// (5.6 KiB with one 4 KiB buffer in `abi/firmware/m0`, 1.6 KiB with the
/// static).
///
/// ```
/// use shmtrace_abi::frame::{kind, Frame, FrameDecoder, FrameEncoder};
/// use shmtrace_abi::layout::PageLayout;
/// use shmtrace_abi::link::{ByteIo, StreamService, DEFAULT_CHUNK_BUFFER};
/// use shmtrace_abi::region::{RegionArbiter, RegionConfig, RegionStorage};
/// use shmtrace_abi::writer::TraceWriter;
///
/// /// A line to the host: what the firmware sent, what the host sends.
/// #[derive(Default)]
/// struct Line { tx: Vec<u8>, rx: std::collections::VecDeque<u8> }
/// impl ByteIo for Line {
///     fn write(&mut self, bytes: &[u8]) { self.tx.extend_from_slice(bytes) }
///     fn read(&mut self) -> Option<u8> { self.rx.pop_front() }
/// }
///
/// let mut storage = Box::new(RegionStorage::<8192, 16>::new());
/// let config = RegionConfig { stream_mode: true, ..RegionConfig::new("track_event") };
/// let handles = storage.init(&config).unwrap();
/// let arbiter = RegionArbiter::new(&handles, PageLayout::Div4).unwrap();
/// let mut w: TraceWriter<_> = TraceWriter::new(arbiter, 1, 0).unwrap();
/// let mut line = Line::default();
/// let mut link = StreamService::new(&handles, &mut line, [0u8; DEFAULT_CHUNK_BUFFER]).unwrap();
///
/// let _ = w.write_packet(|p| p.uint64(8, 100)); // an event, held by the writer
/// // The host asks for a flush, then the clock (the bridge's flush barrier).
/// let mut host = FrameEncoder::new();
/// let mut to_fw = Vec::new();
/// host.command_u32(kind::FLUSH, 1, &mut |b: &[u8]| to_fw.extend_from_slice(b));
/// host.command_u32(kind::SYNC, 9, &mut |b: &[u8]| to_fw.extend_from_slice(b));
/// link.io().rx.extend(to_fw);
/// link.poll(|| w.flush(), || 42_000u64);
///
/// // HELLO, then the flushed chunk and STATS, then the clock.
/// let mut decoder = FrameDecoder::new([0u8; 4096 + 16]);
/// let mut kinds = Vec::new();
/// let mut input = &link.io().tx[..];
/// while !input.is_empty() {
///     let (used, frame) = decoder.push(input);
///     input = &input[used..];
///     if let Some(f) = frame {
///         kinds.push(f.kind);
///         if let Ok(Frame::Clock { firmware_ns, nonce }) = f.parse() {
///             assert_eq!((firmware_ns, nonce), (42_000, 9));
///         }
///     }
/// }
/// assert_eq!(kinds, [kind::HELLO, kind::CHUNK, kind::STATS, kind::CLOCK]);
/// ```
#[derive(Debug)]
pub struct StreamService<'m, IO, B> {
    io: IO,
    reader: RegionReader<'m>,
    control: Control<'m>,
    encoder: FrameEncoder,
    commands: FrameDecoder<[u8; COMMAND_FRAME]>,
    chunk: B,
    /// Ring polls that failed.
    errors: u64,
    /// When the last STATS frame went out (`None`: none yet).
    stats_at: Option<u64>,
    /// A host frame arrived: the link is two-way, and the host asks for
    /// the clock (SYNC) rather than being sent it.
    heard: bool,
}

impl<'m, IO: ByteIo, B: AsMut<[u8]>> StreamService<'m, IO, B> {
    /// The service of the stream-mode region behind `handles`, sending
    /// through `io` and copying chunks through `chunk_buffer`. Sends HELLO.
    /// Run one per region (it is the ring's consumer).
    pub fn new(
        handles: &RegionHandles<'m>,
        io: IO,
        mut chunk_buffer: B,
    ) -> Result<Self, StreamError> {
        if !handles.header.stream_mode() {
            return Err(StreamError::NotStreamMode);
        }
        let reader = RegionReader::attach(handles).map_err(StreamError::Reader)?;
        let (needed, got) = (reader.chunk_buffer_len(), chunk_buffer.as_mut().len());
        if got < needed {
            return Err(StreamError::Reader(ReaderError::BufferTooSmall {
                needed,
                got,
            }));
        }
        let mut service = StreamService {
            io,
            reader,
            control: handles.control,
            encoder: FrameEncoder::new(),
            commands: FrameDecoder::new([0; COMMAND_FRAME]),
            chunk: chunk_buffer,
            errors: 0,
            stats_at: None,
            heard: false,
        };
        service.send_hello();
        Ok(service)
    }

    /// Obeys the host's frames, sends what the ring holds, and STATS when
    /// due (see the type's docs); never waits for the host. `flush` commits
    /// what every writer holds (called for each FLUSH); `clock` is the
    /// firmware's clock.
    pub fn poll(&mut self, mut flush: impl FnMut(), mut clock: impl Clock) {
        for _ in 0..INPUT_PER_POLL {
            let Some(byte) = self.io.read() else { break };
            let (_, frame) = self.commands.push(&[byte]);
            let Some(frame) = frame else { continue };
            let command = frame.parse().ok().and_then(Command::of);
            // A host says no HELLO: one that restarts (a bridge killed
            // and started again) counts its `seq` from 0 again, below the
            // last one heard. Its frames are commands, not data whose loss
            // is counted, so none is dropped for its `seq`.
            self.commands.reset_seq();
            let Some(command) = command else {
                continue;
            };
            self.heard = true;
            match command {
                Command::Enable(on) => self.control.set_trace_enabled(on),
                Command::Clear => {
                    self.control.request_clear();
                }
                Command::Flush => {
                    flush();
                    self.drain();
                    self.send_stats(clock.now_ns());
                }
                Command::Sync(nonce) => {
                    // At once: the reading is as close to the request as the
                    // firmware can make it, and nothing delays the answer.
                    let now = clock.now_ns();
                    let io = &mut self.io;
                    self.encoder.clock(now, nonce, &mut |b: &[u8]| io.write(b));
                }
            }
        }
        self.drain();
        let now = clock.now_ns();
        if self
            .stats_at
            .is_none_or(|at| now.wrapping_sub(at) >= STATS_PERIOD_NS)
        {
            // Not the first period (`new` sent HELLO; a host connected from
            // the start speaks within it).
            if self.stats_at.is_some() {
                // HELLO again: a host that started listening after the
                // firmware did learns its boot.
                self.send_hello();
                // No host frame yet: a one-way link (or no host), so do
                // what a host would ask for. The writers restart their
                // sequences (a host that started listening late gets their
                // interned strings and tracks again), and the clock goes
                // unasked, read right before it is sent (a host that cannot
                // ask relates it one-way).
                if !self.heard {
                    self.control.request_clear();
                    let now = clock.now_ns();
                    let io = &mut self.io;
                    self.encoder.clock(now, 0, &mut |b: &[u8]| io.write(b));
                }
            }
            self.send_stats(now);
        }
    }

    /// HELLO for the region the reader validated last.
    fn send_hello(&mut self) {
        if let Some(header) = self.reader.header() {
            let io = &mut self.io;
            self.encoder
                .hello(&Hello::from_header(header), &mut |b: &[u8]| io.write(b));
        }
    }

    /// Sends every record the ring holds (chunks committed by any writer
    /// while it runs included).
    pub fn drain(&mut self) {
        let io = &mut self.io;
        let mut sink = |b: &[u8]| io.write(b);
        loop {
            match self.reader.poll(self.chunk.as_mut()) {
                Ok(Some(record)) => self.encoder.record(&record, &mut sink),
                Ok(None) => return,
                Err(_) => {
                    self.errors += 1;
                    return;
                }
            }
        }
    }

    fn send_stats(&mut self, now: u64) {
        let c = self.control.counters();
        let stats = FrameStats {
            packets_dropped: c.packets_dropped,
            ring_overflows: c.ring_overflows,
            chunks_lost: c.chunks_lost,
            frames_dropped: 0,
        };
        let io = &mut self.io;
        self.encoder.stats(&stats, &mut |b: &[u8]| io.write(b));
        self.stats_at = Some(now);
    }

    /// Records the drain lost: ring polls that failed, and the region
    /// reader's bad slots, invalid chunks and chunks it could not free.
    /// (What the writers lose the region counts: its `packets_dropped`,
    /// `ring_overflows` and `chunks_lost`, which STATS frames carry.)
    pub fn lost(&self) -> u64 {
        let s = self.reader.stats();
        self.errors + s.bad_slots + s.invalid_chunks + s.release_failures
    }

    /// The region reader (its [`stats`](RegionReader::stats)).
    pub fn reader(&self) -> &RegionReader<'m> {
        &self.reader
    }

    /// The byte channel.
    pub fn io(&mut self) -> &mut IO {
        &mut self.io
    }
}
