//! Values whose `Debug` and `Display` write another text at every call,
//! for the tests that a value is formatted once per event, and the texts
//! the loopback's packets carry.

use prost::Message as _;

use super::loopback::Loopback;
use crate::test_schema::{self as ts, Interned};

/// A value whose every `Debug` or `Display` call writes another text, of
/// another length, and counts its calls: its call `n` writes
/// `LENGTHS[n % 5]` copies of the letter `n` (from `a`), in two pieces.
/// The lengths cross what fits a packet written in place (a packet of at
/// most 127 bytes) and a one-byte length, both ways.
pub(super) struct Changing {
    pub(super) calls: std::cell::Cell<usize>,
}

/// The lengths of [`Changing`]'s texts, call by call.
const LENGTHS: [usize; 5] = [150, 3, 300, 20, 120];

impl Changing {
    /// A value whose first call is call `n`.
    pub(super) fn from_call(n: usize) -> Self {
        Changing {
            calls: std::cell::Cell::new(n),
        }
    }

    /// The text of call `n`.
    pub(super) fn text(n: usize) -> String {
        char::from(b'a' + (n % 26) as u8)
            .to_string()
            .repeat(LENGTHS[n % LENGTHS.len()])
    }

    /// Writes the next call's text.
    fn write(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.calls.get();
        self.calls.set(n + 1);
        let text = Changing::text(n);
        let (a, b) = text.split_at(text.len() / 2);
        f.write_str(a)?;
        f.write_str(b)
    }
}

impl std::fmt::Debug for Changing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.write(f)
    }
}

impl std::fmt::Display for Changing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.write(f)
    }
}

/// The text annotations named `name` of the track events in `category`
/// (and of every slice end, which carries no category), sequence by
/// sequence, in order.
pub(super) fn texts_in(lb: &Loopback, category: &str, name: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for seq in lb.sequences().values() {
        let mut interned = Interned::default();
        let mut texts = Vec::new();
        for bytes in &seq.packets {
            let p = ts::TracePacket::decode(&bytes[..]).expect("valid TracePacket");
            interned.update(&p);
            let Some(te) = &p.track_event else { continue };
            if te.r#type != Some(crate::EventType::SliceEnd as i32)
                && interned.event_categories(te) != [category]
            {
                continue;
            }
            for a in &te.debug_annotations {
                if interned.arg_name(a).as_deref() == Some(name) {
                    texts.push(a.string_value.clone().expect("a text value"));
                }
            }
        }
        if !texts.is_empty() {
            out.push(texts);
        }
    }
    out
}
