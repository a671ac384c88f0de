//! Golden tests against frames recorded from the real Perfetto v59 (see
//! `tests/golden/README.md`): every frame decodes with this crate's messages
//! to what the capture's summary says, re-encodes to the same bytes, and the
//! key frames are rebuilt from typed messages byte for byte.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use prost::Message;
use shmtrace_ipc::frame::{
    bind_service_frame, bind_service_reply_frame, encode_frame, invoke_method_frame, FrameDecoder,
};
use shmtrace_ipc::host::{HostConnection, ServiceTable};
use shmtrace_ipc::protos::{
    self, canonical, commit_data_request::ChunksToMove, consumer_port, ds_config,
    get_async_command_response as cmd, ipc_frame::Msg, observable_events, producer_port,
    read_buffers_response::Slice, trace_config, CommitDataRequest, ConsumerPort, DataSourceConfig,
    DataSourceDescriptor, EnableTracingRequest, GetAsyncCommandResponse,
    InitializeConnectionRequest, InitializeConnectionResponse, IpcFrame, ObserveEventsResponse,
    ProducerPort, ReadBuffersResponse, RegisterDataSourceRequest, TraceConfig, TrackEventCategory,
    TrackEventConfig, TrackEventDescriptor,
};
use shmtrace_ipc::rpc::{Method, Service, ServiceRequest};

#[derive(Debug)]
struct Golden {
    dir: String,
    idx: u64,
    len: usize,
    bytes: Vec<u8>,
    summary: String,
    truncated: bool,
    fds: usize,
}

fn load(path: &str) -> Vec<Golden> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(path);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let hex = v["hex"].as_str().unwrap();
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            Golden {
                dir: v["dir"].as_str().unwrap().to_owned(),
                idx: v["idx"].as_u64().unwrap(),
                len: v["len"].as_u64().unwrap() as usize,
                bytes,
                summary: v["summary"].as_str().unwrap().to_owned(),
                truncated: v
                    .get("truncated")
                    .and_then(|t| t.as_bool())
                    .unwrap_or(false),
                fds: v["fds"].as_array().unwrap().len(),
            }
        })
        .collect()
}

fn decode_one(bytes: &[u8]) -> IpcFrame {
    let mut dec = FrameDecoder::new();
    dec.push(bytes, None);
    let frame = dec.next_frame().unwrap().expect("a whole frame");
    assert_eq!(dec.buffered(), 0, "exactly one frame");
    frame.frame
}

fn encode(frame: &IpcFrame) -> Vec<u8> {
    let mut out = Vec::new();
    encode_frame(frame, &mut out).unwrap();
    out
}

/// Rebuilds the capture proxy's one-line summary of each frame from the
/// decoded frame, tracking bindings and outstanding calls like the proxy.
#[derive(Default)]
struct Summarizer {
    services: HashMap<u32, (String, HashMap<u32, String>)>,
    calls: HashMap<u64, (u32, u32)>,
}

