//! Typed frame payloads: parsing (hostile input) and the byte forms the
//! encoder writes.

use core::fmt;

use crate::layout::CHUNK_HEADER_SIZE;
use crate::region::{HeaderRepr, Name, NameError, PatchSlot, NAME_LEN, PATCH_HAS_MORE};

use super::{kind, VERSION};

/// Bytes of one PATCH entry.
pub const PATCH_ENTRY_LEN: usize = 16;
/// Fixed part of a HELLO payload (before the names).
const HELLO_FIXED_LEN: usize = 20;
/// The longest HELLO payload: the fixed part and two names of at most
/// [`NAME_LEN`](crate::region::NAME_LEN) bytes, each after its length.
pub(crate) const HELLO_MAX_LEN: usize = HELLO_FIXED_LEN + 2 * (1 + crate::region::NAME_LEN);
/// The shortest HELLO payload: the fixed part, a one-byte data source
/// name and an empty producer name, each after its length.
pub(crate) const HELLO_MIN_LEN: usize = HELLO_FIXED_LEN + 1 + 1 + 1;
/// Bytes of a STATS payload.
const STATS_LEN: usize = 16;

/// HELLO: who the firmware is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Frame format version.
    pub version: u16,
    /// Differs between boots.
    pub boot_id: u32,
    /// The firmware's absolute clock id.
    pub clock_id: u32,
    /// SMB page size (largest chunk: `page_size - 8`).
    pub page_size: u32,
    /// Reserved flags (0).
    pub flags: u32,
    /// Data source name (non-empty).
    pub data_source: Name,
    /// Producer name.
    pub producer: Name,
}

impl Hello {
    /// The HELLO describing a region.
    pub fn from_header(header: &HeaderRepr) -> Self {
        Hello {
            version: VERSION,
            boot_id: header.boot_id,
            clock_id: header.clock_id,
            page_size: header.smb.page_size.get() as u32,
            flags: 0,
            data_source: header.data_source,
            producer: header.producer,
        }
    }

    /// The fixed part of the payload (the names follow).
    pub(crate) fn fixed_bytes(&self) -> [u8; HELLO_FIXED_LEN] {
        let mut b = [0u8; HELLO_FIXED_LEN];
        put(&mut b, 0, &self.version.to_le_bytes());
        put(&mut b, 4, &self.boot_id.to_le_bytes());
        put(&mut b, 8, &self.clock_id.to_le_bytes());
        put(&mut b, 12, &self.page_size.to_le_bytes());
        put(&mut b, 16, &self.flags.to_le_bytes());
        b
    }
}

fn put(dst: &mut [u8], at: usize, src: &[u8]) {
    if let Some(d) = dst.get_mut(at..at + src.len()) {
        d.copy_from_slice(src);
    }
}

/// Length byte + bytes of a name field.
pub(crate) fn name_bytes(name: &Name) -> (u8, &[u8]) {
    let s = name.as_str().as_bytes();
    (s.len() as u8, s)
}

/// STATS: firmware counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FrameStats {
    /// Packets the firmware's writers dropped.
    pub packets_dropped: u32,
    /// Chunk commits that found the ring full.
    pub ring_overflows: u32,
    /// Chunks lost.
    pub chunks_lost: u32,
    /// Frames the firmware could not send.
    pub frames_dropped: u32,
}

impl FrameStats {
    pub(crate) fn to_bytes(self) -> [u8; STATS_LEN] {
        let mut b = [0u8; STATS_LEN];
        put(&mut b, 0, &self.packets_dropped.to_le_bytes());
        put(&mut b, 4, &self.ring_overflows.to_le_bytes());
        put(&mut b, 8, &self.chunks_lost.to_le_bytes());
        put(&mut b, 12, &self.frames_dropped.to_le_bytes());
        b
    }
}

/// One PATCH entry's bytes.
pub(crate) fn patch_entry(p: &PatchSlot) -> [u8; PATCH_ENTRY_LEN] {
    let mut b = [0u8; PATCH_ENTRY_LEN];
    put(&mut b, 0, &p.writer_id.to_le_bytes());
    b[2] = if p.has_more { PATCH_HAS_MORE } else { 0 };
    put(&mut b, 4, &p.chunk_id.to_le_bytes());
    put(&mut b, 8, &p.offset.to_le_bytes());
    put(&mut b, 12, &p.data);
    b
}

/// The entries of a PATCH frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Patches<'a> {
    bytes: &'a [u8],
}

impl<'a> Patches<'a> {
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.bytes.len() / PATCH_ENTRY_LEN
    }

    /// Whether there is none (never for a parsed frame).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The entries.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = PatchSlot> + 'a {
        self.bytes.chunks_exact(PATCH_ENTRY_LEN).map(|e| PatchSlot {
            writer_id: u16::from_le_bytes([e[0], e[1]]),
            has_more: e[2] & PATCH_HAS_MORE != 0,
            chunk_id: u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
            offset: u16::from_le_bytes([e[8], e[9]]),
            data: [e[12], e[13], e[14], e[15]],
        })
    }
}

