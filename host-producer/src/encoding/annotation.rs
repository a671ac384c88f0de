//! Debug annotations: named values attached to an event (`DebugAnnotation`,
//! TrackEvent field 4), including nested dictionaries and arrays.
//!
//! Values borrow what they show, so building them never allocates:
//!
//! ```
//! use shmtrace_producer::{Arg, DebugValue};
//! let entries = [("x", DebugValue::from(1)), ("label", DebugValue::from("hi"))];
//! let items = [DebugValue::from(1.5), DebugValue::from(true)];
//! let args = [
//!     Arg::new("player", 7u32),
//!     Arg::new("pos", DebugValue::Dict(&entries)),
//!     Arg::new("samples", DebugValue::Array(&items)),
//! ];
//! assert_eq!(args.len(), 3);
//! ```

use shmtrace_abi::proto::{Message, Sink};
use shmtrace_abi::trace::debug_annotation as field;

/// One annotation value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DebugValue<'a> {
    /// `bool_value`.
    Bool(bool),
    /// `int_value`.
    Int(i64),
    /// `uint_value`.
    Uint(u64),
    /// `double_value`.
    Double(f64),
    /// `string_value`.
    Str(&'a str),
    /// `pointer_value` (shown in hex).
    Pointer(u64),
    /// `dict_entries`: named children.
    Dict(&'a [(&'a str, DebugValue<'a>)]),
    /// `array_values`: unnamed children.
    Array(&'a [DebugValue<'a>]),
}

impl DebugValue<'_> {
    /// A pointer value.
    pub fn pointer<T: ?Sized>(ptr: *const T) -> Self {
        DebugValue::Pointer(ptr.cast::<()>() as usize as u64)
    }
}

macro_rules! from_int {
    ($variant:ident: $($t:ty),*) => {$(
        impl From<$t> for DebugValue<'_> {
            #[inline]
            fn from(v: $t) -> Self {
                DebugValue::$variant(v as _)
            }
        }
    )*};
}
from_int!(Int: i8, i16, i32, i64, isize);
from_int!(Uint: u8, u16, u32, u64, usize);
from_int!(Double: f32, f64);

impl From<bool> for DebugValue<'_> {
    #[inline]
    fn from(v: bool) -> Self {
        DebugValue::Bool(v)
    }
}

impl<'a> From<&'a str> for DebugValue<'a> {
    #[inline]
    fn from(v: &'a str) -> Self {
        DebugValue::Str(v)
    }
}

impl<'a> From<&'a String> for DebugValue<'a> {
    #[inline]
    fn from(v: &'a String) -> Self {
        DebugValue::Str(v)
    }
}

/// An annotation name: static names are interned per sequence, others are
/// written inline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgName<'a> {
    /// A `'static` name (interned: `name_iid`).
    Static(&'static str),
    /// A name built at run time (`name`).
    Dynamic(&'a str),
}

/// A named debug annotation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arg<'a> {
    /// The name.
    pub name: ArgName<'a>,
    /// The value.
    pub value: DebugValue<'a>,
}

impl<'a> Arg<'a> {
    /// An annotation with a static (interned) name.
    #[inline]
    pub fn new(name: &'static str, value: impl Into<DebugValue<'a>>) -> Self {
        Arg {
            name: ArgName::Static(name),
            value: value.into(),
        }
    }

    /// An annotation with a name built at run time (written inline).
    #[inline]
    pub fn dynamic(name: &'a str, value: impl Into<DebugValue<'a>>) -> Self {
        Arg {
            name: ArgName::Dynamic(name),
            value: value.into(),
        }
    }
}

/// How an annotation's name is written.
pub(crate) enum NameRef<'a> {
    Iid(u64),
    Inline(&'a str),
    None,
}

/// Writes one `DebugAnnotation` message body (name, then value).
pub(crate) fn write_annotation<S: Sink>(
    m: &mut Message<'_, S>,
    name: NameRef<'_>,
    value: &DebugValue<'_>,
) {
    match name {
        NameRef::Iid(iid) => m.uint64(field::NAME_IID, iid),
        NameRef::Inline(n) => m.string(field::NAME, n),
        NameRef::None => {}
    }
    write_value(m, value);
}

