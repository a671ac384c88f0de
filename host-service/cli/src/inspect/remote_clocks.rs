//! A relayed machine's clock offsets, from the clock exchanges of its
//! `remote_clock_sync` packet, as Perfetto's trace processor computes them
//! (`ProtoTraceReader::ParseRemoteClockSync`,
//! src/trace_processor/importers/proto/proto_trace_reader.cc).
//!
//! * Each exchange and the next one form a round (the relay's PING, read by
//!   the relay and by the service on receipt, then its UPDATE), unless the
//!   machine's BOOTTIME readings of the two lie [`SYNC_ROUND_NS`] or more
//!   apart (a relay exchanges every 30 s; rounds are sent back to back).
//! * A round gives two estimates of a clock both sides read (non-zero): the
//!   midpoint of the machine's two readings less the service's first, and
//!   the machine's second less the midpoint of the service's two.
//! * The offset is the mean of every estimate of every round, each
//!   division truncated towards zero (C++ integer division).
//! * Each packet gives an offset on its own exchanges; a machine's latest
//!   packet sets its offset (`SetRemoteClockOffset`: the last one wins).

use std::collections::BTreeMap;

use shmtrace_abi::trace::builtin_clock::BOOTTIME;

/// Exchanges whose machine BOOTTIME readings lie this far apart or more are
/// not one round.
pub const SYNC_ROUND_NS: i128 = 30_000_000_000;

/// One clock exchange: the service's (host's) readings and the machine's
/// (client's), by clock id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exchange {
    /// The central service's readings.
    pub host: BTreeMap<u32, u64>,
    /// The relayed machine's readings.
    pub client: BTreeMap<u32, u64>,
}

/// How far `clock` of the machine runs ahead of the host's (its reading
/// less the host's, ns), from `exchanges` in the order they were made;
/// `None` if no round reads `clock` on both sides.
pub fn offset(exchanges: &[Exchange], clock: u32) -> Option<i64> {
    let read = |side: &BTreeMap<u32, u64>, id: u32| -> i128 {
        side.get(&id).map_or(0, |&ns| i128::from(ns))
    };
    let mut sum: i128 = 0;
    let mut estimates: i128 = 0;
    for pair in exchanges.windows(2) {
        let (first, second) = (&pair[0], &pair[1]);
        if read(&second.client, BOOTTIME) - read(&first.client, BOOTTIME) >= SYNC_ROUND_NS {
            continue;
        }
        let (t1h, t1c) = (read(&first.host, clock), read(&first.client, clock));
        let (t2h, t2c) = (read(&second.host, clock), read(&second.client, clock));
        if [t1h, t1c, t2h, t2c].contains(&0) {
            continue;
        }
        sum += (t1c + t2c) / 2 - t1h;
        sum += t2c - (t1h + t2h) / 2;
        estimates += 2;
    }
    if estimates == 0 {
        return None;
    }
    i64::try_from(sum / estimates).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exchange(host: u64, client: u64) -> Exchange {
        Exchange {
            host: BTreeMap::from([(BOOTTIME, host)]),
            client: BTreeMap::from([(BOOTTIME, client)]),
        }
    }

    #[test]
    fn a_round_gives_the_mean_of_its_two_estimates() {
        // The machine runs 3 h ahead; the PING takes 10 us to arrive, the
        // UPDATE leaves 20 us later.
        let ahead: u64 = 3 * 3600 * 1_000_000_000;
        let rounds = [
            exchange(1_000_000 + 10_000, 1_000_000 + ahead),
            exchange(1_000_000 + 30_000, 1_000_000 + ahead + 20_000),
        ];
        // (c1 + c2) / 2 - h1 = ahead + 10_000 - 10_000 = ahead;
        // c2 - (h1 + h2) / 2 = ahead + 20_000 - 20_000 = ahead.
        assert_eq!(offset(&rounds, BOOTTIME), Some(ahead as i64));
    }

    #[test]
    fn estimates_and_their_mean_are_truncated_towards_zero() {
        let rounds = [exchange(1_000, 998), exchange(1_001, 999)];
        // (998 + 999) / 2 - 1000 = 998 - 1000 = -2;
        // 999 - (1000 + 1001) / 2 = 999 - 1000 = -1;
        // -3 / 2 = -1 (not -2, as flooring would give).
        assert_eq!(offset(&rounds, BOOTTIME), Some(-1));
    }

    #[test]
    fn exchanges_30_s_apart_or_missing_a_reading_are_no_round() {
        let far = [
            exchange(1_000, 5_000),
            exchange(1_000 + 30_000_000_000, 5_000 + 30_000_000_000),
        ];
        assert_eq!(offset(&far, BOOTTIME), None);
        let mut unread = [exchange(1_000, 5_000), exchange(1_010, 5_010)];
        unread[1].host.clear();
        assert_eq!(offset(&unread, BOOTTIME), None);
        // A clock only one side read gives nothing; BOOTTIME still does.
        let mut mixed = [exchange(1_000, 5_000), exchange(1_010, 5_010)];
        mixed[0].client.insert(3, 77);
        assert_eq!(offset(&mixed, 3), None);
        // (5000 + 5010) / 2 - 1000 and 5010 - (1000 + 1010) / 2.
        assert_eq!(offset(&mixed, BOOTTIME), Some(4_005));
        assert_eq!(offset(&[], BOOTTIME), None);
    }
}
