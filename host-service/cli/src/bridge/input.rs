//! Where a bridge's bytes come from: `--input PATH|tcp:HOST:PORT|region:FILE[@OFFSET]`.
//!
//! A stream input (a file, a FIFO, a serial device or pty, a TCP
//! connection: QEMU's `-serial` to any of them, a probe's RTT port) is a
//! [`ByteStream`]: read with a timeout, written to when it has a way back
//! (TCP, character devices), ending at end of file or when the peer
//! closes. A [`StreamSource`] turns it into a
//! [`FirmwareSource`] with a [`StreamDecoder`] (the
//! framed format's hostile decoder). A region input names shared memory
//! (a file QEMU backs guest RAM with, a UIO device) at an offset; its
//! reader is the region decoder's.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::{Duration, Instant};

use super::{FirmwareEvent, FirmwareSource, Request, SourceError};

/// A parsed `--input`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputSpec {
    /// A file, FIFO or device.
    Path(PathBuf),
    /// A TCP server to connect to (`HOST:PORT`).
    Tcp(String),
    /// Shared memory: a file and the offset of the region in it.
    Region {
        /// The file (or device) to map.
        path: PathBuf,
        /// Where the region starts in it.
        offset: u64,
    },
}

/// Why an `--input` is not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid input {input:?}: {why}")]
pub struct InputSpecError {
    /// The text given.
    pub input: String,
    /// What is wrong with it.
    pub why: &'static str,
}

fn parse_u64(s: &str) -> Option<u64> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

impl FromStr for InputSpec {
    type Err = InputSpecError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |why| InputSpecError {
            input: input.to_owned(),
            why,
        };
        if let Some(addr) = input.strip_prefix("tcp:") {
            let (host, port) = addr
                .rsplit_once(':')
                .ok_or_else(|| err("expected tcp:HOST:PORT"))?;
            if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
                return Err(err("expected tcp:HOST:PORT with a port from 1 to 65535"));
            }
            return Ok(InputSpec::Tcp(addr.to_owned()));
        }
        if let Some(rest) = input.strip_prefix("region:") {
            let (path, offset) = match rest.rsplit_once('@') {
                Some((p, o)) => (
                    p,
                    parse_u64(o).ok_or_else(|| err("the offset after @ is not a number"))?,
                ),
                None => (rest, 0),
            };
            if path.is_empty() {
                return Err(err("expected region:FILE[@OFFSET]"));
            }
            return Ok(InputSpec::Region {
                path: path.into(),
                offset,
            });
        }
        if input.is_empty() {
            return Err(err("empty"));
        }
        Ok(InputSpec::Path(input.into()))
    }
}

enum Endpoint {
    File(File),
    Tcp(TcpStream),
}

/// A byte stream input. See the module docs.
pub struct ByteStream {
    endpoint: Endpoint,
    writable: bool,
    name: String,
    baud: Option<u32>,
}

/// Major device numbers of pseudo-terminal slaves (`/dev/pts/N`): their
/// line speed is a setting, not a rate.
const PTY_MAJORS: std::ops::RangeInclusive<u32> = 136..=143;

/// Puts a terminal into raw mode (no echo, no line editing, no character
/// translation: the frames are binary and a cooked tty would echo them back
/// to the firmware), at `baud` if given. Returns the line speed of a real
/// serial device (`None` for a pseudo-terminal).
fn raw_tty(file: &File, baud: Option<u32>) -> io::Result<Option<u32>> {
    let mut termios = rustix::termios::tcgetattr(file)?;
    termios.make_raw();
    if let Some(b) = baud {
        termios.set_speed(b)?;
    }
    rustix::termios::tcsetattr(file, rustix::termios::OptionalActions::Now, &termios)?;
    let rdev = rustix::fs::fstat(file)?.st_rdev;
    if PTY_MAJORS.contains(&rustix::fs::major(rdev)) {
        return Ok(baud);
    }
    Ok(Some(termios.input_speed()).filter(|&s| s > 0))
}

impl std::fmt::Debug for ByteStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ByteStream")
            .field("name", &self.name)
            .finish()
    }
}

/// What one read got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadOutcome {
    /// Bytes were read.
    Data(usize),
    /// Nothing arrived within the timeout.
    Nothing,
    /// The stream ended.
    End,
}

