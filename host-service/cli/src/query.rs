//! `shmtrace query`: the service's state (QueryServiceState) as tables:
//! producers, data sources, tracing sessions and their buffers; or as JSON.
//!
//! A producer a relay forwards has its machine's id and name
//! (`ProducerInfo` fields 7 and 8, Perfetto since v56); the producers
//! table gets a MACHINE column only when one does, `host` for the
//! service's own.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::time::Duration;

use serde::Serialize;

use super::consumer::Consumer;
use super::units::{Bytes, Elapsed, UtcTime};
use super::{exit, CliError};
use shmtrace_ipc::protos::{self, DataSourceDescriptor, TracingServiceState, TrackEventDescriptor};

/// Arguments of `shmtrace query`.
#[derive(Debug, Clone, clap::Args)]
pub struct QueryArgs {
    /// The service's consumer socket (default: $PERFETTO_CONSUMER_SOCK_NAME,
    /// else /run/perfetto/traced-consumer.sock if /run/perfetto exists, else
    /// /tmp/perfetto-consumer).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<String>,
    /// Print the state as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The service state, in the form `query` prints.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ServiceState {
    /// The socket queried.
    pub socket: String,
    /// `tracing_service_version`.
    pub version: Option<String>,
    /// Connected producers.
    pub producers: Vec<Producer>,
    /// Registered data sources.
    pub data_sources: Vec<DataSource>,
    /// Whether the service lists sessions (Perfetto since v26).
    pub lists_sessions: bool,
    /// Sessions the caller may see.
    pub sessions: Vec<Session>,
    /// All sessions of the service.
    pub num_sessions: Option<i32>,
    /// All started sessions of the service.
    pub num_sessions_started: Option<i32>,
}

/// A producer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Producer {
    /// Producer id.
    pub id: i32,
    /// Name it gave.
    pub name: String,
    /// Process id (0 if unknown).
    pub pid: i32,
    /// User id.
    pub uid: i32,
    /// SDK version string.
    pub sdk_version: Option<String>,
    /// A frozen Android app.
    pub frozen: bool,
    /// The machine it connected from through a relay (`None`: the
    /// service's own machine).
    pub machine_id: Option<u32>,
    /// That machine's name, as its relay announced it.
    pub machine_name: Option<String>,
}

impl Producer {
    /// Its machine for the tables: `host` (the service's own), else the
    /// relayed machine's name and id, or its id alone.
    pub fn machine_label(&self) -> String {
        match (self.machine_id, &self.machine_name) {
            (None, _) => "host".to_owned(),
            (Some(id), Some(name)) => format!("{name} ({id})"),
            (Some(id), None) => id.to_string(),
        }
    }
}

/// A registered data source.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DataSource {
    /// The producer that registered it.
    pub producer_id: i32,
    /// Its name.
    pub name: String,
    /// For track_event: the categories it advertises.
    pub categories: Vec<String>,
    /// Descriptor flags that are set.
    pub flags: Vec<&'static str>,
}

/// A tracing session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Session {
    /// Session id.
    pub id: u64,
    /// State (`CONFIGURED`, `STARTED`, ...).
    pub state: String,
    /// Consumer's uid.
    pub consumer_uid: i32,
    /// Unique session name, if any.
    pub name: Option<String>,
    /// Buffer sizes, KiB.
    pub buffer_size_kb: Vec<u32>,
    /// Duration, ms (0: until stopped).
    pub duration_ms: u32,
    /// Data source instances.
    pub num_data_sources: u32,
    /// Wall-clock start, ns since the epoch.
    pub start_realtime_ns: Option<i64>,
}

/// The track event categories a data source's descriptor advertises
/// (its `TrackEventDescriptor`), each with its tags; none for another data
/// source, or a descriptor that does not decode.
pub fn track_event_categories(desc: &DataSourceDescriptor) -> Vec<(String, Vec<String>)> {
    protos::from_raw::<TrackEventDescriptor>(desc.track_event_descriptor.as_ref())
        .map(|t| {
            t.available_categories
                .into_iter()
                .filter_map(|c| Some((c.name?, c.tags)))
                .collect()
        })
        .unwrap_or_default()
}

