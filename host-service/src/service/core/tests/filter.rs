//! Simulations of trace filters: reads and files keep only what the
//! bytecode keeps, strings are redacted, malformed packets are counted and
//! dropped, the stats say what the filter did, clones keep the filter
//! unless they skip it, bad filters are refused.

use super::super::filter::testing::{encode, filter_string, nested, simple, END};
use super::*;
use crate::protos::clone_session_request::Selector;
use crate::protos::trace_config::trace_filter::{
    StringFilterChain, StringFilterPolicy, StringFilterRule,
};
use crate::protos::trace_config::{CompressionType, TraceFilter};
use crate::protos::{CloneSessionRequest, CloneSessionResponse};

/// Fields a filtered packet may keep: trusted_uid (3),
/// trusted_packet_sequence_id (10), the test payload (900).
const KEPT: [u32; 3] = [3, 10, 900];

/// Bytecode: `Trace.packet` (message 1) keeps [`KEPT`]; the payload is
/// `payload` (a field rule word and, for nested payloads, message 2 which
/// keeps field 1).
fn bytecode(payload: &[u32]) -> Vec<u8> {
    let mut words = vec![nested(1), 1, END, simple(3), simple(10)];
    words.extend_from_slice(payload);
    words.extend_from_slice(&[END, simple(1), END]);
    encode(&words)
}

fn with_filter(filter: TraceFilter) -> impl FnOnce(&mut TraceConfig) {
    move |cfg| cfg.trace_filter = Some(filter)
}

fn plain_filter() -> TraceFilter {
    TraceFilter {
        bytecode: Some(bytecode(&[simple(900)]).into()),
        ..Default::default()
    }
}

/// Producer "prod" writes `payloads` (writer 1) into a session of `cfg`,
/// which is then stopped and read.
fn read_session(cfg: Bytes, payloads: &[&[u8]]) -> Vec<Vec<u8>> {
    let (mut sim, p, c, cmds) = session_with(descriptor("ds", false, false), cfg);
    let buffer = setup_tracing_buffer(&cmds);
    let req = p.write(1, buffer, payloads, true);
    p.commit(&mut sim, req);
    sim.advance(10);
    c.call(
        &mut sim,
        consumer_port::Request::DisableTracing(Default::default()),
    );
    assert!(c.enabled_reply(&mut sim).is_some());
    c.read(&mut sim)
}

#[test]
fn a_filtered_read_keeps_only_what_the_bytecode_keeps() {
    let written: [&[u8]; 3] = [b"one", b"two", &[7; 3000]];
    let plain = read_session(config("ds", 256, |_| {}), &written);
    let filtered = read_session(config("ds", 256, with_filter(plain_filter())), &written);
    // Every packet is there (those with nothing kept are empty), in order.
    assert_eq!(filtered.len(), plain.len());
    let (stats_packet, rest) = filtered.split_last().unwrap();
    let mut discarded = 0;
    for (f, p) in rest.iter().zip(&plain) {
        // What the unfiltered packet has of the kept fields, in order.
        let mut want = fields(p);
        want.retain(|(n, _)| KEPT.contains(n));
        assert!(fields(f) == want, "packet kept {:?}", fields(f));
        if field(p, 900).is_some() {
            discarded += p.len() - f.len();
        }
    }
    assert_eq!(payloads(&filtered), payloads(&plain));
    assert_eq!(payloads(&filtered).len(), 3);
    // The stats pass unfiltered and count every packet before them (they
    // count themselves once written, as upstream's).
    let stats = stats_of(std::slice::from_ref(stats_packet));
    let f = stats.filter_stats.expect("filter_stats");
    assert_eq!(f.input_packets, Some(rest.len() as u64));
    let out: usize = rest.iter().map(Vec::len).sum();
    assert_eq!(f.output_bytes, Some(out as u64));
    assert!(f.input_bytes.unwrap() > f.output_bytes.unwrap());
    assert_eq!(f.errors, Some(0));
    // What the producer's packets lost: their other trusted fields, and
    // the redundant length of the big payload.
    assert!(discarded > 3 * 4, "{discarded}");
    assert_eq!(f.bytes_discarded_per_buffer, [discarded as u64]);
    assert!(stats_of(&plain).filter_stats.is_none());
}

