//! Simulations of trigger sessions (START_TRACING, STOP_TRACING) on the fake
//! clock.

use super::*;
use crate::protos::trace_config::trigger_config::Trigger;

fn trigger(name: &str, stop_delay_ms: u32) -> Trigger {
    Trigger {
        name: Some(name.into()),
        stop_delay_ms: Some(stop_delay_ms),
        ..Default::default()
    }
}

/// A config for data source "ds" with `mode`, `timeout_ms` and `triggers`.
fn trigger_config(mode: i32, timeout_ms: u32, triggers: Vec<Trigger>) -> Bytes {
    config("ds", 64, |cfg| {
        cfg.trigger_config = Some(trace_config::TriggerConfig {
            trigger_mode: Some(mode),
            trigger_timeout_ms: Some(timeout_ms),
            triggers,
            ..Default::default()
        })
    })
}

const START: i32 = 1;
const STOP: i32 = 2;
const CLONE: i32 = 4;

fn activate(sim: &mut Sim, p: &TestProducer, names: &[&str]) {
    let req = crate::protos::ActivateTriggersRequest {
        trigger_names: names.iter().map(|n| n.to_string()).collect(),
    };
    let id = p.call(sim, producer_port::Request::ActivateTriggers(req));
    let _: crate::protos::ActivateTriggersResponse = sim.reply_ok(p.conn, id);
}

/// The `trigger` packets (field 46) of a read, decoded:
/// `(timestamp, name, producer name, uid, stop_delay_ms)`.
fn triggers_in(packets: &[Vec<u8>]) -> Vec<(u64, String, String, u64, u64)> {
    packets
        .iter()
        .filter_map(|p| {
            let body = field(p, 46)?.err()?;
            let text = |n| String::from_utf8(field(&body, n).unwrap().unwrap_err()).unwrap();
            let num = |n| field(&body, n).unwrap().unwrap();
            assert_eq!(field(p, 10), Some(Ok(1)), "a service packet");
            Some((
                field(p, 8).unwrap().unwrap(),
                text(1),
                text(2),
                num(3),
                num(4),
            ))
        })
        .collect()
}

/// Acknowledges the flush among `cmds`; returns its flags.
fn ack_flush(sim: &mut Sim, p: &TestProducer, cmds: &[Cmd]) -> u64 {
    let Some(Cmd::Flush(f)) = cmds.iter().find(|c| matches!(c, Cmd::Flush(_))) else {
        panic!("no flush in {cmds:?}")
    };
    p.commit(
        sim,
        crate::protos::CommitDataRequest {
            flush_request_id: f.request_id,
            ..Default::default()
        },
    );
    f.flags.unwrap()
}

#[test]
fn a_start_trigger_starts_the_session_and_its_stop_delay_ends_it() {
    let (mut sim, mut p, c, cmds) = session_with(
        descriptor("ds", false, false),
        trigger_config(START, 5000, vec![trigger("go", 1000)]),
    );
    assert!(
        matches!(cmds[..], [Cmd::SetupTracing(_), Cmd::SetupDataSource(_)]),
        "set up, not started: {cmds:?}"
    );
    assert!(c.read(&mut sim).is_empty(), "no data before a trigger");
    sim.advance(100);
    activate(&mut sim, &p, &["unknown", "go"]);
    let t_go = sim.env.now();
    let cmds = p.commands(&mut sim);
    assert!(matches!(cmds[..], [Cmd::StartDataSource(_)]), "{cmds:?}");
    let buffer = 1;
    let req = p.write(1, buffer, &[b"after the trigger"], true);
    p.commit(&mut sim, req);
    // The trigger's stop_delay_ms is the duration now.
    sim.advance(999);
    assert!(p.commands(&mut sim).is_empty());
    sim.advance(1);
    let cmds = p.commands(&mut sim);
    assert_eq!(
        ack_flush(&mut sim, &p, &cmds),
        0x12,
        "stop flush by the service"
    );
    assert!(matches!(p.commands(&mut sim)[..], [Cmd::StopDataSource(_)]));
    assert_eq!(c.enabled_reply(&mut sim).expect("stopped").error, None);
    // The start timeout passes harmlessly.
    sim.advance(10_000);
    let packets = c.read(&mut sim);
    assert_eq!(payloads(&packets), [b"after the trigger".to_vec()]);
    assert_eq!(
        triggers_in(&packets),
        [(
            t_go,
            "go".into(),
            "prod".into(),
            u64::from(PRODUCER_UID),
            1000
        )]
    );
    // The emitted config shows the duration the service applied.
    assert_eq!(trace_config_in(&packets).duration_ms, Some(1000));
    // Triggers are emitted once.
    assert!(triggers_in(&c.read(&mut sim)).is_empty());
}

