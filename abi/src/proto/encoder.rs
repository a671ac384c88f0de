//! The encoder proper: a [`Sink`] abstraction over where bytes go, the
//! [`Encoder`] that tracks open nested messages, and the [`Message`] handle
//! that writes fields.
//!
//! # Invariants
//!
//! * A nested message reserves room for its size (a "slot") and remembers
//!   the logical stream position where its body starts. When it closes, its
//!   size is `position() - start`, and the sink writes it back into the slot,
//!   wherever the slot lives by then (inline, in a patch entry, or nowhere).
//!   Messages close innermost first, so when a slot is filled every later
//!   slot is already filled and the sink may still resize the field.
//! * The encoder's stack of open slots is handed to the sink on every call
//!   that may move to a new region, so a scattered sink can relocate slots
//!   that lie in a region it gives up. Slots are ordered outermost first.
//! * Each [`Message`] knows its depth. A message only writes when the stack
//!   depth equals its own, closing deeper (forgotten) children first; so a
//!   `mem::forget`-ed child handle cannot corrupt its parent's framing.
//! * Nesting deeper than [`MAX_DEPTH`] never panics: the too-deep message and
//!   everything inside it are dropped whole (no tag, no bytes), counted in
//!   [`Encoder::dropped_messages`], and reported as
//!   [`EncodeError::NestingTooDeep`]. The enclosing message stays valid.
//! * The first error is latched; writing continues (errors never panic) and
//!   the owner of the encoder decides what an error means for the output.

use super::wire::{self, is_valid_field_number, tag, WireType, MAX_MESSAGE_LEN};
use heapless::Vec;

#[cfg(doc)]
use super::wire::SIZE_FIELD_LEN;

/// Maximum number of nested messages open at once below the root message.
///
/// A `begin_nested` at this depth yields a message that discards everything
/// written into it (see the module invariants). 16 is well beyond what
/// Perfetto's schemas need in practice (TracePacket → TrackEvent →
/// DebugAnnotation → a few levels of dictionaries).
pub const MAX_DEPTH: usize = 16;

/// Why encoding produced incomplete or no output. The first error is latched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EncodeError {
    /// A field number of 0 or above 2^29 - 1 was used; the field was not
    /// written.
    InvalidFieldNumber(u32),
    /// A nested message or bytes field grew past [`MAX_MESSAGE_LEN`] bytes and
    /// its size cannot be encoded in the 4-byte size field; the output is
    /// malformed from that field on.
    MessageTooLong(u64),
    /// A nested message was opened at depth [`MAX_DEPTH`]; it was dropped.
    NestingTooDeep,
    /// The destination buffer had no room for the whole message.
    BufferFull,
}

impl core::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::InvalidFieldNumber(n) => write!(f, "invalid protobuf field number {n}"),
            Self::MessageTooLong(n) => {
                write!(
                    f,
                    "message of {n} bytes exceeds the {MAX_MESSAGE_LEN}-byte limit"
                )
            }
            Self::NestingTooDeep => write!(f, "nested messages deeper than {MAX_DEPTH}"),
            Self::BufferFull => write!(f, "output buffer too small"),
        }
    }
}

/// Where an [`Encoder`] puts bytes.
///
/// A sink presents one logical byte stream that may be stored in several
/// discontiguous regions (a trace writer's chunks). `open` always lists the
/// size slots of the nested messages currently open, outermost first; a sink
/// that gives up a region while writing must rewrite every slot that lies in
/// that region (e.g. into a patch entry) before returning.
pub trait Sink {
    /// Where a reserved size field lives. Copied freely; only meaningful to
    /// the sink that produced it.
    type Slot: Copy;

    /// Appends `bytes` to the stream.
    fn write(&mut self, bytes: &[u8], open: &mut [Self::Slot]);

    /// Appends the first `len` bytes of `buf` (a field's tag and scalar
    /// value). A sink with room for all of `buf` may copy it whole, since
    /// bytes past the current position are scratch space: one fixed-size
    /// copy is much cheaper than a variable-length one.
    #[inline]
    fn write_small(&mut self, buf: &[u8; SMALL_WRITE_LEN], len: usize, open: &mut [Self::Slot]) {
        self.write(buf.get(..len).unwrap_or(buf), open);
    }

