//! The shared-RAM link: a host maps the region and consumes its ring; the
//! firmware serves the control words it must answer.

use shmtrace_abi::region::{Control, RegionHandles};

use super::{Link, Writers};

/// Serves a host attached to the region (see the [module docs](super)).
#[derive(Debug)]
pub struct AttachLink {
    control: Control<'static>,
    /// The last flush request served.
    flushed: u32,
}

impl AttachLink {
    /// The link of the region behind `handles`.
    pub fn new(handles: &RegionHandles<'static>) -> Self {
        let control = handles.control;
        AttachLink {
            flushed: control.flush_request(),
            control,
        }
    }
}

impl Link for AttachLink {
    fn serve(&mut self, writers: &mut Writers) {
        let request = self.control.flush_request();
        if request != self.flushed {
            writers.flush();
            self.control.ack_flush(request);
            self.flushed = request;
        }
        self.control.answer_sync(|| writers.now_ns());
    }

    fn lost(&self) -> u64 {
        u64::from(self.control.counters().chunks_lost)
    }

    fn mode(&self) -> &'static str {
        "attach"
    }
}
