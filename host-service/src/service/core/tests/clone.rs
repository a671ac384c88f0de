//! Simulations of `CloneSession`: selection, permissions, the flush, the
//! copies (ring buffers, `transfer_on_clone`, `clear_before_clone`,
//! `write_into_file`) and callers or sources that go away mid-clone.

use super::super::session::{SessionState, MAX_SESSIONS_PER_UID};
use super::*;
use crate::protos::clone_session_request::Selector;
use crate::protos::{CloneSessionRequest, CloneSessionResponse};

/// `FlushFlags`: initiator traced, reason TraceClone.
const CLONE_FLAGS: u64 = 0x13;

/// A consumer of `uid` that asks to clone by `selector`; the call's id.
fn ask_clone(sim: &mut Sim, uid: u32, selector: Selector) -> (TestConsumer, u64) {
    ask_clone_with(
        sim,
        uid,
        CloneSessionRequest {
            selector: Some(selector),
            ..Default::default()
        },
        None,
    )
}

fn ask_clone_with(
    sim: &mut Sim,
    uid: u32,
    req: CloneSessionRequest,
    fd: Option<OwnedFd>,
) -> (TestConsumer, u64) {
    let conn = sim.svc.connect_consumer(creds(uid, 78));
    let id = sim.consumer_call(conn, consumer_port::Request::CloneSession(req), fd);
    (TestConsumer { conn, enable: 0 }, id)
}

/// The `CloneSessionResponse` to call `id`, which must have been sent.
fn clone_reply(sim: &mut Sim, c: &TestConsumer, id: u64) -> CloneSessionResponse {
    sim.reply_ok(c.conn, id)
}

/// Clones with `req` (as uid 2000), acknowledges the clone's flush, and
/// reads the clone.
fn flushed_clone(sim: &mut Sim, p: &mut TestProducer, req: CloneSessionRequest) -> Vec<Vec<u8>> {
    let (c, id) = ask_clone_with(sim, 2000, req, None);
    let fl = flushes(&p.commands(sim))[0].request_id;
    ack(sim, p, fl);
    assert_eq!(clone_reply(sim, &c, id).success, Some(true));
    c.read(sim)
}

fn flushes(cmds: &[Cmd]) -> Vec<&crate::protos::get_async_command_response::Flush> {
    cmds.iter()
        .filter_map(|c| match c {
            Cmd::Flush(f) => Some(f),
            _ => None,
        })
        .collect()
}

fn ack(sim: &mut Sim, p: &TestProducer, request_id: Option<u64>) {
    p.commit(
        sim,
        crate::protos::CommitDataRequest {
            flush_request_id: request_id,
            ..Default::default()
        },
    );
}

/// The trace UUID of a read, `(msb, lsb)`.
fn uuid_of(packets: &[Vec<u8>]) -> (i64, i64) {
    let raw = packets
        .iter()
        .find_map(|p| field(p, 89))
        .expect("a trace_uuid packet")
        .unwrap_err();
    let u = crate::protos::TraceUuid::decode(&raw[..]).unwrap();
    (u.msb.unwrap(), u.lsb.unwrap())
}

/// The service events of a read (field 69), decoded.
fn service_events(packets: &[Vec<u8>]) -> Vec<crate::protos::tracing_service_event::EventType> {
    packets
        .iter()
        .filter_map(|p| field(p, 69))
        .map(|raw| {
            crate::protos::TracingServiceEvent::decode(&raw.unwrap_err()[..])
                .unwrap()
                .event_type
                .unwrap()
        })
        .collect()
}

fn session_states(sim: &mut Sim, c: &TestConsumer) -> Vec<(u64, String)> {
    let id = c.call(
        sim,
        consumer_port::Request::QueryServiceState(Default::default()),
    );
    let resp: crate::protos::QueryServiceStateResponse = sim.reply_ok(c.conn, id);
    resp.service_state
        .unwrap()
        .tracing_sessions
        .into_iter()
        .map(|s| (s.id.unwrap(), s.state.unwrap()))
        .collect()
}

/// Producer "prod" with data source "ds" and a session of `cfg` (consumer
/// uid 2000); "a" and "b" written and committed; the buffer id.
fn running(cfg: Bytes) -> (Sim, TestProducer, TestConsumer, u16) {
    let (mut sim, mut p, c, cmds) = session_with(descriptor("ds", false, false), cfg);
    let buffer = setup_tracing_buffer(&cmds);
    let req = p.write(1, buffer, &[b"a", b"b"], true);
    p.commit(&mut sim, req);
    p.commands(&mut sim);
    (sim, p, c, buffer)
}

