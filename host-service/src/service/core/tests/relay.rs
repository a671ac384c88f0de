//! Relayed machines: producers forwarded by a relay, which said who they
//! are and which machine they run on, and the relay's own `RelayPort`
//! calls (the machine's description, its clock exchanges).

use super::*;
use crate::protos::relay_port;
use crate::protos::sync_clock_request::{Clock, Phase};
use crate::protos::{InitRelayRequest, SyncClockRequest, SystemInfo, Utsname};

const MACHINE: u32 = 0x5eed_0001;

fn identity(pid: i32, uid: u32) -> RemoteIdentity {
    RemoteIdentity {
        pid,
        uid,
        machine_id: MACHINE,
        machine_name: "vm-1".into(),
    }
}

fn relay_call(sim: &mut Sim, conn: ConnId, request: relay_port::Request) -> u64 {
    let (id, call) = sim.next_call(request, None);
    sim.svc.on_relay_call(conn, call);
    sim.pump();
    id
}

/// A relay's own connection, announced and initialized, its clocks
/// exchanged once (a PING and an UPDATE).
fn connect_relay(sim: &mut Sim, clocks: &[(u32, u64)]) -> ConnId {
    let conn = sim.svc.connect_emulated_producer(REMOTE_PEER);
    sim.svc.set_peer_identity(conn, identity(1, 0));
    let info = SystemInfo {
        utsname: Some(Utsname {
            sysname: Some("RelayedOS".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let id = relay_call(
        sim,
        conn,
        relay_port::Request::InitRelay(InitRelayRequest {
            system_info: Some(info),
        }),
    );
    let _: crate::protos::InitRelayResponse = sim.reply_ok(conn, id);
    for phase in [Phase::Ping, Phase::Update] {
        let id = relay_call(sim, conn, sync_clock(phase, clocks));
        let _: crate::protos::SyncClockResponse = sim.reply_ok(conn, id);
        sim.advance(1);
    }
    conn
}

fn sync_clock(phase: Phase, clocks: &[(u32, u64)]) -> relay_port::Request {
    relay_port::Request::SyncClock(SyncClockRequest {
        phase: Some(phase as i32),
        clocks: clocks
            .iter()
            .map(|&(id, ts)| Clock {
                clock_id: Some(id),
                timestamp: Some(ts),
            })
            .collect(),
    })
}

/// A producer forwarded by the relay: its connection announced as
/// `identity` before its first call.
fn connect_relayed(sim: &mut Sim, name: &str, identity: RemoteIdentity) -> TestProducer {
    let ds = [descriptor("ds", false, false)];
    TestProducer::connect_emulated_as(sim, name, &ds, false, Some(identity))
}

fn decode<M: prost::Message + Default>(v: Option<Result<u64, Vec<u8>>>) -> M {
    match v {
        Some(Err(bytes)) => M::decode(&bytes[..]).expect("decodes"),
        other => panic!("expected a message, got {other:?}"),
    }
}

#[test]
fn relayed_packets_carry_their_machine_and_the_trace_its_description_and_clocks() {
    let mut sim = Sim::new();
    let relay_clocks = [(6, 5_000), (1, 7_000)];
    let start = sim.env.now();
    let relay = connect_relay(&mut sim, &relay_clocks);
    let mut p = connect_relayed(&mut sim, "remote", identity(55, 1000));
    // A producer of this machine on the same session: no machine id.
    let mut local = TestProducer::connect(&mut sim, "local", &[descriptor("ds", false, false)]);
    let c = TestConsumer::enable(
        &mut sim,
        config("ds", 1024, |c| c.trace_all_machines = Some(true)),
    );
    let buffer = setup_tracing_buffer(&p.commands(&mut sim));
    assert_eq!(setup_tracing_buffer(&local.commands(&mut sim)), buffer);
    p.register_writer(&mut sim, 1, buffer);
    let req = p.write(1, buffer, &[b"from the vm"], true);
    let id = p.commit(&mut sim, req);
    let _: crate::protos::CommitDataResponse = sim.reply_ok(p.conn, id);
    local.register_writer(&mut sim, 1, buffer);
    let req = local.write(1, buffer, &[b"from here"], true);
    let id = local.commit(&mut sim, req);
    let _: crate::protos::CommitDataResponse = sim.reply_ok(local.conn, id);

    let (packets, _) = c.stop_and_read(&mut sim);
    assert!(sim.disconnects().is_empty());
    let remote = packets
        .iter()
        .find(|p| field(p, 900) == Some(Err(b"from the vm".to_vec())))
        .expect("the relayed packet");
    assert_eq!(
        field(remote, 98),
        Some(Ok(u64::from(MACHINE))),
        "machine_id"
    );
    assert_eq!(field(remote, 3), Some(Ok(1000)), "the relay's uid for it");
    assert_eq!(field(remote, 79), Some(Ok(55)), "the relay's pid for it");
    let here = packets
        .iter()
        .find(|p| field(p, 900) == Some(Err(b"from here".to_vec())))
        .expect("the local packet");
    assert_eq!(field(here, 98), None);
    assert_ne!(field(here, 10), field(remote, 10), "two sequences");

    // This machine's system_info and the relayed one's, with its id.
    let infos: Vec<&Vec<u8>> = packets.iter().filter(|p| field(p, 45).is_some()).collect();
    assert_eq!(infos.len(), 2);
    assert_eq!(field(infos[0], 98), None);
    assert_eq!(field(infos[1], 98), Some(Ok(u64::from(MACHINE))));
    let info: SystemInfo = decode(field(infos[1], 45));
    assert_eq!(info.utsname.unwrap().sysname.as_deref(), Some("RelayedOS"));

    // The clock exchanges: the relay's readings, each paired with the
    // service's at receipt, oldest first.
    let syncs: Vec<&Vec<u8>> = packets.iter().filter(|p| field(p, 107).is_some()).collect();
    assert_eq!(syncs.len(), 1, "one remote_clock_sync per machine");
    assert_eq!(field(syncs[0], 98), Some(Ok(u64::from(MACHINE))));
    assert_eq!(field(syncs[0], 3), Some(Ok(0)), "the service's uid");
    let sync: crate::protos::RemoteClockSync = decode(field(syncs[0], 107));
    assert_eq!(sync.synced_clocks.len(), 2);
    for (i, exchange) in sync.synced_clocks.iter().enumerate() {
        let clocks = |s: &Option<crate::protos::ClockSnapshot>| -> Vec<(u32, u64)> {
            s.as_ref()
                .unwrap()
                .clocks
                .iter()
                .map(|c| (c.clock_id.unwrap(), c.timestamp.unwrap()))
                .collect()
        };
        assert_eq!(clocks(&exchange.client_clocks), relay_clocks);
        let host = clocks(&exchange.host_clocks);
        assert_eq!(
            host[0],
            (6, start + i as u64 * 1_000_000),
            "BOOTTIME at receipt"
        );
    }
    assert!(sim.svc.relays.contains_key(&relay));
}

/// QueryServiceState gives a relayed producer its machine's id and name,
/// and a producer of this machine neither (as upstream's since v56).
#[test]
fn query_lists_a_relayed_producer_with_its_machine() {
    let mut sim = Sim::new();
    let _remote = connect_relayed(&mut sim, "remote", identity(55, 1000));
    let _local = TestProducer::connect(&mut sim, "local", &[descriptor("ds", false, false)]);
    let c = TestConsumer::enable(&mut sim, config("ds", 64, |_| {}));
    let id = c.call(
        &mut sim,
        consumer_port::Request::QueryServiceState(Default::default()),
    );
    let resp: crate::protos::QueryServiceStateResponse = sim.reply_ok(c.conn, id);
    let producers = resp.service_state.unwrap().producers;
    let by_name = |name: &str| {
        producers
            .iter()
            .find(|p| p.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("{name} in {producers:?}"))
    };
    let remote = by_name("remote");
    assert_eq!(remote.machine_id, Some(MACHINE));
    assert_eq!(remote.machine_name.as_deref(), Some("vm-1"));
    assert_eq!(remote.pid, Some(55));
    let local = by_name("local");
    assert_eq!(
        (local.machine_id, local.machine_name.as_deref()),
        (None, None)
    );
}

#[test]
fn relayed_producers_are_traced_only_when_the_config_says_so() {
    for (tweak, traced) in [
        (None, false),
        (Some(("all", vec![])), true),
        (Some(("filter", vec!["vm-1"])), true),
        (Some(("filter", vec!["host"])), false),
        (Some(("filter", vec!["vm-2", "host"])), false),
    ] {
        let mut sim = Sim::new();
        let mut p = connect_relayed(&mut sim, "remote", identity(55, 1000));
        let mut local = TestProducer::connect(&mut sim, "local", &[descriptor("ds", false, false)]);
        let _c = TestConsumer::enable(
            &mut sim,
            config("ds", 1024, |c| match &tweak {
                None => {}
                Some(("all", _)) => c.trace_all_machines = Some(true),
                Some((_, names)) => {
                    c.data_sources[0].machine_name_filter =
                        names.iter().map(|n| n.to_string()).collect();
                }
            }),
        );
        let remote_set_up = p
            .commands(&mut sim)
            .iter()
            .any(|c| matches!(c, Cmd::SetupDataSource(_)));
        assert_eq!(remote_set_up, traced, "{tweak:?}");
        let local_set_up = local
            .commands(&mut sim)
            .iter()
            .any(|c| matches!(c, Cmd::SetupDataSource(_)));
        let host_named = match &tweak {
            Some(("filter", names)) => names.contains(&"host"),
            _ => true,
        };
        assert_eq!(local_set_up, host_named, "this machine, {tweak:?}");
    }
}

#[test]
fn a_hostile_relay_costs_only_its_own_connection() {
    let mut sim = Sim::new();
    // RelayPort without an identity: this machine would pose as remote.
    let anonymous = sim.svc.connect_emulated_producer(REMOTE_PEER);
    let id = relay_call(&mut sim, anonymous, sync_clock(Phase::Ping, &[(6, 1)]));
    assert!(matches!(sim.replies(anonymous, id)[0].body, ReplyBody::Err));
    // Too many clocks: the relay is disconnected.
    let relay = sim.svc.connect_emulated_producer(REMOTE_PEER);
    sim.svc.set_peer_identity(relay, identity(1, 0));
    let clocks: Vec<(u32, u64)> = (0..=MAX_CLOCKS_PER_SYNC as u32).map(|i| (i, 1)).collect();
    relay_call(&mut sim, relay, sync_clock(Phase::Ping, &clocks));
    let gone = sim.disconnects();
    assert!(
        matches!(gone[..], [(c, PeerFault::TooManyClocks { clocks: 17 })] if c == relay),
        "{gone:?}"
    );
    sim.svc.disconnect(relay);
    // A producer that has begun cannot change its identity afterwards.
    let p = connect_relayed(&mut sim, "remote", identity(55, 1000));
    sim.svc.set_peer_identity(
        p.conn,
        RemoteIdentity {
            machine_id: 9,
            ..identity(66, 0)
        },
    );
    let producer = sim.svc.producers.values().next().unwrap();
    assert_eq!((producer.machine.id, producer.pid), (MACHINE, 55));
    // The service goes on: a relay that behaves is served.
    let good = connect_relay(&mut sim, &[(6, 1)]);
    assert_eq!(sim.svc.relays[&good].synced.len(), 2);
}