impl ByteStream {
    /// Opens a stream input (a region is not one).
    pub fn open(spec: &InputSpec) -> io::Result<Self> {
        Self::open_with(spec, None)
    }

    /// Opens a stream input; a terminal is put into raw mode, at `baud`
    /// bits/s if given.
    pub fn open_with(spec: &InputSpec, baud: Option<u32>) -> io::Result<Self> {
        match spec {
            InputSpec::Path(path) => {
                let name = path.display().to_string();
                let is_device = std::fs::metadata(path)?.file_type().is_char_device();
                // A serial device or pty takes requests back; a file or
                // FIFO is read only (opening a FIFO for writing too would
                // hide its writer's end of file).
                let file = if is_device {
                    OpenOptions::new().read(true).write(true).open(path)?
                } else {
                    File::open(path)?
                };
                let baud = if is_device && rustix::termios::isatty(&file) {
                    raw_tty(&file, baud)?
                } else {
                    baud
                };
                Ok(ByteStream {
                    endpoint: Endpoint::File(file),
                    writable: is_device,
                    name,
                    baud,
                })
            }
            InputSpec::Tcp(addr) => {
                let stream = TcpStream::connect(addr)?;
                stream.set_nodelay(true)?;
                Ok(ByteStream {
                    endpoint: Endpoint::Tcp(stream),
                    writable: true,
                    name: format!("tcp:{addr}"),
                    baud,
                })
            }
            InputSpec::Region { .. } => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a region is shared memory, not a stream",
            )),
        }
    }

    /// Reads into `buf`, waiting at most `timeout` for bytes.
    pub fn read_timeout(&mut self, buf: &mut [u8], timeout: Duration) -> io::Result<ReadOutcome> {
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        let ready = {
            let fd = match &self.endpoint {
                Endpoint::File(f) => f.as_fd(),
                Endpoint::Tcp(s) => s.as_fd(),
            };
            let mut fds = [rustix::event::PollFd::new(
                &fd,
                rustix::event::PollFlags::IN,
            )];
            let timeout = rustix::event::Timespec {
                tv_sec: i64::from(ms / 1000),
                tv_nsec: i64::from(ms % 1000) * 1_000_000,
            };
            match rustix::event::poll(&mut fds, Some(&timeout)) {
                Ok(n) => n > 0,
                Err(rustix::io::Errno::INTR) => false,
                Err(e) => return Err(e.into()),
            }
        };
        if !ready {
            return Ok(ReadOutcome::Nothing);
        }
        let n = match &mut self.endpoint {
            Endpoint::File(f) => f.read(buf),
            Endpoint::Tcp(s) => s.read(buf),
        };
        match n {
            Ok(0) => Ok(ReadOutcome::End),
            Ok(n) => Ok(ReadOutcome::Data(n)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(ReadOutcome::Nothing),
            // A TCP peer that went with bytes of ours unread (a firmware,
            // or QEMU, that exited while a request was on its way) resets
            // the connection: it ended all the same.
            Err(e)
                if e.kind() == io::ErrorKind::ConnectionReset
                    && matches!(self.endpoint, Endpoint::Tcp(_)) =>
            {
                Ok(ReadOutcome::End)
            }
            // A terminal hung up (a pty whose other side closed: QEMU
            // exited; a USB serial adapter unplugged) fails reads with EIO.
            Err(e)
                if e.raw_os_error() == Some(rustix::io::Errno::IO.raw_os_error())
                    && self.writable =>
            {
                Ok(ReadOutcome::End)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether [`ByteStream::write_all`] reaches the firmware.
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// Sends bytes back to the firmware.
    pub fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this input has no way back to the firmware",
            ));
        }
        match &mut self.endpoint {
            Endpoint::File(f) => f.write_all(bytes),
            Endpoint::Tcp(s) => s.write_all(bytes),
        }
    }

    /// The line speed in bits/s of a serial link (given, or a serial
    /// device's setting), for transfer times.
    pub fn baud(&self) -> Option<u32> {
        self.baud
    }

    /// What it reads (for messages).
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Turns the bytes of a stream into firmware events: the framed format's
/// decoder. It must take any bytes without panicking and with bounded
/// memory, counting what it cannot use.
pub trait StreamDecoder: Send {
    /// Feeds bytes read from the stream.
    fn push(&mut self, bytes: &[u8]);
    /// The stream ended: whatever is buffered is decoded or counted.
    fn finish(&mut self) {}
    /// The next event decoded, if any.
    fn next_event(&mut self) -> Option<FirmwareEvent>;
    /// What was lost so far (bad CRC, gaps in sequence numbers, bytes
    /// skipped, oversized frames, ...), cumulative, by name.
    fn loss(&self) -> Vec<(&'static str, u64)>;
    /// What the decoder did that is no loss (frames decoded, ...).
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
    /// Appends the frame asking the firmware for `request` to `out`;
    /// `false` if the format has none for it.
    fn encode_request(&mut self, request: Request, out: &mut Vec<u8>) -> bool;
    /// A flush was sent and the firmware has not shown it done yet.
    fn flush_pending(&self) -> bool {
        false
    }
    /// Stops waiting for the pending flush (counted).
    fn give_up_flush(&mut self) {}
    /// The last flush's end has not been seen yet, also one given up on:
    /// the firmware obeys its commands in order, so it is still committing
    /// and sending what that flush asked for, and a request sent now waits
    /// behind it.
    fn flush_unanswered(&self) -> bool {
        false
    }
}

/// How long a stream's flush waits for the firmware to show it done.
pub const FLUSH_DONE_WAIT: Duration = Duration::from_millis(400);

/// How long the firmware is taken to be busy with a flush whose end was
/// not seen ([`StreamDecoder::flush_unanswered`]) at most: past that its
/// answer is taken as lost.
pub const FLUSH_ANSWER_WAIT: Duration = Duration::from_secs(2);

/// How long a stream may say nothing a firmware sends before the user is
/// told what to check.
pub const SILENCE_HINT_AFTER: Duration = Duration::from_secs(5);

/// A [`FirmwareSource`] over a [`ByteStream`] and a [`StreamDecoder`].
pub struct StreamSource<D> {
    stream: ByteStream,
    decoder: D,
    buf: Box<[u8]>,
    ended: bool,
    /// Until when a flush may wait for the firmware.
    flush_deadline: Option<Instant>,
    /// When the last flush was sent.
    flush_sent: Option<Instant>,
    /// Requests whose frame could not be sent.
    pub requests_failed: u64,
    /// When the stream was opened, until its first event (then `None`),
    /// or until the user was told about the silence.
    silent_since: Option<Instant>,
    /// Bytes read.
    bytes: u64,
}

impl<D: StreamDecoder> StreamSource<D> {
    /// Reads `stream` through `decoder`.
    pub fn new(stream: ByteStream, decoder: D) -> Self {
        StreamSource {
            stream,
            decoder,
            buf: vec![0; 64 * 1024].into_boxed_slice(),
            ended: false,
            flush_deadline: None,
            flush_sent: None,
            requests_failed: 0,
            silent_since: Some(Instant::now()),
            bytes: 0,
        }
    }

