//! Trace files: a serialized `Trace` message, that is a sequence of
//! `0x0A varint(len) <TracePacket bytes>` (field 1, length-delimited), the
//! format the real Perfetto writes and `ui.perfetto.dev` opens.
//!
//! [`PacketReader`] streams the packets of a file without loading it whole;
//! it never panics, bounds every allocation by [`MAX_PACKET_LEN`], and
//! reports a damaged file as one [`ReadError`] naming the byte offset (then
//! stops). [`write_preamble`] writes the bytes that precede a packet.

use std::io::{self, BufRead, BufReader, Read, Write};

use shmtrace_abi::proto::wire::{
    put_varint, VarintDecoder, WireType, MAX_MESSAGE_LEN, MAX_VARINT_LEN,
};
use shmtrace_abi::trace::{tag1, trace_packet};
use thiserror::Error;

/// The tag of `Trace.packet`: field 1, wire type 2 (`0x0A`).
pub const PACKET_TAG: u8 = tag1(
    trace_packet::TRACE_PACKET_IN_TRACE,
    WireType::LengthDelimited,
);

/// Largest packet accepted (Perfetto's own limit on a length-delimited
/// field, 256 MiB - 1).
pub const MAX_PACKET_LEN: u64 = MAX_MESSAGE_LEN as u64;

/// Why the packets of a file cannot be read (further).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ReadError {
    /// Reading failed.
    #[error("read error: {0}")]
    Io(#[from] io::Error),
    /// The file is compressed.
    #[error("the file is {0}-compressed; decompress it first")]
    Compressed(&'static str),
    /// Something other than a packet where a packet must start.
    #[error("byte {offset}: expected a packet (tag 0x0A), found byte 0x{found:02x}; not a Perfetto trace, or damaged")]
    NotAPacket {
        /// File offset.
        offset: u64,
        /// The byte found.
        found: u8,
    },
    /// A packet length that is not a valid varint or is too large.
    #[error("byte {offset}: invalid packet length")]
    BadLength {
        /// File offset of the length.
        offset: u64,
    },
    /// The file ends inside a packet.
    #[error("the file ends inside packet #{index} (byte {offset}: {got} of {expected} bytes present); the trace was cut short")]
    Truncated {
        /// Index of the cut packet.
        index: u64,
        /// File offset of its tag.
        offset: u64,
        /// Its declared length.
        expected: u64,
        /// Bytes present.
        got: u64,
    },
}

/// One packet read from a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawPacket {
    /// 0-based index in the file.
    pub index: u64,
    /// File offset of its tag.
    pub offset: u64,
    /// The `TracePacket` bytes.
    pub bytes: Vec<u8>,
}

/// Streams the packets of a trace.
#[derive(Debug)]
pub struct PacketReader<R> {
    input: BufReader<R>,
    offset: u64,
    index: u64,
    failed: bool,
}

impl<R: Read> PacketReader<R> {
    /// Reads packets from `input`.
    pub fn new(input: R) -> Self {
        PacketReader {
            input: BufReader::with_capacity(1 << 16, input),
            offset: 0,
            index: 0,
            failed: false,
        }
    }

    /// Bytes consumed so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    fn next_packet(&mut self) -> Result<Option<RawPacket>, ReadError> {
        let start = self.offset;
        let buf = self.input.fill_buf()?;
        let Some(&tag) = buf.first() else {
            return Ok(None);
        };
        if tag != PACKET_TAG {
            if start == 0 {
                if buf.starts_with(&[0x1f, 0x8b]) {
                    return Err(ReadError::Compressed("gzip"));
                }
                if buf.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
                    return Err(ReadError::Compressed("zstd"));
                }
            }
            return Err(ReadError::NotAPacket {
                offset: start,
                found: tag,
            });
        }
        self.input.consume(1);
        self.offset += 1;
        let len = self.read_varint().map_err(|e| match e {
            VarintError::Io(e) => ReadError::Io(e),
            VarintError::Eof => ReadError::Truncated {
                index: self.index,
                offset: start,
                expected: 0,
                got: 0,
            },
            VarintError::Invalid => ReadError::BadLength { offset: start + 1 },
        })?;
        if len > MAX_PACKET_LEN {
            return Err(ReadError::BadLength { offset: start + 1 });
        }
        let mut bytes = Vec::new();
        // `len` is bounded above, so the allocation is too; `take` stops at
        // the end of the file.
        let got = (&mut self.input).take(len).read_to_end(&mut bytes)? as u64;
        self.offset += got;
        if got < len {
            return Err(ReadError::Truncated {
                index: self.index,
                offset: start,
                expected: len,
                got,
            });
        }
        let packet = RawPacket {
            index: self.index,
            offset: start,
            bytes,
        };
        self.index += 1;
        Ok(Some(packet))
    }

    fn read_varint(&mut self) -> Result<u64, VarintError> {
        let mut varint = VarintDecoder::new();
        loop {
            let mut byte = [0u8];
            if self.input.read(&mut byte).map_err(VarintError::Io)? == 0 {
                return Err(VarintError::Eof);
            }
            self.offset += 1;
            match varint.push(byte[0]) {
                Ok(Some(value)) => return Ok(value),
                Ok(None) => {}
                Err(_) => return Err(VarintError::Invalid),
            }
        }
    }
}