impl Summarizer {
    /// The summary with names, and with the `svcN.mM` form the proxy uses
    /// when it did not resolve them.
    fn summarize(&mut self, frame: &IpcFrame) -> [String; 2] {
        let req = frame.request_id.unwrap();
        let py = |b: Option<bool>| if b.unwrap_or(false) { "True" } else { "False" };
        let named = |s: &Self, svc: u32, m: u32| -> [String; 2] {
            let name = s
                .services
                .get(&svc)
                .map(|(n, methods)| format!("{n}.{}", methods.get(&m).cloned().unwrap_or_default()))
                .unwrap_or_default();
            [name, format!("svc{svc}.m{m}")]
        };
        let both = |f: &dyn Fn(&str) -> String, names: [String; 2]| [f(&names[0]), f(&names[1])];
        match frame.msg.as_ref().unwrap() {
            Msg::MsgBindService(b) => {
                let s = format!(
                    "req={req} BindService({})",
                    b.service_name.as_deref().unwrap()
                );
                [s.clone(), s]
            }
            Msg::MsgBindServiceReply(r) => {
                let methods: Vec<(u32, String)> = r
                    .methods
                    .iter()
                    .map(|m| (m.id.unwrap(), m.name.clone().unwrap()))
                    .collect();
                let listed: Vec<String> = methods
                    .iter()
                    .map(|(id, n)| format!("{id}: '{n}'"))
                    .collect();
                // The bound name comes from the request; both captures bind one port.
                let name = if methods.iter().any(|(_, n)| n == "InitializeConnection") {
                    ProducerPort::NAME
                } else {
                    ConsumerPort::NAME
                };
                self.services.insert(
                    r.service_id.unwrap(),
                    (name.to_owned(), methods.into_iter().collect()),
                );
                let s = format!(
                    "req={req} BindServiceReply(success={} service_id={} {name} methods={{{}}})",
                    py(r.success),
                    r.service_id.unwrap(),
                    listed.join(", ")
                );
                [s.clone(), s]
            }
            Msg::MsgInvokeMethod(m) => {
                let (svc, id) = (m.service_id.unwrap(), m.method_id.unwrap());
                self.calls.insert(req, (svc, id));
                let args = m.args_proto.as_ref().unwrap().len();
                let drop = if m.drop_reply.unwrap() {
                    " drop_reply"
                } else {
                    ""
                };
                both(
                    &|n| format!("req={req} InvokeMethod({n} args={args}B{drop})"),
                    named(self, svc, id),
                )
            }
            Msg::MsgInvokeMethodReply(r) => {
                let (svc, id) = self.calls[&req];
                let reply = r.reply_proto.as_ref().map_or(0, Bytes::len);
                both(
                    &|n| {
                        format!(
                            "req={req} InvokeMethodReply({n} success={} has_more={} reply={reply}B)",
                            py(r.success),
                            py(r.has_more)
                        )
                    },
                    named(self, svc, id),
                )
            }
            other => panic!("unexpected frame {other:?}"),
        }
    }
}

fn check_capture(path: &str) -> usize {
    let frames = load(path);
    let mut summarizer = Summarizer::default();
    let mut checked = 0;
    for g in &frames {
        assert_eq!(
            g.bytes.len(),
            if g.truncated { 512 } else { g.len },
            "{} {}",
            g.dir,
            g.idx
        );
        assert_eq!(
            u32::from_le_bytes(g.bytes[..4].try_into().unwrap()) as usize + 4,
            g.len
        );
        if g.truncated {
            // Only the head of the frame was kept: check what it announces.
            let mut dec = FrameDecoder::new();
            dec.push(&g.bytes, None);
            assert!(dec.next_frame().unwrap().is_none());
            assert!(
                g.summary
                    .contains("InvokeMethodReply(ConsumerPort.ReadBuffers"),
                "{}",
                g.summary
            );
            continue;
        }
        let frame = decode_one(&g.bytes);
        let summaries = summarizer.summarize(&frame);
        assert!(
            summaries.contains(&g.summary),
            "{path} {} {}:\n  capture: {}\n  ours:    {}",
            g.dir,
            g.idx,
            g.summary,
            summaries[0]
        );
        assert_eq!(
            encode(&frame),
            g.bytes,
            "{path} {} {}: {}",
            g.dir,
            g.idx,
            g.summary
        );
        checked += 1;
    }
    checked
}

#[test]
fn every_small_frame_decodes_to_its_summary_and_reencodes_byte_for_byte() {
    assert_eq!(check_capture("small/producer_service.log.jsonl"), 19);
    assert_eq!(check_capture("small/consumer_service.log.jsonl"), 11);
}

#[test]
fn every_whole_large_frame_decodes_to_its_summary_and_reencodes_byte_for_byte() {
    assert_eq!(check_capture("large/producer_service.log.jsonl"), 37);
    assert_eq!(check_capture("large/consumer_service.log.jsonl"), 14);
}

fn frames(path: &str) -> Vec<(Golden, IpcFrame)> {
    load(path)
        .into_iter()
        .filter(|g| !g.truncated)
        .map(|g| {
            let f = decode_one(&g.bytes);
            (g, f)
        })
        .collect()
}

fn find<'a>(
    frames: &'a [(Golden, IpcFrame)],
    dir: &str,
    summary_part: &str,
) -> Vec<&'a (Golden, IpcFrame)> {
    frames
        .iter()
        .filter(|(g, _)| g.dir == dir && g.summary.contains(summary_part))
        // Method names also appear in the method table of BindServiceReply.
        .filter(|(g, _)| summary_part.contains("Bind") || !g.summary.contains("BindServiceReply"))
        .collect()
}

