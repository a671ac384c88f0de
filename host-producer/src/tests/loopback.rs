//! A tiny in-process "service" for tests: drains the producer's outbox,
//! moves committed chunks out of the SMB (like `CommitData` handling),
//! applies patches, and reassembles every writer's packets.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use shmtrace_abi::layout::{PageLayout, PageSize};
use shmtrace_abi::reader::{apply_patches, FragmentEvent, Fragments};
use shmtrace_ipc::shm::SharedMemory;

use crate::connection::outbox::Outgoing;
use crate::data_source::DataSourceConfig;
use crate::runtime::runtime;
use crate::smb::arbiter::Arbiter;
use crate::track_event::filter::TrackEventConfig;

/// Serializes tests that use the process-wide runtime.
pub(crate) fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the service received, besides chunks.
#[derive(Default, Debug)]
pub(crate) struct Received {
    /// Non-commit messages, in order.
    pub messages: Vec<Outgoing>,
    /// Flush ids acknowledged, in order.
    pub flush_acks: Vec<u64>,
    /// Commits received (count).
    pub commits: usize,
    /// Chunk bytes (header + payload) by (writer id, chunk id).
    chunks: BTreeMap<(u32, u32), Vec<u8>>,
    /// (writer id -> target buffer) for every chunk, to check targets.
    pub chunk_targets: HashMap<u32, u32>,
    /// Index in `messages` at which each chunk of a writer first arrived.
    pub first_chunk_at: HashMap<u32, usize>,
    /// Patch groups applied.
    pub patches_applied: usize,
}

/// One writer's reassembled packets.
#[derive(Default, Debug)]
pub(crate) struct Sequence {
    pub packets: Vec<Vec<u8>>,
    /// Packets abandoned by the writer (drop sentinels).
    pub dropped: usize,
    /// Packets lost to gaps in chunk ids.
    pub gaps: usize,
}

pub(crate) struct Loopback {
    pub arbiter: Arc<Arbiter>,
    received: Arc<Mutex<Received>>,
    stop: Arc<AtomicBool>,
    pump: Option<JoinHandle<()>>,
}

fn handle(arbiter: &Arbiter, rx: &mut Received, msg: Outgoing) {
    match msg {
        Outgoing::Commit(mut c) => {
            arbiter.materialize(&mut c.chunks_to_move);
            // Like the connection's sender: big requests travel as several
            // (tiny parts here, to exercise the split on every test).
            for part in c.split(3) {
                handle_commit(arbiter, rx, &part);
            }
            runtime().outbox().recycle(c);
            arbiter.commit_sent();
        }
        // A service answers it; nothing to keep.
        Outgoing::Sync(_) => {}
        other => rx.messages.push(other),
    }
}

/// What a service does with one `CommitData`: move the chunks out of the
/// SMB, then apply the patches (each must find its chunk), then the ack.
fn handle_commit(
    arbiter: &Arbiter,
    rx: &mut Received,
    c: &crate::connection::outbox::CommitRequest,
) {
    rx.commits += 1;
    for m in &c.chunks_to_move {
        let bytes = match &m.data {
            Some(d) => d.clone(),
            None => {
                let r = arbiter
                    .smb()
                    .try_acquire_chunk_for_reading(m.page as usize, m.chunk as usize)
                    .expect("committed chunk is Complete");
                let mut buf = vec![0u8; r.chunk_size()];
                let copied = r.copy_out(&mut buf).expect("valid chunk");
                r.release_as_free().expect("release");
                buf.truncate(copied.len);
                buf
            }
        };
        let header =
            shmtrace_abi::layout::ChunkHeaderRepr::from_bytes(bytes[..8].try_into().unwrap());
        let writer = u32::from(header.writer_id);
        rx.chunk_targets.insert(writer, m.target_buffer);
        let at = rx.messages.len();
        rx.first_chunk_at.entry(writer).or_insert(at);
        rx.chunks.insert((writer, header.chunk_id), bytes);
    }
    for p in &c.chunks_to_patch {
        let chunk = rx
            .chunks
            .get_mut(&(p.writer_id, p.chunk_id))
            .expect("patch for a chunk committed before it");
        let entries: Vec<(u32, &[u8])> =
            p.patches.iter().map(|e| (e.offset, &e.data[..])).collect();
        let outcome = apply_patches(&mut chunk[8..], entries).expect("few patches");
        assert!(outcome.failed.is_none(), "patch failed: {outcome:?}");
        rx.patches_applied += 1;
    }
    if c.flush_request_id != 0 {
        rx.flush_acks.push(c.flush_request_id);
    }
}