/// The width of a text column: at least `min`, else its longest entry's
/// (so that a long name shifts the columns after it, the same on every
/// row).
fn column<'a>(min: usize, entries: impl Iterator<Item = &'a str>) -> usize {
    entries.map(|e| e.chars().count()).fold(min, usize::max)
}

impl ServiceState {
    /// Converts the protocol message.
    pub fn from_proto(socket: String, state: TracingServiceState) -> Self {
        let producers = state
            .producers
            .into_iter()
            .map(|p| Producer {
                id: p.id.unwrap_or(0),
                name: p.name.unwrap_or_default(),
                pid: p.pid.unwrap_or(0),
                uid: p.uid.unwrap_or(0),
                sdk_version: p.sdk_version.filter(|v| !v.is_empty()),
                frozen: p.frozen.unwrap_or(false),
                // 0 is the service's own machine, as unset (upstream's
                // protos/perfetto/common/tracing_service_state.proto).
                machine_id: p.machine_id.filter(|&m| m != 0),
                machine_name: p
                    .machine_name
                    .filter(|n| !n.is_empty() && p.machine_id.unwrap_or(0) != 0),
            })
            .collect();
        let data_sources = state
            .data_sources
            .into_iter()
            .map(|d| {
                let desc = d.ds_descriptor.unwrap_or_default();
                let categories = track_event_categories(&desc)
                    .into_iter()
                    .map(|(name, _)| name)
                    .collect();
                let flags = [
                    (desc.will_notify_on_start, "notifies start"),
                    (desc.will_notify_on_stop, "notifies stop"),
                    (
                        desc.handles_incremental_state_clear,
                        "clears incremental state",
                    ),
                    (desc.no_flush, "no flush"),
                ]
                .into_iter()
                .filter_map(|(set, name)| (set == Some(true)).then_some(name))
                .collect();
                DataSource {
                    producer_id: d.producer_id.unwrap_or(0),
                    name: desc.name.unwrap_or_default(),
                    categories,
                    flags,
                }
            })
            .collect();
        let sessions = state
            .tracing_sessions
            .into_iter()
            .map(|s| Session {
                id: s.id.unwrap_or(0),
                state: s.state.unwrap_or_default(),
                consumer_uid: s.consumer_uid.unwrap_or(0),
                name: s.unique_session_name.filter(|n| !n.is_empty()),
                buffer_size_kb: s.buffer_size_kb,
                duration_ms: s.duration_ms.unwrap_or(0),
                num_data_sources: s.num_data_sources.unwrap_or(0),
                start_realtime_ns: s.start_realtime_ns.filter(|&t| t > 0),
            })
            .collect();
        ServiceState {
            socket,
            version: state.tracing_service_version.filter(|v| !v.is_empty()),
            producers,
            data_sources,
            lists_sessions: state.supports_tracing_sessions.unwrap_or(false),
            sessions,
            num_sessions: state.num_sessions,
            num_sessions_started: state.num_sessions_started,
        }
    }

