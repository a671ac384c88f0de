//! The frame encoder: frames into a caller's byte sink or buffer.

use crate::region::{PatchSlot, Record};

use super::payload::{name_bytes, patch_entry, FrameStats, Hello};
use super::{kind, CRC, CRC_LEN, HEADER_LEN, MAGIC};

/// A buffer could not hold the frame; nothing was written to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferTooSmall {
    /// Bytes the frame needs.
    pub needed: usize,
    /// Bytes available.
    pub got: usize,
}

impl core::fmt::Display for BufferTooSmall {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "frame needs {} bytes, buffer has {}",
            self.needed, self.got
        )
    }
}

impl core::error::Error for BufferTooSmall {}

/// Encodes frames, numbering them. Frames go to a byte sink (a
/// `FnMut(&[u8])` that writes a UART, a ring, a socket...) in a few pieces
/// each, or into a buffer with [`encode_to_slice`](Self::encode_to_slice).
/// Nothing is buffered or allocated.
#[derive(Debug, Clone, Default)]
pub struct FrameEncoder {
    seq: u32,
}

impl FrameEncoder {
    /// An encoder whose first frame has `seq` 0.
    pub const fn new() -> Self {
        FrameEncoder { seq: 0 }
    }

    /// The `seq` of the next frame.
    pub fn next_seq(&self) -> u32 {
        self.seq
    }

    /// Encodes one frame of type `kind` whose payload is `parts`
    /// concatenated.
    pub fn encode<S: FnMut(&[u8])>(&mut self, kind: u8, parts: &[&[u8]], sink: &mut S) {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let mut header = [0u8; HEADER_LEN];
        header[..2].copy_from_slice(&MAGIC);
        header[2] = kind;
        header[4..8].copy_from_slice(&self.seq.to_le_bytes());
        header[8..12].copy_from_slice(&(len as u32).to_le_bytes());
        self.seq = self.seq.wrapping_add(1);
        let mut digest = CRC.digest();
        digest.update(&header);
        sink(&header);
        for part in parts {
            digest.update(part);
            sink(part);
        }
        sink(&digest.finalize().to_le_bytes());
    }

    /// Encodes one frame into the start of `buf`; returns its length.
    pub fn encode_to_slice(
        &mut self,
        kind: u8,
        parts: &[&[u8]],
        buf: &mut [u8],
    ) -> Result<usize, BufferTooSmall> {
        let needed = HEADER_LEN + parts.iter().map(|p| p.len()).sum::<usize>() + CRC_LEN;
        if buf.len() < needed {
            return Err(BufferTooSmall {
                needed,
                got: buf.len(),
            });
        }
        let mut at = 0;
        self.encode(kind, parts, &mut |bytes: &[u8]| {
            if let Some(dst) = buf.get_mut(at..at + bytes.len()) {
                dst.copy_from_slice(bytes);
            }
            at += bytes.len();
        });
        Ok(needed)
    }

    /// HELLO.
    pub fn hello<S: FnMut(&[u8])>(&mut self, hello: &Hello, sink: &mut S) {
        let (ds_len, ds) = name_bytes(&hello.data_source);
        let (p_len, p) = name_bytes(&hello.producer);
        let fixed = hello.fixed_bytes();
        self.encode(kind::HELLO, &[&fixed, &[ds_len], ds, &[p_len], p], sink);
    }

    /// CHUNK: `bytes` is the chunk (8-byte header + the payload in use).
    pub fn chunk<S: FnMut(&[u8])>(&mut self, bytes: &[u8], sink: &mut S) {
        self.encode(kind::CHUNK, &[bytes], sink);
    }

    /// PATCH with one entry.
    pub fn patch<S: FnMut(&[u8])>(&mut self, patch: &PatchSlot, sink: &mut S) {
        self.encode(kind::PATCH, &[&patch_entry(patch)], sink);
    }

    /// CLOCK.
    pub fn clock<S: FnMut(&[u8])>(&mut self, firmware_ns: u64, nonce: u32, sink: &mut S) {
        let mut b = [0u8; 12];
        b[..8].copy_from_slice(&firmware_ns.to_le_bytes());
        b[8..].copy_from_slice(&nonce.to_le_bytes());
        self.encode(kind::CLOCK, &[&b], sink);
    }

    /// STATS.
    pub fn stats<S: FnMut(&[u8])>(&mut self, stats: &FrameStats, sink: &mut S) {
        self.encode(kind::STATS, &[&stats.to_bytes()], sink);
    }

    /// A host command without payload: ENABLE, DISABLE or CLEAR.
    pub fn command<S: FnMut(&[u8])>(&mut self, kind: u8, sink: &mut S) {
        self.encode(kind, &[], sink);
    }

    /// A host command with a u32 argument: FLUSH (request id) or SYNC
    /// (nonce).
    pub fn command_u32<S: FnMut(&[u8])>(&mut self, kind: u8, value: u32, sink: &mut S) {
        self.encode(kind, &[&value.to_le_bytes()], sink);
    }

    /// The frame of one ring record from a
    /// [`RegionReader`](crate::region::RegionReader): CHUNK, PATCH, or for
    /// a reset the HELLO of the new boot. A stream-mode firmware's drain
    /// loop is then:
    ///
    /// ```
    /// # use shmtrace_abi::layout::PageLayout;
    /// # use shmtrace_abi::region::{RegionArbiter, RegionConfig, RegionReader, RegionStorage};
    /// # use shmtrace_abi::writer::TraceWriter;
    /// use shmtrace_abi::frame::{FrameEncoder, Hello};
    /// # let mut storage = Box::new(RegionStorage::<8192, 16>::new());
    /// # let mut config = RegionConfig::new("fw");
    /// # config.stream_mode = true;
    /// # let handles = storage.init(&config).unwrap();
    /// # let mut writer: TraceWriter<_> =
    /// #     TraceWriter::new(RegionArbiter::new(&handles, PageLayout::Div4).unwrap(), 1, 0).unwrap();
    /// # let _ = writer.write_packet(|p| p.uint64(8, 1));
    /// # writer.flush();
    /// # let mut uart = Vec::new();
    /// # let mut uart_write = |b: &[u8]| uart.extend_from_slice(b);
    /// let mut buf = [0u8; 4088]; // chunk_buffer_len(): page size - 8
    /// let mut reader = RegionReader::attach(&handles).unwrap();
    /// let mut enc = FrameEncoder::new();
    /// enc.hello(&Hello::from_header(&handles.header), &mut uart_write);
    /// while let Ok(Some(record)) = reader.poll(&mut buf) {
    ///     enc.record(&record, &mut uart_write);
    /// }
    /// # assert_eq!(enc.next_seq(), 2);
    /// ```
    pub fn record<S: FnMut(&[u8])>(&mut self, record: &Record<'_>, sink: &mut S) {
        match record {
            Record::Chunk(c) => self.chunk(c.bytes, sink),
            Record::Patch(p) => self.patch(p, sink),
            Record::Reset(header) => self.hello(&Hello::from_header(header), sink),
        }
    }
}
