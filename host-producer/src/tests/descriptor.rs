//! The `TrackEventDescriptor` advertising the registered categories: its
//! fields, and the `UpdateDataSource` sent when categories are registered
//! while connected (the late-registration path).

use prost::Message as _;
use shmtrace_abi::layout::PageLayout;

use super::loopback::{serial, Loopback};
use crate::connection::outbox::DescriptorInfo;
use crate::connection::outbox::Outgoing;
use crate::runtime::runtime;
use crate::test_schema::{self as ts, Interned};
use crate::track_event::filter::TrackEventConfig;
use crate::{trace_instant, track_event, Category, DynamicCategory, TRACK_EVENT_DATA_SOURCE};

/// `perfetto.protos.TrackEventDescriptor` (upstream field numbers).
#[derive(Clone, PartialEq, prost::Message)]
struct TrackEventDescriptor {
    #[prost(message, repeated, tag = "1")]
    available_categories: Vec<TrackEventCategory>,
}

/// `perfetto.protos.TrackEventCategory`.
#[derive(Clone, PartialEq, prost::Message)]
struct TrackEventCategory {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "2")]
    description: Option<String>,
    #[prost(string, repeated, tag = "3")]
    tags: Vec<String>,
}

static D_PLAIN: Category = Category::new("desc.plain");
static D_FULL: Category = Category::new("desc.full")
    .with_description("Everything about desc")
    .with_tags(&["slow", "debug"]);
static D_GROUP: Category = Category::new("desc.plain,desc.full");
static D_LATE: Category = Category::new("desc.late")
    .with_description("Registered while connected")
    .with_tags(&["debug"]);

/// The categories of a serialized descriptor called `name`, by name.
fn categories(bytes: &[u8], name: &str) -> Vec<TrackEventCategory> {
    let d = TrackEventDescriptor::decode(bytes).expect("valid TrackEventDescriptor");
    d.available_categories
        .into_iter()
        .filter(|c| c.name.as_deref() == Some(name))
        .collect()
}

#[test]
fn descriptor_lists_names_descriptions_and_tags() {
    let _s = serial();
    track_event::register_categories(&[&D_PLAIN, &D_FULL, &D_GROUP]);
    track_event::register_categories(&[&D_FULL]); // no-op
    let _dynamic = DynamicCategory::new("desc.dynamic");
    let bytes = crate::track_event::data_source::serialized_descriptor();

    let plain = categories(&bytes, "desc.plain");
    assert_eq!(plain.len(), 1, "advertised once");
    assert_eq!(plain[0].description, None, "no empty description");
    assert!(plain[0].tags.is_empty());

    let full = categories(&bytes, "desc.full");
    assert_eq!(full.len(), 1, "registering twice advertises once");
    assert_eq!(
        full[0].description.as_deref(),
        Some("Everything about desc")
    );
    assert_eq!(full[0].tags, ["slow", "debug"]);

    // Like upstream, only registered (static) categories are advertised,
    // and a group is not one.
    assert!(categories(&bytes, "desc.dynamic").is_empty());
    assert!(categories(&bytes, "desc.plain,desc.full").is_empty());
}

#[test]
fn late_registration_updates_the_data_source_and_enables_the_category() {
    let _s = serial();
    // Advertised already (whichever test of this process came first), so
    // the connection registers it and a later category is an update.
    track_event::register_categories(&[]);
    assert!(runtime()
        .descriptors()
        .iter()
        .any(|d| d.name == TRACK_EVENT_DATA_SOURCE));
    let lb = Loopback::new(64 * 1024, PageLayout::Div1, false);
    let cfg = TrackEventConfig {
        enabled_categories: vec!["desc.late".into()],
        disabled_categories: vec!["*".into()],
        ..Default::default()
    };
    lb.start_track_event(401, 1, cfg);
    assert!(!D_LATE.is_enabled(), "not registered yet");
    track_event::register_categories(&[&D_LATE]);
    assert!(
        D_LATE.is_enabled(),
        "a running session's filter applies to categories registered later"
    );
    trace_instant!(D_LATE, "after_registration");
    runtime().stop_data_source(401);
    lb.drain();

    let updates: Vec<DescriptorInfo> = lb
        .received()
        .messages
        .iter()
        .filter_map(|m| match m {
            Outgoing::UpdateDataSource(d) => Some(d.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(updates.len(), 1, "one UpdateDataSource per registration");
    let d = &updates[0];
    assert_eq!(d.name, TRACK_EVENT_DATA_SOURCE);
    assert_eq!(
        d.id,
        crate::track_event::data_source::track_event_type().id,
        "same data source id"
    );
    let te = d.track_event_descriptor.as_deref().expect("descriptor");
    let late = categories(te, "desc.late");
    assert_eq!(late.len(), 1, "the new category is advertised");
    assert_eq!(
        late[0].description.as_deref(),
        Some("Registered while connected")
    );
    assert_eq!(late[0].tags, ["debug"]);

    // What goes on the wire (UpdateDataSourceRequest.data_source_descriptor).
    let wire = crate::connection::proto::descriptor_proto(d);
    assert_eq!(wire.name.as_deref(), Some(TRACK_EVENT_DATA_SOURCE));
    assert_eq!(wire.track_event_descriptor.as_deref(), Some(te));

    // The event emitted after registration was recorded under it.
    let mut found = 0;
    for seq in lb.sequences().values() {
        let mut interned = Interned::default();
        for b in &seq.packets {
            let p = ts::TracePacket::decode(&b[..]).expect("valid TracePacket");
            interned.update(&p);
            if let Some(te) = &p.track_event {
                if interned.event_name(te).as_deref() == Some("after_registration") {
                    assert_eq!(interned.event_categories(te), ["desc.late"]);
                    found += 1;
                }
            }
        }
    }
    assert_eq!(found, 1);
    lb.shutdown();
}