    /// What to tell the user once, at `now`, when the stream has given no
    /// event since it was opened [`SILENCE_HINT_AFTER`] ago: nothing that
    /// is a firmware's (no byte, or bytes that are no frame).
    pub fn silence_hint(&mut self, now: Instant) -> Option<String> {
        let since = self.silent_since?;
        if now.saturating_duration_since(since) < SILENCE_HINT_AFTER {
            return None;
        }
        self.silent_since = None;
        let heard = match self.bytes {
            0 => "no byte yet".to_owned(),
            n => format!("{n} bytes read, none of them a frame"),
        };
        Some(format!(
            "{}: nothing from a firmware after {} s ({heard}): is it running, with its region \
             taken in stream mode and a StreamService sending on this line at this baud rate? \
             (A firmware for shared RAM sends nothing here: `shmtrace serve --attach` reads it.)",
            self.stream.name(),
            SILENCE_HINT_AFTER.as_secs()
        ))
    }

    /// The decoder.
    pub fn decoder(&self) -> &D {
        &self.decoder
    }
}

impl<D: StreamDecoder> FirmwareSource for StreamSource<D> {
    fn poll(&mut self, timeout: Duration) -> Result<Option<FirmwareEvent>, SourceError> {
        if let Some(e) = self.decoder.next_event() {
            self.silent_since = None;
            return Ok(Some(e));
        }
        if self.ended {
            return Err(SourceError::Ended);
        }
        match self.stream.read_timeout(&mut self.buf, timeout) {
            Ok(ReadOutcome::Data(n)) => {
                self.bytes += n as u64;
                self.decoder.push(&self.buf[..n]);
                let event = self.decoder.next_event();
                if event.is_some() {
                    self.silent_since = None;
                } else if let Some(hint) = self.silence_hint(Instant::now()) {
                    log::info!("{hint}");
                }
                Ok(event)
            }
            Ok(ReadOutcome::Nothing) => {
                if let Some(hint) = self.silence_hint(Instant::now()) {
                    log::info!("{hint}");
                }
                Ok(None)
            }
            Ok(ReadOutcome::End) => {
                self.ended = true;
                self.decoder.finish();
                if self.decoder.flush_pending() {
                    self.decoder.give_up_flush();
                }
                Ok(self.decoder.next_event())
            }
            Err(e) => Err(SourceError::Failed(format!("read: {e}"))),
        }
    }

