//! The relay (issue 20): `shmtrace relay` on each "machine" forwards its
//! producers (the real Perfetto SDK and ours side by side, on the relay's
//! UNIX socket) to a central service over TCP, which traces them with their
//! machine's id, describes each machine (`system_info` with its
//! `machine_id`) and writes its clock exchanges with the relay
//! (`remote_clock_sync`), against the real central service (the
//! `real-service` driver with `--enable-relay-endpoint`) and ours.
//!
//! The "machines" are processes of this one: each relay has a socket
//! directory, a machine name and an id hint of its own (`machine-N`). In
//! the one-machine tests it shares this machine's clocks and network, and
//! reaches the central service on 127.0.0.1. In the three-machine tests
//! each machine's relay and producers run in Linux namespaces of their own:
//! a time namespace, whose BOOTTIME and MONOTONIC run hours ahead of this
//! machine's, a different amount per machine
//! ([`MachineClocks::OwnTimeNamespaces`]), and a network namespace linked
//! to this one by a veth pair on a /30 of its own from 10.213.0.0/16
//! ([`MachineNetworks::OwnNamespaces`]): the central service listens on
//! this side of every link, each relay connects to its own link's address,
//! and its producers reach it on its UNIX socket. A machine that cannot
//! make these namespaces fails these tests, saying so.
//!
//! The network check: once every producer runs, the central service's
//! port has exactly three connections per machine (the relay's clock
//! connection and one per producer), each machine's from its own address
//! to its own link's (127.0.0.1 to 127.0.0.1 in the one-machine tests);
//! and after the run the namespaces are gone.
//!
//! The checks, per machine and per producer: every event under the
//! producer's machine id; each machine described; its clock offsets,
//! computed from its `remote_clock_sync` exchanges as Perfetto's trace
//! processor computes them, equal to the namespace's offsets (zero for a
//! shared clock) within half the longest exchange round (the bound the
//! round's four readings put on the true offset); and, mapped onto the
//! central clock with those offsets, each producer's events inside the
//! central session (from `tracing_started` to `tracing_disabled`) and
//! inside what the harness saw of the producer on the central clock (from
//! just before it started to its last report). Without the conversion,
//! the events of a machine with clocks of its own would lie hours after
//! the session ended (asserted too).
//!
//! The user's views of the machines: `shmtrace inspect` lists each
//! machine (its name, as its relay gave it in its description, and its
//! clock exchanges) with the packets, sequences and track events the
//! checker finds of it, and labels each sequence with its machine; and
//! `shmtrace query`, while the producers run, gives each producer its
//! machine's id and name, as each central service reports them.
//!
//! Not here: vsock (this machine has no vsock loopback transport).

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use shmtrace_service::ipc::host::machine_id;
use shmtrace_tests::checker::TraceReport;
use shmtrace_tests::real_binaries;
use shmtrace_tests::scenario::{
    self, machine_boottime_offset, machine_monotonic_offset, machine_name, Cell, MachineClocks,
    MachineNetworks, Outcome, ProducerImpl, ProducerSocket, ProducerSpec, Scenario,
};

/// Clock ids (Perfetto's `BuiltinClock`).
const REALTIME: u32 = 1;
const MONOTONIC: u32 = 3;
const BOOTTIME: u32 = 6;

/// Added to the offset tolerance: a clock snapshot reads its clocks one
/// after the other, microseconds apart, so a clock other than BOOTTIME
/// (which the rounds' spans are measured on) is read a little later on both
/// sides; and our producer's clock extrapolates BOOTTIME from the TSC
/// between re-anchorings (microseconds off).
const SLACK_NS: i64 = 1_000_000;

/// Connections of each machine to the central service: its relay's own
/// (the `RelayPort` clock exchanges) and one per producer, forwarded.
const CONNECTIONS_PER_MACHINE: usize = 3;

/// Emitting threads and iterations per thread of each producer.
const THREADS: u32 = 2;
const ITERATIONS: u32 = 200;

/// Machine `machine`'s producers: the real SDK (the cell's producer) and
/// ours.
fn producers(machine: u32) -> [ProducerSpec; 2] {
    let spec = |implementation| ProducerSpec {
        threads: THREADS,
        iterations: ITERATIONS,
        machine,
        implementation,
        ..Default::default()
    };
    [spec(None), spec(Some(ProducerImpl::Ours))]
}

/// How relayed machines are set apart from this one.
#[derive(Clone, Copy)]
enum Machines {
    /// This machine's clocks and network.
    Shared,
    /// Namespaces of their own: time and network.
    OwnNamespaces,
}

