//! `compressed_packets` (TracePacket field 50): a batch of packets, encoded
//! as a `Trace` (`0x0A len packet ...`) and deflated by the service when the
//! TraceConfig asks for compression.
//!
//! Perfetto writes the zlib format (deflate with a 2-byte header and an
//! Adler-32 trailer); gzip and raw deflate streams are accepted too, told
//! apart by their first bytes. Decompression is bounded by
//! [`MAX_DECOMPRESSED`], so a hostile trace cannot make `inspect` allocate
//! without limit.

use std::io::Read;

use flate2::read::{DeflateDecoder, GzDecoder, ZlibDecoder};

use crate::trace_file::MAX_PACKET_LEN;

/// Most bytes one `compressed_packets` may inflate to (the largest packet
/// a trace file may hold).
pub const MAX_DECOMPRESSED: u64 = MAX_PACKET_LEN;

/// Why a `compressed_packets` payload cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum InflateError {
    /// The stream is not valid deflate data.
    #[error("not valid {format} data: {source}")]
    Corrupt {
        /// `zlib`, `gzip` or `deflate`.
        format: &'static str,
        /// The decoder's complaint.
        source: std::io::Error,
    },
    /// It inflates to more than [`MAX_DECOMPRESSED`] bytes.
    #[error("inflates to more than {MAX_DECOMPRESSED} bytes")]
    TooLarge,
}

/// The container format of `data`: a zlib header (CM = 8, header checksum
/// a multiple of 31), the gzip magic, else raw deflate.
fn format_of(data: &[u8]) -> &'static str {
    match data {
        [0x1f, 0x8b, ..] => "gzip",
        [cmf, flg, ..] if cmf & 0x0f == 8 && (u16::from(*cmf) << 8 | u16::from(*flg)) % 31 == 0 => {
            "zlib"
        }
        _ => "deflate",
    }
}

/// Inflates a `compressed_packets` payload; the result is a serialized
/// `Trace`.
pub fn inflate(data: &[u8]) -> Result<Vec<u8>, InflateError> {
    let format = format_of(data);
    let reader: Box<dyn Read + '_> = match format {
        "gzip" => Box::new(GzDecoder::new(data)),
        "zlib" => Box::new(ZlibDecoder::new(data)),
        _ => Box::new(DeflateDecoder::new(data)),
    };
    let mut out = Vec::new();
    reader
        .take(MAX_DECOMPRESSED + 1)
        .read_to_end(&mut out)
        .map_err(|source| InflateError::Corrupt { format, source })?;
    if out.len() as u64 > MAX_DECOMPRESSED {
        return Err(InflateError::TooLarge);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use flate2::write::{DeflateEncoder, GzEncoder, ZlibEncoder};
    use flate2::Compression;

    use super::*;

    const TRACE: &[u8] = &[0x0a, 0x02, 0x50, 0x07, 0x0a, 0x00];

    #[test]
    fn all_three_formats_inflate() {
        let mut zlib = ZlibEncoder::new(Vec::new(), Compression::best());
        zlib.write_all(TRACE).unwrap();
        let mut gzip = GzEncoder::new(Vec::new(), Compression::fast());
        gzip.write_all(TRACE).unwrap();
        let mut raw = DeflateEncoder::new(Vec::new(), Compression::default());
        raw.write_all(TRACE).unwrap();
        for (data, format) in [
            (zlib.finish().unwrap(), "zlib"),
            (gzip.finish().unwrap(), "gzip"),
            (raw.finish().unwrap(), "deflate"),
        ] {
            assert_eq!(format_of(&data), format);
            assert_eq!(inflate(&data).unwrap(), TRACE, "{format}");
        }
    }

    #[test]
    fn corrupt_data_is_an_error() {
        let mut zlib = ZlibEncoder::new(Vec::new(), Compression::best());
        zlib.write_all(TRACE).unwrap();
        let mut data = zlib.finish().unwrap();
        let last = data.len() - 1;
        data[last] ^= 0xff; // the Adler-32 trailer
        let e = inflate(&data).unwrap_err();
        assert!(
            matches!(e, InflateError::Corrupt { format: "zlib", .. }),
            "{e}"
        );
    }
}