    fn transport_loss(&self) -> Vec<(&'static str, u64)> {
        self.decoder.loss()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let mut c = self.decoder.counters();
        c.push(("requests_failed", self.requests_failed));
        c
    }

    fn request(&mut self, request: Request) -> bool {
        if !self.stream.is_writable() || self.ended {
            return false;
        }
        let mut frame = Vec::new();
        if !self.decoder.encode_request(request, &mut frame) {
            return false;
        }
        let sent = self.stream.write_all(&frame).is_ok();
        if !sent {
            self.requests_failed += 1;
            self.decoder.give_up_flush();
        } else if request == Request::Flush && self.decoder.flush_pending() {
            let now = Instant::now();
            self.flush_deadline = Some(now + FLUSH_DONE_WAIT);
            self.flush_sent = Some(now);
        }
        sent
    }

    fn flush_pending(&mut self) -> bool {
        if !self.decoder.flush_pending() {
            return false;
        }
        if self.flush_deadline.is_none_or(|d| Instant::now() >= d) {
            log::debug!("gave up waiting for the flush after {FLUSH_DONE_WAIT:?}");
            self.decoder.give_up_flush();
            return false;
        }
        true
    }

    fn can_sync(&self) -> bool {
        self.stream.is_writable()
    }

    fn flush_unanswered(&self) -> bool {
        !self.ended
            && self.decoder.flush_unanswered()
            && self
                .flush_sent
                .is_some_and(|t| t.elapsed() < FLUSH_ANSWER_WAIT)
    }

    fn link_lost(&self) -> bool {
        self.ended && self.stream.is_writable()
    }

    fn describe(&self) -> String {
        self.stream.name().to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bridge::Hello;

    /// A pty whose other side closed (QEMU exited) fails reads with EIO:
    /// the input's end, which for a two-way link means the firmware was
    /// lost (the engine marks it), not a failed input.
    #[test]
    fn a_hung_up_terminal_is_the_input_s_end() {
        use rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};
        let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).expect("openpt");
        grantpt(&master).expect("grantpt");
        unlockpt(&master).expect("unlockpt");
        let name = ptsname(&master, Vec::new()).expect("ptsname");
        let path = PathBuf::from(name.to_str().expect("a path"));
        let mut input = ByteStream::open(&InputSpec::Path(path)).expect("the pty opens");
        assert!(input.is_writable());
        rustix::io::write(&master, b"ab").expect("write");
        let mut buf = [0u8; 16];
        let wait = Duration::from_secs(5);
        assert_eq!(
            input.read_timeout(&mut buf, wait).unwrap(),
            ReadOutcome::Data(2)
        );
        drop(master);
        assert_eq!(
            input.read_timeout(&mut buf, wait).unwrap(),
            ReadOutcome::End
        );
    }