#[test]
fn without_a_start_trigger_the_session_times_out_with_no_data() {
    let (mut sim, mut p, c, _) = session_with(
        descriptor("ds", false, false),
        trigger_config(START, 2000, vec![trigger("go", 0)]),
    );
    sim.advance(1999);
    assert!(c.enabled_reply(&mut sim).is_none());
    sim.advance(1);
    assert!(
        c.enabled_reply(&mut sim).is_some(),
        "disabled at the timeout"
    );
    assert!(
        !p.commands(&mut sim)
            .iter()
            .any(|c| matches!(c, Cmd::StartDataSource(_))),
        "never started"
    );
    assert!(c.read(&mut sim).is_empty(), "not even service packets");
}

#[test]
fn a_stop_trigger_from_a_matching_producer_stops_after_its_delay() {
    let mut sim = Sim::new();
    let mut p = TestProducer::connect(&mut sim, "prod", &[descriptor("ds", false, false)]);
    let other = TestProducer::connect(&mut sim, "other", &[]);
    let stop = Trigger {
        producer_name_regex: Some("pro.*".into()),
        ..trigger("stop", 500)
    };
    let c = TestConsumer::enable(&mut sim, trigger_config(STOP, 10_000, vec![stop]));
    let cmds = p.commands(&mut sim);
    assert!(
        cmds.iter().any(|c| matches!(c, Cmd::StartDataSource(_))),
        "started at once"
    );
    let req = p.write(1, 1, &[b"before the trigger"], true);
    p.commit(&mut sim, req);
    assert!(c.read(&mut sim).is_empty(), "no data until a trigger");
    // "other" does not match the regex (a full match is needed).
    activate(&mut sim, &other, &["stop"]);
    assert!(c.read(&mut sim).is_empty());
    sim.advance(1000);
    activate(&mut sim, &p, &["stop"]);
    let t_stop = sim.env.now();
    sim.advance(300);
    activate(&mut sim, &p, &["stop"]); // recorded, changes nothing
    sim.advance(199);
    assert!(p.commands(&mut sim).is_empty());
    sim.advance(1);
    let cmds = p.commands(&mut sim);
    assert_eq!(ack_flush(&mut sim, &p, &cmds), 0x12);
    assert!(matches!(p.commands(&mut sim)[..], [Cmd::StopDataSource(_)]));
    assert!(c.enabled_reply(&mut sim).is_some());
    let packets = c.read(&mut sim);
    assert_eq!(payloads(&packets), [b"before the trigger".to_vec()]);
    let got = triggers_in(&packets);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0], (t_stop, "stop".into(), "prod".into(), 1000, 500));
    assert_eq!(got[1].0, t_stop + 300_000_000);
}

#[test]
fn without_a_stop_trigger_the_session_ends_at_the_timeout_with_no_data() {
    let (mut sim, mut p, c, _) = session_with(
        descriptor("ds", false, false),
        trigger_config(STOP, 3000, vec![trigger("stop", 0)]),
    );
    let req = p.write(1, 1, &[b"never read"], true);
    p.commit(&mut sim, req);
    sim.advance(3000);
    let cmds = p.commands(&mut sim);
    ack_flush(&mut sim, &p, &cmds);
    assert!(c.enabled_reply(&mut sim).is_some());
    assert!(
        c.read(&mut sim).is_empty(),
        "a session without its trigger has no data"
    );
}

#[test]
fn skip_probability_and_max_per_24_h_drop_triggers() {
    let never = Trigger {
        skip_probability: Some(1.0),
        ..trigger("never", 0)
    };
    let once = Trigger {
        max_per_24_h: Some(1),
        ..trigger("once", 0)
    };
    // No mode: triggers are only recorded (and gate the data).
    let (mut sim, p, c, _) = session_with(
        descriptor("ds", false, false),
        trigger_config(0, 0, vec![never, once]),
    );
    activate(&mut sim, &p, &["never", "never"]);
    assert!(c.read(&mut sim).is_empty(), "always skipped");
    activate(&mut sim, &p, &["once"]);
    sim.advance(1000);
    activate(&mut sim, &p, &["once"]);
    assert_eq!(
        triggers_in(&c.read(&mut sim)).len(),
        1,
        "the second is over the limit"
    );
    // A day after the first, the limit allows one more.
    sim.advance(24 * 3600 * 1000 - 1000);
    activate(&mut sim, &p, &["once"]);
    assert!(
        triggers_in(&c.read(&mut sim)).is_empty(),
        "exactly 24 h: still in the window"
    );
    sim.advance(1);
    activate(&mut sim, &p, &["once"]);
    assert_eq!(triggers_in(&c.read(&mut sim)).len(), 1);
}