    /// Writes the tables.
    pub fn render(&self, out: &mut impl Write) -> std::io::Result<()> {
        writeln!(
            out,
            "Service at {}: {}",
            self.socket,
            self.version.as_deref().unwrap_or("(version not reported)")
        )?;
        let sessions = match (self.num_sessions, self.num_sessions_started) {
            (Some(n), Some(started)) => format!("{n} tracing session(s), {started} started"),
            (Some(n), None) => format!("{n} tracing session(s)"),
            _ => "sessions not reported".to_owned(),
        };
        // Machines only where a relay forwards producers: the service's
        // own machine alone needs no column.
        let relayed = self.producers.iter().any(|p| p.machine_id.is_some());
        let machines = if relayed {
            let ids: BTreeSet<Option<u32>> = self.producers.iter().map(|p| p.machine_id).collect();
            format!(" on {} machine(s)", ids.len())
        } else {
            String::new()
        };
        writeln!(
            out,
            "  {} producer(s){machines}, {} data source(s), {sessions}",
            self.producers.len(),
            self.data_sources.len()
        )?;

        writeln!(out, "\nProducers:")?;
        if self.producers.is_empty() {
            writeln!(out, "  (none connected)")?;
        } else {
            let labels: Vec<String> = self.producers.iter().map(|p| p.machine_label()).collect();
            let mw = column(24, labels.iter().map(String::as_str));
            let machine_column = |label: &str| {
                if relayed {
                    format!("{label:<mw$} ")
                } else {
                    String::new()
                }
            };
            let nw = column(28, self.producers.iter().map(|p| p.name.as_str()));
            writeln!(
                out,
                "  {:>5}  {:<nw$} {:>8} {:>7}  {}SDK",
                "ID",
                "NAME",
                "PID",
                "UID",
                machine_column("MACHINE")
            )?;
            for (p, label) in self.producers.iter().zip(&labels) {
                writeln!(
                    out,
                    "  {:>5}  {:<nw$} {:>8} {:>7}  {}{}{}",
                    p.id,
                    p.name,
                    if p.pid > 0 {
                        p.pid.to_string()
                    } else {
                        "?".into()
                    },
                    p.uid,
                    machine_column(label),
                    p.sdk_version.as_deref().unwrap_or("-"),
                    if p.frozen { " (frozen)" } else { "" }
                )?;
            }
        }

        writeln!(out, "\nData sources:")?;
        if self.data_sources.is_empty() {
            writeln!(out, "  (none registered)")?;
        } else {
            let names: BTreeMap<i32, &str> = self
                .producers
                .iter()
                .map(|p| (p.id, p.name.as_str()))
                .collect();
            let producers: Vec<String> = self
                .data_sources
                .iter()
                .map(|d| {
                    let name = names.get(&d.producer_id).copied().unwrap_or("?");
                    format!("{} {name}", d.producer_id)
                })
                .collect();
            let pw = column(34, producers.iter().map(String::as_str));
            let nw = column(24, self.data_sources.iter().map(|d| d.name.as_str()));
            writeln!(out, "  {:<pw$} {:<nw$} DETAILS", "PRODUCER", "NAME")?;
            for (d, producer) in self.data_sources.iter().zip(&producers) {
                let mut details = Vec::new();
                if !d.categories.is_empty() {
                    const SHOWN: usize = 8;
                    let mut list = d.categories[..d.categories.len().min(SHOWN)].join(", ");
                    if d.categories.len() > SHOWN {
                        list.push_str(&format!(", ... ({} in all)", d.categories.len()));
                    }
                    details.push(format!("categories: {list}"));
                }
                details.extend(d.flags.iter().map(|f| (*f).to_owned()));
                writeln!(
                    out,
                    "  {producer:<pw$} {:<nw$} {}",
                    d.name,
                    details.join("; ")
                )?;
            }
        }

        writeln!(out, "\nTracing sessions:")?;
        if !self.lists_sessions {
            writeln!(out, "  (this service does not list sessions)")?;
        } else if self.sessions.is_empty() {
            writeln!(out, "  (none visible to this user)")?;
        } else {
            let buffers: Vec<String> = self
                .sessions
                .iter()
                .map(|s| {
                    let sizes: Vec<String> = s
                        .buffer_size_kb
                        .iter()
                        .map(|kb| Bytes(u64::from(*kb) * 1024).to_string())
                        .collect();
                    sizes.join(", ")
                })
                .collect();
            let bw = column(24, buffers.iter().map(String::as_str));
            writeln!(
                out,
                "  {:>6}  {:<12} {:>7} {:>8} {:>9}  {:<bw$} STARTED",
                "ID", "STATE", "UID", "SOURCES", "DURATION", "BUFFERS"
            )?;
            for (s, buffers) in self.sessions.iter().zip(&buffers) {
                let duration = if s.duration_ms == 0 {
                    "-".to_owned()
                } else {
                    Elapsed(Duration::from_millis(u64::from(s.duration_ms))).to_string()
                };
                let started = s.start_realtime_ns.map_or("-".to_owned(), |ns| {
                    UtcTime::from_unix(ns / 1_000_000_000).to_string()
                });
                let name = s
                    .name
                    .as_deref()
                    .map(|n| format!(" ({n})"))
                    .unwrap_or_default();
                writeln!(
                    out,
                    "  {:>6}  {:<12} {:>7} {:>8} {:>9}  {buffers:<bw$} {started}{name}",
                    s.id, s.state, s.consumer_uid, s.num_data_sources, duration,
                )?;
            }
        }
        Ok(())
    }
}

