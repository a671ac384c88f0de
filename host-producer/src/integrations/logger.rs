//! [`TraceLogger`]: records of the [`log`] crate as track events.
//!
//! ```no_run
//! shmtrace_producer::init(shmtrace_producer::ProducerConfig::default()).unwrap();
//! shmtrace_producer::logger::init(log::LevelFilter::Info).unwrap();
//! log::info!(target: "net", "connected to {}", "10.0.0.1");
//! ```
//!
//! [`log`]: https://docs.rs/log
//!
//! Each record is an instant named `log` on the calling thread's track,
//! in the category named after its target (as with the
//! `tracing` layer, `TrackEventConfig`'s category
//! lists and tags select targets), with two string annotations: `level`
//! (`"ERROR"` … `"TRACE"`) and `message`. A message that is a plain string
//! literal is written without formatting; others are formatted into a
//! per-thread buffer, reused from record to record.
//!
//! `log` has one logger per program. To print records as well, wrap the
//! other logger: [`TraceLogger::with_next`]. A program that traces with
//! `tracing` and lets `tracing-log` turn `log` records into `tracing`
//! events does not need this logger: the layer sees them, though all in
//! the category `log` (`tracing-log`'s target for them).
//!
//! The producer's own records (target `shmtrace_producer…`) are not
//! recorded (only passed on), so the producer never re-enters itself from
//! inside its own code.

use std::cell::Cell;
use std::fmt::Write as _;

use log::{LevelFilter, Log, Metadata, Record, SetLoggerError};

use crate::integrations::target_category;
use crate::track_event::__event;
use crate::{Arg, EventName, EventType};

/// A [`log::Log`] writing records as track events, and passing them on to
/// another logger if given one.
pub struct TraceLogger {
    level: LevelFilter,
    next: Option<Box<dyn Log>>,
}

impl std::fmt::Debug for TraceLogger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceLogger")
            .field("level", &self.level)
            .field("next", &self.next.is_some())
            .finish()
    }
}

/// Installs a [`TraceLogger`] recording records up to `level` as the
/// program's logger, and sets `log`'s maximum level to `level`. Fails if
/// the program has a logger already: note that tracing-subscriber's
/// `SubscriberInitExt::init`, with its default features, installs
/// `tracing-log`'s (install the subscriber with
/// `tracing::subscriber::set_global_default` instead).
pub fn init(level: LevelFilter) -> Result<(), SetLoggerError> {
    TraceLogger::new(level).install()
}

impl TraceLogger {
    /// A logger recording records up to `level`.
    pub fn new(level: LevelFilter) -> Self {
        TraceLogger { level, next: None }
    }

    /// Passes every record on to `next` as well (which filters by its own
    /// level).
    pub fn with_next(self, next: Box<dyn Log>) -> Self {
        TraceLogger {
            next: Some(next),
            ..self
        }
    }

    /// Installs this logger as the program's (offering the `track_event`
    /// data source to the service), and sets `log`'s maximum level to this
    /// logger's level (a `next` logger that wants more must
    /// be given it with [`log::set_max_level`] afterwards).
    pub fn install(self) -> Result<(), SetLoggerError> {
        let level = self.level;
        // Offer track events now, so sessions can enable targets before
        // the first record.
        crate::runtime::runtime().advertise_track_event(false);
        log::set_boxed_logger(Box::new(self))?;
        log::set_max_level(level);
        Ok(())
    }

    /// Writes `record` as an instant (if its target's category is enabled).
    fn record(&self, record: &Record<'_>) {
        let target = record.target();
        if record.level() > self.level || target.starts_with(OWN_TARGET) {
            return;
        }
        let category = target_category::category(target);
        if !category.is_enabled() {
            return;
        }
        let level = Arg::new("level", record.level().as_str());
        if let Some(message) = record.args().as_str() {
            let args = [level, Arg::new("message", message)];
            __event(
                category,
                EventType::Instant,
                EventName::Static("log"),
                &args,
            );
            return;
        }
        let mut text = TEXT.try_with(Cell::take).unwrap_or_default();
        // A `Display` impl that fails leaves what it wrote.
        let _ = write!(text, "{}", record.args());
        let args = [level, Arg::new("message", text.as_str())];
        __event(
            category,
            EventType::Instant,
            EventName::Static("log"),
            &args,
        );
        if text.capacity() <= TEXT_KEEP {
            text.clear();
            let _ = TEXT.try_with(|cell| cell.set(text));
        }
    }
}

/// The producer's own targets.
const OWN_TARGET: &str = "shmtrace_producer";

/// A text buffer kept by a thread beyond this capacity is freed instead.
const TEXT_KEEP: usize = 64 * 1024;

thread_local! {
    /// The thread's message buffer, while no record has it (a record
    /// logged while formatting another finds it empty and takes its own).
    static TEXT: Cell<String> = const { Cell::new(String::new()) };
}

impl Log for TraceLogger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        let traced = metadata.level() <= self.level
            && !metadata.target().starts_with(OWN_TARGET)
            && target_category::category(metadata.target()).is_enabled();
        traced || self.next.as_ref().is_some_and(|n| n.enabled(metadata))
    }

    fn log(&self, record: &Record<'_>) {
        self.record(record);
        if let Some(next) = &self.next {
            next.log(record);
        }
    }

    fn flush(&self) {
        if let Some(next) = &self.next {
            next.flush();
        }
    }
}
