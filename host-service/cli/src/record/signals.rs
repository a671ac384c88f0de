//! Ctrl-C and SIGTERM: the first stops the session cleanly, the second
//! aborts the process with [`exit::ABORTED`].
//!
//! An abort must not leave a file that looks like a trace: the trace files
//! being written (each armed with [`arm`] once this run created or
//! truncated it, disarmed with [`disarm`] once it is complete or handed
//! back) are removed first. Several can be armed at once: the session's
//! own file and a CLONE_SNAPSHOT snapshot being taken beside it. The signals are taken on a thread of their own (signal-hook's
//! iterator), so the removal runs outside a signal handler.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::{exit, CliError};

/// The incomplete trace files an abort removes.
static INCOMPLETE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// An abort from now on removes `path` (too).
pub fn arm(path: &Path) {
    let mut armed = INCOMPLETE.lock().unwrap_or_else(PoisonError::into_inner);
    if !armed.iter().any(|p| p == path) {
        armed.push(path.to_path_buf());
    }
}

/// An abort no longer removes `path`.
pub fn disarm(path: &Path) {
    INCOMPLETE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .retain(|p| p != path);
}

/// Starts taking Ctrl-C and SIGTERM: the returned flag is set by the first
/// (the session then stops cleanly); the second removes the armed files and
/// exits with [`exit::ABORTED`].
pub fn stop_signals() -> Result<Arc<AtomicBool>, CliError> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut signals = Signals::new([SIGINT, SIGTERM]).map_err(CliError::Output)?;
    let flag = Arc::clone(&stop);
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for _ in signals.forever() {
                if !flag.swap(true, Ordering::Relaxed) {
                    continue;
                }
                let armed =
                    std::mem::take(&mut *INCOMPLETE.lock().unwrap_or_else(PoisonError::into_inner));
                if armed.is_empty() {
                    eprintln!("shmtrace: aborted");
                }
                for path in armed {
                    match std::fs::remove_file(&path) {
                        Ok(()) => eprintln!(
                            "shmtrace: aborted; removed the incomplete trace {}",
                            path.display()
                        ),
                        Err(e) => eprintln!(
                            "shmtrace: aborted; the incomplete trace {} could not be removed: {e}",
                            path.display()
                        ),
                    }
                }
                std::process::exit(i32::from(exit::ABORTED));
            }
        })
        .map_err(CliError::Output)?;
    Ok(stop)
}