    /// Reserves contiguous room at the current position for a size that
    /// [`Sink::fill_size_field`] will provide later. A scattered sink
    /// reserves [`SIZE_FIELD_LEN`] bytes, enough for any size; a contiguous
    /// sink may reserve less and grow the field when it is filled.
    fn reserve_size_field(&mut self, open: &mut [Self::Slot]) -> Self::Slot;

    /// Logical position: bytes appended so far (reserved size fields included,
    /// region-switching overhead such as fragment headers excluded). Wraps
    /// modulo 2^32; only differences are meaningful.
    fn position(&self) -> u32;

    /// Stores `size` (at most [`MAX_MESSAGE_LEN`]) into `slot`, whose body
    /// is the last `size` bytes of the stream. A sink may change the encoded
    /// length of the field if the body is still contiguous with it (compact
    /// 4 bytes to 1 when `size <= 127`, or grow a 1-byte reservation to the
    /// minimal varint), moving the body and changing `position()` by the
    /// same amount.
    fn fill_size_field(&mut self, slot: Self::Slot, size: u32);
}

/// A protobuf encoder over a [`Sink`]: owns the sink and the stack of open
/// nested messages. Write fields through [`Encoder::root`].
pub struct Encoder<S: Sink> {
    sink: S,
    slots: Vec<S::Slot, MAX_DEPTH>,
    /// Body start position of the message whose slot is `slots[i]`.
    starts: [u32; MAX_DEPTH],
    dropped: u32,
    error: Option<EncodeError>,
}

impl<S: Sink> Encoder<S> {
    /// An encoder writing into `sink`, with no message open.
    pub const fn new(sink: S) -> Self {
        Self {
            sink,
            slots: Vec::new(),
            starts: [0; MAX_DEPTH],
            dropped: 0,
            error: None,
        }
    }

    /// The root message: fields written through it go straight into the
    /// stream (the root has no size field of its own).
    pub fn root(&mut self) -> Message<'_, S> {
        Message {
            enc: self,
            depth: 0,
        }
    }

    /// Closes every open nested message (innermost first), back-filling sizes.
    pub fn close_all(&mut self) {
        self.close_to(0);
    }

    /// The first error since construction or the last [`Encoder::take_error`].
    pub fn error(&self) -> Option<EncodeError> {
        self.error
    }

    /// Returns and clears the latched error.
    pub fn take_error(&mut self) -> Option<EncodeError> {
        self.error.take()
    }

    /// Nested messages dropped because they were opened at [`MAX_DEPTH`].
    pub fn dropped_messages(&self) -> u32 {
        self.dropped
    }

    /// Number of nested messages currently open.
    pub fn depth(&self) -> usize {
        self.slots.len()
    }

    /// Shared access to the sink.
    pub fn sink(&self) -> &S {
        &self.sink
    }

    /// Exclusive access to the sink together with the open slots (outermost
    /// first), for sinks that need to relocate them outside a write.
    pub fn sink_and_slots(&mut self) -> (&mut S, &mut [S::Slot]) {
        (&mut self.sink, &mut self.slots)
    }

    /// Consumes the encoder after closing all open messages.
    pub fn into_sink(mut self) -> S {
        self.close_all();
        self.sink
    }

    fn latch(&mut self, e: EncodeError) {
        if self.error.is_none() {
            self.error = Some(e);
        }
    }

    /// Closes nested messages until `depth` remain open.
    fn close_to(&mut self, depth: usize) {
        while self.slots.len() > depth {
            let Some(slot) = self.slots.pop() else {
                return;
            };
            let start = self.starts[self.slots.len() & (MAX_DEPTH - 1)];
            let size = self.sink.position().wrapping_sub(start);
            let size = if size > MAX_MESSAGE_LEN {
                self.latch(EncodeError::MessageTooLong(u64::from(size)));
                MAX_MESSAGE_LEN
            } else {
                size
            };
            self.sink.fill_size_field(slot, size);
        }
    }

    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        self.sink.write(bytes, &mut self.slots);
    }

    #[inline]
    fn put_small(&mut self, s: &Scratch) {
        self.sink.write_small(&s.buf, s.len(), &mut self.slots);
    }
}