#[test]
fn a_clone_by_id_snapshots_the_session_which_runs_on() {
    let (mut sim, mut p, source, buffer) = running(config("ds", 256, |_| {}));
    let (cloner, id) = ask_clone(&mut sim, 2000, Selector::SessionId(1));
    // The service flushes first; the answer waits for the flush.
    let cmds = p.commands(&mut sim);
    let fl = flushes(&cmds);
    assert_eq!(fl.len(), 1, "one group has instances: {cmds:?}");
    assert_eq!(fl[0].flags, Some(CLONE_FLAGS));
    assert_eq!(fl[0].data_source_ids.len(), 1);
    assert!(sim.replies(cloner.conn, id).is_empty(), "deferred");
    // The producer writes what it had before acknowledging.
    let req = p.write(2, buffer, &[b"flushed"], true);
    p.commit(&mut sim, req);
    ack(&mut sim, &p, fl[0].request_id);
    let resp = clone_reply(&mut sim, &cloner, id);
    assert_eq!(resp.success, Some(true), "{resp:?}");
    assert_eq!(resp.error.as_deref(), Some(""));
    assert_eq!(resp.was_write_into_file, Some(false));
    assert_eq!(
        session_states(&mut sim, &cloner),
        [(1, "STARTED".into()), (2, "CLONED_READ_ONLY".into())]
    );
    // The clone started when its source did.
    let q = cloner.call(
        &mut sim,
        consumer_port::Request::QueryServiceState(Default::default()),
    );
    let state: crate::protos::QueryServiceStateResponse = sim.reply_ok(cloner.conn, q);
    let starts: Vec<Option<i64>> = state
        .service_state
        .unwrap()
        .tracing_sessions
        .iter()
        .map(|s| s.start_realtime_ns)
        .collect();
    assert!(starts[0].is_some());
    assert_eq!(starts[0], starts[1]);

    // The source goes on: a packet written after the clone is its alone.
    let req = p.write(3, buffer, &[b"after"], true);
    p.commit(&mut sim, req);
    let cloned = cloner.read(&mut sim);
    assert_eq!(
        payloads(&cloned),
        [b"a".to_vec(), b"b".to_vec(), b"flushed".to_vec()]
    );
    let uuid = uuid_of(&cloned);
    assert_eq!((resp.uuid_msb, resp.uuid_lsb), (Some(uuid.0), Some(uuid.1)));
    assert_eq!(trace_config_in(&cloned).buffers[0].size_kb, Some(256));
    use crate::protos::tracing_service_event::EventType as E;
    let events = service_events(&cloned);
    for e in [
        E::TracingStarted(true),
        E::FlushStarted(true),
        E::AllDataSourcesFlushed(true),
        E::CloneStarted(true),
        E::BufferCloned(0),
        E::TracingDisabled(true),
        E::ReadTracingBuffersCompleted(true),
    ] {
        assert!(events.contains(&e), "{e:?} missing from {events:?}");
    }
    let stats = stats_of(&cloned);
    assert_eq!(stats.final_flush_outcome, Some(1), "FINAL_FLUSH_SUCCEEDED");
    assert_eq!(stats.flushes_requested, Some(2), "two buffer groups");
    assert_eq!(stats.buffer_stats.len(), 1);
    assert_eq!(stats.buffer_stats[0].chunks_read, Some(2));
    // GetTraceStats works on the clone too.
    let sid = cloner.call(
        &mut sim,
        consumer_port::Request::GetTraceStats(Default::default()),
    );
    let got: crate::protos::GetTraceStatsResponse = sim.reply_ok(cloner.conn, sid);
    assert_eq!(got.trace_stats.unwrap().final_flush_outcome, Some(1));

    // The source's trace has everything, and the same UUID lsb.
    let (packets, _) = source.stop_and_read(&mut sim);
    assert_eq!(
        payloads(&packets),
        [
            b"a".to_vec(),
            b"b".to_vec(),
            b"flushed".to_vec(),
            b"after".to_vec()
        ]
    );
    let source_uuid = uuid_of(&packets);
    assert_eq!(source_uuid.1, uuid.1, "the lsb is kept");
    assert_ne!(source_uuid.0, uuid.0, "the msb is new");
    assert!(!service_events(&packets).contains(&E::CloneStarted(true)));

    // FreeBuffers frees the clone only.
    let fid = cloner.call(
        &mut sim,
        consumer_port::Request::FreeBuffers(Default::default()),
    );
    let _: crate::protos::FreeBuffersResponse = sim.reply_ok(cloner.conn, fid);
    assert_eq!(sim.svc.session_states().len(), 1);
    assert_eq!(sim.svc.buffers.len(), 1);
}