/// Whether a refusal is the one expected.
type Expected = fn(&ConfigError) -> bool;

#[test]
fn invalid_trigger_configs_are_refused_with_clear_errors() {
    let mut sim = Sim::new();
    let cases: Vec<(Bytes, Expected)> = vec![
        (
            config("ds", 64, |cfg| {
                cfg.trigger_config = Some(trace_config::TriggerConfig {
                    trigger_mode: Some(START),
                    use_clone_snapshot_if_available: Some(true),
                    trigger_timeout_ms: Some(1000),
                    ..Default::default()
                })
            }),
            |e| matches!(e, ConfigError::CloneSnapshotIfAvailable),
        ),
        (
            config("ds", 64, |cfg| {
                cfg.write_into_file = Some(true);
                cfg.output_path = Some("/nonexistent/x".into());
                cfg.trigger_config = Some(trace_config::TriggerConfig {
                    trigger_mode: Some(CLONE),
                    trigger_timeout_ms: Some(1000),
                    ..Default::default()
                })
            }),
            |e| matches!(e, ConfigError::TriggersIntoFile("CLONE_SNAPSHOT")),
        ),
        (trigger_config(START, 0, vec![trigger("t", 0)]), |e| {
            matches!(e, ConfigError::TriggerTimeout(0))
        }),
        (trigger_config(3, 1000, vec![]), |e| {
            matches!(e, ConfigError::TriggerMode(3))
        }),
        (
            trigger_config(STOP, 1000, vec![trigger("t", 0), trigger("t", 1)]),
            |e| matches!(e, ConfigError::DuplicateTrigger(name) if name == "t"),
        ),
        (
            trigger_config(
                STOP,
                1000,
                vec![Trigger {
                    producer_name_regex: Some("(".into()),
                    ..trigger("t", 0)
                }],
            ),
            |e| {
                matches!(e, ConfigError::TriggerRegex { trigger, pattern, .. }
                    if trigger == "t" && pattern == "(")
            },
        ),
        (
            config("ds", 64, |cfg| {
                cfg.duration_ms = Some(10);
                cfg.trigger_config = Some(trace_config::TriggerConfig {
                    trigger_mode: Some(START),
                    trigger_timeout_ms: Some(1000),
                    ..Default::default()
                })
            }),
            |e| matches!(e, ConfigError::DurationWithTriggers),
        ),
        (
            config("ds", 64, |cfg| {
                cfg.write_into_file = Some(true);
                cfg.output_path = Some("/nonexistent/x".into());
                cfg.trigger_config = Some(trace_config::TriggerConfig {
                    trigger_mode: Some(STOP),
                    trigger_timeout_ms: Some(1000),
                    ..Default::default()
                })
            }),
            |e| matches!(e, ConfigError::TriggersIntoFile("STOP_TRACING")),
        ),
    ];
    for (cfg, expected) in cases {
        let error = TestConsumer::refused(&mut sim, cfg);
        assert!(expected(&error), "unexpected refusal {error:?}");
    }
}

#[test]
fn a_trigger_flood_keeps_a_bounded_number_for_the_trace() {
    let (mut sim, p, c, _) = session_with(
        descriptor("ds", false, false),
        trigger_config(0, 0, vec![trigger("t", 0)]),
    );
    let names = vec!["t"; crate::service::core::triggers::MAX_PENDING_TRIGGERS + 100];
    activate(&mut sim, &p, &names);
    let got = triggers_in(&c.read(&mut sim));
    assert_eq!(
        got.len(),
        crate::service::core::triggers::MAX_PENDING_TRIGGERS
    );
    // Emitted ones make room again.
    activate(&mut sim, &p, &["t"]);
    assert_eq!(triggers_in(&c.read(&mut sim)).len(), 1);
}

#[test]
fn skip_probability_outside_0_1_is_accepted_like_upstream() {
    let with_skip = |name: &str, p: f64| Trigger {
        skip_probability: Some(p),
        ..trigger(name, 0)
    };
    let (mut sim, p, c, _) = session_with(
        descriptor("ds", false, false),
        trigger_config(
            0,
            0,
            vec![
                with_skip("over", 1.5),
                with_skip("under", -0.5),
                with_skip("nan", f64::NAN),
            ],
        ),
    );
    assert!(
        c.enabled_reply(&mut sim).is_none(),
        "accepted: the session runs"
    );
    activate(&mut sim, &p, &["over", "over", "over"]);
    assert!(c.read(&mut sim).is_empty(), "above 1: always skipped");
    activate(&mut sim, &p, &["under", "nan"]);
    assert_eq!(
        triggers_in(&c.read(&mut sim)).len(),
        2,
        "below 0 and NaN: never skipped"
    );
}

