//! Simulations of service-side compression: deflated reads and files
//! inflate to exactly the packets the same session sends uncompressed, big
//! compressed packets are cut into slices, zstd is refused.

use std::io::Read;

use flate2::read::ZlibDecoder;

use super::*;
use crate::protos::trace_config::{compression_config, CompressionConfig, CompressionType};
use crate::service::core::compress::COMPRESS_SLICE_SIZE;
use crate::service::core::readback::READ_REPLY_LIMIT;
use crate::service::fuzzing::random_bytes;

/// Both ways a config asks for deflate.
const DEFLATE: [fn(&mut TraceConfig); 2] = [
    |cfg| cfg.compression_type = Some(CompressionType::Deflate as i32),
    |cfg| {
        cfg.compression = Some(CompressionConfig {
            deflate: Some(compression_config::Deflate {}),
            zstd: None,
        })
    },
];

/// The packets inside `packets`, each of which must be a lone
/// `compressed_packets` (no trusted field of its own) holding a zlib
/// stream of `Trace.packet` records.
pub(super) fn inflate_all(packets: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for p in packets {
        let f = fields(p);
        let [(50, Err(data))] = &f[..] else {
            panic!("not a lone compressed_packets: {f:?}")
        };
        // zlib header: deflate, 32 KiB window, header checksum.
        assert_eq!(data[0], 0x78, "a zlib stream");
        assert_eq!((u16::from(data[0]) << 8 | u16::from(data[1])) % 31, 0);
        let mut trace = Vec::new();
        ZlibDecoder::new(&data[..])
            .read_to_end(&mut trace)
            .expect("the stream inflates");
        for (number, value) in fields(&trace) {
            assert_eq!(number, 1, "Trace.packet records only");
            out.push(value.expect_err("a packet is length-delimited"));
        }
    }
    out
}

/// `compressed` (inflated) and `plain` are the same packets, the trace
/// configs aside: each session's is the config it was given.
fn assert_same_packets(compressed: &[Vec<u8>], plain: &[Vec<u8>]) {
    assert_eq!(compressed.len(), plain.len());
    let mut configs = 0;
    for (c, p) in compressed.iter().zip(plain) {
        if field(p, 33).is_some() {
            let cc = trace_config_in(std::slice::from_ref(c));
            let pc = trace_config_in(std::slice::from_ref(p));
            assert!(super::super::compress::wants_deflate(&cc));
            assert!(!super::super::compress::wants_deflate(&pc));
            assert_eq!(cc.buffers, pc.buffers);
            configs += 1;
        } else {
            assert!(c == p, "packet differs: {:?} vs {:?}", fields(c), fields(p));
        }
    }
    assert_eq!(configs, 1);
}

/// Stops `c`'s session, which must end at once.
fn stop(sim: &mut Sim, c: &TestConsumer) {
    c.call(
        sim,
        consumer_port::Request::DisableTracing(Default::default()),
    );
    assert!(c.enabled_reply(sim).is_some());
}

/// Producer "prod" writing into a session of `cfg` tweaked by `tweak`:
/// small packets, a 10 KB one spanning chunks, a random one on a second
/// writer; then the stop.
fn run_read_session(tweak: impl FnOnce(&mut TraceConfig)) -> Vec<Vec<u8>> {
    let (mut sim, p, c, cmds) =
        session_with(descriptor("ds", false, false), config("ds", 1024, tweak));
    let buffer = setup_tracing_buffer(&cmds);
    let big = vec![0xAB; 10_000];
    let req = p.write(1, buffer, &[b"first", b"second", &big], true);
    p.commit(&mut sim, req);
    let noise = random_bytes(&mut 7, 3000);
    let req = p.write(2, buffer, &[&noise], true);
    p.commit(&mut sim, req);
    sim.advance(10);
    stop(&mut sim, &c);
    c.read(&mut sim)
}