fn args(frame: &IpcFrame) -> Bytes {
    match frame.msg.as_ref().unwrap() {
        Msg::MsgInvokeMethod(m) => m.args_proto.clone().unwrap(),
        other => panic!("not an invocation: {other:?}"),
    }
}

fn reply(frame: &IpcFrame) -> Bytes {
    match frame.msg.as_ref().unwrap() {
        Msg::MsgInvokeMethodReply(r) => r.reply_proto.clone().unwrap(),
        other => panic!("not a reply: {other:?}"),
    }
}

#[test]
fn producer_session_decodes_to_the_expected_fields() {
    let f = frames("small/producer_service.log.jsonl");

    let init =
        InitializeConnectionRequest::decode(args(&find(&f, "c2s", "InitializeConnection")[0].1))
            .unwrap();
    assert_eq!(
        init.producer_name.as_deref(),
        Some("/example/perfetto/reference/ref-producer")
    );
    assert_eq!(init.shared_memory_page_size_hint_bytes, Some(0));
    assert_eq!(init.shared_memory_size_hint_bytes, Some(0));
    assert_eq!(init.smb_scraping_mode, Some(1));
    assert!(init
        .sdk_version
        .as_deref()
        .unwrap()
        .starts_with("Perfetto v59.0-09c740d78"));
    assert_eq!(init.supported_protocol_abi_versions, Some(3));
    let init_reply =
        InitializeConnectionResponse::decode(reply(&find(&f, "s2c", "InitializeConnection")[0].1))
            .unwrap();
    assert_eq!(
        init_reply,
        InitializeConnectionResponse {
            using_shmem_provided_by_producer: Some(false),
            direct_smb_patching_supported: Some(true),
            use_shmem_emulation: Some(false),
            protocol_abi_versions: Some(3),
        }
    );

    let reg = RegisterDataSourceRequest::decode(args(&find(&f, "c2s", "RegisterDataSource")[0].1))
        .unwrap();
    let desc = reg.data_source_descriptor.unwrap();
    assert_eq!(desc.name.as_deref(), Some("track_event"));
    assert_ne!(desc.id.unwrap_or(0), 0);
    assert_eq!(
        (
            desc.will_notify_on_stop,
            desc.will_notify_on_start,
            desc.handles_incremental_state_clear,
            desc.no_flush
        ),
        (Some(true), Some(true), Some(true), Some(true))
    );
    let te = TrackEventDescriptor::decode(desc.track_event_descriptor.unwrap()).unwrap();
    let cats: Vec<&str> = te
        .available_categories
        .iter()
        .map(|c| c.name.as_deref().unwrap())
        .collect();
    assert_eq!(cats, ["oracle", "oracle.net", "oracle.slow"]);
    assert_eq!(te.available_categories[2].tags, ["slow"]);

    let cmds: Vec<(usize, GetAsyncCommandResponse)> = find(&f, "s2c", "GetAsyncCommand")
        .iter()
        .map(|(g, fr)| (g.fds, GetAsyncCommandResponse::decode(reply(fr)).unwrap()))
        .collect();
    assert_eq!(cmds.len(), 4);
    assert_eq!(
        cmds[0],
        (
            1,
            GetAsyncCommandResponse {
                cmd: Some(cmd::Cmd::SetupTracing(cmd::SetupTracing {
                    shared_buffer_page_size_kb: Some(4),
                    shm_key_windows: None
                }))
            }
        ),
        "SetupTracing carries the shared memory fd"
    );
    let (setup, start) = match (&cmds[1].1.cmd, &cmds[2].1.cmd) {
        (Some(cmd::Cmd::SetupDataSource(s)), Some(cmd::Cmd::StartDataSource(t))) => (s, t),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        (setup.new_instance_id, start.new_instance_id),
        (Some(1), Some(1))
    );
    assert_eq!(setup.config, start.config);
    let config: DataSourceConfig = protos::from_raw(setup.config.as_ref()).unwrap();
    assert_eq!(config.name.as_deref(), Some("track_event"));
    assert_eq!(
        (
            config.target_buffer,
            config.trace_duration_ms,
            config.stop_timeout_ms,
            config.tracing_session_id
        ),
        (Some(1), Some(2000), Some(5000), Some(1))
    );
    assert_eq!(
        (config.enable_extra_guardrails, config.session_initiator),
        (Some(false), Some(0))
    );
    let te: TrackEventConfig = protos::from_raw(config.track_event_config.as_ref()).unwrap();
    assert_eq!(te.enabled_categories, ["*"]);
    assert_eq!(
        cmds[3].1.cmd,
        Some(cmd::Cmd::StopDataSource(cmd::StopDataSource {
            instance_id: Some(1)
        }))
    );

    let writers: Vec<producer_port::Request> = find(&f, "c2s", "RegisterTraceWriter")
        .iter()
        .map(|(_, fr)| producer_port::Request::decode(6, args(fr)).unwrap())
        .collect();
    assert_eq!(writers.len(), 3);
    for (i, w) in writers.iter().enumerate() {
        match w {
            producer_port::Request::RegisterTraceWriter(r) => {
                assert_eq!(
                    (r.trace_writer_id, r.target_buffer),
                    (Some(i as u32 + 1), Some(1))
                )
            }
            other => panic!("{other:?}"),
        }
    }
    let commit = CommitDataRequest::decode(args(&find(&f, "c2s", "CommitData")[0].1)).unwrap();
    let moved: Vec<(u32, u32, u32)> = commit
        .chunks_to_move
        .iter()
        .map(|c| (c.page.unwrap(), c.chunk.unwrap(), c.target_buffer.unwrap()))
        .collect();
    assert_eq!(moved, [(1, 0, 1), (2, 0, 1), (0, 0, 1)]);
    assert!(commit.chunks_to_patch.is_empty() && commit.flush_request_id.is_none());
}

