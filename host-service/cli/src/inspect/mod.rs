//! `shmtrace inspect`: what a trace file holds, and whether it is sound.
//!
//! Reads traces written by the real Perfetto as well as by shmtrace,
//! `compressed_packets` (deflate) included. Several
//! files are read as successive reads of one session (as a consumer that
//! reads mid-session writes them), so sequences continue across them.

mod analysis;
mod clocks;
mod compressed;
mod kinds;
mod remote_clocks;
mod report;

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;

pub use analysis::{
    config_info, stats_info, Analysis, Analyzer, CompressionInfo, ConfigInfo, MachineInfo, Problem,
    ProblemKind, SequenceInfo, BUFFER_LOSS_STATS, RING_WRAP_STATS, SERVICE_LOSS_STATS,
};
pub use report::render;

use super::trace_file::PacketReader;
use super::{exit, CliError};

/// Arguments of `shmtrace inspect`.
#[derive(Debug, Clone, clap::Args)]
pub struct InspectArgs {
    /// Trace file(s). Several are read as successive reads of one session.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Exit with status 1 if the trace has problems: unresolved interned
    /// data, lost data that nothing records, malformed packets, bad
    /// counters or timestamps. (Packets that a RING buffer's wrap left
    /// without their sequence's incremental-state clear, or without the
    /// clock snapshot relating their sequence's clock, are counted as
    /// "unresolvable after ring wrap", not failed.) Broken slice nesting and
    /// unpaired flows are reported but fail only with --strict: a session
    /// that starts or stops while a program runs cuts slices and flows.
    #[arg(long)]
    pub check: bool,
    /// With --check, also fail on broken slice nesting and unpaired flows,
    /// for a trace that covers its producers' whole run.
    #[arg(long, requires = "check")]
    pub strict: bool,
    /// Print the analysis as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also print the session's TraceConfig (text format).
    #[arg(long)]
    pub config: bool,
    /// How many categories, names and tracks to list.
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub top: usize,
}

/// Reads and analyzes trace files.
///
/// A file with no packet at all (empty, a directory, or bytes that are no
/// packet from the first one) is an error, not an empty trace: a trace a
/// service wrote always holds its own packets.
pub fn analyze_files(files: &[PathBuf]) -> Result<Analysis, CliError> {
    let mut analyzer = Analyzer::new();
    for path in files {
        let not_a_trace = |reason: String| CliError::NotATrace {
            path: path.clone(),
            reason,
        };
        let file = File::open(path).map_err(|source| CliError::Io {
            action: "open",
            path: path.clone(),
            source,
        })?;
        let meta = file.metadata().map_err(|source| CliError::Io {
            action: "read",
            path: path.clone(),
            source,
        })?;
        if meta.is_dir() {
            return Err(not_a_trace("it is a directory".into()));
        }
        analyzer.file(&path.display().to_string());
        let mut packets = 0u64;
        for packet in PacketReader::new(file) {
            match packet {
                Ok(packet) => {
                    packets += 1;
                    analyzer.packet(packet.index, &packet.bytes);
                }
                Err(e) if packets == 0 => return Err(not_a_trace(e.to_string())),
                Err(e) => analyzer.damaged(&e.to_string()),
            }
        }
        if packets == 0 {
            return Err(not_a_trace(
                "the file is empty (0 packets: a `shmtrace record` or `perfetto` still recording \
                 into it may not have written it yet)"
                    .into(),
            ));
        }
    }
    Ok(analyzer.finish())
}

/// The analysis of a trace file that a session just wrote: as
/// [`analyze_files`], but a file with no packet is an empty trace here (a
/// session may record nothing), not an error.
pub fn analyze_recorded(path: &std::path::Path) -> Result<Analysis, CliError> {
    match analyze_files(&[path.to_path_buf()]) {
        Err(CliError::NotATrace { .. }) if std::fs::metadata(path).is_ok_and(|m| m.len() == 0) => {
            let mut analyzer = Analyzer::new();
            analyzer.file(&path.display().to_string());
            Ok(analyzer.finish())
        }
        result => result,
    }
}