enum VarintError {
    Io(io::Error),
    Eof,
    Invalid,
}

impl<R: Read> Iterator for PacketReader<R> {
    type Item = Result<RawPacket, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let item = self.next_packet().transpose();
        self.failed = matches!(item, Some(Err(_)));
        item
    }
}

/// Writes the bytes that precede a packet of `len` bytes in a trace file.
pub fn write_preamble(out: &mut impl Write, len: usize) -> io::Result<usize> {
    let mut buf = [0u8; 1 + MAX_VARINT_LEN];
    buf[0] = PACKET_TAG;
    let mut varint = [0u8; MAX_VARINT_LEN];
    let n = put_varint(len as u64, &mut varint);
    buf[1..=n].copy_from_slice(&varint[..n]);
    out.write_all(&buf[..=n])?;
    Ok(1 + n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(packets: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in packets {
            write_preamble(&mut out, p.len()).unwrap();
            out.extend_from_slice(p);
        }
        out
    }

    #[test]
    fn preamble_bytes() {
        let mut out = Vec::new();
        assert_eq!(write_preamble(&mut out, 5).unwrap(), 2);
        assert_eq!(write_preamble(&mut out, 300).unwrap(), 3);
        assert_eq!(out, [0x0a, 0x05, 0x0a, 0xac, 0x02]);
    }

    #[test]
    fn reads_back_what_was_written() {
        let big = vec![7u8; 70_000];
        let bytes = trace(&[b"ab", b"", &big]);
        let packets: Vec<_> = PacketReader::new(bytes.as_slice())
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(packets.len(), 3);
        assert_eq!(packets[0].bytes, b"ab");
        assert_eq!((packets[1].index, packets[1].offset), (1, 4));
        assert_eq!(packets[2].bytes, big);
    }

    #[test]
    fn damage_is_reported_once_with_its_offset() {
        let mut bytes = trace(&[b"abc", b"defgh"]);
        bytes.truncate(bytes.len() - 2);
        let mut reader = PacketReader::new(bytes.as_slice());
        assert!(reader.next().unwrap().is_ok());
        match reader.next() {
            Some(Err(ReadError::Truncated {
                index: 1,
                offset: 5,
                expected: 5,
                got: 3,
            })) => {}
            other => panic!("{other:?}"),
        }
        assert!(reader.next().is_none());

        let garbage = [0x0a, 0x01, 0x00, 0x12, 0x00];
        let results: Vec<_> = PacketReader::new(&garbage[..]).collect();
        assert!(matches!(
            results[1],
            Err(ReadError::NotAPacket {
                offset: 3,
                found: 0x12
            })
        ));
        let gz = [0x1f, 0x8b, 0x08];
        assert!(matches!(
            PacketReader::new(&gz[..]).next(),
            Some(Err(ReadError::Compressed("gzip")))
        ));
        let huge_len = [0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f];
        assert!(matches!(
            PacketReader::new(&huge_len[..]).next(),
            Some(Err(ReadError::BadLength { offset: 1 }))
        ));
        let endless_varint = [
            0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        ];
        assert!(matches!(
            PacketReader::new(&endless_varint[..]).next(),
            Some(Err(ReadError::BadLength { offset: 1 }))
        ));
    }
}
