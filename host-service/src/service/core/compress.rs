//! Service-side trace compression: `TraceConfig.compression { deflate {} }`
//! and the deprecated `compression_type: COMPRESSION_TYPE_DEFLATE`.
//!
//! Like upstream (`TracingServiceImpl::MaybeCompressPackets`,
//! src/tracing/service/tracing_service_impl.cc, and `ZlibCompressFn`,
//! src/tracing/service/zlib_compressor.cc), every batch of packets a read
//! produces — service packets included — becomes one `TracePacket` holding
//! only `compressed_packets` (field 50): the zlib stream (deflate level 6,
//! zlib header and Adler-32 trailer) of the batch serialized as a `Trace`,
//! each packet preceded by its `Trace.packet` tag and length. The
//! compressed packet carries no trusted fields of its own: the packets
//! inside keep theirs.
//!
//! Invariants: a [`Deflater`] holds one batch's compressed output and
//! nothing of the input; a batch inflates to exactly the bytes the same
//! read would have sent uncompressed.
//!
//! zstd (`compression { zstd {} }`) is refused at `EnableTracing`
//! ([`ConfigError::ZstdCompression`](super::ConfigError::ZstdCompression)).

use std::io::Write;

use flate2::write::ZlibEncoder;
use flate2::Compression;
use shmtrace_abi::trace::trace_packet;

use super::readback::PACKET_TAG;

use crate::protos::trace_config::CompressionType;
use crate::protos::wire::{put_tag, put_varint, WireType as Wt};
use crate::protos::TraceConfig;

/// Largest slice of a compressed packet sent in a `ReadBuffersResponse`
/// (upstream's `kCompressSliceSize`, 128 KiB - 512,
/// src/tracing/service/packet_compressor_common.h).
pub const COMPRESS_SLICE_SIZE: usize = 128 * 1024 - 512;

/// The zlib level upstream's compressor uses (`deflateInit(&stream_, 6)`,
/// src/tracing/service/zlib_compressor.cc).
const LEVEL: u32 = 6;

/// Whether `config` asks for deflate: `compression.deflate` set, or the
/// deprecated `compression_type` is `COMPRESSION_TYPE_DEFLATE` (upstream
/// ignores other values, and an empty `compression`).
pub fn wants_deflate(config: &TraceConfig) -> bool {
    config
        .compression
        .as_ref()
        .is_some_and(|c| c.deflate.is_some())
        || config.compression_type == Some(CompressionType::Deflate as i32)
}

/// One compressed `TracePacket`: `preamble` (the `compressed_packets` tag
/// and length) followed by `data` (the zlib stream).
pub struct Compressed {
    /// The tag and length of field 50.
    pub preamble: Vec<u8>,
    /// The zlib stream.
    pub data: Vec<u8>,
}

impl Compressed {
    /// The packet's length in bytes.
    pub fn len(&self) -> usize {
        self.preamble.len() + self.data.len()
    }
}

/// Compresses one batch of packets.
pub struct Deflater {
    encoder: ZlibEncoder<Vec<u8>>,
    /// Bytes taken so far (packets with their preambles).
    input: usize,
}

impl Deflater {
    /// An empty batch.
    pub fn new() -> Self {
        Self {
            encoder: ZlibEncoder::new(Vec::new(), Compression::new(LEVEL)),
            input: 0,
        }
    }

    /// Adds one packet, made of `slices` totalling `len` bytes, with its
    /// `Trace.packet` preamble.
    pub fn packet<'a>(&mut self, slices: impl Iterator<Item = &'a [u8]>, len: usize) {
        let mut preamble = Vec::with_capacity(11);
        preamble.push(PACKET_TAG);
        put_varint(&mut preamble, len as u64);
        self.write(&preamble);
        for s in slices {
            self.write(s);
        }
        self.input += preamble.len() + len;
    }

    /// Bytes taken so far: the length of the batch as a `Trace`.
    pub fn input(&self) -> usize {
        self.input
    }

    fn write(&mut self, bytes: &[u8]) {
        // The encoder writes into a Vec, which takes every byte: the only
        // errors `write_all` could return come from its inner writer.
        let result = self.encoder.write_all(bytes);
        debug_assert!(result.is_ok());
    }

    /// Ends the zlib stream: the compressed packet.
    pub fn finish(self) -> Compressed {
        // As in `write`: finishing into a Vec cannot fail; an error would
        // leave an unterminated stream, which inflaters report.
        let data = match self.encoder.finish() {
            Ok(data) => data,
            Err(e) => {
                log::warn!("finishing a compressed batch failed: {e}");
                Vec::new()
            }
        };
        let mut preamble = Vec::with_capacity(12);
        put_tag(
            &mut preamble,
            trace_packet::COMPRESSED_PACKETS,
            Wt::LengthDelimited,
        );
        put_varint(&mut preamble, data.len() as u64);
        Compressed { preamble, data }
    }
}