/// Size of the buffer a field's tag and scalar value are assembled in
/// before one [`Sink::write_small`]: a 5-byte tag plus a 10-byte varint fit.
pub const SMALL_WRITE_LEN: usize = 16;

/// A small stack buffer holding one field's tag and scalar value, so each
/// scalar field costs a single fixed-size [`Sink::write_small`].
struct Scratch {
    buf: [u8; SMALL_WRITE_LEN],
    len: usize,
}

impl Scratch {
    #[inline]
    fn new() -> Self {
        Self {
            buf: [0; SMALL_WRITE_LEN],
            len: 0,
        }
    }

    /// Appends one byte. Callers never push more than [`SMALL_WRITE_LEN`]
    /// bytes (a 5-byte tag plus at most 10 more); the index is masked so a
    /// mistake could only garble the scratch, never panic.
    #[inline]
    fn push(&mut self, byte: u8) {
        self.buf[self.len & (SMALL_WRITE_LEN - 1)] = byte;
        self.len += 1;
    }

    #[inline]
    fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.push(value as u8 | 0x80);
            value >>= 7;
        }
        self.push(value as u8);
    }

    #[inline]
    fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.push(b);
        }
    }

    /// Bytes pushed, capped at the buffer size.
    #[inline]
    fn len(&self) -> usize {
        self.len.min(SMALL_WRITE_LEN)
    }
}

const _: () = assert!(SMALL_WRITE_LEN.is_power_of_two() && SMALL_WRITE_LEN >= 15);
const _: () = assert!(MAX_DEPTH.is_power_of_two());

/// A message being written: the root message of an [`Encoder`] or a nested
/// message opened with [`Message::begin_nested`] / [`Message::nested`].
///
/// Dropping a nested `Message` closes it (its size is back-filled). While a
/// child exists its parent is mutably borrowed, so fields cannot interleave.
pub struct Message<'a, S: Sink> {
    enc: &'a mut Encoder<S>,
    /// Number of open nested messages this message sits at; above
    /// [`MAX_DEPTH`] the message is a discarding placeholder.
    depth: u8,
}

impl<S: Sink> Drop for Message<'_, S> {
    fn drop(&mut self) {
        let depth = usize::from(self.depth);
        if depth > 0 && depth <= MAX_DEPTH {
            self.enc.close_to(depth - 1);
        }
    }
}

impl<'a, S: Sink> Message<'a, S> {
    /// Prepares a write of `field`: returns `false` if nothing must be
    /// written (discarding placeholder or invalid field number).
    #[inline]
    fn begin_field(&mut self, field: u32) -> bool {
        let depth = usize::from(self.depth);
        if self.enc.slots.len() != depth && !self.realign() {
            return false;
        }
        if !is_valid_field_number(field) {
            self.enc.latch(EncodeError::InvalidFieldNumber(field));
            return false;
        }
        true
    }

    /// Slow path of [`Self::begin_field`]: closes forgotten children, or
    /// reports that this message is a discarding placeholder.
    #[cold]
    fn realign(&mut self) -> bool {
        let depth = usize::from(self.depth);
        if depth > MAX_DEPTH || depth > self.enc.slots.len() {
            return false;
        }
        self.enc.close_to(depth);
        true
    }

    #[inline]
    fn varint_field(&mut self, field: u32, value: u64) {
        if self.begin_field(field) {
            let mut s = Scratch::new();
            s.varint(u64::from(tag(field, WireType::Varint)));
            s.varint(value);
            self.enc.put_small(&s);
        }
    }

    /// Writes a `uint64` field.
    #[inline]
    pub fn uint64(&mut self, field: u32, value: u64) {
        self.varint_field(field, value);
    }

    /// Writes a `uint32` field.
    #[inline]
    pub fn uint32(&mut self, field: u32, value: u32) {
        self.varint_field(field, u64::from(value));
    }