fn run(cell: Cell, machines: u32, setting: Machines) -> Outcome {
    let (clocks, networks) = match setting {
        Machines::Shared => (MachineClocks::Shared, MachineNetworks::Loopback),
        Machines::OwnNamespaces => (
            MachineClocks::OwnTimeNamespaces,
            MachineNetworks::OwnNamespaces,
        ),
    };
    let scenario = Scenario {
        producer_socket: ProducerSocket::Relayed,
        machine_clocks: clocks,
        machine_networks: networks,
        ..Scenario::new("relay", (0..machines).flat_map(producers).collect())
    };
    let outcome = scenario::run(cell, &real_binaries!(), &scenario)
        .unwrap_or_else(|e| panic!("relay in cell {}: {e}", cell.name()));
    outcome
        .report
        .assert_ok(&format!("relay in cell {}", cell.name()));
    check(&outcome, &scenario, machines);
    check_views(&outcome, &scenario, machines);
    check_clocks(&outcome, &scenario, clocks);
    check_network(&outcome, machines, networks);
    outcome
}

/// The machine id of relayed machine `index`.
fn id_of(index: u32) -> u32 {
    machine_id(&machine_name(index), "")
}

/// Every machine's events are in the trace under its machine id, each
/// producer's under its own machine's, and the trace describes each
/// machine and holds its clock exchanges.
fn check(outcome: &Outcome, scenario: &Scenario, machines: u32) {
    let report = &outcome.report;
    let emitted = outcome.emitted();
    // Two slices per iteration, per thread, per producer (two per machine).
    assert_eq!(
        emitted.slice_begin,
        u64::from(machines * 2 * THREADS * ITERATIONS * 2)
    );
    assert_eq!(report.totals.track_events(), emitted.track_events());
    assert!(
        !report.machines.contains_key("0"),
        "no packet without a machine id: {:?}",
        report.machines.keys()
    );
    for machine in 0..machines {
        let id = id_of(machine);
        let runs: Vec<_> = outcome
            .producers
            .iter()
            .zip(&scenario.producers)
            .filter(|(_, spec)| spec.machine == machine)
            .map(|(run, _)| run)
            .collect();
        assert_eq!(runs.len(), 2, "machine {machine} runs both producers");
        let in_trace = report
            .machines
            .get(&id.to_string())
            .unwrap_or_else(|| panic!("no packets of machine {machine} (id {id})"));
        let emitted: u64 = runs.iter().map(|r| r.emitted().track_events()).sum();
        assert_eq!(in_trace.totals.track_events(), emitted, "machine {machine}");
        assert!(
            report.machines_described.contains(&id),
            "system_info of machine {machine}: {:?}",
            report.machines_described
        );
        let exchanges = report.remote_clock_syncs.get(&id.to_string()).copied();
        assert!(
            exchanges.is_some_and(|n| n >= 2),
            "clock exchanges of machine {machine}: {exchanges:?}"
        );
    }
    for (run, spec) in outcome.producers.iter().zip(&scenario.producers) {
        let who = who(spec);
        let counts = report
            .producers
            .get(&run.pid.to_string())
            .unwrap_or_else(|| panic!("no events of {who} (pid {})", run.pid));
        assert_eq!(counts.track_events(), run.emitted().track_events(), "{who}");
        let times = report.event_times[&run.pid.to_string()];
        assert_eq!(times.machine, id_of(spec.machine), "{who}'s machine id");
    }
    assert_eq!(report.machines.len() as u32, machines);
}