/// A parsed frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame<'a> {
    /// Firmware identity.
    Hello(Hello),
    /// A chunk: 8-byte header, then payload (maybe trimmed).
    Chunk(&'a [u8]),
    /// Patches.
    Patch(Patches<'a>),
    /// A firmware clock reading.
    Clock {
        /// Firmware time (ns).
        firmware_ns: u64,
        /// The host nonce answered (0: unsolicited).
        nonce: u32,
    },
    /// Firmware counters.
    Stats(FrameStats),
    /// Host: start tracing.
    Enable,
    /// Host: stop tracing.
    Disable,
    /// Host: restart writer sequences.
    Clear,
    /// Host: flush, with a request id.
    Flush(u32),
    /// Host: clock sync request, with a nonce.
    Sync(u32),
}

/// Why a frame (with a good CRC) has an unusable payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FrameError {
    /// A type this version does not know.
    UnknownType(u8),
    /// The payload length does not fit the type.
    BadLength {
        /// The frame type.
        kind: u8,
        /// The payload length.
        len: usize,
    },
    /// HELLO of another frame format version.
    UnsupportedVersion(u16),
    /// A HELLO name is invalid.
    BadName(NameError),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::UnknownType(k) => write!(f, "unknown frame type {k:#04x}"),
            Self::BadLength { kind, len } => {
                write!(f, "frame type {kind:#04x} with a {len}-byte payload")
            }
            Self::UnsupportedVersion(v) => write!(f, "HELLO of frame format version {v}"),
            Self::BadName(e) => write!(f, "HELLO name: {e}"),
        }
    }
}

impl core::error::Error for FrameError {}

fn u32_at(b: &[u8], at: usize) -> u32 {
    match b.get(at..at + 4) {
        Some(&[a, b, c, d]) => u32::from_le_bytes([a, b, c, d]),
        _ => 0,
    }
}

fn parse_name(b: &[u8], at: usize) -> Result<(Name, usize), FrameError> {
    let bad = FrameError::BadLength {
        kind: kind::HELLO,
        len: b.len(),
    };
    let len = usize::from(*b.get(at).ok_or(bad)?);
    if len > NAME_LEN {
        return Err(FrameError::BadName(NameError::TooLong(len)));
    }
    let bytes = b.get(at + 1..at + 1 + len).ok_or(bad)?;
    let s = core::str::from_utf8(bytes).map_err(|_| FrameError::BadName(NameError::NotUtf8))?;
    let name = Name::new(s).map_err(FrameError::BadName)?;
    Ok((name, at + 1 + len))
}

impl<'a> Frame<'a> {
    /// Parses a payload of frame type `kind`.
    pub fn parse(kind: u8, payload: &'a [u8]) -> Result<Self, FrameError> {
        let len = payload.len();
        let bad = FrameError::BadLength { kind, len };
        let exact = |n: usize| if len == n { Ok(()) } else { Err(bad) };
        Ok(match kind {
            kind::HELLO => {
                if len < HELLO_FIXED_LEN {
                    return Err(bad);
                }
                let version = u16::from_le_bytes([payload[0], payload[1]]);
                if version != VERSION {
                    return Err(FrameError::UnsupportedVersion(version));
                }
                let (data_source, at) = parse_name(payload, HELLO_FIXED_LEN)?;
                if data_source.is_empty() {
                    return Err(FrameError::BadName(NameError::Empty));
                }
                let (producer, end) = parse_name(payload, at)?;
                if end != len {
                    return Err(bad);
                }
                Frame::Hello(Hello {
                    version,
                    boot_id: u32_at(payload, 4),
                    clock_id: u32_at(payload, 8),
                    page_size: u32_at(payload, 12),
                    flags: u32_at(payload, 16),
                    data_source,
                    producer,
                })
            }
            kind::CHUNK => {
                if len < CHUNK_HEADER_SIZE {
                    return Err(bad);
                }
                Frame::Chunk(payload)
            }
            kind::PATCH => {
                if len == 0 || len % PATCH_ENTRY_LEN != 0 {
                    return Err(bad);
                }
                Frame::Patch(Patches { bytes: payload })
            }
            kind::CLOCK => {
                exact(12)?;
                Frame::Clock {
                    firmware_ns: u64::from(u32_at(payload, 0))
                        | u64::from(u32_at(payload, 4)) << 32,
                    nonce: u32_at(payload, 8),
                }
            }
            kind::STATS => {
                if len < STATS_LEN {
                    return Err(bad);
                }
                Frame::Stats(FrameStats {
                    packets_dropped: u32_at(payload, 0),
                    ring_overflows: u32_at(payload, 4),
                    chunks_lost: u32_at(payload, 8),
                    frames_dropped: u32_at(payload, 12),
                })
            }
            kind::ENABLE => exact(0).map(|_| Frame::Enable)?,
            kind::DISABLE => exact(0).map(|_| Frame::Disable)?,
            kind::CLEAR => exact(0).map(|_| Frame::Clear)?,
            kind::FLUSH => exact(4).map(|_| Frame::Flush(u32_at(payload, 0)))?,
            kind::SYNC => exact(4).map(|_| Frame::Sync(u32_at(payload, 0)))?,
            other => return Err(FrameError::UnknownType(other)),
        })
    }
}