    /// Writes an `int64` field (negative values take 10 bytes).
    #[inline]
    pub fn int64(&mut self, field: u32, value: i64) {
        self.varint_field(field, value as u64);
    }

    /// Writes an `int32` field (negative values are sign-extended to 10 bytes,
    /// as the protobuf spec requires).
    #[inline]
    pub fn int32(&mut self, field: u32, value: i32) {
        self.varint_field(field, i64::from(value) as u64);
    }

    /// Writes a `sint32` field (zigzag).
    #[inline]
    pub fn sint32(&mut self, field: u32, value: i32) {
        self.varint_field(field, u64::from(wire::zigzag32(value)));
    }

    /// Writes a `sint64` field (zigzag).
    #[inline]
    pub fn sint64(&mut self, field: u32, value: i64) {
        self.varint_field(field, wire::zigzag64(value));
    }

    /// Writes a `bool` field.
    #[inline]
    pub fn bool(&mut self, field: u32, value: bool) {
        self.varint_field(field, u64::from(value));
    }

    /// Writes an enum field (encoded like `int32`).
    #[inline]
    pub fn enumeration(&mut self, field: u32, value: i32) {
        self.int32(field, value);
    }

    #[inline]
    fn fixed_field<const N: usize>(&mut self, field: u32, wire_type: WireType, le: [u8; N]) {
        if self.begin_field(field) {
            let mut s = Scratch::new();
            s.varint(u64::from(tag(field, wire_type)));
            s.bytes(&le);
            self.enc.put_small(&s);
        }
    }

    /// Writes a `fixed64` field.
    #[inline]
    pub fn fixed64(&mut self, field: u32, value: u64) {
        self.fixed_field(field, WireType::Fixed64, value.to_le_bytes());
    }

    /// Writes a `fixed32` field.
    #[inline]
    pub fn fixed32(&mut self, field: u32, value: u32) {
        self.fixed_field(field, WireType::Fixed32, value.to_le_bytes());
    }

    /// Writes an `sfixed64` field.
    #[inline]
    pub fn sfixed64(&mut self, field: u32, value: i64) {
        self.fixed_field(field, WireType::Fixed64, value.to_le_bytes());
    }

    /// Writes an `sfixed32` field.
    #[inline]
    pub fn sfixed32(&mut self, field: u32, value: i32) {
        self.fixed_field(field, WireType::Fixed32, value.to_le_bytes());
    }

    /// Writes a `double` field.
    #[inline]
    pub fn double(&mut self, field: u32, value: f64) {
        self.fixed_field(field, WireType::Fixed64, value.to_le_bytes());
    }

    /// Writes a `float` field.
    #[inline]
    pub fn float(&mut self, field: u32, value: f32) {
        self.fixed_field(field, WireType::Fixed32, value.to_le_bytes());
    }

    /// Writes a `bytes` field (also any pre-encoded message body).
    ///
    /// Longer than [`MAX_MESSAGE_LEN`] is refused with
    /// [`EncodeError::MessageTooLong`] and nothing is written.
    pub fn bytes(&mut self, field: u32, value: &[u8]) {
        if !self.begin_field(field) {
            return;
        }
        let len = value.len() as u64;
        if len > u64::from(MAX_MESSAGE_LEN) {
            self.enc.latch(EncodeError::MessageTooLong(len));
            return;
        }
        let mut s = Scratch::new();
        s.varint(u64::from(tag(field, WireType::LengthDelimited)));
        s.varint(len);
        self.enc.put_small(&s);
        self.enc.put(value);
    }

    /// Writes a `string` field.
    #[inline]
    pub fn string(&mut self, field: u32, value: &str) {
        self.bytes(field, value.as_bytes());
    }

    /// Writes a packed `repeated uint64` field (one length-delimited record).
    pub fn packed_uint64(&mut self, field: u32, values: &[u64]) {
        self.packed(field, values.iter().copied());
    }

    /// Writes a packed `repeated uint32` field.
    pub fn packed_uint32(&mut self, field: u32, values: &[u32]) {
        self.packed(field, values.iter().map(|&v| u64::from(v)));
    }