#[test]
fn strings_to_filter_are_redacted() {
    let filter = TraceFilter {
        bytecode: Some(bytecode(&[filter_string(900)]).into()),
        string_filter_chain: Some(StringFilterChain {
            rules: vec![StringFilterRule {
                policy: Some(StringFilterPolicy::SfpMatchRedactGroups as i32),
                regex_pattern: Some(r"user=(\w+) .*".into()),
                ..Default::default()
            }],
        }),
        ..Default::default()
    };
    let packets = read_session(
        config("ds", 256, with_filter(filter)),
        &[b"user=alice logged in", b"nothing to hide"],
    );
    assert_eq!(
        payloads(&packets),
        [
            b"user=P60RE logged in".to_vec(),
            b"nothing to hide".to_vec()
        ]
    );
}

#[test]
fn malformed_packets_are_counted_and_dropped_whole() {
    // The payload is kept as a message (message 2), so a payload that is
    // not one (wire type 3) fails its packet.
    let filter = TraceFilter {
        bytecode: Some(bytecode(&[nested(900), 2]).into()),
        ..Default::default()
    };
    let cfg = config("ds", 256, with_filter(filter.clone()));
    let good: &[u8] = &[0x08, 0x05, 0x10, 0x06];
    let packets = read_session(cfg, &[good, &[0x0b], good]);
    // The good payloads keep field 1 only.
    assert_eq!(payloads(&packets), [vec![0x08, 0x05], vec![0x08, 0x05]]);
    let f = stats_of(&packets).filter_stats.unwrap();
    assert_eq!(f.errors, Some(1));
    // The failed packet sends nothing (and the stats do not count
    // themselves).
    assert_eq!(f.input_packets, Some(packets.len() as u64));
    // Two bytes of each good payload, and all of the failed packet.
    let per_buffer = f.bytes_discarded_per_buffer;
    assert_eq!(per_buffer.len(), 1);
    assert!(per_buffer[0] > 4, "{per_buffer:?}");

    // A compressed batch keeps an empty packet in its place, as upstream's
    // compressor writes the packet with no slices.
    let deflated = config("ds", 256, |cfg| {
        cfg.trace_filter = Some(filter.clone());
        cfg.compression_type = Some(CompressionType::Deflate as i32);
    });
    let inflated = super::compress::inflate_all(&read_session(deflated, &[good, &[0x0b], good]));
    assert_eq!(inflated.len(), packets.len() + 1);
    assert_eq!(inflated.iter().filter(|p| p.is_empty()).count(), 1);
    assert_eq!(payloads(&inflated), [vec![0x08, 0x05], vec![0x08, 0x05]]);

    // A file gets an empty packet in its place.
    let (mut sim, p, c, file, buffer) = file_session(with_filter(filter));
    let req = p.write(1, buffer, &[good, &[0x0b]], true);
    p.commit(&mut sim, req);
    c.call(
        &mut sim,
        consumer_port::Request::DisableTracing(Default::default()),
    );
    assert!(c.enabled_reply(&mut sim).is_some());
    let written = written_packets(&file);
    assert_eq!(payloads(&written), [vec![0x08, 0x05]]);
    let (stats_packet, rest) = written.split_last().unwrap();
    assert_eq!(rest.iter().filter(|p| p.is_empty()).count(), 1);
    let stats = stats_of(std::slice::from_ref(stats_packet))
        .filter_stats
        .unwrap();
    assert_eq!(stats.errors, Some(1));
    assert_eq!(stats.input_packets, Some(rest.len() as u64));
    let out: usize = rest.iter().map(Vec::len).sum();
    assert_eq!(stats.output_bytes, Some(out as u64));
}

