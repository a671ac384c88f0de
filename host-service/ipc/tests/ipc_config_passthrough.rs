//! A consumer's `DataSourceConfig` reaches the producer with every field the
//! consumer wrote — including fields this project has no message for — byte
//! for byte, through real sockets: consumer → service (EnableTracing) →
//! producer (SetupDataSource / StartDataSource).

mod ipc_common;

use std::sync::mpsc;

use bytes::Bytes;
use ipc_common::serve;
use shmtrace_ipc::host::ServiceTable;
use shmtrace_ipc::protos::wire::{put_tag, put_varint, Fields, WireType};
use shmtrace_ipc::protos::{
    self, consumer_port, ds_config, get_async_command_response as cmd, producer_port, trace_config,
    ConsumerPort, DataSourceConfig, EnableTracingRequest, EnableTracingResponse,
    GetAsyncCommandResponse, ProducerPort, TraceConfig,
};
use shmtrace_ipc::socket;
use shmtrace_ipc::Client;

/// Field numbers the service owns in a DataSourceConfig.
const SERVICE_OWNED: [u32; 6] = [2, 3, 4, 6, 7, 8];

/// A config as a real Chrome/Perfetto consumer might write it: a known
/// field, `track_event_config` (113), `chrome_config` (101, no message in
/// this project), an unknown extension (9999, length-delimited), an unknown
/// varint (5000), a fixed32 (5001) and a field the service overwrites.
fn consumer_config() -> Vec<u8> {
    let mut raw = protos::to_raw(&DataSourceConfig {
        name: Some("org.chromium.trace_event".into()),
        target_buffer: Some(0),
        legacy_config: Some("legacy".into()),
        ..Default::default()
    })
    .to_vec();
    let mut field = |number: u32, payload: &[u8]| {
        put_tag(&mut raw, number, WireType::LengthDelimited);
        put_varint(&mut raw, payload.len() as u64);
        raw.extend_from_slice(payload);
    };
    field(113, b"\x12\x01*\x12\x05cat.a");
    field(101, b"\x0a\x0crecord-until\x10\x01\xaa\x06\x02hi");
    field(9999, b"an extension we know nothing about");
    put_tag(&mut raw, 5000, WireType::Varint);
    put_varint(&mut raw, 123_456_789);
    put_tag(&mut raw, 5001, WireType::Fixed32);
    raw.extend_from_slice(&[1, 2, 3, 4]);
    // The consumer tries to claim a session id.
    put_tag(&mut raw, 4, WireType::Varint);
    put_varint(&mut raw, 777);
    raw
}

/// The fields of a serialized message, as `(number, exact bytes)`.
fn fields(raw: &[u8]) -> Vec<(u32, Vec<u8>)> {
    Fields::new(raw)
        .map(|f| f.unwrap())
        .map(|f| (f.number, f.bytes.to_vec()))
        .collect()
}