/// What `shmtrace inspect` and `shmtrace query` say of each machine: its
/// packets, sequences and track events as the checker finds them, its
/// name and clock exchanges; each sequence's machine; and each producer's
/// machine, by its pid, in the service's state.
fn check_views(outcome: &Outcome, scenario: &Scenario, machines: u32) {
    let report = &outcome.report;
    let analysis = &outcome.inspect.analysis;
    let listed = analysis["machines"]
        .as_array()
        .expect("inspect --json lists machines");
    assert_eq!(
        listed.len() as u32,
        machines + 1,
        "inspect's machines: the host and each relayed one: {listed:?}"
    );
    let host = &listed[0];
    assert_eq!(host["id"], 0, "the host first: {host}");
    assert_eq!(host["described"], true, "{host}");
    // Every producer is relayed: the host wrote only the service's packets.
    assert_eq!(
        (&host["sequences"], &host["packets"], &host["track_events"]),
        (&0.into(), &0.into(), &0.into()),
        "{host}"
    );
    let sequence_machines: Vec<(u64, u64)> = analysis["sequences"]
        .as_array()
        .expect("inspect's sequences")
        .iter()
        .map(|s| (s["id"].as_u64().unwrap(), s["machine_id"].as_u64().unwrap()))
        .collect();
    for machine in 0..machines {
        let id = id_of(machine);
        let listing = listed
            .iter()
            .find(|m| m["id"] == id)
            .unwrap_or_else(|| panic!("inspect lists no machine {id}: {listed:?}"));
        let checked = &report.machines[&id.to_string()];
        assert_eq!(listing["packets"], checked.packets, "machine {machine}");
        assert_eq!(
            listing["track_events"],
            checked.totals.track_events(),
            "machine {machine}"
        );
        assert_eq!(listing["name"], machine_name(machine), "machine {machine}");
        assert_eq!(listing["described"], true, "machine {machine}");
        assert_eq!(
            listing["clock_exchanges"],
            report.remote_clock_syncs[&id.to_string()],
            "machine {machine}"
        );
        // Its offset, computed from the same exchanges as a trace
        // processor does, as the checker computes it.
        assert_eq!(
            listing["clock_offset_ns"],
            report.remote_clock_offsets[&id.to_string()].offsets[&BOOTTIME.to_string()],
            "machine {machine}"
        );
        // Its sequences: those the checker found of its producers' pids.
        let pids: BTreeSet<u32> = outcome
            .producers
            .iter()
            .zip(&scenario.producers)
            .filter(|(_, spec)| spec.machine == machine)
            .map(|(run, _)| run.pid)
            .collect();
        let checked_sequences: Vec<u64> = report
            .sequences
            .iter()
            .filter(|s| !s.pids.is_empty() && s.pids.iter().all(|p| pids.contains(p)))
            .map(|s| u64::from(s.id))
            .collect();
        let labelled: Vec<u64> = sequence_machines
            .iter()
            .filter(|&&(_, m)| m == u64::from(id))
            .map(|&(s, _)| s)
            .collect();
        assert!(!labelled.is_empty(), "machine {machine} has sequences");
        assert_eq!(labelled, checked_sequences, "machine {machine}'s sequences");
        assert_eq!(
            listing["sequences"],
            checked_sequences.len(),
            "machine {machine}"
        );
    }
    // The span is on the central clock, every machine's times shifted by
    // its offset: seconds, where machines whose clocks run hours ahead
    // (OwnNamespaces) spanned hours when read as the central machine's.
    let clocks = &analysis["clocks"];
    assert_eq!(clocks["unplaced_machines"], serde_json::json!([]));
    let span = clocks["last_ns"].as_u64().unwrap() - clocks["first_ns"].as_u64().unwrap();
    assert!(span < 60_000_000_000, "inspect's span: {span} ns");
    let state = outcome
        .service_state
        .as_ref()
        .expect("the service's state while the producers ran");
    let listed = state["producers"].as_array().expect("query's producers");
    for (run, spec) in outcome.producers.iter().zip(&scenario.producers) {
        let who = who(spec);
        let producer = listed
            .iter()
            .find(|p| p["pid"] == run.pid)
            .unwrap_or_else(|| panic!("query lists no {who} (pid {}): {state}", run.pid));
        assert_eq!(
            (&producer["machine_id"], &producer["machine_name"]),
            (
                &id_of(spec.machine).into(),
                &machine_name(spec.machine).into()
            ),
            "{who} in query: {producer}"
        );
    }
}

/// Which producer `spec` is, for messages.
fn who(spec: &ProducerSpec) -> String {
    let sdk = match spec.implementation {
        Some(ProducerImpl::Ours) => "our producer",
        _ => "the real SDK",
    };
    format!("{sdk} on machine {}", spec.machine)
}

/// What machine `index`'s clock `clock` should read more than the central
/// machine's, ns.
fn expected_offset(clocks: MachineClocks, index: u32, clock: u32) -> i64 {
    let offset = match (clocks, clock) {
        (MachineClocks::OwnTimeNamespaces, BOOTTIME) => machine_boottime_offset(index),
        (MachineClocks::OwnTimeNamespaces, MONOTONIC) => machine_monotonic_offset(index),
        _ => Duration::ZERO,
    };
    offset.as_nanos() as i64
}

