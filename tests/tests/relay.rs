//! The relay (issue 20): `shmtrace relay` on each "machine" forwards its
//! producers (the real Perfetto SDK and ours side by side, on the relay's
//! UNIX socket) to a central service over TCP, which traces them with their
//! machine's id, describes each machine (`system_info` with its
//! `machine_id`) and writes its clock exchanges with the relay
//! (`remote_clock_sync`), against the real central service (the
//! `real-service` driver with `--enable-relay-endpoint`) and ours.
//!
//! The "machines" are this one: each relay has a socket directory, a
//! machine name and an id hint of its own (`machine-N`), and all share this
//! machine's clocks, so the checker takes every timestamp as this
//! machine's; it checks that each machine's clock exchanges hold a whole
//! round (what a trace processor needs to align the machine's clocks).
//! Each producer's events must all be in the trace under its own machine's
//! id.
//!
//! Not here yet: clocks that differ between machines, network namespaces,
//! and vsock (this machine has no vsock loopback transport).

use shmtrace_service::ipc::host::machine_id;
use shmtrace_tests::real_binaries;
use shmtrace_tests::scenario::{
    self, machine_name, Cell, Outcome, ProducerImpl, ProducerSocket, ProducerSpec, Scenario,
};

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

fn run(cell: Cell, machines: u32) -> Outcome {
    let scenario = Scenario {
        producer_socket: ProducerSocket::Relayed,
        ..Scenario::new("relay", (0..machines).flat_map(producers).collect())
    };
    let outcome = scenario::run(cell, &real_binaries!(), &scenario)
        .unwrap_or_else(|e| panic!("relay in cell {}: {e}", cell.name()));
    outcome
        .report
        .assert_ok(&format!("relay in cell {}", cell.name()));
    check(&outcome, &scenario, machines);
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

/// Which producer `spec` is, for messages.
fn who(spec: &ProducerSpec) -> String {
    let sdk = match spec.implementation {
        Some(ProducerImpl::Ours) => "our producer",
        _ => "the real SDK",
    };
    format!("{sdk} on machine {}", spec.machine)
}

#[test]
fn relay_one_machine_to_the_real_central_service() {
    run(Cell::REAL, 1);
}

#[test]
fn relay_one_machine_to_our_central_service() {
    run(Cell::OUR_SERVICE, 1);
}

#[test]
fn relay_one_machine_to_our_central_service_recorded_by_our_cli() {
    run(Cell::OUR_SERVICE_AND_CLI, 1);
}

/// Issue 20 item 4: three machines, one central service, one trace.
#[test]
fn relay_three_machines_to_our_central_service() {
    run(Cell::OUR_SERVICE, 3);
}

#[test]
fn relay_three_machines_to_the_real_central_service() {
    run(Cell::REAL, 3);
}