#[test]
fn clones_by_name_and_their_refusals() {
    let named = |cfg: &mut TraceConfig| cfg.unique_session_name = Some("snap".into());
    let (mut sim, mut p, source, _) = running(config("ds", 64, named));
    let refusal = |sim: &mut Sim, uid, selector| {
        let (c, id) = ask_clone(sim, uid, selector);
        let resp = clone_reply(sim, &c, id);
        assert_eq!(resp.success, Some(false));
        assert_eq!((resp.uuid_msb, resp.uuid_lsb), (Some(0), Some(0)));
        resp.error.unwrap()
    };
    assert_eq!(
        refusal(&mut sim, 2000, Selector::UniqueSessionName("nope".into())),
        "Tracing session not found"
    );
    assert_eq!(
        refusal(&mut sim, 2000, Selector::SessionId(7)),
        "Tracing session not found"
    );
    assert_eq!(
        refusal(&mut sim, 3000, Selector::UniqueSessionName("snap".into())),
        "Not allowed to clone a session from another UID"
    );
    assert_eq!(
        refusal(&mut sim, 2000, Selector::SessionId(BUGREPORT_SESSION_ID)),
        "No tracing sessions eligible for bugreport found"
    );
    assert!(p.commands(&mut sim).is_empty(), "no flush for refusals");
    // Root may clone it; by name.
    let (root, id) = ask_clone(&mut sim, 0, Selector::UniqueSessionName("snap".into()));
    let cmds = p.commands(&mut sim);
    ack(&mut sim, &p, flushes(&cmds)[0].request_id);
    assert_eq!(clone_reply(&mut sim, &root, id).success, Some(true));
    assert_eq!(
        payloads(&root.read(&mut sim)),
        [b"a".to_vec(), b"b".to_vec()]
    );
    // A clone has no name to be found by, and does not hold the name.
    let (again, id) = ask_clone(&mut sim, 0, Selector::UniqueSessionName("snap".into()));
    let cmds = p.commands(&mut sim);
    ack(&mut sim, &p, flushes(&cmds)[0].request_id);
    assert_eq!(clone_reply(&mut sim, &again, id).success, Some(true));
    // The source's own consumer has a session already: the flush runs,
    // then the clone is refused.
    let id = source.call(
        &mut sim,
        consumer_port::Request::CloneSession(CloneSessionRequest {
            selector: Some(Selector::SessionId(1)),
            ..Default::default()
        }),
    );
    let cmds = p.commands(&mut sim);
    ack(&mut sim, &p, flushes(&cmds)[0].request_id);
    let resp: CloneSessionResponse = sim.reply_ok(source.conn, id);
    assert_eq!(
        resp.error.as_deref(),
        Some("The consumer is already attached to another tracing session")
    );
    assert_eq!(
        sim.svc.session_states().len(),
        3,
        "the source and two clones"
    );
    // With the source gone, the name is free: clones do not hold it.
    source.call(
        &mut sim,
        consumer_port::Request::FreeBuffers(Default::default()),
    );
    let renamed = TestConsumer::enable(&mut sim, config("ds", 64, named));
    assert!(renamed.enabled_reply(&mut sim).is_none(), "running");
    assert_eq!(
        sim.svc.session_states(),
        std::collections::BTreeMap::from([
            (2, SessionState::ClonedReadOnly),
            (3, SessionState::ClonedReadOnly),
            (4, SessionState::Started)
        ])
    );
}

/// `for_bugreport` on a clone by id (`record --clone ID
/// --clone-for-bugreport`, as perfetto_cmd's) makes the clone's flush name
/// the bugreport as its target; without it the flush names none.
#[test]
fn for_bugreport_makes_the_clone_s_flush_target_the_bugreport() {
    let (mut sim, mut p, _c, _) = running(config("ds", 64, |_| {}));
    for (for_bugreport, flags) in [(Some(true), CLONE_FLAGS | 0x100), (None, CLONE_FLAGS)] {
        let req = CloneSessionRequest {
            selector: Some(Selector::SessionId(1)),
            for_bugreport,
            skip_trace_filter: for_bugreport,
            ..Default::default()
        };
        let (c, id) = ask_clone_with(&mut sim, 2000, req, None);
        let cmds = p.commands(&mut sim);
        let fl = flushes(&cmds);
        assert_eq!(fl.len(), 1);
        assert_eq!(fl[0].flags, Some(flags), "{for_bugreport:?}");
        ack(&mut sim, &p, fl[0].request_id);
        assert_eq!(clone_reply(&mut sim, &c, id).success, Some(true));
    }
}