#[test]
fn clones_keep_the_filter_unless_they_skip_it() {
    let cfg = config("ds", 256, with_filter(plain_filter()));
    let (mut sim, mut p, c, cmds) = session_with(descriptor("ds", false, false), cfg);
    let buffer = setup_tracing_buffer(&cmds);
    let req = p.write(1, buffer, &[b"x"], true);
    p.commit(&mut sim, req);
    p.commands(&mut sim);
    for skip in [false, true] {
        let conn = sim.svc.connect_consumer(creds(2000, 78));
        let req = CloneSessionRequest {
            selector: Some(Selector::SessionId(1)),
            skip_trace_filter: Some(skip),
            ..Default::default()
        };
        let id = sim.consumer_call(conn, consumer_port::Request::CloneSession(req), None);
        let cloner = TestConsumer { conn, enable: 0 };
        let flush = p.commands(&mut sim).iter().find_map(|cmd| match cmd {
            Cmd::Flush(f) => f.request_id,
            _ => None,
        });
        p.commit(
            &mut sim,
            crate::protos::CommitDataRequest {
                flush_request_id: flush,
                ..Default::default()
            },
        );
        let resp: CloneSessionResponse = sim.reply_ok(cloner.conn, id);
        assert_eq!(resp.success, Some(true));
        let packets = cloner.read(&mut sim);
        assert_eq!(payloads(&packets), [b"x".to_vec()]);
        let has_config = packets.iter().any(|p| field(p, 33).is_some());
        assert_eq!(has_config, skip, "skip_trace_filter {skip}");
        assert_eq!(stats_of(&packets).filter_stats.is_some(), !skip);
    }
    // The source still filters.
    c.call(
        &mut sim,
        consumer_port::Request::DisableTracing(Default::default()),
    );
    assert!(c.enabled_reply(&mut sim).is_some());
    let packets = c.read(&mut sim);
    assert!(packets.iter().all(|p| field(p, 33).is_none()));
}

#[test]
fn bad_filters_are_refused_with_why() {
    let mut sim = Sim::new();
    let refused = |sim: &mut Sim, filter: TraceFilter| {
        TestConsumer::refused(sim, config("ds", 64, with_filter(filter))).to_string()
    };
    let e = refused(
        &mut sim,
        TraceFilter {
            bytecode: Some(bad_checksum().into()),
            ..Default::default()
        },
    );
    assert!(e.starts_with("Trace filter bytecode invalid: "), "{e}");
    assert!(e.contains("checksum"), "{e}");
    // No bytecode at all.
    let e = refused(&mut sim, TraceFilter::default());
    assert!(e.starts_with("Trace filter bytecode invalid: "), "{e}");
    // A root that does not keep Trace.packet as a message.
    let e = refused(
        &mut sim,
        TraceFilter {
            bytecode: Some(encode(&[simple(1), END]).into()),
            ..Default::default()
        },
    );
    assert!(e.starts_with("Failed to set filter root"), "{e}");
    // bytecode_v2 is preferred: a bad v1 beside a good v2 is fine.
    let both = TraceFilter {
        bytecode: Some(bad_checksum().into()),
        bytecode_v2: Some(bytecode(&[simple(900)]).into()),
        ..Default::default()
    };
    assert!(
        TestConsumer::enable(&mut sim, config("ds", 64, with_filter(both)))
            .enabled_reply(&mut sim)
            .is_none()
    );
    // Rules: no policy; a pattern the service cannot compile.
    for (rule, want) in [
        (
            StringFilterRule::default(),
            "Trace filter has invalid string filtering rules",
        ),
        (
            StringFilterRule {
                policy: Some(StringFilterPolicy::SfpMatchBreak as i32),
                regex_pattern: Some("(?=lookahead)".into()),
                name: Some("look".into()),
                ..Default::default()
            },
            "Trace filter string rule \"look\" has a pattern that does not compile",
        ),
    ] {
        let e = refused(
            &mut sim,
            TraceFilter {
                bytecode: Some(bytecode(&[simple(900)]).into()),
                string_filter_chain_v54: Some(StringFilterChain { rules: vec![rule] }),
                ..Default::default()
            },
        );
        assert!(e.starts_with(want), "{e}");
    }
}

/// [`plain_filter`]'s bytecode with a wrong checksum.
fn bad_checksum() -> Vec<u8> {
    let mut b = bytecode(&[simple(900)]);
    *b.last_mut().unwrap() ^= 1;
    b
}
