//! Text-format TraceConfigs as Perfetto users write them, and broken ones:
//! every error names the line, the column and the field, and says why.

use prost::Message;
use shmtrace_cli::config::{Config, ConfigError, TextError};
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
    // And back to text, a line per value, as Perfetto's parser reads it.
    let text = config.to_text();
    assert!(
        text.contains("enabled_categories: \"a\"\n")
            && text.contains("enabled_categories: \"b\"\n"),
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

/// Lower-case hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The expected bytes of the two configs below are what the official
/// python protobuf encodes them to, with the schema of the `perfetto`
/// PyPI package v0.59.1. Made once with
/// `python3 host-service/cli/src/schema/gen_trace_config.py --encode FILE`
/// (FILE holding the text of the test), which runs
/// `text_format.Parse` + `SerializeToString(deterministic=True)`.
const SYSTEM_TRACE: &str = r#"buffers {
  size_kb: 63488
  fill_policy: DISCARD
}
buffers {
  size_kb: 2048
  fill_policy: RING_BUFFER
}
data_sources {
  config {
    name: "linux.ftrace"
    target_buffer: 0
    ftrace_config {
      buffer_size_kb: 16384
      drain_period_ms: 250
      ftrace_events: "sched/sched_switch"
      ftrace_events: "sched/sched_waking"
      ftrace_events: "power/suspend_resume"
      ftrace_events: "ftrace/print"
      atrace_categories: "gfx"
      atrace_categories: "view"
      atrace_apps: "com.example.app"
      symbolize_ksyms: true
      compact_sched {
        enabled: true
      }
    }
  }
}
data_sources {
  config {
    name: "linux.process_stats"
    target_buffer: 1
    process_stats_config {
      scan_all_processes_on_start: true
      proc_stats_poll_ms: 1000
    }
  }
}
data_sources {
  config {
    name: "linux.sys_stats"
    target_buffer: 1
    sys_stats_config {
      meminfo_period_ms: 1000
      meminfo_counters: MEMINFO_MEM_TOTAL
      meminfo_counters: MEMINFO_MEM_FREE
      vmstat_period_ms: 1000
      stat_period_ms: 1000
      stat_counters: STAT_CPU_TIMES
      stat_counters: STAT_FORK_COUNT
    }
  }
}
data_sources {
  config {
    name: "android.log"
    android_log_config {
      log_ids: LID_DEFAULT
      log_ids: LID_SYSTEM
      min_prio: PRIO_INFO
    }
  }
}
data_sources {
  config {
    name: "track_event"
    track_event_config {
      disabled_categories: "*"
      enabled_categories: "rendering"
      enabled_categories: "audio.*"
      enabled_tags: "slow"
      disabled_tags: "debug"
    }
  }
}
duration_ms: 10000
write_into_file: true
file_write_period_ms: 2500
flush_period_ms: 30000
incremental_state_config {
  clear_period_ms: 5000
}
"#;

const SYSTEM_TRACE_BYTES: &[&str] = &[
    "0a060880f00320020a050880102001128b010a88010a0c6c696e75782e667472",
    "6163651000a206750a1273636865642f73636865645f7377697463680a127363",
    "6865642f73636865645f77616b696e670a14706f7765722f73757370656e645f",
    "726573756d650a0c6674726163652f7072696e7412036766781204766965771a",
    "0f636f6d2e6578616d706c652e6170705080800158fa0162020801680112210a",
    "1f0a136c696e75782e70726f636573735f73746174731001ba0605100120e807",
    "12290a270a0f6c696e75782e7379735f73746174731001c2061108e807100110",
    "0218e80728e8073001300412180a160a0b616e64726f69642e6c6f67da060608",
    "000803180412360a340a0b747261636b5f6576656e748a07240a012a12097265",
    "6e646572696e671207617564696f2e2a1a0564656275672204736c6f7718904e",
    "400148c41368b0ea01aa0103088827",
];

const TRIGGERED_PROFILE: &str = r#"buffers: {
  size_kb: 32768
  fill_policy: RING_BUFFER
}
data_sources: {
  config {
    name: "android.heapprofd"
    heapprofd_config {
      sampling_interval_bytes: 4096
      process_cmdline: "com.example.app"
      shmem_size_bytes: 8388608
      block_client: true
    }
  }
}
data_sources: {
  config {
    name: "linux.perf"
    perf_event_config {
      timebase {
        frequency: 100
        counter: SW_CPU_CLOCK
      }
      callstack_sampling {
        kernel_frames: true
      }
    }
  }
}
data_sources: {
  config {
    name: "org.chromium.trace_event"
    chrome_config {
      trace_config: "{\"record_mode\":\"record-until-full\"}"
    }
  }
}
trigger_config {
  trigger_mode: STOP_TRACING
  trigger_timeout_ms: 30000
  triggers {
    name: "jank"
    producer_name_regex: ".*"
    stop_delay_ms: 500
  }
}
"#;

