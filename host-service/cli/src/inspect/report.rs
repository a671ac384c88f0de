//! The human-readable form of an [`Analysis`].

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::time::Duration;

use super::analysis::{Analysis, TrackInfo};
use crate::units::{Bytes, Elapsed};

/// Most tracks listed.
const MAX_TRACKS: usize = 50;

/// Writes `analysis` for people; lists at most `top` categories and names.
pub fn render(
    analysis: &Analysis,
    top: usize,
    config: bool,
    out: &mut impl Write,
) -> io::Result<()> {
    header(analysis, out)?;
    if config {
        if let Some(c) = &analysis.session.config {
            writeln!(out, "\nTraceConfig:")?;
            for line in c.text.lines() {
                writeln!(out, "  {line}")?;
            }
        }
    }
    packets(analysis, out)?;
    track_events(analysis, top, out)?;
    tracks(analysis, top.max(MAX_TRACKS), out)?;
    machines(analysis, out)?;
    sequences(analysis, out)?;
    clocks(analysis, out)?;
    loss(analysis, out)?;
    stats(analysis, out)?;
    problems(analysis, out)
}

fn header(a: &Analysis, out: &mut impl Write) -> io::Result<()> {
    let span = match (a.clocks.first_ns, a.clocks.last_ns) {
        (Some(first), Some(last)) if last > first => {
            format!(", spanning {}", Elapsed(Duration::from_nanos(last - first)))
        }
        _ => String::new(),
    };
    let unplaced = &a.clocks.unplaced_machines;
    let span = if unplaced.is_empty() {
        span
    } else {
        let ids: Vec<String> = unplaced.iter().map(u32::to_string).collect();
        format!(
            "{span} (leaving out machine(s) {}: no clock exchanges relate their clocks to the \
             host's)",
            ids.join(", ")
        )
    };
    writeln!(
        out,
        "{}: {} packets, {}{span}",
        a.files.join(" + "),
        a.packets,
        Bytes(a.packet_bytes)
    )?;
    let c = &a.compression;
    if c.zstd_batches > 0 {
        writeln!(
            out,
            "  compressed  {} zstd_compressed_packets batch(es), not inflated (unsupported)",
            c.zstd_batches
        )?;
    }
    if c.batches > 0 {
        writeln!(
            out,
            "  compressed  {} compressed_packets batch(es): {} inflated to {}, {} packets",
            c.batches,
            Bytes(c.compressed_bytes),
            Bytes(c.inflated_bytes),
            c.packets
        )?;
    }
    let s = &a.session;
    if let Some(version) = &s.service_version {
        let system = s
            .system
            .as_deref()
            .map(|s| format!(" on {s}"))
            .unwrap_or_default();
        writeln!(out, "  service     {version}{system}")?;
    }
    if let Some(uuid) = &s.uuid {
        writeln!(out, "  trace uuid  {uuid}")?;
    }
    if let Some(c) = &s.config {
        let buffers: Vec<String> = c
            .buffers
            .iter()
            .map(|(kb, policy)| format!("{} {policy}", Bytes(u64::from(*kb) * 1024)))
            .collect();
        writeln!(out, "  buffers     {}", buffers.join(", "))?;
        writeln!(out, "  sources     {}", c.data_sources.join(", "))?;
        let mut mode = Vec::new();
        if let Some(ms) = c.duration_ms {
            mode.push(format!(
                "duration {}",
                Elapsed(Duration::from_millis(u64::from(ms)))
            ));
        }
        if c.write_into_file {
            mode.push("written into a file by the service".to_owned());
        }
        if !mode.is_empty() {
            writeln!(out, "  session     {}", mode.join(", "))?;
        }
    }
    if !s.service_events.is_empty() {
        let events: Vec<String> = s
            .service_events
            .iter()
            .map(|(name, n)| {
                if *n > 1 {
                    format!("{name} x{n}")
                } else {
                    name.clone()
                }
            })
            .collect();
        writeln!(out, "  lifecycle   {}", events.join(", "))?;
    }
    if !s.triggers.is_empty() {
        writeln!(out, "  triggers    {}", s.triggers.join(", "))?;
    }
    for slow in &s.slow_data_sources {
        writeln!(out, "  slow        {slow}")?;
    }
    Ok(())
}