#[test]
fn large_capture_commits_with_patches_decode() {
    let f = frames("large/producer_service.log.jsonl");
    let commits: Vec<CommitDataRequest> = find(&f, "c2s", "CommitData")
        .iter()
        .map(|(_, fr)| CommitDataRequest::decode(args(fr)).unwrap())
        .collect();
    assert_eq!(commits.len(), 22);
    let patches: usize = commits
        .iter()
        .flat_map(|c| &c.chunks_to_patch)
        .map(|p| p.patches.len())
        .sum();
    assert!(patches > 0, "the large capture has out-of-band patches");
    for p in commits
        .iter()
        .flat_map(|c| &c.chunks_to_patch)
        .flat_map(|c| &c.patches)
    {
        assert_eq!(p.data.as_ref().unwrap().len(), 4, "a patch is 4 bytes");
    }
}

#[test]
fn consumer_session_decodes_and_reassembles_the_trace() {
    let f = frames("small/consumer_service.log.jsonl");

    match consumer_port::Request::decode(11, args(&find(&f, "c2s", "ObserveEvents")[0].1)).unwrap()
    {
        consumer_port::Request::ObserveEvents(r) => assert_eq!(r.events_to_observe, [1, 2]),
        other => panic!("{other:?}"),
    }
    let events: Vec<ObserveEventsResponse> = find(&f, "s2c", "ObserveEvents")
        .iter()
        .map(|(_, fr)| ObserveEventsResponse::decode(reply(fr)).unwrap())
        .collect();
    let states: Vec<i32> = events
        .iter()
        .flat_map(|e| &e.events.as_ref().unwrap().instance_state_changes)
        .map(|c| c.state.unwrap())
        .collect();
    let stopped = observable_events::DataSourceInstanceState::Stopped as i32;
    let started = observable_events::DataSourceInstanceState::Started as i32;
    assert_eq!(states, [stopped, started, stopped]);
    assert_eq!(
        events[1].events.as_ref().unwrap().instance_state_changes[0]
            .data_source_name
            .as_deref(),
        Some("track_event")
    );

    let enable =
        EnableTracingRequest::decode(args(&find(&f, "c2s", "EnableTracing")[0].1)).unwrap();
    let config: TraceConfig = protos::from_raw(enable.trace_config.as_ref()).unwrap();
    assert_eq!(config.duration_ms, Some(2000));
    assert_eq!(config.buffers.len(), 1);
    assert_eq!(config.buffers[0].size_kb, Some(16384));
    assert_eq!(
        config.buffers[0].fill_policy,
        Some(trace_config::buffer_config::FillPolicy::Discard as i32)
    );
    let ds: DataSourceConfig = protos::from_raw(config.data_sources[0].config.as_ref()).unwrap();
    assert_eq!(
        (ds.name.as_deref(), ds.target_buffer),
        (Some("track_event"), Some(0))
    );
    let enabled =
        protos::EnableTracingResponse::decode(reply(&find(&f, "s2c", "EnableTracing")[0].1))
            .unwrap();
    assert_eq!(
        enabled.state,
        Some(protos::enable_tracing_response::State::Disabled(true))
    );

    // The ReadBuffers reply reassembles into the very trace file the
    // consumer wrote.
    let read = ReadBuffersResponse::decode(reply(&find(&f, "s2c", "ReadBuffers")[0].1)).unwrap();
    let mut trace = Vec::new();
    let mut packet = Vec::new();
    let mut packets = 0;
    for slice in &read.slices {
        packet.extend_from_slice(slice.data.as_ref().unwrap());
        if slice.last_slice_for_packet == Some(true) {
            trace.push(0x0a);
            shmtrace_ipc::protos::wire::put_varint(&mut trace, packet.len() as u64);
            trace.append(&mut packet);
            packets += 1;
        }
    }
    assert_eq!(packets, 228);
    let golden = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden/small/capture_run_trace.perfetto-trace"),
    )
    .unwrap();
    assert_eq!(trace, golden);
    let decoded = protos::Trace::decode(&trace[..]).unwrap();
    assert_eq!(decoded.packet.len(), 228);
    let configs: Vec<&Bytes> = decoded
        .packet
        .iter()
        .filter_map(|p| match &p.data {
            Some(protos::trace_packet::Data::TraceConfig(c)) => Some(c),
            _ => None,
        })
        .collect();
    assert_eq!(
        configs,
        [enable.trace_config.as_ref().unwrap()],
        "the trace_config packet is the consumer's bytes"
    );
}