#[test]
fn the_bugreport_id_clones_the_highest_scored_started_session() {
    let mut sim = Sim::new();
    let mut p = TestProducer::connect(&mut sim, "prod", &[descriptor("ds", false, false)]);
    for score in [5, 9, 0] {
        TestConsumer::enable(
            &mut sim,
            config("ds", 64, |cfg| cfg.bugreport_score = Some(score)),
        );
    }
    p.commands(&mut sim);
    let (c, id) = ask_clone(&mut sim, 2000, Selector::SessionId(BUGREPORT_SESSION_ID));
    let cmds = p.commands(&mut sim);
    let fl = flushes(&cmds);
    assert_eq!(fl.len(), 1);
    assert_eq!(
        fl[0].flags,
        Some(CLONE_FLAGS | 0x100),
        "clone target bugreport"
    );
    ack(&mut sim, &p, fl[0].request_id);
    assert_eq!(clone_reply(&mut sim, &c, id).success, Some(true));
    let packets = c.read(&mut sim);
    assert_eq!(trace_config_in(&packets).bugreport_score, Some(9));
}

#[test]
fn a_ring_buffer_clone_after_wrap_reads_as_the_source_would() {
    let (mut sim, mut p, source, buffer) = running(config("ds", 16, |_| {}));
    // Over 16 KiB of 1000-byte packets: the ring wraps.
    let data: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 1000]).collect();
    let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
    let req = p.write(1, buffer, &refs, true);
    p.commit(&mut sim, req);
    let (cloner, id) = ask_clone(&mut sim, 2000, Selector::SessionId(1));
    let cmds = p.commands(&mut sim);
    ack(&mut sim, &p, flushes(&cmds)[0].request_id);
    assert_eq!(clone_reply(&mut sim, &cloner, id).success, Some(true));
    let cloned = cloner.read(&mut sim);
    let read = source.read(&mut sim);
    let producer_packets = |packets: &[Vec<u8>]| -> Vec<Vec<u8>> {
        packets
            .iter()
            .filter(|p| field(p, 900).is_some())
            .cloned()
            .collect()
    };
    let (from_clone, from_source) = (producer_packets(&cloned), producer_packets(&read));
    assert!(
        from_clone.len() > 5 && from_clone.len() < 40,
        "{}",
        from_clone.len()
    );
    assert_eq!(
        from_clone, from_source,
        "same packets, appendix and loss flags"
    );
    assert_eq!(payloads(&cloned).last(), Some(&data[39]));
    assert!(
        field(&from_clone[0], 42).is_some(),
        "the first packet says data was overwritten"
    );
    let (c, s) = (stats_of(&cloned), source_stats(&mut sim, &source));
    assert!(c.buffer_stats[0].write_wrap_count >= Some(1));
    assert_eq!(
        c.buffer_stats, s.buffer_stats,
        "the same counts, reads included"
    );
}

fn source_stats(sim: &mut Sim, c: &TestConsumer) -> crate::protos::TraceStats {
    let id = c.call(
        sim,
        consumer_port::Request::GetTraceStats(Default::default()),
    );
    let got: crate::protos::GetTraceStatsResponse = sim.reply_ok(c.conn, id);
    got.trace_stats.unwrap()
}

