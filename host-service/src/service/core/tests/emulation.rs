//! Shmem emulation: producers on TCP or vsock, which keep their own buffer
//! and send whole chunks inline in `CommitDataRequest.ChunksToMove.data`.

use super::*;
use crate::service::core::MAX_EMULATED_CHUNK;
use shmtrace_abi::layout::{ChunkFlags, Packets, CHUNK_HEADER_SIZE};
use shmtrace_abi::proto::wire::WireType;
use shmtrace_abi::trace::{tag2, trace_packet};

/// The bytes of a chunk header.
fn header_bytes(chunk_id: u32, writer_id: u16, count: u16) -> [u8; CHUNK_HEADER_SIZE] {
    ChunkHeaderRepr {
        chunk_id,
        writer_id,
        packets: Packets::new(count, ChunkFlags::EMPTY).expect("count fits"),
    }
    .to_bytes()
}

/// A whole chunk holding one packet `{900: payload}` (one fragment).
fn one_packet_chunk(chunk_id: u32, writer_id: u16, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 120);
    let mut chunk = header_bytes(chunk_id, writer_id, 1).to_vec();
    chunk.push(payload.len() as u8 + 3);
    chunk.extend_from_slice(&tag2(trace_packet::FOR_TESTING, WireType::LengthDelimited));
    chunk.push(payload.len() as u8);
    chunk.extend_from_slice(payload);
    chunk
}

fn inline(target: u16, data: Vec<u8>) -> ChunksToMove {
    ChunksToMove {
        target_buffer: Some(u32::from(target)),
        data: Some(Bytes::from(data)),
        ..Default::default()
    }
}

#[test]
fn an_emulated_producer_gets_no_smb_and_commits_chunks_and_patches_inline() {
    let mut sim = Sim::new();
    let mut p =
        TestProducer::connect_emulated(&mut sim, "remote", &[descriptor("ds", false, false)]);
    let c = TestConsumer::enable(&mut sim, config("ds", 1024, |_| {}));
    // SetupTracing names the page size and carries no descriptor
    // (`commands` asserts it and makes the producer's private buffer).
    let cmds = p.commands(&mut sim);
    assert!(
        matches!(cmds[0], Cmd::SetupTracing(ref s) if s.shared_buffer_page_size_kb == Some(4)),
        "{cmds:?}"
    );
    assert!(matches!(
        cmds[1..],
        [Cmd::SetupDataSource(_), Cmd::StartDataSource(_)]
    ));
    let buffer = setup_tracing_buffer(&cmds);
    assert!(
        sim.svc.producers.values().all(|p| p.smb.is_none()),
        "the service created no SMB"
    );
    p.register_writer(&mut sim, 1, buffer);

    // Two small packets and one of 10 KB spanning three chunks, whose size
    // field is patched after its first chunk went.
    let big: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    let req = p.write(1, buffer, &[b"first", b"second", &big], true);
    assert!(req.chunks_to_move.len() >= 3);
    for (i, m) in req.chunks_to_move.iter().enumerate() {
        let data = m.data.as_ref().expect("inline");
        assert_eq!(data.len(), 4096 - 8, "a whole Div1 chunk, header included");
        let header = ChunkHeaderRepr::from_bytes(data[..8].try_into().unwrap());
        assert_eq!((header.writer_id, header.chunk_id), (1, i as u32));
    }
    assert!(
        !req.chunks_to_patch.is_empty(),
        "the big packet needs patches"
    );
    let id = p.commit(&mut sim, req);
    let _: crate::protos::CommitDataResponse = sim.reply_ok(p.conn, id);

    // A flush: the service scrapes nothing (it has no SMB of this
    // producer); the producer's own commit carries the ack.
    let flush = c.call(
        &mut sim,
        consumer_port::Request::Flush(crate::protos::FlushRequest {
            timeout_ms: Some(1000),
            flags: None,
        }),
    );
    let flush_id = p
        .commands(&mut sim)
        .iter()
        .find_map(|c| match c {
            Cmd::Flush(f) => f.request_id,
            _ => None,
        })
        .expect("a Flush command");
    // (A new writer: each `write` starts a writer's chunk ids at 0.)
    p.register_writer(&mut sim, 2, buffer);
    let mut req = p.write(2, buffer, &[b"flushed"], true);
    req.flush_request_id = Some(flush_id);
    let id = p.commit(&mut sim, req);
    let _: crate::protos::CommitDataResponse = sim.reply_ok(p.conn, id);
    let _: crate::protos::FlushResponse = sim.reply_ok(c.conn, flush);

    assert!(sim.disconnects().is_empty());
    let (packets, stats) = c.stop_and_read(&mut sim);
    let got = payloads(&packets);
    assert_eq!(got.len(), 4);
    assert_eq!(
        (&got[0][..], &got[1][..], &got[3][..]),
        (&b"first"[..], &b"second"[..], &b"flushed"[..])
    );
    assert!(got[2] == big, "the big packet, reassembled and patched");
    // Packets of a remote producer carry upstream's identity for it.
    for pkt in packets.iter().filter(|p| field(p, 900).is_some()) {
        assert_eq!(field(pkt, 3), Some(Ok(0)), "trusted_uid");
        assert_eq!(field(pkt, 79), None, "no pid is known");
    }
    assert_eq!(stats.chunks_discarded, Some(0));
    assert!(stats.buffer_stats[0].patches_succeeded.unwrap() >= 1);
    assert_eq!(stats.flushes_succeeded, Some(1));
}