#[test]
fn a_deflated_read_inflates_to_the_packets_of_an_uncompressed_one() {
    let plain = run_read_session(|_| {});
    assert_eq!(payloads(&plain).len(), 4);
    for tweak in DEFLATE {
        let compressed = run_read_session(tweak);
        // Service packets, producer packets and the stats, all in one
        // batch.
        assert_eq!(compressed.len(), 1);
        let inflated = inflate_all(&compressed);
        assert_same_packets(&inflated, &plain);
        // The packets inside keep their trusted fields.
        for pkt in inflated.iter().filter(|p| field(p, 900).is_some()) {
            assert_eq!(field(pkt, 3), Some(Ok(u64::from(PRODUCER_UID))));
            assert!(matches!(field(pkt, 10), Some(Ok(2 | 3))));
        }
        assert!(field(inflated.last().unwrap(), 35).is_some());
    }
}

/// A `write_into_file` session tweaked by `tweak`: a periodic write, more
/// data, the final write; the file's packets.
fn run_file_session(tweak: impl FnOnce(&mut TraceConfig)) -> Vec<Vec<u8>> {
    let (mut sim, p, c, file, buffer) = file_session(tweak);
    let req = p.write(1, buffer, &[b"early", &vec![0x11; 5000]], true);
    p.commit(&mut sim, req);
    sim.advance(100);
    let req = p.write(2, buffer, &[b"late"], true);
    p.commit(&mut sim, req);
    stop(&mut sim, &c);
    written_packets(&file)
}

#[test]
fn a_deflated_file_inflates_to_the_packets_of_an_uncompressed_one() {
    let plain = run_file_session(|_| {});
    assert_eq!(payloads(&plain).len(), 3);
    for tweak in DEFLATE {
        let compressed = run_file_session(tweak);
        // One compressed packet per write: the periodic one and the last.
        assert_eq!(compressed.len(), 2);
        assert_same_packets(&inflate_all(&compressed), &plain);
    }
}

#[test]
fn a_deflated_file_stops_before_the_packet_that_would_pass_max_file_size() {
    let (mut sim, mut p, c, file, buffer) = file_session(|cfg| {
        DEFLATE[0](cfg);
        cfg.max_file_size_bytes = Some(8192);
    });
    // Three incompressible 3 KB packets per write.
    let mut seed = 99;
    for writer in 1..=3 {
        let noise: Vec<Vec<u8>> = (0..3).map(|_| random_bytes(&mut seed, 3000)).collect();
        let refs: Vec<&[u8]> = noise.iter().map(|v| &v[..]).collect();
        let req = p.write(writer, buffer, &refs, true);
        p.commit(&mut sim, req);
        sim.advance(100);
    }
    let (bytes, _) = written_trace(&file);
    assert!(bytes.len() <= 8192, "{}", bytes.len());
    // The first write (9 KB, incompressible) would not fit: nothing was
    // written, and the session stopped.
    assert!(bytes.is_empty(), "{}", bytes.len());
    assert!(matches!(p.commands(&mut sim)[..], [Cmd::StopDataSource(_)]));
    assert!(c.enabled_reply(&mut sim).is_some());
}