    /// A TCP peer that closes with bytes of ours unread resets the
    /// connection: the input's end too.
    #[test]
    fn a_reset_tcp_connection_is_the_input_s_end() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let addr = listener.local_addr().expect("address").to_string();
        let mut input = ByteStream::open(&InputSpec::Tcp(addr)).expect("connect");
        let (peer, _) = listener.accept().expect("accept");
        input.write_all(b"unread").expect("write");
        std::thread::sleep(Duration::from_millis(50));
        drop(peer);
        let mut buf = [0u8; 16];
        let outcome = input.read_timeout(&mut buf, Duration::from_secs(5));
        assert_eq!(outcome.unwrap(), ReadOutcome::End);
    }

    #[test]
    fn inputs_parse_or_say_why_not() {
        let ok = |s: &str| s.parse::<InputSpec>().unwrap();
        assert_eq!(ok("/dev/ttyUSB0"), InputSpec::Path("/dev/ttyUSB0".into()));
        assert_eq!(
            ok("tcp:localhost:4444"),
            InputSpec::Tcp("localhost:4444".into())
        );
        assert_eq!(ok("tcp:[::1]:4444"), InputSpec::Tcp("[::1]:4444".into()));
        assert_eq!(
            ok("region:/dev/shm/ram@0x1000"),
            InputSpec::Region {
                path: "/dev/shm/ram".into(),
                offset: 0x1000
            }
        );
        assert_eq!(
            ok("region:ram.bin"),
            InputSpec::Region {
                path: "ram.bin".into(),
                offset: 0
            }
        );
        for bad in [
            "",
            "tcp:host",
            "tcp::80",
            "tcp:host:0",
            "tcp:host:99999",
            "region:",
            "region:f@x",
        ] {
            let e = bad.parse::<InputSpec>().unwrap_err();
            assert_eq!(e.input, bad);
            assert!(e.to_string().starts_with("invalid input"), "{e}");
        }
    }

    /// A test decoder: each line `hello NAME` is a hello, any other line a
    /// chunk of its bytes; a line over 16 bytes is lost, counted.
    #[derive(Default)]
    struct Lines {
        partial: Vec<u8>,
        events: std::collections::VecDeque<FirmwareEvent>,
        lost: u64,
    }

    impl StreamDecoder for Lines {
        fn push(&mut self, bytes: &[u8]) {
            for &b in bytes {
                if b != b'\n' {
                    self.partial.push(b);
                    continue;
                }
                let line = std::mem::take(&mut self.partial);
                if line.len() > 16 {
                    self.lost += 1;
                } else if let Some(name) = line.strip_prefix(b"hello ") {
                    self.events.push_back(FirmwareEvent::Hello(Hello {
                        boot_id: 1,
                        data_source: String::from_utf8_lossy(name).into_owned(),
                        producer: String::new(),
                        clock_id: 6,
                    }));
                } else {
                    self.events.push_back(FirmwareEvent::Chunk(line));
                }
            }
        }
        fn next_event(&mut self) -> Option<FirmwareEvent> {
            self.events.pop_front()
        }
        fn loss(&self) -> Vec<(&'static str, u64)> {
            vec![("long_lines", self.lost)]
        }
        fn encode_request(&mut self, request: Request, out: &mut Vec<u8>) -> bool {
            match request {
                Request::Sync(n) => {
                    out.extend_from_slice(format!("sync {n}\n").as_bytes());
                    true
                }
                _ => false,
            }
        }
    }

    fn drain(source: &mut dyn FirmwareSource) -> (Vec<FirmwareEvent>, bool) {
        let mut events = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            match source.poll(Duration::from_millis(20)) {
                Ok(Some(e)) => events.push(e),
                Ok(None) => {}
                Err(SourceError::Ended) => return (events, true),
                Err(e) => panic!("{e}"),
            }
        }
        (events, false)
    }

    #[test]
    fn a_file_is_read_to_its_end_and_takes_no_requests() {
        let path = std::env::temp_dir().join(format!("shmtrace-input-{}", std::process::id()));
        std::fs::write(&path, b"hello fw\nabc\nthis line is far too long\nxyz\n").unwrap();
        let stream = ByteStream::open(&InputSpec::Path(path.clone())).unwrap();
        let mut source = StreamSource::new(stream, Lines::default());
        assert!(!source.can_sync());
        assert!(!source.request(Request::Sync(1)));
        let (events, ended) = drain(&mut source);
        assert!(ended);
        assert_eq!(events.len(), 3);
        assert_eq!(events[1], FirmwareEvent::Chunk(b"abc".to_vec()));
        assert_eq!(source.transport_loss(), [("long_lines", 1)]);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn tcp_waits_for_bytes_carries_requests_back_and_ends_when_closed() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let spec: InputSpec = format!("tcp:127.0.0.1:{port}").parse().unwrap();
        let stream = ByteStream::open(&spec).unwrap();
        let (mut firmware, _) = listener.accept().unwrap();
        let mut source = StreamSource::new(stream, Lines::default());
        assert_eq!(source.describe(), format!("tcp:127.0.0.1:{port}"));
        // Nothing yet: the poll times out.
        let start = std::time::Instant::now();
        assert_eq!(source.poll(Duration::from_millis(30)).unwrap(), None);
        assert!(start.elapsed() >= Duration::from_millis(25));
        assert!(source.can_sync());
        assert!(source.request(Request::Sync(7)));
        assert!(!source.request(Request::Clear), "no frame for it");
        let mut asked = [0u8; 7];
        firmware.read_exact(&mut asked).unwrap();
        assert_eq!(&asked, b"sync 7\n");
        firmware.write_all(b"hello net\nchunk\n").unwrap();
        drop(firmware);
        let (events, ended) = drain(&mut source);
        assert!(ended);
        assert_eq!(events.len(), 2);
        assert_eq!(events[1], FirmwareEvent::Chunk(b"chunk".to_vec()));
    }

    /// A line that carries nothing a firmware sends (a firmware built for
    /// shared RAM, the wrong port or baud rate) is told once, after
    /// [`SILENCE_HINT_AFTER`]; one that spoke is never told.
    #[test]
    fn a_silent_stream_is_told_once_what_to_check() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let spec: InputSpec = format!("tcp:127.0.0.1:{port}").parse().unwrap();
        let mut source = StreamSource::new(ByteStream::open(&spec).unwrap(), Lines::default());
        let (firmware, _) = listener.accept().unwrap();
        let opened = Instant::now();
        assert_eq!(source.poll(Duration::from_millis(5)).unwrap(), None);
        assert_eq!(source.silence_hint(opened), None, "too early");
        let later = opened + SILENCE_HINT_AFTER + Duration::from_millis(1);
        assert_eq!(
            source.silence_hint(later).as_deref(),
            Some(
                format!(
                    "tcp:127.0.0.1:{port}: nothing from a firmware after 5 s (no byte yet): is it \
                     running, with its region taken in stream mode and a StreamService sending \
                     on this line at this baud rate? (A firmware for shared RAM sends nothing \
                     here: `shmtrace serve --attach` reads it.)"
                )
                .as_str()
            )
        );
        assert_eq!(source.silence_hint(later), None, "told once");
        // Bytes that make no event are counted in what it says.
        let mut source = StreamSource::new(ByteStream::open(&spec).unwrap(), Lines::default());
        let (mut other, _) = listener.accept().unwrap();
        other.write_all(b"no newline").unwrap();
        while source.bytes < 10 {
            assert_eq!(source.poll(Duration::from_millis(20)).unwrap(), None);
        }
        let hint = source
            .silence_hint(Instant::now() + SILENCE_HINT_AFTER)
            .unwrap();
        assert!(
            hint.contains("(10 bytes read, none of them a frame)"),
            "{hint}"
        );
        // A stream that gave an event is never told.
        let mut source = StreamSource::new(ByteStream::open(&spec).unwrap(), Lines::default());
        let (mut third, _) = listener.accept().unwrap();
        third.write_all(b"hello fw\n").unwrap();
        while source.poll(Duration::from_millis(20)).unwrap().is_none() {}
        assert_eq!(
            source.silence_hint(Instant::now() + 2 * SILENCE_HINT_AFTER),
            None
        );
        drop((firmware, other));
    }

    #[test]
    fn a_region_is_not_a_stream_and_a_missing_file_is_an_error() {
        let region = InputSpec::Region {
            path: "x".into(),
            offset: 0,
        };
        assert_eq!(
            ByteStream::open(&region).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        let missing = InputSpec::Path("/nonexistent/shmtrace-input".into());
        assert_eq!(
            ByteStream::open(&missing).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }
}