#[test]
fn a_flush_of_an_emulated_producer_waits_for_its_own_commit() {
    let mut sim = Sim::new();
    let mut p =
        TestProducer::connect_emulated(&mut sim, "remote", &[descriptor("ds", false, false)]);
    let c = TestConsumer::enable(&mut sim, config("ds", 256, |_| {}));
    let buffer = setup_tracing_buffer(&p.commands(&mut sim));
    p.register_writer(&mut sim, 1, buffer);
    // Written, never committed: in the producer's private buffer only.
    let shm = p.smb.take().unwrap().into_inner();
    let (mut w, log) = Arbiter::writer(shm.smb(), 1, buffer, true);
    let _ = w.write_packet(|m| m.bytes(900, b"private"));
    let id = c.call(
        &mut sim,
        consumer_port::Request::Flush(crate::protos::FlushRequest {
            timeout_ms: Some(100),
            flags: None,
        }),
    );
    sim.advance(100);
    assert_eq!(sim.replies(c.conn, id)[0].body, ReplyBody::Err);
    assert!(payloads(&c.read(&mut sim)).is_empty(), "nothing scraped");
    // The producer commits the chunk itself.
    w.flush();
    drop(w);
    let req = log.borrow().clone();
    assert!(req.chunks_to_move.iter().all(|m| m.data.is_some()));
    p.commit(&mut sim, req);
    // Its disconnect scrapes nothing either, and costs nothing.
    sim.svc.disconnect(p.conn);
    let (packets, _) = c.stop_and_read(&mut sim);
    assert_eq!(payloads(&packets), [b"private".to_vec()]);
}

#[test]
fn hostile_inline_chunks_are_counted_and_cost_nobody_else() {
    let mut sim = Sim::new();
    let ds = [descriptor("ds", false, false)];
    let mut local = TestProducer::connect(&mut sim, "local", &ds);
    let mut remote = TestProducer::connect_emulated(&mut sim, "remote", &ds);
    let mut evil = TestProducer::connect_emulated(&mut sim, "evil", &ds);
    let c = TestConsumer::enable(&mut sim, config("ds", 256, |_| {}));
    let buffer = setup_tracing_buffer(&local.commands(&mut sim));
    remote.commands(&mut sim);
    evil.commands(&mut sim);
    local.register_writer(&mut sim, 1, buffer);
    remote.register_writer(&mut sim, 1, buffer);
    evil.register_writer(&mut sim, 1, buffer);

    let good = local.write(1, buffer, &[b"local"], true);
    local.commit(&mut sim, good);
    let good = remote.write(1, buffer, &[b"remote"], true);
    remote.commit(&mut sim, good);

    let valid = one_packet_chunk(0, 1, b"counted-not");
    let mut long = valid.clone();
    long.resize(MAX_EMULATED_CHUNK + 1, 0);
    let mut garbage = header_bytes(7, 1, 3).to_vec();
    garbage.extend_from_slice(&[0xFF; 32]);
    let mut forged = crate::protos::CommitDataRequest::default();
    let discarded = [
        Vec::new(),                              // no header
        valid[..CHUNK_HEADER_SIZE - 1].to_vec(), // short of a header
        long,                                    // 65536: upstream's 16-bit size wraps to 0
        vec![0xEE; 70_000],                      // over any chunk size
        header_bytes(1, 0, 1).to_vec(),          // writer id 0
    ];
    for data in discarded {
        forged.chunks_to_move.push(inline(buffer, data));
    }
    // Someone else's buffer, and a page of an SMB it does not have.
    forged
        .chunks_to_move
        .push(inline(9999, one_packet_chunk(2, 1, b"x")));
    forged.chunks_to_move.push(ChunksToMove {
        page: Some(0),
        chunk: Some(0),
        target_buffer: Some(u32::from(buffer)),
        ..Default::default()
    });
    // A valid header over fragments that lie: stored, then refused by the
    // buffer's reader as any SMB chunk would be.
    forged.chunks_to_move.push(inline(buffer, garbage));
    let id = evil.commit(&mut sim, forged);
    let _: crate::protos::CommitDataResponse = sim.reply_ok(evil.conn, id);
    // The evil producer is still connected and its honest chunks count.
    let honest = evil.write(1, buffer, &[b"evil but honest"], true);
    evil.commit(&mut sim, honest);
    assert!(sim.disconnects().is_empty());

    remote.register_writer(&mut sim, 2, buffer);
    let more = remote.write(2, buffer, &[b"remote again"], true);
    remote.commit(&mut sim, more);
    let (packets, stats) = c.stop_and_read(&mut sim);
    let mut got = payloads(&packets);
    got.sort();
    assert_eq!(
        got,
        [
            b"evil but honest".to_vec(),
            b"local".to_vec(),
            b"remote".to_vec(),
            b"remote again".to_vec()
        ]
    );
    assert_eq!(stats.chunks_discarded, Some(7));
}

