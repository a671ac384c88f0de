//! Text-format TraceConfigs as Perfetto users write them, and broken ones:
//! every error names the line, the column and the field, and says why.

use prost::Message;
use shmtrace_service::cli::config::{Config, ConfigError, TextError};
use shmtrace_service::protos::trace_config::buffer_config::FillPolicy;
use shmtrace_service::protos::{self, DataSourceConfig, TraceConfig, TrackEventConfig};

fn parse(text: &str) -> Config {
    let config = Config::from_text(text, "config.pbtxt").unwrap_or_else(|e| panic!("{e}"));
    config.check().unwrap_or_else(|e| panic!("{e}"));
    config
}

fn text_error(text: &str) -> TextError {
    match Config::from_text(text, "config.pbtxt") {
        Err(ConfigError::Text(e)) => *e,
        Err(other) => panic!("not a text error: {other}"),
        Ok(_) => panic!("accepted:\n{text}"),
    }
}

fn data_source(config: &TraceConfig, i: usize) -> DataSourceConfig {
    protos::from_raw(config.data_sources[i].config.as_ref()).unwrap()
}

/// The shape of the track_event config in Perfetto's documentation.
#[test]
fn track_event_config_as_documented() {
    let config = parse(
        r#"
buffers {
  size_kb: 65536
  fill_policy: DISCARD
}
buffers {
  size_kb: 4096
  fill_policy: RING_BUFFER
}
data_sources {
  config {
    name: "track_event"
    target_buffer: 0
    track_event_config {
      disabled_categories: "*"
      enabled_categories: "rendering"
      enabled_categories: "audio.*"
      enabled_tags: "debug"
    }
  }
}
data_sources {
  config {
    name: "org.example.custom"
    target_buffer: 1
    legacy_config: "verbose=1"
  }
  producer_name_filter: "my-app"
}
duration_ms: 10000
write_into_file: true
file_write_period_ms: 2500
flush_period_ms: 30000
flush_timeout_ms: 10000
data_source_stop_timeout_ms: 2000
incremental_state_config {
  clear_period_ms: 1000
}
unique_session_name: "nightly"
"#,
    );
    let v = config.view();
    assert_eq!(v.buffers.len(), 2);
    assert_eq!(v.buffers[0].size_kb, Some(65536));
    assert_eq!(v.buffers[0].fill_policy, Some(FillPolicy::Discard as i32));
    assert_eq!(
        v.buffers[1].fill_policy,
        Some(FillPolicy::RingBuffer as i32)
    );
    assert_eq!(v.duration_ms, Some(10_000));
    assert_eq!(v.write_into_file, Some(true));
    assert_eq!(v.file_write_period_ms, Some(2500));
    assert_eq!(v.flush_period_ms, Some(30_000));
    assert_eq!(v.flush_timeout_ms, Some(10_000));
    assert_eq!(v.data_source_stop_timeout_ms, Some(2000));
    assert_eq!(
        v.incremental_state_config.as_ref().unwrap().clear_period_ms,
        Some(1000)
    );
    assert_eq!(v.unique_session_name.as_deref(), Some("nightly"));
    let te_ds = data_source(v, 0);
    assert_eq!(te_ds.name.as_deref(), Some("track_event"));
    let te: TrackEventConfig = protos::from_raw(te_ds.track_event_config.as_ref()).unwrap();
    assert_eq!(te.disabled_categories, ["*"]);
    assert_eq!(te.enabled_categories, ["rendering", "audio.*"]);
    assert_eq!(te.enabled_tags, ["debug"]);
    let custom = data_source(v, 1);
    assert_eq!(custom.target_buffer, Some(1));
    assert_eq!(custom.legacy_config.as_deref(), Some("verbose=1"));
    assert_eq!(v.data_sources[1].producer_name_filter, ["my-app"]);
    assert_eq!(
        config.data_source_names(),
        ["track_event", "org.example.custom"]
    );
    // What is sent decodes to the same config.
    assert_eq!(&TraceConfig::decode(config.bytes()).unwrap(), v);
}

