//! The end-of-session summary: what was written, what each data source
//! contributed, what was lost and why, and how to open the file.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use super::session::{Ended, ServiceCounters, SessionReport};
use super::snapshots::FailedSnapshot;
use crate::config::{Config, TRACK_EVENT};
use crate::inspect::{stats_info, Analysis, BUFFER_LOSS_STATS, SERVICE_LOSS_STATS};
use crate::units::{Bytes, Elapsed};
use shmtrace_ipc::protos::{self, TrackEventConfig};
use shmtrace_producer::filter;

/// The summary of one `record`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    /// The trace file.
    pub file: String,
    /// The trace went to standard output (`-o -`).
    #[serde(skip)]
    pub to_stdout: bool,
    /// Its size.
    pub file_bytes: u64,
    /// Packets in it.
    pub packets: u64,
    /// Track events in it (`None`: not counted, the trace went to
    /// standard output, which cannot be read back, or the file could not
    /// be read back).
    pub track_events: Option<u64>,
    /// Producer packet sequences (writers) in it (`None` as for
    /// `track_events`).
    pub sequences: Option<usize>,
    /// Producer processes in it.
    pub producer_pids: Vec<i32>,
    /// How long the session ran.
    pub duration_ms: u64,
    /// How it ended.
    pub ended: String,
    /// Per data source of the config: what happened to it.
    pub data_sources: Vec<DataSourceOutcome>,
    /// Lost data, each with its cause; empty if nothing was lost.
    pub losses: Vec<String>,
    /// Problems `inspect --check` would report.
    pub problems: u64,
    /// Snapshots written for CLONE_SNAPSHOT triggers.
    pub snapshots: Vec<String>,
    /// Snapshots CLONE_SNAPSHOT triggers asked for and that were not
    /// written, and why.
    pub failed_snapshots: Vec<FailedSnapshot>,
}

/// Why a track_event data source that started recorded nothing, as far as
/// its categories tell: which of the `registered` ones (name, tags) the
/// config's `TrackEventConfig` enables, by the SDK's matching rules
/// (`shmtrace_producer::filter`), and which ones it names.
fn categories_hint(config: &Config, registered: &BTreeMap<String, Vec<String>>) -> String {
    let te = config
        .data_sources()
        .into_iter()
        .flatten()
        .find(|d| d.name.as_deref() == Some(TRACK_EVENT))
        .and_then(|d| protos::from_raw::<TrackEventConfig>(d.track_event_config.as_ref()).ok())
        .unwrap_or_default();
    let named = te.enabled_categories.join(", ");
    let filter = filter::TrackEventConfig {
        disabled_categories: te.disabled_categories,
        enabled_categories: te.enabled_categories,
        disabled_tags: te.disabled_tags,
        enabled_tags: te.enabled_tags,
    };
    let enabled: Vec<&str> = registered
        .iter()
        .filter(|(name, tags)| {
            let tags: Vec<&str> = tags.iter().map(String::as_str).collect();
            filter.decide(name, &tags).enables()
        })
        .map(|(name, _)| name.as_str())
        .collect();
    let all: Vec<&str> = registered.keys().map(String::as_str).collect();
    match (all.is_empty(), enabled.is_empty(), named.is_empty()) {
        (true, _, true) => "are the categories enabled?".to_owned(),
        (true, _, false) => format!(
            "it enables the categories {named}: are they the program's? `shmtrace query` \
             lists those of running programs"
        ),
        (false, true, _) => format!(
            "it enables none of the categories its producers registered ({}){}",
            all.join(", "),
            if named.is_empty() {
                String::new()
            } else {
                format!(", only {named}")
            }
        ),
        (false, false, _) => format!(
            "it enables {} of the categories its producers registered: did they emit \
             events in them?",
            enabled.join(", ")
        ),
    }
}

/// The status of a track_event data source that started on `producers`
/// and left no track event in the file: a CLONE_SNAPSHOT session's file
/// holds none by design (its events go into the snapshots), any other's
/// gets the categories' hint.
fn nothing_recorded_status(
    config: &Config,
    producers: &[String],
    registered: &BTreeMap<String, Vec<String>>,
) -> String {
    if config.clone_snapshots() {
        return format!(
            "started on {}; a CLONE_SNAPSHOT session's events are in the snapshots its \
             triggers take, not in this file",
            producers.join(", ")
        );
    }
    format!(
        "started on {}, but no track events were recorded ({})",
        producers.join(", "),
        categories_hint(config, registered)
    )
}