#[test]
fn transfer_on_clone_moves_the_buffer_and_clear_before_clone_empties_it() {
    // Two buffers, "ds" in each: 0 moves on clone, 1 is cleared before it.
    let (mut sim, mut p, source, cmds) = session_with(
        descriptor("ds", false, false),
        config("ds", 64, |cfg| {
            let mut second = cfg.buffers[0].clone();
            cfg.buffers[0].transfer_on_clone = Some(true);
            second.clear_before_clone = Some(true);
            cfg.buffers.push(second);
            let dsc = crate::protos::DataSourceConfig {
                name: Some("ds".into()),
                target_buffer: Some(1),
                ..Default::default()
            };
            cfg.data_sources.push(trace_config::DataSource {
                config: Some(crate::protos::to_raw(&dsc)),
                ..Default::default()
            });
        }),
    );
    let moved = setup_tracing_buffer(&cmds);
    let cleared = moved + 1;
    let req = p.write(1, moved, &[b"moved"], true);
    p.commit(&mut sim, req);
    let req = p.write(2, cleared, &[b"cleared"], true);
    p.commit(&mut sim, req);
    let (cloner, id) = ask_clone(&mut sim, 2000, Selector::SessionId(1));
    // One flush per buffer group, each for the instance writing there.
    let cmds = p.commands(&mut sim);
    let fl = flushes(&cmds);
    assert_eq!(fl.len(), 2);
    assert!(fl.iter().all(|f| f.data_source_ids.len() == 1));
    assert_ne!(fl[0].data_source_ids, fl[1].data_source_ids);
    let last = fl[1].request_id;
    let req = p.write(2, cleared, &[b"after the clear"], true);
    p.commit(&mut sim, req);
    ack(&mut sim, &p, last);
    assert_eq!(clone_reply(&mut sim, &cloner, id).success, Some(true));
    let cloned = cloner.read(&mut sim);
    assert_eq!(
        payloads(&cloned),
        [b"moved".to_vec(), b"after the clear".to_vec()]
    );
    use crate::protos::tracing_service_event::EventType as E;
    let events = service_events(&cloned);
    assert!(events.contains(&E::BufferCloned(0)) && events.contains(&E::BufferCloned(1)));
    let stats = stats_of(&cloned);
    assert_eq!(stats.buffer_stats.len(), 2);
    assert_eq!(
        stats.buffer_stats[1].chunks_written,
        Some(1),
        "cleared, then one"
    );
    // The source's transfer buffer is a new, empty one; the other kept
    // what came after the clear.
    let (packets, stats) = source.stop_and_read(&mut sim);
    assert_eq!(payloads(&packets), [b"after the clear".to_vec()]);
    assert_eq!(stats.buffer_stats[0].chunks_written, Some(0));
}

#[test]
fn a_flush_that_times_out_still_clones_and_says_so() {
    let (mut sim, mut p, _source, _) = running(config("ds", 64, |_| {}));
    let (cloner, id) = ask_clone(&mut sim, 2000, Selector::SessionId(1));
    assert_eq!(flushes(&p.commands(&mut sim)).len(), 1);
    sim.advance(4999);
    assert!(sim.replies(cloner.conn, id).is_empty());
    sim.advance(1);
    assert_eq!(clone_reply(&mut sim, &cloner, id).success, Some(true));
    let cloned = cloner.read(&mut sim);
    assert_eq!(payloads(&cloned), [b"a".to_vec(), b"b".to_vec()]);
    assert_eq!(stats_of(&cloned).final_flush_outcome, Some(2), "FAILED");
}

#[test]
fn a_stopped_session_clones_without_a_flush() {
    let (mut sim, mut p, source, _) = running(config("ds", 64, |_| {}));
    source.call(
        &mut sim,
        consumer_port::Request::DisableTracing(Default::default()),
    );
    p.commands(&mut sim);
    let (cloner, id) = ask_clone(&mut sim, 2000, Selector::SessionId(1));
    assert!(flushes(&p.commands(&mut sim)).is_empty());
    assert_eq!(clone_reply(&mut sim, &cloner, id).success, Some(true));
    let cloned = cloner.read(&mut sim);
    assert_eq!(payloads(&cloned), [b"a".to_vec(), b"b".to_vec()]);
    assert_eq!(stats_of(&cloned).final_flush_outcome, Some(2));
    // A clone of the clone, by its id.
    let (second, id) = ask_clone(&mut sim, 2000, Selector::SessionId(2));
    assert_eq!(clone_reply(&mut sim, &second, id).success, Some(true));
    assert!(
        payloads(&second.read(&mut sim)).is_empty(),
        "the clone was read"
    );
}

