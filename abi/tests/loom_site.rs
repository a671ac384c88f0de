//! loom model of `EventSite` numbering: contexts that resolve the same call
//! site at once (a thread and an interrupt, or two cores) may each take a
//! number for it, but two sites never share one, and the site keeps one of
//! its own, so no writer's site cache can hand one site's ids to another
//! (an entry cached under the number the site did not keep is never read
//! again).
//!
//! Run with:
//! `RUSTFLAGS="--cfg loom" cargo test -p shmtrace-abi --release --test 'loom_*' --target-dir target/loom`
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use shmtrace_abi::track_event::EventSite;

#[test]
fn contexts_numbering_sites_at_once_never_share_a_number() {
    loom::model(|| {
        let a = Arc::new(EventSite::new("c", "a"));
        let b = Arc::new(EventSite::new("c", "b"));
        let other = {
            let (a, b) = (a.clone(), b.clone());
            thread::spawn(move || (a.numbered(), b.numbered()))
        };
        let mine_a = a.numbered();
        let mine_b = b.numbered();
        let (theirs_a, theirs_b) = other.join().unwrap();
        for n in [mine_a, theirs_a] {
            assert!(n != mine_b && n != theirs_b, "two sites, one number");
        }
        assert!([mine_a, mine_b, theirs_a, theirs_b]
            .iter()
            .all(|&n| n != EventSite::UNNUMBERED));
        // Each site keeps a number one of the contexts took for it.
        assert!(
            [mine_a, theirs_a].contains(&a.number()),
            "a lost its numbers"
        );
        assert!(
            [mine_b, theirs_b].contains(&b.number()),
            "b lost its numbers"
        );
        // Once numbered, a site's number holds.
        assert_eq!((a.numbered(), b.numbered()), (a.number(), b.number()));
    });
}