/// Whether the session waited for a START_TRACING trigger that, as the
/// trace read back says, never came.
fn no_start_trigger(config: &Config, analysis: Option<&Analysis>) -> bool {
    config.waits_for_start_trigger() && analysis.is_some_and(|a| a.session.triggers.is_empty())
}

/// For a loss statistic `what` (as `inspect` names it: `service: NAME`)
/// that the service counts over all its sessions: how much of `value` came
/// while this session ran, `start` being the counters as it started; `None`
/// for a statistic of the session's own.
fn service_wide(what: &str, value: u64, start: ServiceCounters) -> Option<u64> {
    let name = what.strip_prefix("service: ")?;
    ServiceCounters::NAMES
        .contains(&name)
        .then(|| value.saturating_sub(start.get(name)))
}

/// The loss line of the statistic `what` = `value`: a service-wide
/// counter as what it grew by since `start`, its value as the session
/// started (or as `record` `attached` to it; nothing if it did not grow),
/// any other as it is.
fn loss_line(
    what: &str,
    value: u64,
    meaning: &str,
    start: ServiceCounters,
    attached: bool,
) -> Option<String> {
    match service_wide(what, value, start) {
        Some(0) => None,
        Some(grown) => {
            let since = if attached {
                "since this record attached"
            } else {
                "during this session"
            };
            Some(format!(
                "{what} = {grown} {since} ({value} since the service started): {meaning}"
            ))
        }
        None => Some(format!("{what} = {value}: {meaning}")),
    }
}

/// What happened to one data source of the config.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DataSourceOutcome {
    /// Its name.
    pub name: String,
    /// Producers on which an instance started (if the service reports it).
    pub producers: Vec<String>,
    /// Whether a producer registered it.
    pub registered: bool,
    /// In words.
    pub status: String,
}

/// How the service ended a session without a configured duration: by its
/// triggers, if its config has some and the trace was read back (the
/// first trigger in it, or none within the trigger timeout), else just by
/// the service.
fn ended_by_triggers(config: &Config, analysis: Option<&Analysis>) -> String {
    use protos::trace_config::trigger_config::TriggerMode;
    let (Some(triggers), Some(analysis)) = (config.view().trigger_config.as_ref(), analysis) else {
        return "ended by the service".to_owned();
    };
    if config.clone_snapshots() {
        return format!(
            "ended by the service at its trigger_timeout_ms ({}); a CLONE_SNAPSHOT session is \
             read only through the snapshots its triggers take",
            Elapsed(Duration::from_millis(u64::from(
                triggers.trigger_timeout_ms.unwrap_or(0)
            )))
        );
    }
    let mode = match triggers
        .trigger_mode
        .and_then(|m| TriggerMode::try_from(m).ok())
    {
        Some(TriggerMode::StartTracing) => "START_TRACING",
        Some(TriggerMode::StopTracing) => "STOP_TRACING",
        _ => return "ended by the service".to_owned(),
    };
    let fired = analysis.session.triggers.first();
    match fired {
        Some(name) if mode == "START_TRACING" => format!(
            "ended by the service: the START_TRACING trigger {name:?} started it, and its stop \
             delay ended it"
        ),
        Some(name) => format!("ended by the service after the {mode} trigger {name:?}"),
        None => format!(
            "ended by the service: no {mode} trigger came within trigger_timeout_ms ({})",
            Elapsed(Duration::from_millis(u64::from(
                triggers.trigger_timeout_ms.unwrap_or(0)
            )))
        ),
    }
}