#[test]
fn callers_and_sources_that_go_away_mid_clone_leave_nothing_behind() {
    // The caller hangs up before the flush completes.
    let (mut sim, mut p, source, _) = running(config("ds", 64, |_| {}));
    let (cloner, _) = ask_clone(&mut sim, 2000, Selector::SessionId(1));
    let fl = flushes(&p.commands(&mut sim))[0].request_id;
    sim.svc.disconnect(cloner.conn);
    ack(&mut sim, &p, fl);
    sim.advance(10_000);
    assert_eq!(sim.svc.session_states().len(), 1);
    assert_eq!(sim.svc.buffers.len(), 1);
    assert!(sim.svc.sessions[&1].pending_clones.is_empty());
    assert!(sim
        .sent
        .iter()
        .all(|o| !matches!(o, Output::Reply { conn, .. } if *conn == cloner.conn)));

    // The source is freed before the flush completes.
    let (cloner, id) = ask_clone(&mut sim, 2000, Selector::SessionId(1));
    let fl = flushes(&p.commands(&mut sim))[0].request_id;
    source.call(
        &mut sim,
        consumer_port::Request::FreeBuffers(Default::default()),
    );
    let resp = clone_reply(&mut sim, &cloner, id);
    assert_eq!(resp.success, Some(false));
    assert_eq!(resp.error.as_deref(), Some("Original session ended"));
    ack(&mut sim, &p, fl);
    sim.advance(10_000);
    assert!(sim.svc.session_states().is_empty());
    assert!(sim.svc.buffers.is_empty());
    // The caller can clone or trace afterwards.
    let c = cloner.call(
        &mut sim,
        consumer_port::Request::ReadBuffers(Default::default()),
    );
    assert_eq!(sim.replies(cloner.conn, c).len(), 1);
}

#[test]
fn clones_count_against_the_session_and_memory_limits() {
    let (mut sim, mut p, _source, _) = running(config("ds", 256, |_| {}));
    sim.svc.cfg.max_buffer_bytes = 600 * 1024;
    let (first, id) = ask_clone(&mut sim, 2000, Selector::SessionId(1));
    let fl = flushes(&p.commands(&mut sim))[0].request_id;
    // A second clone asked while the first holds nothing yet fits the
    // check at the request, but not the one at the copy.
    let (second, id2) = ask_clone(&mut sim, 2000, Selector::SessionId(1));
    let fl2 = flushes(&p.commands(&mut sim))[0].request_id;
    ack(&mut sim, &p, fl);
    ack(&mut sim, &p, fl2);
    assert_eq!(clone_reply(&mut sim, &first, id).success, Some(true));
    let resp = clone_reply(&mut sim, &second, id2);
    assert_eq!(resp.success, Some(false));
    let e = resp.error.unwrap();
    assert!(
        e.starts_with("cloning needs 262144 B of trace buffers and 524288 B are held")
            && e.contains("limit of 614400 B"),
        "{e}"
    );
    // Refused at the request when it is over already.
    let (third, id) = ask_clone(&mut sim, 2000, Selector::SessionId(1));
    assert!(flushes(&p.commands(&mut sim)).is_empty());
    assert!(clone_reply(&mut sim, &third, id)
        .error
        .unwrap()
        .starts_with("cloning needs"));
    assert_eq!(sim.svc.buffers.len(), 2);

    // Sessions per uid: the source, the clone, and three more.
    sim.svc.cfg.max_buffer_bytes = DEFAULT_MAX_BUFFER_BYTES;
    for _ in 0..3 {
        let (c, id) = ask_clone(&mut sim, 2000, Selector::SessionId(1));
        let fl = flushes(&p.commands(&mut sim))[0].request_id;
        ack(&mut sim, &p, fl);
        assert_eq!(clone_reply(&mut sim, &c, id).success, Some(true));
    }
    let (c, id) = ask_clone(&mut sim, 2000, Selector::SessionId(1));
    assert_eq!(
        clone_reply(&mut sim, &c, id).error.as_deref(),
        Some(CloneError::TooManySessionsForUid(2000).to_string().as_str())
    );
}