/// Colons before braces, lists, `<>` brackets, `;` separators and
/// comments: all the spellings the text format allows.
#[test]
fn text_format_spellings() {
    let config = parse(
        "# comment\nbuffers: { size_kb: 1024 }  # trailing comment\n\
         buffers < size_kb: 2048; fill_policy: 2 >\n\
         data_sources: [{ config: { name: 'track_event' track_event_config: \
         { enabled_categories: [\"a\", \"b\"] } } }]\n\
         duration_ms: 0x3e8\n",
    );
    let v = config.view();
    assert_eq!(v.buffers[1].size_kb, Some(2048));
    assert_eq!(v.buffers[1].fill_policy, Some(2));
    assert_eq!(v.duration_ms, Some(1000));
    let te: TrackEventConfig =
        protos::from_raw(data_source(v, 0).track_event_config.as_ref()).unwrap();
    assert_eq!(te.enabled_categories, ["a", "b"]);
    // And back to text.
    let text = config.to_text();
    assert!(
        text.contains("enabled_categories: [\"a\", \"b\"]"),
        "{text}"
    );
}

#[test]
fn unknown_enum_value() {
    let e = text_error("buffers {\n  size_kb: 1024\n  fill_policy: DISCARDD\n}\n");
    assert_eq!((e.line, e.column), (3, 16));
    assert_eq!(e.field.as_deref(), Some("buffers[0].fill_policy"));
    assert!(e.message.contains("DISCARDD"), "{}", e.message);
}

#[test]
fn wrong_value_type() {
    let e = text_error("buffers { size_kb: \"big\" }");
    assert_eq!((e.line, e.column), (1, 20));
    assert_eq!(e.field.as_deref(), Some("buffers[0].size_kb"));
}

#[test]
fn misspelt_nested_field_with_a_suggestion() {
    let e = text_error(
        "buffers { size_kb: 1 }\ndata_sources {\n  config {\n    name: \"track_event\"\n    \
         track_event_config {\n      enabled_categories: \"a\"\n      disabled_categoires: \"*\"\n    }\n  }\n}\n",
    );
    assert_eq!((e.line, e.column), (7, 7));
    assert_eq!(
        e.field.as_deref(),
        Some("data_sources[0].config.track_event_config.disabled_categoires")
    );
    assert_eq!(
        e.hint.as_deref(),
        Some("TrackEventConfig has no field `disabled_categoires`; did you mean `disabled_categories`?")
    );
    let shown = e.to_string();
    assert!(shown.starts_with("config.pbtxt:7:7: "), "{shown}");
    assert!(
        shown.contains("7 |       disabled_categoires: \"*\""),
        "{shown}"
    );
}

#[test]
fn second_repeated_entry_is_numbered() {
    let e = text_error("buffers { size_kb: 1 }\nbuffers { size_kb: 2 sise_kb: 3 }\n");
    assert_eq!(e.line, 2);
    assert_eq!(e.field.as_deref(), Some("buffers[1].sise_kb"));
    assert!(e.hint.unwrap().contains("did you mean `size_kb`"));
}

#[test]
fn unclosed_brace_points_at_the_end() {
    let text = "buffers {\n  size_kb: 1024\n";
    let e = text_error(text);
    assert_eq!(e.line, 3, "{e}");
    assert!(e.message.contains("end of input"), "{}", e.message);
}

#[test]
fn data_source_config_without_a_schema_here() {
    let e = text_error(
        "buffers { size_kb: 1 }\ndata_sources {\n  config {\n    name: \"linux.ftrace\"\n    \
         ftrace_config {\n      ftrace_events: \"sched/sched_switch\"\n    }\n  }\n}\n",
    );
    assert_eq!(e.line, 5);
    assert_eq!(
        e.field.as_deref(),
        Some("data_sources[0].config.ftrace_config")
    );
    let hint = e.hint.unwrap();
    assert!(
        hint.contains("does not carry the schema of `ftrace_config`"),
        "{hint}"
    );
    assert!(hint.contains("-c FILE"), "{hint}");
}

#[test]
fn parses_but_cannot_work() {
    for (text, expected) in [
        ("duration_ms: 10", "no buffers"),
        ("buffers { fill_policy: DISCARD }", "buffers[0]: size_kb is missing or 0"),
        ("buffers { size_kb: 4 }", "no data_sources"),
        (
            "buffers { size_kb: 4 } data_sources { config { target_buffer: 0 } }",
            "data_sources[0].config.name is missing",
        ),
        (
            "buffers { size_kb: 4 } data_sources { config { name: \"x\" target_buffer_name: \"big\" } }",
            "target_buffer_name \"big\" names no buffer",
        ),
    ] {
        let config = Config::from_text(text, "c").unwrap();
        let e = config.check().expect_err(text).to_string();
        assert!(e.contains(expected), "{text}: {e}");
    }
}
