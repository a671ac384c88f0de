//! What a packet carries: the name of its payload field (a member of
//! `TracePacket`'s `data` oneof), found by scanning its top-level fields, so
//! that payloads this project does not decode (ftrace bundles, perf samples,
//! ...) are still named.

use shmtrace_abi::trace::trace_packet as tp;

use shmtrace_ipc::protos::wire::Fields;

/// The members of `TracePacket.data` in Perfetto v59: `(field number, name)`,
/// sorted by number.
const PAYLOADS: &[(u32, &str)] = &[
    (1, "ftrace_events"),
    (2, "process_tree"),
    (4, "inode_file_map"),
    (5, "chrome_events"),
    (6, "clock_snapshot"),
    (7, "sys_stats"),
    (9, "process_stats"),
    (11, "track_event"),
    (33, "trace_config"),
    (34, "ftrace_stats"),
    (35, "trace_stats"),
    (36, "synchronization_marker"),
    (37, "profile_packet"),
    (38, "battery"),
    (39, "android_log"),
    (40, "power_rails"),
    (43, "process_descriptor"),
    (44, "thread_descriptor"),
    (45, "system_info"),
    (46, "trigger"),
    (47, "packages_list"),
    (48, "chrome_benchmark_metadata"),
    (49, "perfetto_metatrace"),
    (50, "compressed_packets"),
    (51, "chrome_metadata"),
    (52, "gpu_counter_event"),
    (53, "gpu_render_stage_event"),
    (54, "streaming_profile_packet"),
    (57, "graphics_frame_event"),
    (60, "track_descriptor"),
    (61, "module_symbols"),
    (62, "vulkan_memory_event"),
    (63, "gpu_log"),
    (64, "deobfuscation_mapping"),
    (65, "vulkan_api_event"),
    (66, "perf_sample"),
    (67, "cpu_info"),
    (68, "smaps_packet"),
    (69, "service_event"),
    (70, "initial_display_state"),
    (71, "gpu_mem_total_event"),
    (72, "extension_descriptor"),
    (73, "memory_tracker_snapshot"),
    (74, "streaming_allocation"),
    (75, "streaming_free"),
    (77, "android_energy_estimation_breakdown"),
    (78, "ui_state"),
    (82, "translation_table"),
    (83, "android_game_intervention_list"),
    (84, "statsd_atom"),
    (86, "android_system_property"),
    (89, "trace_uuid"),
    (90, "track_event_range_of_interest"),
    (91, "entity_state_residency"),
    (95, "etw_events"),
    (99, "v8_js_code"),
    (100, "v8_internal_code"),
    (101, "v8_wasm_code"),
    (102, "v8_reg_exp_code"),
    (103, "v8_code_move"),
    (107, "remote_clock_sync"),
    (109, "chrome_trigger"),
    (110, "pixel_modem_events"),
    (111, "pixel_modem_token_database"),
    (113, "clone_snapshot_trigger"),
    (115, "kernel_wakelock_data"),
    (117, "generic_kernel_task_state_event"),
    (118, "generic_kernel_cpu_freq_event"),
    (119, "cpu_per_uid_data"),
    (120, "generic_kernel_task_rename_event"),
    (122, "generic_kernel_process_tree"),
    (123, "user_list"),
    (124, "trace_provenance"),
    (125, "protovms"),
    (126, "trace_attributes"),
    (127, "android_aflags"),
    (128, "gpu_info"),
    (129, "generic_gpu_frequency_event"),
    (130, "interrupt_info"),
    (131, "art_process_metadata"),
    (132, "journald_event"),
    (133, "zstd_compressed_packets"),
    (134, "concurrent_session_event"),
    (135, "stack_sample"),
    (138, "recovered_trace_info"),
    (900, "for_testing"),
];

/// `TracePacket` fields outside the `data` oneof (sequence state, trusted
/// fields, timestamps).
const NON_PAYLOAD: &[u32] = &[
    tp::TRUSTED_UID,
    tp::TIMESTAMP,
    tp::TRUSTED_PACKET_SEQUENCE_ID,
    tp::INTERNED_DATA,
    tp::SEQUENCE_FLAGS,
    tp::INCREMENTAL_STATE_CLEARED,
    tp::PREVIOUS_PACKET_DROPPED,
    tp::TIMESTAMP_CLOCK_ID,
    tp::TRACE_PACKET_DEFAULTS,
    tp::TRUSTED_PID,
    tp::FIRST_PACKET_ON_SEQUENCE,
    tp::MACHINE_ID,
];

/// Name of a packet without a payload (only sequence state, e.g. interned
/// data or defaults).
pub const NO_PAYLOAD: &str = "(no payload)";

/// The payload kind of a serialized packet: the known payload name, or
/// `field #N` for an unknown field that is not sequence state, or
/// [`NO_PAYLOAD`]. `None` if the packet is not well-formed protobuf.
pub fn packet_kind(packet: &[u8]) -> Option<String> {
    let mut kind = None;
    for field in Fields::new(packet) {
        let number = field.ok()?.number;
        if kind.is_some() || NON_PAYLOAD.contains(&number) {
            continue;
        }
        kind = Some(match PAYLOADS.binary_search_by_key(&number, |&(n, _)| n) {
            Ok(i) => PAYLOADS[i].1.to_owned(),
            Err(_) => format!("field #{number}"),
        });
    }
    Some(kind.unwrap_or_else(|| NO_PAYLOAD.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_and_disjoint() {
        assert!(PAYLOADS.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(PAYLOADS.iter().all(|(n, _)| !NON_PAYLOAD.contains(n)));
    }

    #[test]
    fn kinds() {
        // trusted_packet_sequence_id 2, then an ftrace bundle (field 1).
        assert_eq!(
            packet_kind(&[0x50, 0x02, 0x0a, 0x00]).unwrap(),
            "ftrace_events"
        );
        // sequence_flags only.
        assert_eq!(packet_kind(&[0x68, 0x01]).unwrap(), NO_PAYLOAD);
        // field 2000 (an extension), varint.
        assert_eq!(packet_kind(&[0x80, 0x7d, 0x01]).unwrap(), "field #2000");
        // truncated.
        assert_eq!(packet_kind(&[0x0a, 0x05, 0x00]), None);
    }
}