fn packets(a: &Analysis, out: &mut impl Write) -> io::Result<()> {
    writeln!(out, "\nPackets by kind:")?;
    let mut kinds: Vec<_> = a.packets_by_kind.iter().collect();
    kinds.sort_by(|x, y| y.1.packets.cmp(&x.1.packets).then(x.0.cmp(y.0)));
    for (kind, count) in kinds {
        writeln!(
            out,
            "  {kind:<28} {:>9}  {:>10}",
            count.packets,
            Bytes(count.bytes).to_string()
        )?;
    }
    Ok(())
}

fn top_list(map: &BTreeMap<String, u64>, top: usize) -> String {
    let mut items: Vec<_> = map.iter().collect();
    items.sort_by(|x, y| y.1.cmp(x.1).then(x.0.cmp(y.0)));
    let shown: Vec<String> = items
        .iter()
        .take(top)
        .map(|(name, n)| format!("{name} {n}"))
        .collect();
    let more = items.len().saturating_sub(top);
    if more > 0 {
        format!("{}, ... and {more} more", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

fn track_events(a: &Analysis, top: usize, out: &mut impl Write) -> io::Result<()> {
    let t = &a.track_events;
    if t.total == 0 {
        return writeln!(out, "\nTrack events: none");
    }
    writeln!(
        out,
        "\nTrack events: {} ({} slices begun, {} ended, {} instants, {} counters{}), {} arguments",
        t.total,
        t.slice_begin,
        t.slice_end,
        t.instant,
        t.counter,
        if t.other > 0 {
            format!(", {} other", t.other)
        } else {
            String::new()
        },
        t.args
    )?;
    writeln!(out, "  categories  {}", top_list(&t.by_category, top))?;
    writeln!(out, "  names       {}", top_list(&t.by_name, top))?;
    writeln!(
        out,
        "  slices      nesting depth up to {}, {} open at the end",
        t.max_depth, t.open_slices
    )?;
    writeln!(
        out,
        "  flows       {} links, {} started and never continued, {} ends without a start",
        t.flow_links, t.flows_unpaired_start, t.flows_unpaired_end
    )?;
    writeln!(
        out,
        "  interning   {} ids resolved, {} unresolved",
        t.interned_resolved, t.interned_unresolved
    )
}

fn track_line(t: &TrackInfo) -> String {
    let mut who = String::new();
    match t.kind {
        "process" => who = format!("pid {}", t.pid.unwrap_or(0)),
        "thread" => who = format!("tid {}", t.tid.unwrap_or(0)),
        _ => {}
    }
    let name = t.name.as_deref().unwrap_or(if t.uuid == 0 {
        "(default track)"
    } else if t.described {
        "(unnamed)"
    } else {
        "(not described)"
    });
    format!("{:<8} {:<10} {name}", t.kind, who)
}

fn tracks(a: &Analysis, max: usize, out: &mut impl Write) -> io::Result<()> {
    if a.tracks.is_empty() {
        return Ok(());
    }
    writeln!(out, "\nTracks: {}", a.tracks.len())?;
    // Processes first, each followed by its children; then the rest.
    let mut order: Vec<(usize, &TrackInfo)> = Vec::new();
    let known: std::collections::HashSet<u64> = a.tracks.iter().map(|t| t.uuid).collect();
    for process in a.tracks.iter().filter(|t| t.kind == "process") {
        order.push((0, process));
        for child in a.tracks.iter().filter(|t| t.parent == Some(process.uuid)) {
            order.push((1, child));
        }
    }
    for t in &a.tracks {
        let placed = t.kind == "process"
            || t.parent.is_some_and(|p| {
                known.contains(&p) && a.tracks.iter().any(|x| x.uuid == p && x.kind == "process")
            });
        if !placed {
            order.push((0, t));
        }
    }
    for (depth, t) in order.iter().take(max) {
        let line = track_line(t);
        let indent = "  ".repeat(depth + 1);
        let width = 56usize.saturating_sub(indent.len());
        writeln!(out, "{indent}{line:<width$} {:>8} events", t.events)?;
    }
    if order.len() > max {
        writeln!(out, "  ... and {} more (see --json)", order.len() - max)?;
    }
    Ok(())
}

/// The machines of a multi-machine trace (nothing for one machine).
fn machines(a: &Analysis, out: &mut impl Write) -> io::Result<()> {
    if a.machines.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "\nMachines: {} (the host and {} relayed)",
        a.machines.len(),
        a.machines.iter().filter(|m| m.id != 0).count()
    )?;
    writeln!(
        out,
        "  {:>10}  {:<16} {:>9} {:>9} {:>8} {:>6} {:>9}  system",
        "id", "name", "sequences", "packets", "events", "clocks", "ahead"
    )?;
    for m in &a.machines {
        let system = match (&m.system, m.described) {
            (Some(system), _) => system.clone(),
            (None, true) => "(described, no uname)".to_owned(),
            (None, false) => "(not described)".to_owned(),
        };
        // The host's clocks are the trace's: it exchanges none.
        let (clocks, ahead) = match (m.id, m.clock_offset_ns) {
            (0, _) => ("-".to_owned(), "-".to_owned()),
            (_, offset) => (
                m.clock_exchanges.to_string(),
                offset.map_or_else(|| "?".to_owned(), signed_offset),
            ),
        };
        writeln!(
            out,
            "  {:>10}  {:<16} {:>9} {:>9} {:>8} {:>6} {:>9}  {system}",
            m.id,
            m.label(),
            m.sequences,
            m.packets,
            m.track_events,
            clocks,
            ahead
        )?;
    }
    Ok(())
}

/// A clock offset, signed: microseconds below a millisecond, else as an
/// elapsed time.
fn signed_offset(ns: i64) -> String {
    let sign = if ns < 0 { "-" } else { "+" };
    let abs = ns.unsigned_abs();
    if abs < 1_000_000 {
        format!("{sign}{} us", abs / 1_000)
    } else {
        format!("{sign}{}", Elapsed(Duration::from_nanos(abs)))
    }
}

fn sequences(a: &Analysis, out: &mut impl Write) -> io::Result<()> {
    if a.sequences.is_empty() {
        return writeln!(out, "\nSequences: none from producers");
    }
    // Each sequence's machine, where the trace has more than one.
    let names: BTreeMap<u32, String> = a.machines.iter().map(|m| (m.id, m.label())).collect();
    let machine = |id: u32| -> String {
        if names.is_empty() {
            return String::new();
        }
        let label = names.get(&id).cloned().unwrap_or_else(|| id.to_string());
        format!(" {label:<16}")
    };
    let machine_header = if names.is_empty() {
        String::new()
    } else {
        format!(" {:<16}", "machine")
    };
    writeln!(out, "\nSequences: {} from producers", a.sequences.len())?;
    writeln!(
        out,
        "  {:>6}{machine_header} {:>8} {:>6} {:>9} {:>8} {:>7} {:>6} {:>8} {:>10}  start",
        "id", "pid", "buffer", "packets", "events", "clears", "marks", "skipped", "after-wrap"
    )?;
    for s in &a.sequences {
        let pids: Vec<String> = s.pids.iter().map(i32::to_string).collect();
        writeln!(
            out,
            "  {:>6}{} {:>8} {:>6} {:>9} {:>8} {:>7} {:>6} {:>8} {:>10}  {}",
            s.id,
            machine(s.machine_id),
            pids.join(","),
            s.buffer.map_or("-".to_owned(), |b| b.to_string()),
            s.packets,
            s.track_events,
            s.cleared,
            s.loss_marks,
            s.skipped_packets,
            s.unresolvable_after_wrap,
            if s.start_lost { "lost" } else { "ok" }
        )?;
    }
    Ok(())
}

fn clocks(a: &Analysis, out: &mut impl Write) -> io::Result<()> {
    let c = &a.clocks;
    writeln!(out, "\nClocks:")?;
    writeln!(
        out,
        "  primary     {}",
        c.primary.as_deref().unwrap_or("BOOTTIME (default)")
    )?;
    if c.service_snapshots > 0 {
        writeln!(
            out,
            "  snapshots   {} from the service, of {}",
            c.service_snapshots,
            c.builtin.join(", ")
        )?;
    }
    if !c.sequence_scoped.is_empty() {
        let scoped: Vec<String> = c
            .sequence_scoped
            .iter()
            .map(|(id, n)| format!("{id} on {n} sequence(s)"))
            .collect();
        writeln!(out, "  sequence    {}", scoped.join(", "))?;
    }
    if c.out_of_order > 0 {
        writeln!(
            out,
            "  out of order {} packet(s) earlier than their sequence's latest time \
             (legal: sorted by time)",
            c.out_of_order
        )?;
    }
    Ok(())
}

fn loss(a: &Analysis, out: &mut impl Write) -> io::Result<()> {
    let l = &a.loss;
    if !l.any() {
        return writeln!(out, "\nData loss: none recorded");
    }
    writeln!(out, "\nData loss:")?;
    for (what, value, meaning) in &l.stats {
        writeln!(out, "  {what} = {value}: {meaning}")?;
    }
    if l.loss_marks > 0 {
        writeln!(
            out,
            "  {} loss mark(s) in sequences (previous_packet_dropped, reasons 0x{:x})",
            l.loss_marks, l.loss_reasons
        )?;
    }
    if l.sequences_start_lost > 0 {
        writeln!(
            out,
            "  {} sequence(s) lost their start (first packets missing)",
            l.sequences_start_lost
        )?;
    }
    if l.skipped_packets > 0 {
        writeln!(
            out,
            "  {} packet(s) unusable: they need interned data that was lost",
            l.skipped_packets
        )?;
    }
    if l.unresolvable_after_wrap > 0 {
        writeln!(
            out,
            "  {} packet(s) unresolvable after ring wrap: they need incremental state, or a \
             clock snapshot of their sequence, that the ring buffer overwrote",
            l.unresolvable_after_wrap
        )?;
    }
    if l.malformed_packets > 0 {
        writeln!(out, "  {} malformed packet(s)", l.malformed_packets)?;
    }
    if l.file_damaged {
        writeln!(out, "  the file is damaged or cut short")?;
    }
    Ok(())
}

fn stats(a: &Analysis, out: &mut impl Write) -> io::Result<()> {
    let Some(s) = &a.stats else {
        return writeln!(out, "\nStatistics: no trace_stats packet");
    };
    writeln!(out, "\nStatistics (trace_stats):")?;
    let get = |m: &BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
    for (i, b) in s.buffers.iter().enumerate() {
        writeln!(
            out,
            "  buffer {i} ({}): {} written in all, {} chunks written, {} read, {} overwritten, \
             {} discarded, {} patches ({} failed)",
            Bytes(get(b, "buffer_size")),
            Bytes(get(b, "bytes_written")),
            get(b, "chunks_written"),
            get(b, "chunks_read"),
            get(b, "chunks_overwritten"),
            get(b, "chunks_discarded"),
            get(b, "patches_succeeded") + get(b, "patches_failed"),
            get(b, "patches_failed"),
        )?;
    }
    let v = &s.service;
    writeln!(
        out,
        "  service: {} producer(s) connected, {} data source(s) registered, flushes {} requested / \
         {} ok / {} failed",
        get(v, "producers_connected"),
        get(v, "data_sources_registered"),
        get(v, "flushes_requested"),
        get(v, "flushes_succeeded"),
        get(v, "flushes_failed"),
    )?;
    if v.keys().any(|k| k.starts_with("filter_stats.")) {
        writeln!(
            out,
            "  trace filter: {} packet(s), {} in, {} out, {} dropped as malformed",
            get(v, "filter_stats.input_packets"),
            Bytes(get(v, "filter_stats.input_bytes")),
            Bytes(get(v, "filter_stats.output_bytes")),
            get(v, "filter_stats.errors"),
        )?;
    }
    Ok(())
}

fn problems(a: &Analysis, out: &mut impl Write) -> io::Result<()> {
    if a.ok_strict() {
        return writeln!(out, "\nCheck: OK");
    }
    if a.ok() {
        writeln!(
            out,
            "\nCheck: OK, but for {} problem(s) that may be slices or flows cut at the \
             trace's edges (--check --strict fails on them)",
            a.problem_total()
        )?;
    } else {
        writeln!(out, "\nCheck: {} problem(s)", a.problem_total())?;
    }
    for (kind, n) in &a.problem_counts {
        let edge = if kind.may_be_edge_cut() {
            " (may be cut at the trace's edges)"
        } else {
            ""
        };
        writeln!(out, "  {}: {n}{edge}", kind.label())?;
    }
    for p in &a.problems {
        writeln!(out, "  - [{}] {}", kind_tag(p.kind), p.message)?;
    }
    let shown = a.problems.len() as u64;
    if shown < a.problem_total() {
        writeln!(out, "  ... {} more not shown", a.problem_total() - shown)?;
    }
    Ok(())
}

fn kind_tag(kind: super::ProblemKind) -> &'static str {
    kind.label()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspect::{MachineInfo, SequenceInfo};

    fn rendered(a: &Analysis, section: fn(&Analysis, &mut Vec<u8>) -> io::Result<()>) -> String {
        let mut out = Vec::new();
        section(a, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    fn sequence(id: u32, machine_id: u32, pid: i32) -> SequenceInfo {
        SequenceInfo {
            id,
            machine_id,
            pids: vec![pid],
            packets: 10,
            track_events: 8,
            cleared: 1,
            ..Default::default()
        }
    }

    fn machines(sequences: Vec<SequenceInfo>, machines: Vec<MachineInfo>) -> Analysis {
        Analysis {
            sequences,
            machines,
            ..Default::default()
        }
    }

    /// One machine: no machine section, no machine column.
    #[test]
    fn one_machine_shows_no_machines() {
        let a = machines(vec![sequence(2, 0, 40)], Vec::new());
        assert_eq!(rendered(&a, super::machines), "");
        assert_eq!(
            rendered(&a, sequences),
            "\nSequences: 1 from producers\n\
             \x20     id      pid buffer   packets   events  clears  marks  skipped after-wrap  start\n\
             \x20      2       40      -        10        8       1      0        0          0  ok\n"
        );
    }

    /// Several: each machine by id and label, with its counts and system;
    /// each sequence with its machine's label.
    #[test]
    fn machines_and_their_sequences() {
        let vm = MachineInfo {
            id: 1_154_022_635,
            name: Some("vm-1".into()),
            system: Some("Linux 6.8.0 aarch64".into()),
            described: true,
            clock_exchanges: 2,
            clock_offset_ns: Some(3 * 3_600_000_000_000 + 42),
            packets: 10,
            sequences: 1,
            track_events: 8,
        };
        let unnamed = MachineInfo {
            id: 77,
            name: None,
            system: None,
            described: false,
            clock_offset_ns: None,
            ..vm.clone()
        };
        let host = MachineInfo {
            id: 0,
            system: Some("Linux 6.8.0 x86_64".into()),
            described: true,
            ..Default::default()
        };
        let a = machines(
            vec![sequence(2, 77, 40), sequence(3, 1_154_022_635, 41)],
            vec![host, unnamed, vm],
        );
        assert_eq!(
            rendered(&a, super::machines),
            "\nMachines: 3 (the host and 2 relayed)\n\
             \x20         id  name             sequences   packets   events clocks     ahead  system\n\
             \x20          0  host                     0         0        0      -         -  Linux 6.8.0 x86_64\n\
             \x20         77  77                       1        10        8      2         ?  (not described)\n\
             \x20 1154022635  vm-1                     1        10        8      2    +3h00m  Linux 6.8.0 aarch64\n"
        );
        assert_eq!(
            rendered(&a, sequences),
            "\nSequences: 2 from producers\n\
             \x20     id machine               pid buffer   packets   events  clears  marks  skipped after-wrap  start\n\
             \x20      2 77                     40      -        10        8       1      0        0          0  ok\n\
             \x20      3 vm-1                   41      -        10        8       1      0        0          0  ok\n"
        );
    }

    #[test]
    fn offsets_are_signed_and_small_ones_in_microseconds() {
        assert_eq!(signed_offset(12_345), "+12 us");
        assert_eq!(signed_offset(-999_999), "-999 us");
        assert_eq!(signed_offset(-2_500_000), "-2 ms");
        assert_eq!(signed_offset(3 * 3_600_000_000_000), "+3h00m");
    }

    /// A machine no exchanges place is named in the header, its times left
    /// out of the span.
    #[test]
    fn the_header_names_machines_left_out_of_the_span() {
        let mut a = machines(Vec::new(), Vec::new());
        a.files = vec!["t.pftrace".into()];
        a.clocks.first_ns = Some(1_000_000_000);
        a.clocks.last_ns = Some(3_000_000_000);
        a.clocks.unplaced_machines = vec![77];
        let text = rendered(&a, header);
        assert!(
            text.starts_with(
                "t.pftrace: 0 packets, 0 B, spanning 2.0 s (leaving out machine(s) 77: no clock \
                 exchanges relate their clocks to the host's)\n"
            ),
            "{text}"
        );
    }
}