/// Runs `shmtrace query`; returns the exit status.
pub fn run(args: &QueryArgs, out: &mut impl Write) -> Result<u8, CliError> {
    let consumer = Consumer::connect(args.socket.as_deref())?;
    let state = consumer.service_state(false)?;
    let state = ServiceState::from_proto(consumer.address().to_string(), state);
    if args.json {
        serde_json::to_writer_pretty(&mut *out, &state).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        state.render(out)?;
    }
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shmtrace_ipc::protos::tracing_service_state::Producer as ProducerProto;

    fn producer(id: i32, name: &str, machine: Option<(u32, &str)>) -> ProducerProto {
        ProducerProto {
            id: Some(id),
            name: Some(name.into()),
            pid: Some(100 + id),
            uid: Some(1000),
            machine_id: machine.map(|(m, _)| m),
            machine_name: machine.map(|(_, n)| n.to_owned()),
            ..Default::default()
        }
    }

    fn rendered(producers: Vec<ProducerProto>) -> (ServiceState, String) {
        let proto = TracingServiceState {
            producers,
            ..Default::default()
        };
        let state = ServiceState::from_proto("sock".into(), proto);
        let mut out = Vec::new();
        state.render(&mut out).unwrap();
        (state, String::from_utf8(out).unwrap())
    }

    /// The service's own producers only: no machine column, no machine
    /// count, and machine 0 (as some services send for "this one") is none.
    #[test]
    fn one_machine_shows_no_machines() {
        let (state, text) = rendered(vec![
            producer(1, "app", None),
            producer(2, "other", Some((0, ""))),
        ]);
        assert_eq!(state.producers[1].machine_id, None);
        assert!(text.contains("  2 producer(s), 0 data source(s)"), "{text}");
        assert!(!text.contains("MACHINE"), "{text}");
        assert!(!text.contains("machine"), "{text}");
        let header = text.lines().find(|l| l.contains("NAME")).unwrap();
        assert_eq!(header.split_whitespace().last(), Some("SDK"));
    }

    /// A name longer than its column widens it: every row's last column
    /// still starts under its header.
    #[test]
    fn long_names_keep_the_columns_aligned() {
        let long = "/work/build/target/debug/examples/custom_data_source";
        let (_, text) = rendered(vec![producer(1, "app", None), producer(2, long, None)]);
        let lines: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.contains("NAME"))
            .take(3)
            .collect();
        let sdk = lines[0].find("SDK").unwrap();
        for row in &lines[1..] {
            assert_eq!(row.rfind(" -").map(|i| i + 1), Some(sdk), "{text}");
        }
    }

    /// Relayed producers: each with its machine's name and id, the
    /// service's own as host, and the machines counted.
    #[test]
    fn relayed_producers_show_their_machines() {
        let (state, text) = rendered(vec![
            producer(1, "local", None),
            producer(2, "remote-a", Some((77, "vm-1"))),
            producer(3, "remote-b", Some((77, "vm-1"))),
            producer(4, "unnamed", Some((9, ""))),
        ]);
        assert_eq!(state.producers[1].machine_id, Some(77));
        assert_eq!(state.producers[1].machine_name.as_deref(), Some("vm-1"));
        assert_eq!(state.producers[3].machine_name, None);
        assert!(
            text.contains("  4 producer(s) on 3 machine(s), 0 data source(s)"),
            "{text}"
        );
        let row = |name: &str| -> Vec<String> {
            let line = text
                .lines()
                .find(|l| l.contains(name))
                .unwrap_or_else(|| panic!("{name} in {text}"));
            line.split_whitespace().map(str::to_owned).collect()
        };
        let header = row("NAME");
        assert_eq!(header, ["ID", "NAME", "PID", "UID", "MACHINE", "SDK"]);
        assert_eq!(row("local"), ["1", "local", "101", "1000", "host", "-"]);
        assert_eq!(
            row("remote-a"),
            ["2", "remote-a", "102", "1000", "vm-1", "(77)", "-"]
        );
        assert_eq!(row("unnamed"), ["4", "unnamed", "104", "1000", "9", "-"]);
        let json = serde_json::to_value(&state).unwrap();
        assert_eq!(json["producers"][1]["machine_id"], 77);
        assert_eq!(json["producers"][1]["machine_name"], "vm-1");
        assert!(json["producers"][0]["machine_id"].is_null());
    }
}