/// Each machine's clock offsets, computed from its exchanges as a trace
/// processor does, are its real ones; mapped onto the central clock with
/// them, each producer's events lie inside the session and inside what the
/// harness saw of the producer.
fn check_clocks(outcome: &Outcome, scenario: &Scenario, clocks: MachineClocks) {
    let report: &TraceReport = &outcome.report;
    let service_event = |name: &str| -> Vec<i64> {
        let times = report
            .service_event_times
            .get(name)
            .unwrap_or_else(|| panic!("no {name} service event with a timestamp"));
        times.iter().map(|&t| t as i64).collect()
    };
    let started = *service_event("tracing_started").iter().min().unwrap();
    let disabled = *service_event("tracing_disabled").iter().max().unwrap();
    for (run, spec) in outcome.producers.iter().zip(&scenario.producers) {
        let who = who(spec);
        let id = id_of(spec.machine);
        let sync = &report.remote_clock_offsets[&id.to_string()];
        assert!(
            sync.rounds >= 1,
            "machine {}: no round: {sync:?}",
            spec.machine
        );
        // Half the longest round bounds each estimate's error (see the
        // module docs), plus the slack of clocks read one after another.
        let tolerance = (sync.max_span / 2) as i64 + SLACK_NS;
        for clock in [BOOTTIME, MONOTONIC, REALTIME] {
            let expected = expected_offset(clocks, spec.machine, clock);
            let offset = sync.offsets[&clock.to_string()];
            assert!(
                (offset - expected).abs() <= tolerance,
                "machine {}: clock {clock} is {offset} ns ahead by the exchanges, \
                 {expected} ns in truth (tolerance {tolerance} ns)",
                spec.machine
            );
        }
        let offset = sync.offsets[&BOOTTIME.to_string()];
        let times = report.event_times[&run.pid.to_string()];
        let (first, last) = (times.first - offset, times.last - offset);
        let (spawned, reported) = (run.started_ns as i64, run.reported_ns as i64);
        assert!(
            first >= spawned - tolerance && last <= reported + tolerance,
            "{who}: its events [{first}, {last}] on the central clock lie outside \
             [{spawned}, {reported}], from just before it started to its last report \
             (tolerance {tolerance} ns)"
        );
        assert!(
            first >= started - tolerance && last <= disabled + tolerance,
            "{who}: its events [{first}, {last}] on the central clock lie outside the \
             session [{started}, {disabled}] (tolerance {tolerance} ns)"
        );
        if clocks == MachineClocks::OwnTimeNamespaces {
            assert!(
                times.first > disabled,
                "{who}: on its own clock its events lie after the session ends, \
                 so the check above needs the conversion"
            );
        }
    }
}

/// Each machine reached the central service over its own link, from its
/// own address (or all over loopback), and its namespace is gone.
fn check_network(outcome: &Outcome, machines: u32, networks: MachineNetworks) {
    let connections = &outcome.central_connections;
    assert_eq!(
        connections.len(),
        machines as usize * CONNECTIONS_PER_MACHINE,
        "connections to the central service: {connections:?}"
    );
    if networks == MachineNetworks::Loopback {
        assert!(outcome.machine_links.is_empty());
        for connection in connections {
            assert!(
                connection.local.ip().is_loopback() && connection.peer.ip().is_loopback(),
                "a connection to the central service not on loopback: {connection:?}"
            );
        }
        return;
    }
    assert_eq!(outcome.machine_links.len() as u32, machines);
    for (machine, link) in &outcome.machine_links {
        // Addresses differ between machines, so three per machine, of the
        // 3 x machines, leave none that came another way (loopback).
        let from: Vec<_> = connections
            .iter()
            .filter(|c| *c.peer.ip() == link.own)
            .collect();
        assert_eq!(
            from.len(),
            CONNECTIONS_PER_MACHINE,
            "machine {machine}'s connections from its address {}: {connections:?}",
            link.own
        );
        for connection in from {
            assert_eq!(
                *connection.local.ip(),
                link.central,
                "machine {machine} reached the central service on its own link's address"
            );
        }
    }
    let listed = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    let listed = String::from_utf8_lossy(&listed.stdout);
    for link in outcome.machine_links.values() {
        assert!(
            !listed
                .lines()
                .any(|line| line.split_whitespace().next() == Some(link.namespace.as_str())),
            "namespace {} outlived its run: {listed}",
            link.namespace
        );
    }
}

#[test]
fn relay_one_machine_to_the_real_central_service() {
    run(Cell::REAL, 1, Machines::Shared);
}

#[test]
fn relay_one_machine_to_our_central_service() {
    run(Cell::OUR_SERVICE, 1, Machines::Shared);
}

#[test]
fn relay_one_machine_to_our_central_service_recorded_by_our_cli() {
    run(Cell::OUR_SERVICE_AND_CLI, 1, Machines::Shared);
}

/// Issue 20 item 4: three machines with clocks and networks of their own,
/// one central service, one trace.
#[test]
fn relay_three_machines_to_our_central_service() {
    run(Cell::OUR_SERVICE, 3, Machines::OwnNamespaces);
}

#[test]
fn relay_three_machines_to_the_real_central_service() {
    run(Cell::REAL, 3, Machines::OwnNamespaces);
}