#[test]
fn unknown_data_source_config_fields_reach_the_producer_byte_for_byte() {
    // The "service": a consumer port and a producer port.
    let (consumer_sock, consumer_host) = socket::pair().unwrap();
    let (producer_sock, producer_host) = socket::pair().unwrap();
    let (config_tx, config_rx) = mpsc::channel::<Bytes>();
    let consumer_side = serve(
        consumer_host,
        ServiceTable::from(ConsumerPort),
        move |conn, call| {
            let consumer_port::Request::EnableTracing(req) = call.request else {
                panic!("{:?}", call.request)
            };
            let cfg: TraceConfig = protos::from_raw(req.trace_config.as_ref()).unwrap();
            let raw = cfg.data_sources[0].config.clone().unwrap();
            let rewritten = ds_config::rewrite(
                &raw,
                &ds_config::ServiceFields {
                    target_buffer: 42,
                    trace_duration_ms: cfg.duration_ms.unwrap_or(0),
                    stop_timeout_ms: 5000,
                    tracing_session_id: 7,
                    ..Default::default()
                },
            )
            .unwrap();
            config_tx.send(rewritten).unwrap();
            let done = EnableTracingResponse {
                state: Some(protos::enable_tracing_response::State::Disabled(true)),
                error: None,
            };
            conn.resolve(call.reply, &done).unwrap();
        },
    );
    let producer_side = serve(
        producer_host,
        ServiceTable::from(ProducerPort),
        move |conn, call| {
            assert!(matches!(
                call.request,
                producer_port::Request::GetAsyncCommand(_)
            ));
            let config = config_rx.recv().unwrap();
            let setup = GetAsyncCommandResponse {
                cmd: Some(cmd::Cmd::SetupDataSource(cmd::SetupDataSource {
                    new_instance_id: Some(1),
                    config: Some(config.clone()),
                })),
            };
            let start = GetAsyncCommandResponse {
                cmd: Some(cmd::Cmd::StartDataSource(cmd::StartDataSource {
                    new_instance_id: Some(1),
                    config: Some(config),
                })),
            };
            conn.reply(&call.reply, Ok(&setup), true, None).unwrap();
            conn.reply(&call.reply, Ok(&start), true, None).unwrap();
        },
    );

    // The producer waits for commands.
    let producer = Client::from_stream(producer_sock).unwrap();
    let port = producer.bind::<ProducerPort>().unwrap();
    let mut commands = port
        .start::<producer_port::GetAsyncCommand>(&Default::default(), None)
        .unwrap();

    // The consumer enables tracing.
    let sent = consumer_config();
    let trace_config = TraceConfig {
        buffers: vec![trace_config::BufferConfig {
            size_kb: Some(1024),
            ..Default::default()
        }],
        data_sources: vec![trace_config::DataSource {
            config: Some(Bytes::from(sent.clone())),
            ..Default::default()
        }],
        duration_ms: Some(1000),
        ..Default::default()
    };
    let consumer = Client::from_stream(consumer_sock).unwrap();
    let cport = consumer.bind::<ConsumerPort>().unwrap();
    let enable = EnableTracingRequest {
        trace_config: Some(protos::to_raw(&trace_config)),
        attach_notification_only: None,
    };
    let done = cport.call::<consumer_port::EnableTracing>(&enable).unwrap();
    assert_eq!(
        done.state,
        Some(protos::enable_tracing_response::State::Disabled(true))
    );

    // What the producer got.
    let mut received = Vec::new();
    for _ in 0..2 {
        let reply = commands
            .next(Some(std::time::Duration::from_secs(30)))
            .unwrap()
            .unwrap();
        received.push(match reply.message.cmd {
            Some(cmd::Cmd::SetupDataSource(s)) => s.config.unwrap(),
            Some(cmd::Cmd::StartDataSource(s)) => s.config.unwrap(),
            other => panic!("{other:?}"),
        });
    }
    assert_eq!(received[0], received[1]);
    let got = fields(&received[0]);

    // Every field the consumer wrote, except those the service owns, arrived
    // with exactly the bytes it was sent with.
    for (number, bytes) in fields(&sent)
        .into_iter()
        .filter(|(n, _)| !SERVICE_OWNED.contains(n))
    {
        assert!(
            got.contains(&(number, bytes.clone())),
            "field {number} lost or altered"
        );
    }
    for number in [113, 101, 9999, 5000, 5001, 1000] {
        assert!(
            got.iter().any(|(n, _)| *n == number),
            "field {number} missing"
        );
    }
    // Unknown fields come last, in the consumer's order (as Perfetto does).
    let tail: Vec<u32> = got.iter().rev().take(3).map(|(n, _)| *n).collect();
    assert_eq!(tail, [5001, 5000, 9999]);

    // The service-owned fields carry the service's values.
    let decoded: DataSourceConfig = protos::from_raw(Some(&received[0])).unwrap();
    assert_eq!(decoded.target_buffer, Some(42));
    assert_eq!(decoded.tracing_session_id, Some(7));
    assert_eq!(decoded.trace_duration_ms, Some(1000));
    assert_eq!(decoded.name.as_deref(), Some("org.chromium.trace_event"));
    assert_eq!(
        got.iter().filter(|(n, _)| *n == 4).count(),
        1,
        "the consumer's session id is gone"
    );

    drop((cport, consumer, port, commands, producer));
    consumer_side.join().unwrap();
    producer_side.join().unwrap();
}