fn write_value<S: Sink>(m: &mut Message<'_, S>, value: &DebugValue<'_>) {
    match *value {
        DebugValue::Bool(b) => m.bool(field::BOOL_VALUE, b),
        DebugValue::Int(i) => m.int64(field::INT_VALUE, i),
        DebugValue::Uint(u) => m.uint64(field::UINT_VALUE, u),
        DebugValue::Double(d) => m.double(field::DOUBLE_VALUE, d),
        DebugValue::Str(s) => m.string(field::STRING_VALUE, s),
        DebugValue::Pointer(p) => m.uint64(field::POINTER_VALUE, p),
        DebugValue::Dict(entries) => {
            for (name, v) in entries {
                m.nested(field::DICT_ENTRIES, |child| {
                    write_annotation(child, NameRef::Inline(name), v)
                });
            }
        }
        DebugValue::Array(items) => {
            for v in items {
                m.nested(field::ARRAY_VALUES, |child| {
                    write_annotation(child, NameRef::None, v)
                });
            }
        }
    }
}

/// A flat annotation value whose text, if any, lies in the buffer of the
/// [`FlatArgs`] holding it (`text[start..end]`), so that values can be
/// collected one by one without borrowing a growing buffer.
#[cfg(feature = "tracing")]
#[derive(Debug, Clone, Copy)]
pub(crate) enum FlatValue {
    Int(i64),
    Uint(u64),
    Bool(bool),
    Double(f64),
    Text(usize, usize),
}

/// A field of a trace point, kept with its value: its index among the
/// fields the trace point declares (one index names one field at every
/// event of the trace point) and its name.
#[cfg(feature = "tracing")]
#[derive(Debug, Clone, Copy)]
pub(crate) struct FieldId {
    pub(crate) index: usize,
    pub(crate) name: &'static str,
}

#[cfg(feature = "tracing")]
impl FieldId {
    /// The id of the field `key` names.
    #[inline(always)]
    pub(crate) fn of(key: impl crate::encoding::event::FieldKey) -> Self {
        FieldId {
            index: key.index(),
            name: key.name(),
        }
    }
}

#[cfg(feature = "tracing")]
impl crate::encoding::event::FieldKey for FieldId {
    #[inline(always)]
    fn index(self) -> usize {
        self.index
    }
    #[inline(always)]
    fn name(self) -> &'static str {
        self.name
    }
}

/// Annotations with static names and flat values: first a string one
/// (`head`), then `values`, whose texts are in `text`. What the `tracing`
/// layer collects from an event, written without first becoming [`Arg`]s.
#[cfg(feature = "tracing")]
#[derive(Debug, Clone, Copy)]
pub(crate) struct FlatArgs<'a> {
    pub(crate) head: (&'static str, &'static str),
    pub(crate) values: &'a [(FieldId, FlatValue)],
    pub(crate) text: &'a str,
}

/// The values after the head, handed over one by one (a slice begin of
/// the `tracing` layer streamed after its trace point's pre-encoded head,
/// which holds the head annotation).
#[cfg(feature = "tracing")]
impl crate::encoding::event::FlatFields for FlatArgs<'_> {
    #[inline(always)]
    fn each<O: crate::encoding::event::FlatOut>(&self, out: &mut O) -> bool {
        use crate::encoding::event::FieldValue as F;
        for &(field, value) in self.values {
            let value = match value {
                FlatValue::Int(v) => F::Int(v),
                FlatValue::Uint(v) => F::Uint(v),
                FlatValue::Bool(v) => F::Bool(v),
                FlatValue::Double(v) => F::Double(v),
                FlatValue::Text(start, end) => F::Str(self.text.get(start..end).unwrap_or("")),
            };
            out.value(field, value);
        }
        true
    }
}

#[cfg(feature = "tracing")]
impl<'a> FlatArgs<'a> {
    /// `head` alone.
    #[inline(always)]
    pub(crate) fn head_only(head: (&'static str, &'static str)) -> Self {
        FlatArgs {
            head,
            values: &[],
            text: "",
        }
    }

    /// The annotations, `head` first.
    #[inline(always)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&'static str, DebugValue<'a>)> + '_ {
        let fields = self.fields().map(|(field, value)| (field.name, value));
        std::iter::once((self.head.0, DebugValue::Str(self.head.1))).chain(fields)
    }

    /// The annotations after `head`, with their fields.
    #[inline(always)]
    pub(crate) fn fields(&self) -> impl Iterator<Item = (FieldId, DebugValue<'a>)> + '_ {
        let text = self.text;
        self.values.iter().map(move |&(field, value)| {
            let value = match value {
                FlatValue::Int(v) => DebugValue::Int(v),
                FlatValue::Uint(v) => DebugValue::Uint(v),
                FlatValue::Bool(v) => DebugValue::Bool(v),
                FlatValue::Double(v) => DebugValue::Double(v),
                FlatValue::Text(start, end) => DebugValue::Str(text.get(start..end).unwrap_or("")),
            };
            (field, value)
        })
    }
}
