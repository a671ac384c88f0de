//! loom model of `EventSite` numbering: contexts that resolve the same call
//! site at once (a thread and an interrupt, or two cores) agree on its
//! number, and two sites never share one, so no writer's site cache can
//! hand one site's ids to another.
//!
//! Run with:
//! `RUSTFLAGS="--cfg loom" cargo test -p shmtrace-abi --release --test 'loom_*' --target-dir target/loom`
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use shmtrace_abi::track_event::EventSite;

#[test]
fn contexts_numbering_sites_at_once_agree() {
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
        assert_eq!(mine_a, theirs_a, "one site, two numbers");
        assert_eq!(mine_b, theirs_b, "one site, two numbers");
        assert_ne!(mine_a, mine_b, "two sites, one number");
        assert!(mine_a != 0 && mine_b != 0);
        assert_eq!((a.number(), b.number()), (mine_a, mine_b));
    });
}