    /// Writes a packed `repeated int64` field.
    pub fn packed_int64(&mut self, field: u32, values: &[i64]) {
        self.packed(field, values.iter().map(|&v| v as u64));
    }

    fn packed<I: Iterator<Item = u64> + Clone>(&mut self, field: u32, values: I) {
        if !self.begin_field(field) {
            return;
        }
        let len: u64 = values.clone().map(|v| wire::varint_len(v) as u64).sum();
        if len > u64::from(MAX_MESSAGE_LEN) {
            self.enc.latch(EncodeError::MessageTooLong(len));
            return;
        }
        let mut s = Scratch::new();
        s.varint(u64::from(tag(field, WireType::LengthDelimited)));
        s.varint(len);
        self.enc.put_small(&s);
        for v in values {
            let mut s = Scratch::new();
            s.varint(v);
            self.enc.put_small(&s);
        }
    }

    /// Appends pre-encoded field bytes verbatim (e.g. a cached serialized
    /// field). The caller vouches that they are well-formed.
    pub fn raw(&mut self, bytes: &[u8]) {
        if self.enc.slots.len() != usize::from(self.depth) && !self.realign() {
            return;
        }
        self.enc.put(bytes);
    }

    /// Opens nested message `field`; it is closed (size back-filled) when the
    /// returned handle is dropped. At [`MAX_DEPTH`] the handle discards all
    /// writes (see the module docs).
    pub fn begin_nested(&mut self, field: u32) -> Message<'_, S> {
        let depth = usize::from(self.depth);
        let child_depth = self.depth.saturating_add(1);
        if depth > MAX_DEPTH || !self.begin_field(field) {
            // Already discarding (or invalid field): the child discards too.
            return Message {
                enc: self.enc,
                depth: discarding_depth(child_depth),
            };
        }
        if depth == MAX_DEPTH {
            self.enc.dropped = self.enc.dropped.saturating_add(1);
            self.enc.latch(EncodeError::NestingTooDeep);
            return Message {
                enc: self.enc,
                depth: child_depth,
            };
        }
        let mut s = Scratch::new();
        s.varint(u64::from(tag(field, WireType::LengthDelimited)));
        self.enc.put_small(&s);
        let enc = &mut *self.enc;
        let slot = enc.sink.reserve_size_field(&mut enc.slots);
        let start = enc.sink.position();
        // The push succeeds: depth < MAX_DEPTH was checked above, and
        // `slots.len() == depth` (so the mask is a no-op).
        enc.starts[enc.slots.len() & (MAX_DEPTH - 1)] = start;
        let _ = enc.slots.push(slot);
        Message {
            enc: self.enc,
            depth: child_depth,
        }
    }

    /// Writes nested message `field` with `f` and closes it.
    ///
    /// ```
    /// use shmtrace_abi::proto::encode_to_slice;
    /// let mut buf = [0u8; 16];
    /// let n = encode_to_slice(&mut buf, |packet| {
    ///     packet.nested(11, |track_event| track_event.uint32(9, 1));
    /// })
    /// .unwrap();
    /// assert_eq!(&buf[..n], &[0x5A, 0x02, 0x48, 0x01]);
    /// ```
    pub fn nested<R>(&mut self, field: u32, f: impl FnOnce(&mut Message<'_, S>) -> R) -> R {
        let mut child = self.begin_nested(field);
        f(&mut child)
    }

    /// `true` if writes to this message are discarded because it was opened
    /// past [`MAX_DEPTH`].
    pub fn is_discarding(&self) -> bool {
        usize::from(self.depth) > MAX_DEPTH
    }

    /// The encoder this message writes through.
    pub fn encoder(&self) -> &Encoder<S> {
        self.enc
    }

    /// Exclusive access to the encoder, for the owner of a root message.
    pub(crate) fn encoder_mut(&mut self) -> &mut Encoder<S> {
        self.enc
    }
}

/// Depth marking a discarding placeholder (always above [`MAX_DEPTH`]).
#[inline]
fn discarding_depth(d: u8) -> u8 {
    d.max(MAX_DEPTH as u8 + 1)
}