#[test]
fn a_compressed_batch_larger_than_a_slice_is_cut_into_slices() {
    let (mut sim, p, c, cmds) = session_with(
        descriptor("ds", false, false),
        config("ds", 1024, DEFLATE[1]),
    );
    let buffer = setup_tracing_buffer(&cmds);
    // 400 KB that deflate cannot shrink, 20 KB per packet.
    let mut seed = 1;
    let noise: Vec<Vec<u8>> = (0..20).map(|_| random_bytes(&mut seed, 20_000)).collect();
    for (i, n) in noise.iter().enumerate() {
        let req = p.write(i as u16 + 1, buffer, &[n], true);
        p.commit(&mut sim, req);
    }
    stop(&mut sim, &c);
    let id = c.call(
        &mut sim,
        consumer_port::Request::ReadBuffers(Default::default()),
    );
    let mut bodies: Vec<Bytes> = sim
        .replies(c.conn, id)
        .into_iter()
        .map(|g| match g.body {
            ReplyBody::Ok(b) => b,
            ReplyBody::Err => panic!("ReadBuffers failed"),
        })
        .collect();
    while let Some(Output::Reply { body, .. }) = sim.svc.poll_read_reply(c.conn) {
        let ReplyBody::Ok(b) = body else {
            panic!("ReadBuffers failed")
        };
        bodies.push(b);
    }
    let mut packets = Vec::new();
    let mut slices_per_packet = Vec::new();
    let (mut cur, mut slices) = (Vec::new(), 0);
    for b in bodies {
        assert!(b.len() <= READ_REPLY_LIMIT, "{}", b.len());
        for s in crate::protos::ReadBuffersResponse::decode(b)
            .unwrap()
            .slices
        {
            let data = s.data.unwrap_or_default();
            assert!(data.len() <= COMPRESS_SLICE_SIZE);
            cur.extend_from_slice(&data);
            slices += 1;
            if s.last_slice_for_packet == Some(true) {
                packets.push(std::mem::take(&mut cur));
                slices_per_packet.push(std::mem::take(&mut slices));
            }
        }
    }
    assert!(cur.is_empty());
    // Each batch reads past 128 KiB - 64 bytes: its compressed packet is
    // over one slice, so it comes as the preamble and two data slices.
    assert!(packets.len() >= 3, "{slices_per_packet:?}");
    assert!(
        slices_per_packet.iter().filter(|&&n| n == 3).count() >= 2,
        "{slices_per_packet:?}"
    );
    assert!(packets.iter().any(|p| p.len() > COMPRESS_SLICE_SIZE));
    assert_eq!(payloads(&inflate_all(&packets)), noise);
}

#[test]
fn zstd_is_refused_naming_what_is_supported() {
    let mut sim = Sim::new();
    for deflate_too in [false, true] {
        let error = TestConsumer::refused(
            &mut sim,
            config("ds", 64, |cfg| {
                cfg.compression = Some(CompressionConfig {
                    deflate: deflate_too.then_some(compression_config::Deflate {}),
                    zstd: Some(compression_config::Zstd { level: Some(3) }),
                })
            }),
        );
        assert!(matches!(error, ConfigError::ZstdCompression), "{error:?}");
        assert_eq!(
            error.to_string(),
            "zstd trace compression is not supported by the shmtrace service; it compresses \
             with deflate: `compression { deflate {} }` or `compression_type: \
             COMPRESSION_TYPE_DEFLATE`"
        );
    }
}

#[test]
fn a_clone_of_a_deflating_session_reads_deflated() {
    let (mut sim, mut p, source, cmds) =
        session_with(descriptor("ds", false, false), config("ds", 64, DEFLATE[0]));
    let buffer = setup_tracing_buffer(&cmds);
    let req = p.write(1, buffer, &[b"a", b"b"], true);
    p.commit(&mut sim, req);
    stop(&mut sim, &source);
    p.commands(&mut sim);
    let cloner = TestConsumer {
        conn: sim.svc.connect_consumer(creds(2000, 78)),
        enable: 0,
    };
    let req = crate::protos::CloneSessionRequest {
        selector: Some(crate::protos::clone_session_request::Selector::SessionId(1)),
        ..Default::default()
    };
    let id = cloner.call(&mut sim, consumer_port::Request::CloneSession(req));
    let resp: crate::protos::CloneSessionResponse = sim.reply_ok(cloner.conn, id);
    assert_eq!(resp.success, Some(true));
    // The clone keeps the source's config, compression included (upstream
    // copies it in `TracingServiceImpl::FinishCloneSession`,
    // src/tracing/service/tracing_service_impl.cc).
    let cloned = inflate_all(&cloner.read(&mut sim));
    assert_eq!(payloads(&cloned), [b"a".to_vec(), b"b".to_vec()]);
}
