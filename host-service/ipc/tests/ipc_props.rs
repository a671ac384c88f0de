//! Property tests of framing and encoding, and the fuzz entry point run on
//! real captures and their mutations.

use bytes::Bytes;
use proptest::prelude::*;
use prost::Message;
use shmtrace_ipc::frame::{
    bind_service_frame, encode_frame, invoke_method_frame, invoke_method_reply_frame,
    request_error_frame, FrameDecoder,
};
use shmtrace_ipc::protos::wire::{put_tag, put_varint, Fields, WireType};
use shmtrace_ipc::protos::{
    canonical, commit_data_request as cdr, ds_config, CommitDataRequest, DataSourceConfig, IpcFrame,
};

fn frame_strategy() -> impl Strategy<Value = IpcFrame> {
    let bytes = prop::collection::vec(any::<u8>(), 0..3000).prop_map(Bytes::from);
    prop_oneof![
        (any::<u64>(), "[A-Za-z]{0,20}").prop_map(|(id, name)| bind_service_frame(id, &name)),
        (
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            bytes.clone(),
            any::<bool>()
        )
            .prop_map(|(id, s, m, args, drop)| invoke_method_frame(id, s, m, args, drop)),
        (any::<u64>(), prop::option::of(bytes), any::<bool>())
            .prop_map(|(id, reply, more)| invoke_method_reply_frame(id, reply.ok_or(()), more)),
        (any::<u64>(), ".{0,40}").prop_map(|(id, e)| request_error_frame(id, &e)),
    ]
}

proptest! {
    #[test]
    fn any_split_of_a_frame_stream_decodes_to_the_same_frames(
        frames in prop::collection::vec(frame_strategy(), 1..20),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..30),
    ) {
        let mut stream = Vec::new();
        for f in &frames {
            encode_frame(f, &mut stream).unwrap();
        }
        let mut points: Vec<usize> = cuts.iter().map(|c| c.index(stream.len() + 1)).collect();
        points.push(0);
        points.push(stream.len());
        points.sort_unstable();
        let mut dec = FrameDecoder::new();
        let mut out = Vec::new();
        for w in points.windows(2) {
            dec.push(&stream[w[0]..w[1]], None);
            while let Some(f) = dec.next_frame().unwrap() {
                out.push(f.frame);
            }
        }
        prop_assert_eq!(out, frames);
        prop_assert_eq!(dec.buffered(), 0);
    }

    #[test]
    fn canonical_encoding_round_trips(
        moves in prop::collection::vec((any::<u32>(), 0u32..14, any::<u32>(), prop::option::of(prop::collection::vec(any::<u8>(), 0..300))), 0..20),
        patches in prop::collection::vec((any::<u32>(), any::<u32>(), any::<u32>(), prop::collection::vec((any::<u32>(), any::<[u8; 4]>()), 0..5), any::<bool>()), 0..5),
        flush in prop::option::of(any::<u64>()),
    ) {
        let msg = CommitDataRequest {
            chunks_to_move: moves.into_iter().map(|(page, chunk, buf, data)| cdr::ChunksToMove {
                page: Some(page), chunk: Some(chunk), target_buffer: Some(buf), data: data.map(Bytes::from), chunk_incomplete: None,
            }).collect(),
            chunks_to_patch: patches.into_iter().map(|(b, w, c, ps, more)| cdr::ChunkToPatch {
                target_buffer: Some(b), writer_id: Some(w), chunk_id: Some(c),
                patches: ps.into_iter().map(|(offset, data)| cdr::chunk_to_patch::Patch { offset: Some(offset), data: Some(Bytes::copy_from_slice(&data)) }).collect(),
                has_more_patches: Some(more),
            }).collect(),
            flush_request_id: flush,
        };
        let bytes = canonical::encode(&msg);
        prop_assert_eq!(CommitDataRequest::decode(&bytes[..]).unwrap(), msg);
    }

    #[test]
    fn rewriting_keeps_every_field_the_service_does_not_own(
        unknown in prop::collection::vec((2000u32..100_000, prop::collection::vec(any::<u8>(), 0..50), any::<bool>()), 0..10),
        name in "[a-z.]{1,20}",
        session in any::<u64>(),
    ) {
        let mut raw = canonical::encode(&DataSourceConfig { name: Some(name.clone()), ..Default::default() });
        for (number, payload, varint) in &unknown {
            if *varint {
                put_tag(&mut raw, *number, WireType::Varint);
                put_varint(&mut raw, payload.len() as u64);
            } else {
                put_tag(&mut raw, *number, WireType::LengthDelimited);
                put_varint(&mut raw, payload.len() as u64);
                raw.extend_from_slice(payload);
            }
        }
        let set = ds_config::ServiceFields { tracing_session_id: session, ..Default::default() };
        let out = ds_config::rewrite(&raw, &set).unwrap();
        let before: Vec<Vec<u8>> = Fields::new(&raw).map(|f| f.unwrap().bytes.to_vec()).collect();
        let after: Vec<Vec<u8>> = Fields::new(&out).map(|f| f.unwrap().bytes.to_vec()).collect();
        for field in &before {
            prop_assert!(after.contains(field));
        }
        let decoded = DataSourceConfig::decode(&out[..]).unwrap();
        prop_assert_eq!(decoded.tracing_session_id, Some(session));
        prop_assert_eq!(decoded.name, Some(name));
    }
}

fn capture_streams() -> Vec<Vec<u8>> {
    let mut streams = Vec::new();
    for cap in ["small", "large"] {
        for side in ["producer", "consumer"] {
            let path = format!(
                "{}/tests/golden/{cap}/{side}_service.log.jsonl",
                env!("CARGO_MANIFEST_DIR")
            );
            let text = std::fs::read_to_string(path).unwrap();
            for dir in ["c2s", "s2c"] {
                let mut stream = Vec::new();
                for line in text.lines() {
                    let v: serde_json::Value = serde_json::from_str(line).unwrap();
                    if v["dir"] == dir && v.get("truncated").is_none() {
                        let hex = v["hex"].as_str().unwrap();
                        stream.extend(
                            (0..hex.len())
                                .step_by(2)
                                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()),
                        );
                    }
                }
                streams.push(stream);
            }
        }
    }
    streams
}

#[test]
fn the_fuzz_entry_point_accepts_real_traffic_and_its_mutations() {
    for stream in capture_streams() {
        for seed in [0u8, 3, 60] {
            let mut input = vec![seed];
            input.extend_from_slice(&stream);
            shmtrace_ipc::fuzzing::ipc_frame(&input);
            // Deterministic mutations: flip one byte at a time, at a stride.
            for at in (1..input.len()).step_by(37) {
                let mut mutated = input.clone();
                mutated[at] ^= 0x5a;
                shmtrace_ipc::fuzzing::ipc_frame(&mutated);
            }
        }
    }
}
