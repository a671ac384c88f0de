//! loom models of `WriterCell`, the slot a writer lives in when a thread (or
//! task) and an interrupt handler both write through it.
//!
//! Run with:
//! `RUSTFLAGS="--cfg loom" cargo test -p shmtrace-abi --release --test 'loom_*' --target-dir target/loom`
//!
//! An interrupt preempts the code it interrupts and runs to completion; loom
//! threads interleave at every atomic operation, which covers that and
//! more (two cores). The slot is a loom `UnsafeCell`, so loom itself
//! reports two parties touching the writer at once. On top of that the
//! models assert:
//!
//! * never two borrowers inside at once;
//! * each borrower sees every write of the borrowers before it (the value
//!   each one reads is the number of borrows before it);
//! * every borrow that found the cell busy is counted as a miss;
//! * a writer taken out while another context borrows is handed over
//!   whole, and dropped exactly once.
#![cfg(loom)]

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use std::sync::Mutex;

use loom::sync::Arc;
use loom::thread;
use shmtrace_abi::track_event::WriterCell;

/// Bookkeeping outside loom's view (plain std atomics add no
/// synchronization loom could rely on; loom runs one thread at a time).
#[derive(Default)]
struct Book {
    inside: AtomicBool,
    seen: Mutex<Vec<u32>>,
    drops: AtomicU32,
}

/// The "writer": how many borrows it has seen.
struct Counter {
    count: u32,
    book: std::sync::Arc<Book>,
}

impl Drop for Counter {
    fn drop(&mut self) {
        self.book.drops.fetch_add(1, SeqCst);
    }
}

/// One borrow: `Some(())` if it got the writer.
fn borrow(cell: &WriterCell<Counter>, book: &Book) -> Option<()> {
    cell.try_with(|w| {
        assert!(!book.inside.swap(true, SeqCst), "two borrowers at once");
        book.seen.lock().unwrap().push(w.count);
        w.count += 1;
        book.inside.store(false, SeqCst);
    })
}

#[test]
fn a_thread_and_an_interrupt_share_a_writer() {
    loom::model(|| {
        let book = std::sync::Arc::new(Book::default());
        let cell = Arc::new(WriterCell::new());
        assert!(cell
            .set(Counter {
                count: 0,
                book: book.clone(),
            })
            .is_ok());
        let task = {
            let (cell, book) = (cell.clone(), book.clone());
            thread::spawn(move || (0..2).filter(|_| borrow(&cell, &book).is_none()).count() as u32)
        };
        let irq_missed = u32::from(borrow(&cell, &book).is_none());
        let task_missed = task.join().unwrap();
        let missed = irq_missed + task_missed;
        // The cell always held the writer: every failed borrow found it busy.
        assert_eq!(cell.busy_misses(), missed);
        let mut seen = book.seen.lock().unwrap().clone();
        seen.sort_unstable();
        let borrowed = 3 - missed;
        assert_eq!(seen, (0..borrowed).collect::<Vec<_>>());
        let w = cell.take().expect("the writer is still there");
        assert_eq!(w.count, borrowed);
        drop(w);
        assert_eq!(book.drops.load(SeqCst), 1);
    });
}

#[test]
fn a_writer_taken_while_an_interrupt_borrows_it() {
    loom::model(|| {
        let book = std::sync::Arc::new(Book::default());
        let cell = Arc::new(WriterCell::new());
        assert!(cell
            .set(Counter {
                count: 0,
                book: book.clone(),
            })
            .is_ok());
        let irq = {
            let (cell, book) = (cell.clone(), book.clone());
            thread::spawn(move || borrow(&cell, &book).is_some())
        };
        let taken = cell.take();
        let borrowed = irq.join().unwrap();
        match taken {
            // Taken after the borrow, or before it: then the borrow found
            // the cell busy (counted) or empty (not a miss).
            Some(w) => {
                assert_eq!(w.count, u32::from(borrowed));
                let misses = cell.busy_misses();
                assert!(misses <= u32::from(!borrowed));
                // Empty now: a borrow finds nothing, and that is no miss.
                assert!(cell.try_with(|_| ()).is_none());
                assert_eq!(cell.busy_misses(), misses);
            }
            // The borrow held it: it is still in the cell.
            None => {
                assert!(borrowed);
                assert_eq!(cell.try_with(|w| w.count), Some(1));
            }
        }
        drop(cell);
        assert_eq!(book.drops.load(SeqCst), 1, "dropped once");
    });
}