impl Loopback {
    /// Connects the runtime to a fresh SMB of `size` bytes (4 KiB pages).
    pub(crate) fn new(size: usize, layout: PageLayout, emulated: bool) -> Self {
        let rt = runtime();
        rt.connected();
        let shm = SharedMemory::heap(size, PageSize::DEFAULT).unwrap();
        let arbiter = rt.setup_smb(shm, emulated, layout);
        let received = Arc::new(Mutex::new(Received::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let pump = {
            let (arbiter, received, stop) = (arbiter.clone(), received.clone(), stop.clone());
            std::thread::spawn(move || {
                crate::smb::arbiter::forbid_stalls_on_this_thread();
                while !stop.load(Ordering::Acquire) {
                    {
                        let mut rx = received.lock().unwrap();
                        while let Some(msg) = rt.outbox().try_next() {
                            handle(&arbiter, &mut rx, msg);
                        }
                    }
                    rt.outbox().wait(Duration::from_millis(2));
                }
            })
        };
        Loopback {
            arbiter,
            received,
            stop,
            pump: Some(pump),
        }
    }

    /// Connects without a pump thread: nothing is drained until
    /// [`Loopback::drain`] or [`Loopback::discard`] is called.
    pub(crate) fn manual(size: usize, layout: PageLayout) -> Self {
        Self::manual_with(size, layout, false)
    }

    /// [`Loopback::manual`], under shmem emulation if `emulated`.
    pub(crate) fn manual_with(size: usize, layout: PageLayout, emulated: bool) -> Self {
        let rt = runtime();
        rt.connected();
        let shm = SharedMemory::heap(size, PageSize::DEFAULT).unwrap();
        let arbiter = rt.setup_smb(shm, emulated, layout);
        Loopback {
            arbiter,
            received: Arc::new(Mutex::new(Received::default())),
            stop: Arc::new(AtomicBool::new(false)),
            pump: None,
        }
    }

    /// Frees every committed chunk without keeping its contents; returns
    /// how many.
    pub(crate) fn discard(&self) -> usize {
        let mut freed = 0;
        while let Some(msg) = runtime().outbox().try_next() {
            if let Outgoing::Commit(c) = msg {
                for m in &c.chunks_to_move {
                    if let Ok(r) = self
                        .arbiter
                        .smb()
                        .try_acquire_chunk_for_reading(m.page as usize, m.chunk as usize)
                    {
                        let _ = r.release_as_free();
                        freed += 1;
                    }
                }
                runtime().outbox().recycle(c);
                self.arbiter.commit_sent();
            }
        }
        freed
    }

    /// Drains whatever is queued right now (the pump also does).
    pub(crate) fn drain(&self) {
        let mut rx = self.received.lock().unwrap();
        while let Some(msg) = runtime().outbox().try_next() {
            handle(&self.arbiter, &mut rx, msg);
        }
    }

    pub(crate) fn received(&self) -> MutexGuard<'_, Received> {
        self.received.lock().unwrap()
    }

    /// Sets up and starts a track_event instance.
    pub(crate) fn start_track_event(&self, id: u64, buffer: u32, cfg: TrackEventConfig) {
        let config = DataSourceConfig {
            name: crate::TRACK_EVENT_DATA_SOURCE.into(),
            target_buffer: buffer,
            track_event_config: Some(cfg),
            ..Default::default()
        };
        assert!(runtime().setup_data_source(id, config));
        runtime().start_data_source(id);
    }

    /// Every writer's packets, reassembled from its chunks in id order.
    pub(crate) fn sequences(&self) -> BTreeMap<u32, Sequence> {
        self.drain();
        let rx = self.received();
        let mut out: BTreeMap<u32, Sequence> = BTreeMap::new();
        let mut partial: HashMap<u32, (u32, Vec<u8>)> = HashMap::new();
        let mut last_id: HashMap<u32, u32> = HashMap::new();
        for (&(writer, chunk_id), bytes) in &rx.chunks {
            let seq = out.entry(writer).or_default();
            if let Some(prev) = last_id.insert(writer, chunk_id) {
                if prev + 1 != chunk_id && partial.remove(&writer).is_some() {
                    seq.gaps += 1;
                }
            }
            let (_, frags) = Fragments::from_chunk(bytes).expect("valid chunk");
            for f in frags {
                match f.expect("well-formed fragments") {
                    FragmentEvent::Dropped(d) => {
                        if d.continues_from_prev {
                            partial.remove(&writer);
                        }
                        seq.dropped += 1;
                    }
                    FragmentEvent::Data(f) => {
                        if f.continues_from_prev {
                            match partial.get_mut(&writer) {
                                Some((id, buf)) if *id + 1 == chunk_id => {
                                    buf.extend_from_slice(f.data)
                                }
                                _ => {
                                    seq.gaps += 1;
                                    continue;
                                }
                            }
                        } else {
                            partial.insert(writer, (chunk_id, f.data.to_vec()));
                        }
                        if f.continues_on_next {
                            if let Some(p) = partial.get_mut(&writer) {
                                p.0 = chunk_id;
                            }
                        } else if let Some((_, buf)) = partial.remove(&writer) {
                            seq.packets.push(buf);
                        }
                    }
                }
            }
        }
        out
    }

    /// Stops everything: the runtime disconnects, the pump ends.
    pub(crate) fn shutdown(self) {
        self.drain();
    }
}

impl Drop for Loopback {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(p) = self.pump.take() {
            let _ = p.join();
        }
        runtime().disconnected();
    }
}
