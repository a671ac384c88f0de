//! `activate_triggers` against a fake service on a real socket (the one of
//! [`hostile`](super::hostile)): triggers activated while connected leave
//! at once in one `ActivateTriggers` without asking for a reply; those
//! activated before the connection wait for it, the expired ones dropped
//! and counted.

use std::time::Duration;

use shmtrace_ipc::protos::{self as pb, producer_port::Request};

use super::hostile::{connect, Peer};
use super::loopback::serial;
use crate::runtime::{PendingTriggers, MAX_PENDING_TRIGGERS};

/// The `ActivateTriggers` calls the service received, in order, each with
/// whether it asked for no reply.
fn activations(peer: &Peer) -> Vec<(Vec<String>, bool)> {
    peer.calls
        .iter()
        .zip(&peer.drop_replies)
        .filter_map(|(call, drop_reply)| match call {
            Request::ActivateTriggers(pb::ActivateTriggersRequest { trigger_names }) => {
                Some((trigger_names.clone(), *drop_reply))
            }
            _ => None,
        })
        .collect()
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|n| (*n).to_owned()).collect()
}

#[test]
fn triggers_are_sent_when_connected_and_kept_until_a_connection_while_alive() {
    let _s = serial();
    // No connection (as every test leaves it).
    crate::runtime::runtime().disconnected();
    let before = crate::stats();
    // No connection: kept, "late" and "early" alive, "stale" expired by
    // the time the connection opens, the empty name ignored.
    crate::activate_triggers(&["early", "stale"], Duration::ZERO);
    crate::activate_triggers(&["late", "early"], Duration::from_secs(60));
    crate::activate_triggers(&[""], Duration::from_secs(60));
    let (_service, _conn, mut peer) = connect();
    peer.handshake(Default::default());
    assert!(
        peer.until(|p| !activations(p).is_empty()),
        "the kept triggers were not sent on connecting"
    );
    // Connected: sent at once, exactly as named.
    crate::activate_triggers(&["now", "also"], Duration::ZERO);
    assert!(peer.until(|p| activations(p).len() >= 2));
    std::thread::sleep(Duration::from_millis(50));
    peer.until(|_| true);
    assert_eq!(
        activations(&peer),
        [
            (names(&["late", "early"]), true),
            (names(&["now", "also"]), true)
        ],
        "one message per batch, the unexpired kept ones first, no reply asked"
    );
    let after = crate::stats();
    assert_eq!(after.triggers_expired - before.triggers_expired, 2);
    assert_eq!(after.triggers_dropped, before.triggers_dropped);
}

#[test]
fn the_pending_triggers_are_bounded_and_expire() {
    let now = std::time::Instant::now();
    let mut pending = PendingTriggers::default();
    let soon = Some(now + Duration::from_secs(1));
    let many: Vec<String> = (0..MAX_PENDING_TRIGGERS + 10)
        .map(|i| format!("t{i}"))
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    assert_eq!(pending.keep(&many[..5], soon, now), (0, 0));
    assert_eq!(
        pending.keep(&many[5..], None, now),
        (10, 0),
        "the newest dropped"
    );
    // The first five expire; their room is taken by new ones.
    let later = now + Duration::from_secs(2);
    assert_eq!(
        pending.keep(&["a", "b", "c"], None, later),
        (0, 5),
        "the expired ones make room, and are reported"
    );
    let (alive, expired) = pending.take(later);
    assert_eq!(expired, 0, "reported when they made room");
    assert_eq!(alive.len(), MAX_PENDING_TRIGGERS - 2);
    assert_eq!(alive[0], "t5");
    assert_eq!(&alive[alive.len() - 3..], ["a", "b", "c"]);
    assert_eq!(pending.take(later), (Vec::new(), 0), "taken once");
}