/// Runs `shmtrace inspect`, printing to `out`; returns the exit status.
pub fn run(args: &InspectArgs, out: &mut impl Write) -> Result<u8, CliError> {
    let analysis = analyze_files(&args.files)?;
    if args.json {
        serde_json::to_writer_pretty(&mut *out, &analysis).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        render(&analysis, args.top, args.config, out)?;
    }
    let passed = if args.strict {
        analysis.ok_strict()
    } else {
        analysis.ok()
    };
    Ok(if args.check && !passed {
        exit::CHECK_FAILED
    } else {
        exit::OK
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trace whose session had a trace filter: its `filter_stats` show in
    /// the statistics, and packets the filter dropped as malformed are a
    /// recorded loss.
    #[test]
    fn filter_stats_are_shown_and_filter_errors_are_a_loss() {
        use prost::Message as _;
        use shmtrace_ipc::protos::trace_packet::{Data, OptionalTrustedPacketSequenceId};
        use shmtrace_ipc::protos::trace_stats::FilterStats;
        use shmtrace_ipc::protos::{TracePacket, TraceStats};
        let stats = TracePacket {
            data: Some(Data::TraceStats(TraceStats {
                filter_stats: Some(FilterStats {
                    input_packets: Some(10),
                    input_bytes: Some(4096),
                    output_bytes: Some(1024),
                    errors: Some(2),
                    ..Default::default()
                }),
                ..Default::default()
            })),
            optional_trusted_packet_sequence_id: Some(
                OptionalTrustedPacketSequenceId::TrustedPacketSequenceId(1),
            ),
            ..Default::default()
        };
        let mut analyzer = Analyzer::new();
        analyzer.file("filtered");
        analyzer.packet(0, &stats.encode_to_vec());
        let analysis = analyzer.finish();
        let service = &analysis.stats.as_ref().expect("stats").service;
        assert_eq!(service.get("filter_stats.errors"), Some(&2));
        assert_eq!(service.get("filter_stats.input_packets"), Some(&10));
        let loss: Vec<_> = analysis
            .loss
            .stats
            .iter()
            .map(|(n, v, _)| (n.as_str(), *v))
            .collect();
        assert_eq!(loss, [("service: filter_stats.errors", 2)]);
        let mut out = Vec::new();
        render(&analysis, 10, false, &mut out).expect("renders");
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains(
                "trace filter: 10 packet(s), 4.0 KiB in, 1.0 KiB out, 2 dropped as malformed"
            ),
            "{text}"
        );
    }

    /// A real service's trace with its packets damaged (bytes changed, cut
    /// out or put in) is analyzed, rendered and written as JSON: the
    /// damage shows as problems, never as a panic.
    #[test]
    fn damaged_packets_are_analyzed_without_a_panic() {
        use proptest::prelude::*;
        let trace = include_bytes!("../../tests/data/real_ring_wrap.perfetto-trace");
        let packets: Vec<Vec<u8>> = PacketReader::new(&trace[..])
            .map(|p| p.expect("the golden trace reads").bytes)
            .collect();
        let damage = (
            any::<prop::sample::Index>(),
            0u8..3,
            any::<prop::sample::Index>(),
            any::<u8>(),
        );
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            cases: 200,
            failure_persistence: None,
            ..ProptestConfig::default()
        });
        runner
            .run(&proptest::collection::vec(damage, 1..12), |damages| {
                let mut packets = packets.clone();
                for (which, kind, at, byte) in damages {
                    let n = packets.len();
                    let p = &mut packets[which.index(n)];
                    let at = at.index(p.len() + 1);
                    match kind {
                        0 if at < p.len() => p[at] = byte,
                        1 => p.truncate(at),
                        _ => p.insert(at, byte),
                    }
                }
                let mut analyzer = Analyzer::new();
                analyzer.file("damaged");
                for (i, p) in packets.iter().enumerate() {
                    analyzer.packet(i as u64, p);
                }
                let analysis = analyzer.finish();
                let mut out = Vec::new();
                render(&analysis, 10, true, &mut out).expect("renders");
                prop_assert!(!out.is_empty());
                prop_assert!(serde_json::to_string(&analysis).is_ok());
                Ok(())
            })
            .unwrap();
    }
}