#[test]
fn a_write_into_file_clone_copies_the_file_then_writes_the_rest() {
    let (mut sim, mut p, _c, file, buffer) = file_session(|_| {});
    let req = p.write(1, buffer, &[b"early"], true);
    p.commit(&mut sim, req);
    sim.advance(100);
    let (written, _) = written_trace(&file);
    assert!(!written.is_empty());
    let req = p.write(2, buffer, &[b"late"], true);
    p.commit(&mut sim, req);
    p.commands(&mut sim);
    // Without a descriptor: refused.
    let req = CloneSessionRequest {
        selector: Some(Selector::SessionId(1)),
        ..Default::default()
    };
    let (c, id) = ask_clone_with(&mut sim, 2000, req.clone(), None);
    assert_eq!(
        clone_reply(&mut sim, &c, id).error.as_deref(),
        Some(
            "Failed to clone 'write_into_file' session: a file descriptor is required to \
             copy existing file"
        )
    );
    let out = rustix::fs::memfd_create("clone", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    let (c, id) = ask_clone_with(&mut sim, 2000, req, Some(out.try_clone().unwrap()));
    let fl = flushes(&p.commands(&mut sim))[0].request_id;
    ack(&mut sim, &p, fl);
    let resp = clone_reply(&mut sim, &c, id);
    assert_eq!(resp.success, Some(true), "{resp:?}");
    assert_eq!(resp.was_write_into_file, Some(true));
    let (bytes, trace) = written_trace(&out);
    assert!(bytes.starts_with(&written), "the source's file first");
    let raw: Vec<Vec<u8>> = fields(&bytes)
        .into_iter()
        .map(|(_, v)| v.unwrap_err())
        .collect();
    assert_eq!(raw.len(), trace.packet.len());
    assert_eq!(payloads(&raw), [b"early".to_vec(), b"late".to_vec()]);
    // ReadBuffers of a clone written to a file: one empty reply.
    assert!(c.read(&mut sim).is_empty());
}

/// A clone asked into the session's own file (another descriptor of the
/// same file, as `record --clone -o` that file sends) is refused before
/// anything is written: the file holds what it held, and the session
/// writes on into it. A clone into another file still works after it.
#[test]
fn a_clone_into_the_sessions_own_file_is_refused_and_leaves_it_alone() {
    let (mut sim, mut p, _c, file, buffer) = file_session(|_| {});
    let req = p.write(1, buffer, &[b"early"], true);
    p.commit(&mut sim, req);
    sim.advance(100);
    let (before, _) = written_trace(&file);
    assert!(!before.is_empty());
    let req = CloneSessionRequest {
        selector: Some(Selector::SessionId(1)),
        ..Default::default()
    };
    // The same file, opened anew: the same device and inode.
    let same: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&file)
        ))
        .unwrap()
        .into();
    let (c, id) = ask_clone_with(&mut sim, 2000, req.clone(), Some(same));
    assert_eq!(
        clone_reply(&mut sim, &c, id).error.as_deref(),
        Some(CloneError::OutputIsSessionFile.to_string().as_str())
    );
    assert!(flushes(&p.commands(&mut sim)).is_empty(), "no clone began");
    assert_eq!(written_trace(&file).0, before, "the file is as it was");
    let req2 = p.write(2, buffer, &[b"late"], true);
    p.commit(&mut sim, req2);
    sim.advance(100);
    let (after, _) = written_trace(&file);
    assert!(
        after.len() > before.len() && after.starts_with(&before),
        "the session writes on"
    );
    let out = rustix::fs::memfd_create("clone", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    let (c, id) = ask_clone_with(&mut sim, 2000, req, Some(out.try_clone().unwrap()));
    let fl = flushes(&p.commands(&mut sim))[0].request_id;
    ack(&mut sim, &p, fl);
    assert_eq!(clone_reply(&mut sim, &c, id).success, Some(true));
    assert!(written_trace(&out).0.starts_with(&after));
}