impl Summary {
    /// Puts the summary together.
    pub fn new(
        path: &Path,
        file_bytes: u64,
        config: &Config,
        report: &SessionReport,
        analysis: Option<&Analysis>,
    ) -> Self {
        let duration = Duration::from_millis(u64::from(config.view().duration_ms.unwrap_or(0)));
        let ended = match &report.ended {
            Ended::Stopped { why, flushed: true } => format!("stopped {why} (flushed)"),
            Ended::Stopped {
                why,
                flushed: false,
            } => format!(
                "stopped {why} (the flush did not complete: data still in the producers' \
                 buffers may be missing)"
            ),
            Ended::ByService
                if !duration.is_zero()
                    && report.elapsed + Duration::from_millis(500) >= duration =>
            {
                format!(
                    "ended by the service after the configured {}",
                    Elapsed(duration)
                )
            }
            Ended::ByService => ended_by_triggers(config, analysis),
            Ended::Failed(error) => format!("failed: {error}"),
            Ended::Cloned { flushed, into_file } => format!(
                "a snapshot of the running session, which runs on{}{}",
                if *flushed {
                    " (flushed)"
                } else {
                    " (the flush did not complete: data still in the producers' buffers may be \
                     missing)"
                },
                if *into_file {
                    "; the service wrote it (write_into_file)"
                } else {
                    ""
                }
            ),
        };
        let data_sources = config
            .data_source_names()
            .into_iter()
            .map(|name| {
                let producers: Vec<String> = report
                    .started
                    .iter()
                    .filter(|(_, ds)| *ds == name)
                    .map(|(p, _)| p.clone())
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect();
                let registered = report.registered.contains(&name) || !producers.is_empty();
                let nothing_recorded =
                    name == TRACK_EVENT && analysis.is_some_and(|a| a.track_events.total == 0);
                let events_recorded =
                    name == TRACK_EVENT && analysis.is_some_and(|a| a.track_events.total > 0);
                let status = if producers.is_empty() && events_recorded {
                    // Its producers were not seen (attached, or not
                    // observed), but what they wrote is there.
                    "recorded".to_owned()
                } else if producers.is_empty() && report.attached && !registered {
                    "no producer has it now (this record attached to the running session: \
                     earlier ones were not seen)"
                        .to_owned()
                } else if !producers.is_empty() && nothing_recorded {
                    nothing_recorded_status(config, &producers, &report.categories)
                } else if !producers.is_empty() {
                    format!("recorded from {}", producers.join(", "))
                } else if !registered {
                    "no producer registered it; nothing was recorded from it".to_owned()
                } else if report.observed && no_start_trigger(config, analysis) {
                    "registered; not started, as no START_TRACING trigger came".to_owned()
                } else if report.observed {
                    "registered, but no instance started (producer name filters?)".to_owned()
                } else {
                    "registered".to_owned()
                };
                DataSourceOutcome {
                    name,
                    producers,
                    registered,
                    status,
                }
            })
            .collect();
        let mut losses = Vec::new();
        match analysis {
            Some(a) => {
                for (what, value, meaning) in &a.loss.stats {
                    losses.extend(loss_line(
                        what,
                        *value,
                        meaning,
                        report.service_at_start,
                        report.attached,
                    ));
                }
                let l = &a.loss;
                if l.loss_marks > 0 {
                    losses.push(format!(
                        "{} gap(s) marked inside packet sequences (previous_packet_dropped)",
                        l.loss_marks
                    ));
                }
                if l.sequences_start_lost > 0 {
                    losses.push(format!(
                        "{} sequence(s) lost their first packets",
                        l.sequences_start_lost
                    ));
                }
                if l.skipped_packets > 0 {
                    losses.push(format!(
                        "{} packet(s) cannot be decoded: the interned data they need was lost",
                        l.skipped_packets
                    ));
                }
                if l.unresolvable_after_wrap > 0 {
                    losses.push(format!(
                        "{} packet(s) unresolvable after ring wrap: the ring buffer overwrote \
                         the incremental-state clear they need",
                        l.unresolvable_after_wrap
                    ));
                }
                if l.malformed_packets > 0 || l.file_damaged {
                    losses.push("the file holds malformed data".to_owned());
                }
            }
            None => {
                if let Some(stats) = &report.stats {
                    let info = stats_info(stats);
                    for (i, buffer) in info.buffers.iter().enumerate() {
                        for &(name, meaning) in BUFFER_LOSS_STATS {
                            if let Some(v) = buffer.get(name) {
                                losses.push(format!("buffer {i}: {name} = {v}: {meaning}"));
                            }
                        }
                    }
                    for &(name, meaning) in SERVICE_LOSS_STATS {
                        let Some(&v) = info.service.get(name) else {
                            continue;
                        };
                        let what = format!("service: {name}");
                        losses.extend(loss_line(
                            &what,
                            v,
                            meaning,
                            report.service_at_start,
                            report.attached,
                        ));
                    }
                }
            }
        }
        if report.incomplete_packets > 0 {
            losses.push(format!(
                "{} packet(s) arrived incomplete from the service and were dropped",
                report.incomplete_packets
            ));
        }
        let mut pids: BTreeSet<i32> = BTreeSet::new();
        if let Some(a) = analysis {
            for s in &a.sequences {
                pids.extend(s.pids.iter().copied());
            }
        }
        Summary {
            file: if super::is_stdout(path) {
                "standard output".into()
            } else {
                path.display().to_string()
            },
            to_stdout: super::is_stdout(path),
            file_bytes,
            packets: analysis.map_or(report.packets_written, |a| a.packets),
            track_events: analysis.map(|a| a.track_events.total),
            sequences: analysis.map(|a| a.sequences.len()),
            producer_pids: pids.into_iter().collect(),
            duration_ms: report.elapsed.as_millis() as u64,
            ended,
            data_sources,
            losses,
            problems: analysis.map_or(0, Analysis::problem_total),
            snapshots: report
                .snapshots
                .iter()
                .map(|p| p.display().to_string())
                .collect(),
            failed_snapshots: report.failed_snapshots.clone(),
        }
    }

