//! The `log` logger against the loopback service.

use log::Log as _;
use prost::Message as _;
use shmtrace_abi::layout::PageLayout;

use super::loopback::{serial, Loopback};
use crate::runtime::runtime;
use crate::test_schema::{self as ts, Interned};
use crate::track_event::filter::TrackEventConfig;

/// A `Display` whose every call writes another text, of another length
/// (across what fits a packet written in place and a one-byte length),
/// and counts its calls.
struct Changing(std::cell::Cell<usize>);

impl Changing {
    /// The text of call `n`.
    fn text(n: usize) -> String {
        char::from(b'a' + n as u8)
            .to_string()
            .repeat([150, 3, 300][n % 3])
    }
}

impl std::fmt::Display for Changing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0.get();
        self.0.set(n + 1);
        f.write_str(&Changing::text(n))
    }
}

/// A record's message is formatted once, however many sessions record
/// it: each writes the first call's text.
#[test]
fn a_message_is_formatted_once() {
    let _s = serial();
    let lb = Loopback::new(1 << 20, PageLayout::Div1, false);
    // What installing the logger does first.
    runtime().advertise_track_event(false);
    lb.start_track_event(440, 1, TrackEventConfig::default());
    lb.start_track_event(441, 2, TrackEventConfig::default());
    let logger = crate::logger::TraceLogger::new(log::LevelFilter::Info);
    for i in 0..3 {
        let value = Changing(std::cell::Cell::new(i));
        logger.log(
            &log::Record::builder()
                .args(format_args!("{value}"))
                .level(log::Level::Info)
                .target("tl.log")
                .build(),
        );
        assert_eq!(value.0.get(), i + 1, "`Display` calls of record {i}");
    }
    runtime().stop_data_source(440);
    runtime().stop_data_source(441);
    let mut messages = Vec::new();
    for seq in lb.sequences().values() {
        let mut interned = Interned::default();
        let mut texts = Vec::new();
        for bytes in &seq.packets {
            let p = ts::TracePacket::decode(&bytes[..]).expect("valid TracePacket");
            interned.update(&p);
            let Some(te) = &p.track_event else { continue };
            if interned.event_categories(te) != ["tl.log"] {
                continue;
            }
            for a in &te.debug_annotations {
                if interned.arg_name(a).as_deref() == Some("message") {
                    texts.push(a.string_value.clone().expect("a text value"));
                }
            }
        }
        if !texts.is_empty() {
            messages.push(texts);
        }
    }
    let want: Vec<String> = (0..3).map(Changing::text).collect();
    assert_eq!(messages, [want.clone(), want]);
    lb.shutdown();
}