/// CLONE_SNAPSHOT: the session starts at once and yields nothing to
/// ReadBuffers; each trigger, after its stop delay, is reported to the
/// consumer as a CLONE_TRIGGER_HIT event; a clone naming the trigger holds
/// the data and the `clone_snapshot_trigger` packet; the session runs on
/// until its trigger timeout.
#[test]
fn clone_snapshot_triggers_notify_the_consumer_which_clones() {
    use crate::protos::clone_session_request::Selector;
    use crate::protos::observable_events::Type;
    for use_if_available in [false, true] {
        let cfg = config("ds", 64, |cfg| {
            cfg.trigger_config = Some(trace_config::TriggerConfig {
                trigger_mode: Some(if use_if_available { STOP } else { CLONE }),
                use_clone_snapshot_if_available: Some(use_if_available),
                trigger_timeout_ms: Some(60_000),
                triggers: vec![trigger("snap", 200)],
            })
        });
        let (mut sim, mut p, c, cmds) = session_with(descriptor("ds", false, false), cfg);
        assert!(cmds.iter().any(|c| matches!(c, Cmd::StartDataSource(_))));
        let observe = c.call(
            &mut sim,
            consumer_port::Request::ObserveEvents(crate::protos::ObserveEventsRequest {
                events_to_observe: vec![Type::CloneTriggerHit as i32],
            }),
        );
        let req = p.write(1, 1, &[b"before"], true);
        p.commit(&mut sim, req);
        assert!(
            payloads(&c.read(&mut sim)).is_empty(),
            "read only by clones"
        );
        activate(&mut sim, &p, &["snap"]);
        let t_snap = sim.env.now();
        sim.advance(199);
        assert!(sim.replies(c.conn, observe).is_empty());
        sim.advance(1);
        let got = sim.replies(c.conn, observe);
        assert_eq!(got.len(), 1);
        assert!(got[0].has_more);
        let ReplyBody::Ok(b) = &got[0].body else {
            panic!("failed")
        };
        let hit = crate::protos::ObserveEventsResponse::decode(b.clone())
            .unwrap()
            .events
            .unwrap()
            .clone_trigger_hit
            .expect("a clone_trigger_hit");
        assert_eq!(hit.tracing_session_id, Some(1));
        assert_eq!(hit.trigger_name.as_deref(), Some("snap"));
        assert_eq!(hit.producer_name.as_deref(), Some("prod"));
        assert_eq!(hit.producer_uid, Some(PRODUCER_UID));
        assert_eq!(hit.boot_time_ns, Some(t_snap));
        assert_eq!(hit.trigger_delay_ms, Some(200));
        // The consumer clones on another connection, as perfetto_cmd does.
        let cloner = sim.svc.connect_consumer(creds(2000, 78));
        let req = crate::protos::CloneSessionRequest {
            selector: Some(Selector::SessionId(1)),
            clone_trigger_name: hit.trigger_name.clone(),
            clone_trigger_producer_name: hit.producer_name.clone(),
            clone_trigger_trusted_producer_uid: hit.producer_uid.map(|u| u as i32),
            clone_trigger_boot_time_ns: hit.boot_time_ns,
            clone_trigger_delay_ms: hit.trigger_delay_ms,
            ..Default::default()
        };
        let id = sim.consumer_call(cloner, consumer_port::Request::CloneSession(req), None);
        let cmds = p.commands(&mut sim);
        ack_flush(&mut sim, &p, &cmds);
        let resp: crate::protos::CloneSessionResponse = sim.reply_ok(cloner, id);
        assert_eq!(resp.success, Some(true), "{resp:?}");
        let clone = TestConsumer {
            conn: cloner,
            enable: 0,
        };
        let packets = clone.read(&mut sim);
        assert_eq!(payloads(&packets), [b"before".to_vec()]);
        let snap = packets
            .iter()
            .find_map(|p| field(p, 113))
            .expect("clone_snapshot_trigger")
            .unwrap_err();
        assert_eq!(field(&snap, 1), Some(Err(b"snap".to_vec())));
        assert_eq!(triggers_in(&packets).len(), 1, "the trigger received");
        // The session runs on until its trigger timeout.
        assert!(c.enabled_reply(&mut sim).is_none());
        sim.advance(60_000);
        let cmds = p.commands(&mut sim);
        ack_flush(&mut sim, &p, &cmds);
        assert!(c.enabled_reply(&mut sim).is_some(), "ended at the timeout");
    }
}