    /// Writes the summary for people.
    pub fn render(&self, out: &mut impl Write) -> io::Result<()> {
        writeln!(
            out,
            "Wrote {}: {}, {} packets, recorded for {}; {}.",
            self.file,
            Bytes(self.file_bytes),
            self.packets,
            Elapsed(Duration::from_millis(self.duration_ms)),
            self.ended
        )?;
        let pids: Vec<String> = self.producer_pids.iter().map(i32::to_string).collect();
        match (self.track_events, self.sequences) {
            (Some(events), Some(sequences)) => writeln!(
                out,
                "  track events  {events} on {sequences} sequence(s){}",
                if pids.is_empty() {
                    String::new()
                } else {
                    format!(" from {} process(es) (pid {})", pids.len(), pids.join(", "))
                }
            )?,
            _ if self.to_stdout => writeln!(
                out,
                "  track events  not counted: the trace went to standard output (`shmtrace \
                 inspect` counts them in a saved copy)"
            )?,
            _ => writeln!(
                out,
                "  track events  not counted: the file could not be read back (`shmtrace \
                 inspect {}` says why)",
                self.file
            )?,
        }
        for (i, ds) in self.data_sources.iter().enumerate() {
            let label = if i == 0 { "data sources" } else { "" };
            writeln!(out, "  {label:<12}  {}: {}", ds.name, ds.status)?;
        }
        if self.losses.is_empty() {
            writeln!(out, "  data loss     none")?;
        }
        for (i, loss) in self.losses.iter().enumerate() {
            let label = if i == 0 { "data loss" } else { "" };
            writeln!(out, "  {label:<12}  {loss}")?;
        }
        if self.problems > 0 {
            writeln!(
                out,
                "  check         {} problem(s); see `shmtrace inspect --check {}`",
                self.problems, self.file
            )?;
        }
        for (i, snapshot) in self.snapshots.iter().enumerate() {
            let label = if i == 0 { "snapshots" } else { "" };
            writeln!(
                out,
                "  {label:<12}  {snapshot} (a CLONE_SNAPSHOT trigger's)"
            )?;
        }
        for (i, f) in self.failed_snapshots.iter().enumerate() {
            let label = if i == 0 { "no snapshot" } else { "" };
            writeln!(
                out,
                "  {label:<12}  {} (the CLONE_SNAPSHOT trigger {:?}'s): {}",
                f.path, f.trigger, f.error
            )?;
        }
        if self.to_stdout {
            return Ok(());
        }
        writeln!(
            out,
            "Open it at https://ui.perfetto.dev (\"Open trace file\"), or look inside with \
             `shmtrace inspect {}`.",
            self.file
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;
    use protos::trace_config::trigger_config::TriggerMode;
    use protos::trace_config::TriggerConfig;

    fn config(mode: TriggerMode) -> Config {
        let view = protos::TraceConfig {
            trigger_config: Some(TriggerConfig {
                trigger_mode: Some(mode as i32),
                trigger_timeout_ms: Some(10_000),
                ..Default::default()
            }),
            ..Default::default()
        };
        Config::from_binary(view.encode_to_vec(), "test").unwrap()
    }

    fn fired(names: &[&str]) -> Analysis {
        let mut a = Analysis::default();
        a.session.triggers = names.iter().map(|&n| n.to_owned()).collect();
        a
    }

    #[test]
    fn a_session_ended_by_the_service_names_its_trigger_or_its_timeout() {
        let stop = config(TriggerMode::StopTracing);
        assert_eq!(
            ended_by_triggers(&stop, Some(&fired(&["go", "later"]))),
            "ended by the service after the STOP_TRACING trigger \"go\""
        );
        assert_eq!(
            ended_by_triggers(&stop, Some(&fired(&[]))),
            "ended by the service: no STOP_TRACING trigger came within trigger_timeout_ms \
             (10.0 s)"
        );
        assert_eq!(
            ended_by_triggers(&config(TriggerMode::StartTracing), Some(&fired(&["go"]))),
            "ended by the service: the START_TRACING trigger \"go\" started it, and its stop \
             delay ended it"
        );
        // Written to standard output: not read back, so not known.
        assert_eq!(ended_by_triggers(&stop, None), "ended by the service");
        let plain = Config::from_binary(Vec::new(), "test").unwrap();
        assert_eq!(
            ended_by_triggers(&plain, Some(&fired(&["go"]))),
            "ended by the service"
        );
    }

    #[test]
    fn a_start_trigger_that_never_came_is_told_as_such() {
        let start = config(TriggerMode::StartTracing);
        assert!(no_start_trigger(&start, Some(&fired(&[]))));
        assert!(!no_start_trigger(&start, Some(&fired(&["go"]))));
        // Not read back (standard output): not known.
        assert!(!no_start_trigger(&start, None));
        assert!(!no_start_trigger(
            &config(TriggerMode::StopTracing),
            Some(&fired(&[]))
        ));
    }

    #[test]
    fn a_clone_snapshot_file_without_events_points_at_the_snapshots() {
        let producers = ["app".to_owned()];
        let registered = BTreeMap::from([("gfx".to_owned(), Vec::new())]);
        assert_eq!(
            nothing_recorded_status(&config(TriggerMode::CloneSnapshot), &producers, &registered),
            "started on app; a CLONE_SNAPSHOT session's events are in the snapshots its \
             triggers take, not in this file"
        );
        assert_eq!(
            nothing_recorded_status(&config(TriggerMode::StopTracing), &producers, &registered),
            "started on app, but no track events were recorded (it enables gfx of the \
             categories its producers registered: did they emit events in them?)"
        );
    }

    #[test]
    fn uncounted_events_say_why() {
        let mut summary = Summary {
            file: "standard output".into(),
            to_stdout: true,
            ..Default::default()
        };
        let text = |s: &Summary| {
            let mut out = Vec::new();
            s.render(&mut out).unwrap();
            String::from_utf8(out).unwrap()
        };
        assert!(text(&summary).contains("not counted: the trace went to standard output"));
        // A file that could not be read back is not standard output.
        summary.file = "gone.pftrace".into();
        summary.to_stdout = false;
        let file = text(&summary);
        assert!(
            file.contains(
                "not counted: the file could not be read back (`shmtrace inspect \
                 gone.pftrace` says why)"
            ),
            "{file}"
        );
    }

    #[test]
    fn service_wide_counters_count_from_the_start_or_the_attach() {
        let start = ServiceCounters {
            chunks_discarded: 2,
            patches_discarded: 0,
        };
        let line = |value, attached| {
            loss_line(
                "service: chunks_discarded",
                value,
                "refused",
                start,
                attached,
            )
        };
        assert_eq!(line(2, false), None);
        assert_eq!(
            line(5, false).as_deref(),
            Some(
                "service: chunks_discarded = 3 during this session (5 since the service \
                 started): refused"
            )
        );
        assert_eq!(
            line(5, true).as_deref(),
            Some(
                "service: chunks_discarded = 3 since this record attached (5 since the service \
                 started): refused"
            )
        );
        assert_eq!(
            loss_line("buffer 0: chunks_overwritten", 4, "ring", start, true).as_deref(),
            Some("buffer 0: chunks_overwritten = 4: ring")
        );
    }
}