const TRIGGERED_PROFILE_BYTES: &[&str] = &[
    "0a0608808002200112330a310a11616e64726f69642e6865617070726f6664ca",
    "061b088020120f636f6d2e6578616d706c652e61707040808080044801121c0a",
    "1a0a0a6c696e75782e70657266fa060b7a0410642001820102100112440a420a",
    "186f72672e6368726f6d69756d2e74726163655f6576656e74aa06250a237b22",
    "7265636f72645f6d6f6465223a227265636f72642d756e74696c2d66756c6c22",
    "7d8a01150802120d0a046a616e6b12022e2a18f40318b0ea01",
];

/// A system trace as in Perfetto's docs: ftrace with atrace, process and
/// system stats, logcat, track_event with categories and tags, long trace
/// settings. Encodes to the same bytes as the official protobuf.
#[test]
fn system_trace_config_encodes_as_upstream() {
    let config = parse(SYSTEM_TRACE);
    assert_eq!(hex(config.bytes()), SYSTEM_TRACE_BYTES.concat());
    let v = config.view();
    assert_eq!(v.write_into_file, Some(true));
    assert_eq!(v.flush_period_ms, Some(30_000));
    assert_eq!(
        config.data_source_names(),
        [
            "linux.ftrace",
            "linux.process_stats",
            "linux.sys_stats",
            "android.log",
            "track_event"
        ]
    );
    let te: TrackEventConfig =
        protos::from_raw(data_source(v, 4).track_event_config.as_ref()).unwrap();
    assert_eq!(te.enabled_categories, ["rendering", "audio.*"]);
    assert_eq!(te.disabled_tags, ["debug"]);
    // Printed back with the data-source configs decoded, without the
    // `[...]` lists Perfetto's own text parser does not read, and read back
    // to the same bytes.
    let text = config.to_text();
    for needle in [
        "ftrace_events: \"sched/sched_switch\"",
        "atrace_apps: \"com.example.app\"",
        "scan_all_processes_on_start: true",
        "meminfo_counters: MEMINFO_MEM_TOTAL\n",
        "meminfo_counters: MEMINFO_MEM_FREE\n",
        "min_prio: PRIO_INFO",
    ] {
        assert!(text.contains(needle), "{needle} not in\n{text}");
    }
    assert!(!text.contains('['), "{text}");
    assert_eq!(hex(parse(&text).bytes()), SYSTEM_TRACE_BYTES.concat());
    // And the text parses to the same bytes again.
    let again = Config::from_text(&text, "printed").unwrap();
    assert_eq!(again.bytes(), config.bytes());
}

/// heapprofd, perf, a Chrome config and a stop trigger.
#[test]
fn triggered_profile_config_encodes_as_upstream() {
    let config = parse(TRIGGERED_PROFILE);
    assert_eq!(hex(config.bytes()), TRIGGERED_PROFILE_BYTES.concat());
    assert_eq!(
        config.data_source_names(),
        [
            "android.heapprofd",
            "linux.perf",
            "org.chromium.trace_event"
        ]
    );
}

/// Misspelt names inside and of data-source configs: line, column, field
/// path and the closest name.
#[test]
fn misspelt_data_source_config_fields_with_suggestions() {
    for (text, at, field, hint) in [
        (
            "buffers { size_kb: 1 }\ndata_sources {\n  config {\n    name: \"linux.ftrace\"\n    \
             ftrace_config {\n      ftrace_event: \"sched/sched_switch\"\n    }\n  }\n}\n",
            (6, 7),
            "data_sources[0].config.ftrace_config.ftrace_event",
            "FtraceConfig has no field `ftrace_event`; did you mean `ftrace_events`?",
        ),
        (
            "buffers { size_kb: 1 }\ndata_sources {\n  config {\n    name: \"linux.process_stats\"\n    \
             process_stat_config {\n      scan_all_processes_on_start: true\n    }\n  }\n}\n",
            (5, 5),
            "data_sources[0].config.process_stat_config",
            "DataSourceConfig has no field `process_stat_config`; did you mean \
             `process_stats_config`?",
        ),
    ] {
        let e = text_error(text);
        assert_eq!((e.line, e.column), at, "{e}");
        assert_eq!(e.field.as_deref(), Some(field));
        assert_eq!(e.hint.as_deref(), Some(hint));
    }
}

#[test]
fn unknown_enum_value_in_a_data_source_config() {
    let e = text_error(
        "buffers { size_kb: 1 }\ndata_sources { config { name: \"linux.sys_stats\"\n  \
         sys_stats_config { meminfo_period_ms: 1000 meminfo_counters: MEMINFO_MEM_TOTALL } } }\n",
    );
    assert_eq!(e.line, 3);
    assert_eq!(
        e.field.as_deref(),
        Some("data_sources[0].config.sys_stats_config.meminfo_counters[0]")
    );
    assert!(e.message.contains("MEMINFO_MEM_TOTALL"), "{}", e.message);
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