/// A descriptor whose data source does not take part in flushes.
fn no_flush_descriptor(name: &str) -> DataSourceDescriptor {
    DataSourceDescriptor {
        no_flush: Some(true),
        ..descriptor(name, false, false)
    }
}

/// The ids of the Flush commands among `cmds`, with their data source ids.
fn flushes(cmds: &[Cmd]) -> Vec<(u64, Vec<u64>)> {
    cmds.iter()
        .filter_map(|c| match c {
            Cmd::Flush(f) => Some((f.request_id.unwrap_or(0), f.data_source_ids.clone())),
            _ => None,
        })
        .collect()
}

/// The real SDK's `track_event` has `no_flush`, and its idle threads'
/// last chunks go out when the threads exit, which can be just before a
/// consumer's stop. An emulated producer with scraping enabled is still
/// asked to flush (with no data source ids, so that it may scrape itself),
/// and the flush waits for its ack, which it sends after those chunks: the
/// read after the stop has them. Before, the flush completed at once and
/// the stop's read could miss them.
#[test]
fn a_flush_waits_for_an_emulated_producer_whose_data_sources_have_no_flush() {
    let mut sim = Sim::new();
    let mut p = TestProducer::connect_emulated(&mut sim, "remote", &[no_flush_descriptor("ds")]);
    let c = TestConsumer::enable(&mut sim, config("ds", 1024, |_| {}));
    let cmds = p.commands(&mut sim);
    let buffer = setup_tracing_buffer(&cmds);
    p.register_writer(&mut sim, 1, buffer);

    let flush = c.call(
        &mut sim,
        consumer_port::Request::Flush(crate::protos::FlushRequest {
            timeout_ms: Some(1000),
            flags: None,
        }),
    );
    let asked = flushes(&p.commands(&mut sim));
    let [(flush_id, ids)] = asked.as_slice() else {
        panic!("one Flush command expected: {asked:?}");
    };
    assert!(ids.is_empty(), "no data source is flushed: {ids:?}");
    assert!(
        sim.replies(c.conn, flush).is_empty(),
        "the flush waits for the producer"
    );
    // The chunk the producer committed before its ack.
    let req = p.write(1, buffer, &[b"last chunk"], true);
    let id = p.commit(&mut sim, req);
    let _: crate::protos::CommitDataResponse = sim.reply_ok(p.conn, id);
    let ack = crate::protos::CommitDataRequest {
        flush_request_id: Some(*flush_id),
        ..Default::default()
    };
    let id = p.commit(&mut sim, ack);
    let _: crate::protos::CommitDataResponse = sim.reply_ok(p.conn, id);
    let _: crate::protos::FlushResponse = sim.reply_ok(c.conn, flush);

    let (packets, stats) = c.stop_and_read(&mut sim);
    assert_eq!(payloads(&packets), [b"last chunk".to_vec()]);
    assert_eq!(stats.flushes_succeeded, Some(1));
}

/// Where the service scrapes (an SMB producer), or the producer asked for
/// no scraping, a producer whose data sources all have `no_flush` is not
/// asked, and the flush completes at once.
#[test]
fn a_flush_skips_no_flush_producers_it_can_scrape_or_that_refuse_scraping() {
    let mut sim = Sim::new();
    let mut local = TestProducer::connect(&mut sim, "local", &[no_flush_descriptor("ds")]);
    let mut remote = TestProducer::connect_emulated_as(
        &mut sim,
        "remote",
        &[no_flush_descriptor("ds")],
        false,
        None,
    );
    let c = TestConsumer::enable(&mut sim, config("ds", 1024, |_| {}));
    local.commands(&mut sim);
    remote.commands(&mut sim);

    let flush = c.call(
        &mut sim,
        consumer_port::Request::Flush(crate::protos::FlushRequest {
            timeout_ms: Some(1000),
            flags: None,
        }),
    );
    let _: crate::protos::FlushResponse = sim.reply_ok(c.conn, flush);
    assert_eq!(flushes(&local.commands(&mut sim)), []);
    assert_eq!(flushes(&remote.commands(&mut sim)), []);
}
