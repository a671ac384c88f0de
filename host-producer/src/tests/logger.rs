//! The `log` logger against the loopback service.

use log::Log as _;
use shmtrace_abi::layout::PageLayout;

use super::changing::{texts_in, Changing};
use super::loopback::{serial, Loopback};
use crate::runtime::runtime;
use crate::track_event::filter::TrackEventConfig;

/// A record's message is formatted once, however many sessions record it
/// (a `Display` that writes another text, of another length, at every
/// call): each session's packet carries the first call's text.
#[test]
fn a_message_is_formatted_once() {
    let _s = serial();
    let lb = Loopback::new(1 << 20, PageLayout::Div1, false);
    // What installing the logger does first.
    runtime().advertise_track_event(false);
    lb.start_track_event(440, 1, TrackEventConfig::default());
    lb.start_track_event(441, 2, TrackEventConfig::default());
    let logger = crate::logger::TraceLogger::new(log::LevelFilter::Info);
    for i in 0..5 {
        let value = Changing::from_call(i);
        logger.log(
            &log::Record::builder()
                .args(format_args!("{value}"))
                .level(log::Level::Info)
                .target("tl.log")
                .build(),
        );
        assert_eq!(value.calls.get(), i + 1, "`Display` calls of record {i}");
    }
    runtime().stop_data_source(440);
    runtime().stop_data_source(441);
    let want: Vec<String> = (0..5).map(Changing::text).collect();
    assert_eq!(texts_in(&lb, "tl.log", "message"), [want.clone(), want]);
    lb.shutdown();
}