#[test]
fn a_clone_carries_its_trigger_and_the_triggers_received() {
    let (mut sim, mut p, source, cmds) = session_with(
        descriptor("ds", false, false),
        config("ds", 64, |cfg| {
            cfg.trigger_config = Some(trace_config::TriggerConfig {
                trigger_mode: Some(2),
                trigger_timeout_ms: Some(60_000),
                triggers: vec![trace_config::trigger_config::Trigger {
                    name: Some("seen".into()),
                    stop_delay_ms: Some(30_000),
                    ..Default::default()
                }],
                ..Default::default()
            })
        }),
    );
    let buffer = setup_tracing_buffer(&cmds);
    let req = p.write(1, buffer, &[b"a"], true);
    p.commit(&mut sim, req);
    let areq = crate::protos::ActivateTriggersRequest {
        trigger_names: vec!["seen".into()],
    };
    let aid = p.call(&mut sim, producer_port::Request::ActivateTriggers(areq));
    let _: crate::protos::ActivateTriggersResponse = sim.reply_ok(p.conn, aid);
    let req = CloneSessionRequest {
        selector: Some(Selector::SessionId(1)),
        clone_trigger_name: Some("snap-now".into()),
        clone_trigger_producer_name: Some("other".into()),
        clone_trigger_trusted_producer_uid: Some(1234),
        clone_trigger_boot_time_ns: Some(777),
        clone_trigger_delay_ms: Some(5),
        ..Default::default()
    };
    let cloned = flushed_clone(&mut sim, &mut p, req);
    let snap: Vec<crate::protos::TracePacket> = cloned
        .iter()
        .filter(|p| field(p, 113).is_some())
        .map(|p| crate::protos::TracePacket::decode(&p[..]).unwrap())
        .collect();
    assert_eq!(snap.len(), 1);
    assert_eq!(snap[0].timestamp, Some(777));
    let t = field(
        &cloned.iter().find(|p| field(p, 113).is_some()).unwrap()[..],
        113,
    )
    .unwrap()
    .unwrap_err();
    assert_eq!(
        fields(&t),
        [
            (1, Err(b"snap-now".to_vec())),
            (2, Err(b"other".to_vec())),
            (3, Ok(1234)),
            (4, Ok(5))
        ]
    );
    let moved: Vec<&Vec<u8>> = cloned.iter().filter(|p| field(p, 46).is_some()).collect();
    assert_eq!(moved.len(), 1, "the received trigger went with the clone");
    // As upstream orders them: the clone's trigger right before those
    // received.
    let at = |n: u32| cloned.iter().position(|p| field(p, n).is_some());
    assert_eq!(at(113).map(|i| i + 1), at(46));
    assert_eq!(payloads(&cloned), [b"a".to_vec()]);
    // The source is left without triggers: like upstream's, it reads as
    // still waiting for one (no data at all) until another comes.
    assert!(source.read(&mut sim).is_empty());
    let aid = p.call(
        &mut sim,
        producer_port::Request::ActivateTriggers(crate::protos::ActivateTriggersRequest {
            trigger_names: vec!["seen".into()],
        }),
    );
    let _: crate::protos::ActivateTriggersResponse = sim.reply_ok(p.conn, aid);
    let packets = source.read(&mut sim);
    assert_eq!(packets.iter().filter(|p| field(p, 46).is_some()).count(), 1);
    assert!(packets.iter().all(|p| field(p, 113).is_none()));
    // A trigger the source had emitted goes with the next clone too.
    let (c, id) = ask_clone(&mut sim, 2000, Selector::SessionId(1));
    let fl = flushes(&p.commands(&mut sim))[0].request_id;
    ack(&mut sim, &p, fl);
    assert_eq!(clone_reply(&mut sim, &c, id).success, Some(true));
    let cloned = c.read(&mut sim);
    assert_eq!(cloned.iter().filter(|p| field(p, 46).is_some()).count(), 1);
    assert!(
        cloned.iter().all(|p| field(p, 113).is_none()),
        "no clone trigger asked"
    );
}

/// `disable_trace_config` leaves the clone's trigger out, as it does the
/// triggers received (upstream emits both only without it).
#[test]
fn disable_trace_config_leaves_the_clone_trigger_out() {
    let (mut sim, mut p, _source, cmds) = session_with(
        descriptor("ds", false, false),
        config("ds", 64, |cfg| {
            cfg.builtin_data_sources = Some(trace_config::BuiltinDataSource {
                disable_trace_config: Some(true),
                ..Default::default()
            });
        }),
    );
    let buffer = setup_tracing_buffer(&cmds);
    let req = p.write(1, buffer, &[b"a"], true);
    p.commit(&mut sim, req);
    let req = CloneSessionRequest {
        selector: Some(Selector::SessionId(1)),
        clone_trigger_name: Some("snap-now".into()),
        ..Default::default()
    };
    let cloned = flushed_clone(&mut sim, &mut p, req);
    assert_eq!(payloads(&cloned), [b"a".to_vec()]);
    for n in [33, 113] {
        assert!(cloned.iter().all(|p| field(p, n).is_none()), "field {n}");
    }
}

/// A clone in progress holds its session's place: EnableTracing counts it
/// (the per-uid limit here), so clones finishing later cannot take the
/// service over its limits.
#[test]
fn clones_in_progress_count_against_new_sessions() {
    let (mut sim, mut p, _source, _) = running(config("ds", 64, |_| {}));
    let mut pending = Vec::new();
    for _ in 0..MAX_SESSIONS_PER_UID - 1 {
        let (c, id) = ask_clone(&mut sim, 2000, Selector::SessionId(1));
        let fl = flushes(&p.commands(&mut sim))[0].request_id;
        pending.push((c, id, fl));
    }
    assert_eq!(
        sim.svc.sessions.len(),
        1,
        "the clones are still in progress"
    );
    let refused = TestConsumer::enable_with(&mut sim, config("ds", 64, |_| {}), None, 2000);
    assert_eq!(
        refused.enabled_reply(&mut sim).and_then(|r| r.error),
        Some(ConfigError::TooManySessionsForUid(2000).to_string())
    );
    for (c, id, fl) in pending {
        ack(&mut sim, &p, fl);
        assert_eq!(clone_reply(&mut sim, &c, id).success, Some(true));
    }
    assert_eq!(sim.svc.sessions.len(), MAX_SESSIONS_PER_UID);
}