#[test]
fn the_service_rewrite_of_the_consumer_config_matches_perfettos_setup_data_source() {
    let consumer = frames("small/consumer_service.log.jsonl");
    let producer = frames("small/producer_service.log.jsonl");
    let enable =
        EnableTracingRequest::decode(args(&find(&consumer, "c2s", "EnableTracing")[0].1)).unwrap();
    let config: TraceConfig = protos::from_raw(enable.trace_config.as_ref()).unwrap();
    let raw = config.data_sources[0].config.as_ref().unwrap();
    let rewritten = ds_config::rewrite(
        raw,
        &ds_config::ServiceFields {
            target_buffer: 1,
            trace_duration_ms: config.duration_ms.unwrap(),
            stop_timeout_ms: 5000,
            tracing_session_id: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let setup =
        GetAsyncCommandResponse::decode(reply(&find(&producer, "s2c", "GetAsyncCommand")[1].1))
            .unwrap();
    match setup.cmd {
        Some(cmd::Cmd::SetupDataSource(s)) => assert_eq!(s.config.unwrap(), rewritten),
        other => panic!("{other:?}"),
    }
}

/// The golden bytes of the frame whose summary contains `part`.
fn golden(frames: &[(Golden, IpcFrame)], dir: &str, part: &str, nth: usize) -> Vec<u8> {
    find(frames, dir, part)[nth].0.bytes.clone()
}

fn invoke<M: Method>(request_id: u64, req: &M::Request, drop_reply: bool) -> Vec<u8> {
    encode(&invoke_method_frame(
        request_id,
        1,
        M::ID,
        canonical::encode(req).into(),
        drop_reply,
    ))
}

#[test]
fn producer_frames_built_from_typed_messages_match_perfetto_byte_for_byte() {
    let f = frames("small/producer_service.log.jsonl");
    assert_eq!(
        encode(&bind_service_frame(1, "ProducerPort")),
        golden(&f, "c2s", "BindService(", 0)
    );
    assert_eq!(
        encode(&bind_service_reply_frame(
            1,
            Some((1, ProducerPort::METHODS))
        )),
        golden(&f, "s2c", "BindServiceReply", 0)
    );

    let sdk = "Perfetto v59.0-09c740d78 (09c740d78f1eca598fddcf5e0c5e223f4d1bb7cb)";
    let init = InitializeConnectionRequest {
        shared_memory_page_size_hint_bytes: Some(0),
        shared_memory_size_hint_bytes: Some(0),
        producer_name: Some("/example/perfetto/reference/ref-producer".into()),
        smb_scraping_mode: Some(1),
        sdk_version: Some(sdk.into()),
        supported_protocol_abi_versions: Some(3),
        ..Default::default()
    };
    assert_eq!(
        invoke::<producer_port::InitializeConnection>(2, &init, false),
        golden(&f, "c2s", "InitializeConnection", 0)
    );

    let id = find(&f, "c2s", "RegisterDataSource")
        .first()
        .map(|(_, fr)| {
            RegisterDataSourceRequest::decode(args(fr))
                .unwrap()
                .data_source_descriptor
                .unwrap()
                .id
        })
        .unwrap();
    let category = |name: &str, description: &str, tags: &[&str]| TrackEventCategory {
        name: Some(name.into()),
        description: Some(description.into()),
        tags: tags.iter().map(|t| t.to_string()).collect(),
    };
    let descriptor = TrackEventDescriptor {
        available_categories: vec![
            category("oracle", "Oracle main category", &[]),
            category("oracle.net", "Oracle flow-terminating events", &[]),
            category("oracle.slow", "Oracle slow category", &["slow"]),
        ],
    };
    let register = RegisterDataSourceRequest {
        data_source_descriptor: Some(DataSourceDescriptor {
            name: Some("track_event".into()),
            id,
            will_notify_on_stop: Some(true),
            will_notify_on_start: Some(true),
            handles_incremental_state_clear: Some(true),
            no_flush: Some(true),
            track_event_descriptor: Some(protos::to_raw(&descriptor)),
            ..Default::default()
        }),
    };
    assert_eq!(
        invoke::<producer_port::RegisterDataSource>(4, &register, false),
        golden(&f, "c2s", "RegisterDataSource", 0)
    );

    let commit = CommitDataRequest {
        chunks_to_move: [(1, 0), (2, 0), (0, 0)]
            .iter()
            .map(|&(page, chunk)| ChunksToMove {
                page: Some(page),
                chunk: Some(chunk),
                target_buffer: Some(1),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    assert_eq!(
        invoke::<producer_port::CommitData>(9, &commit, true),
        golden(&f, "c2s", "CommitData", 0)
    );
    assert_eq!(
        invoke::<producer_port::GetAsyncCommand>(3, &Default::default(), false),
        golden(&f, "c2s", "GetAsyncCommand", 0)
    );
}

#[test]
fn service_replies_sent_through_the_host_match_perfetto_byte_for_byte() {
    let f = frames("small/producer_service.log.jsonl");
    let mut host = HostConnection::new(Arc::new(ServiceTable::from(ProducerPort)), None);
    // The producer's requests, replayed into our host.
    for (g, _) in f.iter().filter(|(g, _)| g.dir == "c2s") {
        host.decoder().push(&g.bytes, None);
    }
    let mut calls = HashMap::new();
    while let Some(call) = host.poll_call().unwrap() {
        calls.insert(call.method.name, call.reply);
    }
    let sent = |host: &mut HostConnection<producer_port::Request>| {
        let mut out = Vec::new();
        while let Some(seg) = host.out().next_send() {
            out.extend_from_slice(seg.bytes);
            let n = seg.bytes.len();
            host.out().advance(n);
        }
        out
    };
    assert_eq!(sent(&mut host), golden(&f, "s2c", "BindServiceReply", 0));

    host.resolve(
        calls["InitializeConnection"].clone(),
        &InitializeConnectionResponse {
            using_shmem_provided_by_producer: Some(false),
            direct_smb_patching_supported: Some(true),
            use_shmem_emulation: Some(false),
            protocol_abi_versions: Some(3),
        },
    )
    .unwrap();
    assert_eq!(
        sent(&mut host),
        golden(&f, "s2c", "InitializeConnection", 0)
    );
    host.resolve(
        calls["RegisterDataSource"].clone(),
        &protos::RegisterDataSourceResponse::default(),
    )
    .unwrap();
    assert_eq!(sent(&mut host), golden(&f, "s2c", "RegisterDataSource", 0));

    let stream = &calls["GetAsyncCommand"];
    let setup_tracing = GetAsyncCommandResponse {
        cmd: Some(cmd::Cmd::SetupTracing(cmd::SetupTracing {
            shared_buffer_page_size_kb: Some(4),
            shm_key_windows: None,
        })),
    };
    host.reply(stream, Ok(&setup_tracing), true, None).unwrap();
    assert_eq!(sent(&mut host), golden(&f, "s2c", "GetAsyncCommand", 0));

    let consumer_config = DataSourceConfig {
        name: Some("track_event".into()),
        target_buffer: Some(0),
        track_event_config: Some(protos::to_raw(&TrackEventConfig {
            enabled_categories: vec!["*".into()],
            ..Default::default()
        })),
        ..Default::default()
    };
    let config = ds_config::rewrite(
        &protos::to_raw(&consumer_config),
        &ds_config::ServiceFields {
            target_buffer: 1,
            trace_duration_ms: 2000,
            stop_timeout_ms: 5000,
            tracing_session_id: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let setup = GetAsyncCommandResponse {
        cmd: Some(cmd::Cmd::SetupDataSource(cmd::SetupDataSource {
            new_instance_id: Some(1),
            config: Some(config.clone()),
        })),
    };
    host.reply(stream, Ok(&setup), true, None).unwrap();
    assert_eq!(sent(&mut host), golden(&f, "s2c", "GetAsyncCommand", 1));
    let start = GetAsyncCommandResponse {
        cmd: Some(cmd::Cmd::StartDataSource(cmd::StartDataSource {
            new_instance_id: Some(1),
            config: Some(config),
        })),
    };
    host.reply(stream, Ok(&start), true, None).unwrap();
    assert_eq!(sent(&mut host), golden(&f, "s2c", "GetAsyncCommand", 2));
    let stop = GetAsyncCommandResponse {
        cmd: Some(cmd::Cmd::StopDataSource(cmd::StopDataSource {
            instance_id: Some(1),
        })),
    };
    host.reply(stream, Ok(&stop), true, None).unwrap();
    assert_eq!(sent(&mut host), golden(&f, "s2c", "GetAsyncCommand", 3));
}

#[test]
fn consumer_frames_built_from_typed_messages_match_perfetto_byte_for_byte() {
    let f = frames("small/consumer_service.log.jsonl");
    assert_eq!(
        encode(&bind_service_frame(1, "ConsumerPort")),
        golden(&f, "c2s", "BindService(", 0)
    );
    assert_eq!(
        encode(&bind_service_reply_frame(
            1,
            Some((1, ConsumerPort::METHODS))
        )),
        golden(&f, "s2c", "BindServiceReply", 0)
    );

    let ds = DataSourceConfig {
        name: Some("track_event".into()),
        target_buffer: Some(0),
        track_event_config: Some(protos::to_raw(&TrackEventConfig {
            enabled_categories: vec!["*".into()],
            ..Default::default()
        })),
        ..Default::default()
    };
    let config = TraceConfig {
        buffers: vec![trace_config::BufferConfig {
            size_kb: Some(16384),
            fill_policy: Some(trace_config::buffer_config::FillPolicy::Discard as i32),
            ..Default::default()
        }],
        data_sources: vec![trace_config::DataSource {
            config: Some(protos::to_raw(&ds)),
            ..Default::default()
        }],
        duration_ms: Some(2000),
        ..Default::default()
    };
    let enable = EnableTracingRequest {
        trace_config: Some(protos::to_raw(&config)),
        attach_notification_only: None,
    };
    assert_eq!(
        invoke::<consumer_port::EnableTracing>(3, &enable, false),
        golden(&f, "c2s", "EnableTracing", 0)
    );
    assert_eq!(
        invoke::<consumer_port::ReadBuffers>(4, &Default::default(), false),
        golden(&f, "c2s", "ReadBuffers", 0)
    );

    // The 11 KiB ReadBuffers reply, rebuilt from its slices through the host:
    // nested lengths (including the two short slices straddling protozero's
    // 4096-byte buffer slices) come out exactly as Perfetto wrote them.
    let read = ReadBuffersResponse::decode(reply(&find(&f, "s2c", "ReadBuffers")[0].1)).unwrap();
    let rebuilt = ReadBuffersResponse {
        slices: read
            .slices
            .iter()
            .map(|s| Slice {
                data: s.data.clone(),
                last_slice_for_packet: s.last_slice_for_packet,
            })
            .collect(),
    };
    let mut host = HostConnection::new(Arc::new(ServiceTable::from(ConsumerPort)), None);
    host.decoder()
        .push(&golden(&f, "c2s", "ReadBuffers", 0), None);
    let call = host.poll_call().unwrap().unwrap();
    assert!(matches!(
        call.request,
        consumer_port::Request::ReadBuffers(_)
    ));
    host.resolve(call.reply, &rebuilt).unwrap();
    let seg = host.out().next_send().unwrap();
    assert_eq!(seg.bytes, &golden(&f, "s2c", "ReadBuffers", 0)[..]);
}
