//! The producer port: every `ProducerPort` RPC
//! (protos/perfetto/ipc/producer_port.proto; upstream's
//! src/tracing/ipc/service/producer_ipc_service.cc and
//! src/tracing/service/tracing_service_endpoints_impl.cc).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::os::fd::OwnedFd;

use bytes::Bytes;
use prost::Message;

use super::{BufferId, ConnId, Endpoint, PeerFault, ProducerId, TracingService};
use crate::ipc::{Call, PendingReply};
use crate::protos::get_async_command_response::Cmd;
use crate::protos::initialize_connection_request::ProducerSmbScrapingMode;
use crate::protos::producer_port::Request;
use crate::protos::{
    ActivateTriggersResponse, DataSourceDescriptor, GetAsyncCommandResponse,
    InitializeConnectionRequest, InitializeConnectionResponse, NotifyDataSourceStartedResponse,
    NotifyDataSourceStoppedResponse, RegisterDataSourceResponse, RegisterTraceWriterResponse,
    SyncResponse, UnregisterDataSourceResponse, UnregisterTraceWriterResponse,
    UpdateDataSourceResponse,
};
use crate::service::buffer::WriterId;
use crate::service::shm::SharedMemory;

/// The `ProtocolAbiVersion` bit of the SMB ABI v1: the only one this
/// service speaks.
const PROTOCOL_ABI_V1: u32 = 1;

/// Commands queued for a producer that has not asked for them yet, beyond
/// which it is disconnected (it is not reading its command stream).
const MAX_QUEUED_COMMANDS: usize = 4096;

/// Most data sources one producer may have registered at once. Upstream
/// keeps every registration (`TracingServiceImpl::RegisterDataSource`,
/// src/tracing/service/tracing_service_impl.cc, with no limit); here a
/// producer that registers without end would cost the service memory and,
/// as every registration is checked against the producer's others and
/// every session's data sources, CPU time for all its peers. Real
/// producers register a few dozen.
pub const MAX_DATA_SOURCES_PER_PRODUCER: usize = 1024;

/// Most bytes the descriptors one producer has registered may take
/// together (as encoded): one descriptor may fill an IPC frame (128 KiB),
/// and with [`MAX_DATA_SOURCES_PER_PRODUCER`] alone a producer could hold
/// 128 MiB. With the shell's producer connection limit, all producers hold
/// at most 256 MiB of descriptors.
pub const MAX_DESCRIPTOR_BYTES_PER_PRODUCER: usize = 256 * 1024;

/// A connected, initialized producer.
#[derive(Debug)]
pub struct Producer {
    /// Its connection.
    pub conn: ConnId,
    /// Its uid (peer credentials).
    pub uid: u32,
    /// Its pid (peer credentials; 0 if unknown).
    pub pid: i32,
    /// Its machine (id 0: this one).
    pub machine: super::Machine,
    /// The name it gave.
    pub name: String,
    /// The SDK version it gave.
    pub sdk_version: String,
    /// SMB size hint.
    pub shm_size_hint: u32,
    /// SMB page size hint.
    pub page_size_hint: u32,
    /// Scrape its SMB on flush, stop and disconnect.
    pub scraping: bool,
    /// Its SMB, once created (or adopted). Always `None` under shmem
    /// emulation.
    pub smb: Option<SharedMemory>,
    /// Shmem emulation (a transport without descriptor passing): its
    /// chunks arrive inline, it scrapes itself, the service has no SMB of
    /// it to read or scrape.
    pub emulated: bool,
    /// Under emulation: `SetupTracing` (page size, no descriptor) was sent.
    pub emulated_setup_sent: bool,
    /// The `GetAsyncCommand` stream.
    commands: Option<PendingReply>,
    /// Commands generated before the stream was opened.
    queued: VecDeque<(Bytes, Option<OwnedFd>)>,
    /// Registered data sources (at most [`MAX_DATA_SOURCES_PER_PRODUCER`]).
    pub data_sources: Vec<DataSourceDescriptor>,
    /// Encoded bytes of `data_sources` (at most
    /// [`MAX_DESCRIPTOR_BYTES_PER_PRODUCER`]).
    descriptor_bytes: usize,
    /// A registration was refused over the limits since the last
    /// unregistration (one log line each time).
    over_data_source_limit: bool,
    /// Registered writers and their target buffers.
    pub writers: HashMap<WriterId, BufferId>,
    /// Buffers it may write into (buffers of sessions where it has an
    /// instance).
    pub allowed_buffers: HashSet<BufferId>,
}

/// Longest name (of a producer, a data source) a log line shows.
const SHOWN_NAME_CHARS: usize = 80;

/// `name` for a log line: names are the producer's choice and may fill an
/// IPC frame, so at most [`SHOWN_NAME_CHARS`] characters of it, then `…`.
fn shown(name: &str) -> std::borrow::Cow<'_, str> {
    match name.char_indices().nth(SHOWN_NAME_CHARS) {
        Some((end, _)) => format!("{}…", name.get(..end).unwrap_or_default()).into(),
        None => name.into(),
    }
}

impl TracingService {
    /// Dispatches one `ProducerPort` call.
    pub fn on_producer_call(&mut self, conn: ConnId, call: Call<Request>) {
        let Some(Endpoint::Producer {
            creds,
            id,
            emulated,
            machine,
        }) = self.conns.get(&conn)
        else {
            return;
        };
        let (creds, id, emulated) = (*creds, *id, *emulated);
        let to = call.reply;
        let request = match (call.request, id) {
            (Request::InitializeConnection(req), None) => {
                let machine = machine.clone();
                self.initialize_connection(conn, creds, emulated, machine, to, req, call.fd);
                return;
            }
            (Request::InitializeConnection(_), Some(_)) => {
                log::info!("producer connection {}: InitializeConnection twice", conn.0);
                self.reject(conn, &to);
                return;
            }
            (_, None) => {
                log::info!(
                    "producer connection {}: call before InitializeConnection",
                    conn.0
                );
                self.reject(conn, &to);
                return;
            }
            (request, Some(id)) => (request, id),
        };
        let (request, producer) = request;
        match request {
            Request::InitializeConnection(_) => {}
            Request::RegisterDataSource(req) => {
                let error = req
                    .data_source_descriptor
                    .and_then(|d| self.register_data_source(producer, d).err());
                self.reply(conn, &to, &RegisterDataSourceResponse { error }, false);
            }
            Request::UpdateDataSource(req) => {
                let updated = match req.data_source_descriptor {
                    Some(d) => self.update_data_source(producer, d),
                    None => Ok(()),
                };
                match updated {
                    Ok(()) => self.reply(conn, &to, &UpdateDataSourceResponse {}, false),
                    Err(()) => self.reject(conn, &to),
                }
            }
            Request::UnregisterDataSource(req) => {
                self.unregister_data_source(producer, req.data_source_name.unwrap_or_default());
                self.reply(conn, &to, &UnregisterDataSourceResponse {}, false);
            }
            Request::CommitData(req) => {
                let usable = self
                    .producers
                    .get(&producer)
                    .is_some_and(|p| p.smb.is_some() || p.emulated);
                let inline = req.chunks_to_move.iter().all(|c| c.data.is_some());
                if !usable && !inline {
                    // Upstream ignores it and the unresolved reply fails.
                    self.reject(conn, &to);
                    return;
                }
                match self.commit_data(producer, req) {
                    Ok(()) => self.reply(conn, &to, &crate::protos::CommitDataResponse {}, false),
                    Err(fault) => self.disconnect_peer(conn, fault.into()),
                }
            }
            Request::GetAsyncCommand(_) => self.open_command_stream(producer, to),
            Request::RegisterTraceWriter(req) => {
                let writer = req.trace_writer_id.unwrap_or(0);
                let buffer = req.target_buffer.unwrap_or(0);
                log::debug!("producer {producer}: writer {writer} registered for buffer {buffer}");
                if let (Ok(writer), Ok(buffer)) =
                    (WriterId::try_from(writer), BufferId::try_from(buffer))
                {
                    if let Some(p) = self.producers.get_mut(&producer) {
                        p.writers.insert(writer, buffer);
                    }
                }
                self.reply(conn, &to, &RegisterTraceWriterResponse {}, false);
            }
            Request::UnregisterTraceWriter(req) => {
                log::debug!(
                    "producer {producer}: writer {:?} unregistered",
                    req.trace_writer_id
                );
                if let Ok(writer) = WriterId::try_from(req.trace_writer_id.unwrap_or(0)) {
                    if let Some(p) = self.producers.get_mut(&producer) {
                        p.writers.remove(&writer);
                        for b in p.allowed_buffers.iter() {
                            if let Some((_, buf)) = self.buffers.get_mut(b) {
                                buf.writer_unregistered(producer, writer);
                            }
                        }
                    }
                }
                self.reply(conn, &to, &UnregisterTraceWriterResponse {}, false);
            }
            Request::NotifyDataSourceStarted(req) => {
                self.instance_started(producer, req.data_source_id.unwrap_or(0));
                self.reply(conn, &to, &NotifyDataSourceStartedResponse {}, false);
            }
            Request::NotifyDataSourceStopped(req) => {
                self.instance_stopped(producer, req.data_source_id.unwrap_or(0));
                self.reply(conn, &to, &NotifyDataSourceStoppedResponse {}, false);
            }
            Request::ActivateTriggers(req) => {
                self.activate_triggers(producer, &req.trigger_names);
                self.reply(conn, &to, &ActivateTriggersResponse {}, false);
            }
            // Every earlier request of this connection has been handled.
            Request::Sync(_) => self.reply(conn, &to, &SyncResponse {}, false),
            Request::AttachV2RingBuffer(_) | Request::DrainV2RingBuffer(_) => {
                log::info!("producer {producer}: tracing v2 ring buffers are not supported (not negotiated)");
                self.reject(conn, &to);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn initialize_connection(
        &mut self,
        conn: ConnId,
        creds: crate::ipc::PeerCredentials,
        emulated: bool,
        machine: super::Machine,
        to: PendingReply,
        req: InitializeConnectionRequest,
        fd: Option<OwnedFd>,
    ) {
        if self.lockdown && (emulated || creds.uid != self.cfg.uid) {
            log::info!(
                "lockdown: refusing producer of uid {}{}",
                creds.uid,
                if emulated { " (remote)" } else { "" }
            );
            self.reject(conn, &to);
            return;
        }
        let versions = req.supported_protocol_abi_versions;
        if versions.is_some_and(|v| v != 0 && v & PROTOCOL_ABI_V1 == 0) {
            log::info!(
                "producer supports no protocol ABI version this service speaks ({versions:?})"
            );
            self.reject(conn, &to);
            return;
        }
        let Some(id) = self.alloc_producer_id() else {
            log::warn!("no producer ids left");
            self.reject(conn, &to);
            return;
        };
        let scraping =
            req.smb_scraping_mode == Some(ProducerSmbScrapingMode::SmbScrapingEnabled as i32);
        let mut smb = None;
        if req.producer_provided_shmem.unwrap_or(false) && !emulated {
            match fd {
                Some(fd) => match self
                    .env
                    .adopt_smb(fd, req.shared_memory_page_size_hint_bytes.unwrap_or(0))
                {
                    Ok(shm) => smb = Some(shm),
                    Err(e) => log::info!("refusing the producer's shared memory: {e}"),
                },
                None => log::info!("producer_provided_shmem without a descriptor"),
            }
        }
        let provided = smb.is_some();
        let producer = Producer {
            conn,
            uid: creds.uid,
            pid: creds.pid,
            machine,
            name: req.producer_name.unwrap_or_default(),
            sdk_version: req.sdk_version.unwrap_or_default(),
            shm_size_hint: req.shared_memory_size_hint_bytes.unwrap_or(0),
            page_size_hint: req.shared_memory_page_size_hint_bytes.unwrap_or(0),
            scraping,
            smb,
            emulated,
            emulated_setup_sent: false,
            commands: None,
            queued: VecDeque::new(),
            data_sources: Vec::new(),
            descriptor_bytes: 0,
            over_data_source_limit: false,
            writers: HashMap::new(),
            allowed_buffers: HashSet::new(),
        };
        log::info!(
            "producer {id} {:?} connected (pid {}, uid {}{}{})",
            shown(&producer.name),
            creds.pid,
            creds.uid,
            if emulated { ", shmem emulation" } else { "" },
            match producer.machine.id {
                0 => String::new(),
                m => format!(", machine {m} {:?}", shown(&producer.machine.name)),
            }
        );
        self.producers.insert(id, producer);
        self.stats.producers_seen += 1;
        if let Some(Endpoint::Producer { id: slot, .. }) = self.conns.get_mut(&conn) {
            *slot = Some(id);
        }
        let resp = InitializeConnectionResponse {
            using_shmem_provided_by_producer: Some(provided),
            direct_smb_patching_supported: Some(true),
            use_shmem_emulation: Some(emulated),
            protocol_abi_versions: versions.map(|v| v & PROTOCOL_ABI_V1),
        };
        self.reply(conn, &to, &resp, false);
        if provided {
            // The SMB exists already: SetupTracing carries no descriptor.
            let setup = crate::protos::get_async_command_response::SetupTracing::default();
            self.send_command(id, Cmd::SetupTracing(setup), None);
        }
    }

    fn alloc_producer_id(&mut self) -> Option<ProducerId> {
        if self.producers.len() >= usize::from(u16::MAX) {
            return None;
        }
        loop {
            self.last_producer_id = self.last_producer_id.wrapping_add(1);
            if self.last_producer_id != 0 && !self.producers.contains_key(&self.last_producer_id) {
                return Some(self.last_producer_id);
            }
        }
    }

    /// Registers a data source; `Err` is the error the response carries
    /// when the producer is over its limits. A descriptor without a name or
    /// with a duplicate id is ignored without an error, as upstream does.
    fn register_data_source(
        &mut self,
        producer: ProducerId,
        d: DataSourceDescriptor,
    ) -> Result<(), String> {
        let Some(p) = self.producers.get_mut(&producer) else {
            return Ok(());
        };
        let name = d.name.clone().unwrap_or_default();
        if name.is_empty() {
            log::info!("producer {producer}: ignoring a data source without a name");
            return Ok(());
        }
        let id = d.id.unwrap_or(0);
        if id != 0 && p.data_sources.iter().any(|x| x.id == Some(id)) {
            log::info!(
                "producer {producer}: ignoring data source {:?} with a duplicate id {id}",
                shown(&name)
            );
            return Ok(());
        }
        let len = d.encoded_len();
        let error = if p.data_sources.len() >= MAX_DATA_SOURCES_PER_PRODUCER {
            Some(format!(
                "too many data sources: a producer may register at most \
                 {MAX_DATA_SOURCES_PER_PRODUCER}"
            ))
        } else if p.descriptor_bytes + len > MAX_DESCRIPTOR_BYTES_PER_PRODUCER {
            Some(format!(
                "data source descriptors too large: this one takes {len} B and the producer's \
                 others {} B, over the limit of {MAX_DESCRIPTOR_BYTES_PER_PRODUCER} B per producer",
                p.descriptor_bytes
            ))
        } else {
            None
        };
        if let Some(error) = error {
            // Once per producer: a hostile one may keep trying.
            if !p.over_data_source_limit {
                p.over_data_source_limit = true;
                log::warn!(
                    "producer {producer} {:?}: refusing data source {:?}: {error}",
                    shown(&p.name),
                    shown(&name)
                );
            }
            return Err(error);
        }
        p.descriptor_bytes += len;
        p.data_sources.push(d.clone());
        self.stats.data_sources_seen += 1;
        // Sessions running or set up that want it get it now.
        let wanting: Vec<(u64, usize)> = self
            .sessions
            .values()
            .filter(|s| {
                matches!(
                    s.state,
                    super::session::SessionState::Configured
                        | super::session::SessionState::Started
                )
            })
            .flat_map(|s| {
                let sid = s.id;
                s.config
                    .data_sources
                    .iter()
                    .enumerate()
                    .map(move |(i, _)| (sid, i))
            })
            .collect();
        for (sid, index) in wanting {
            self.maybe_setup_instance(sid, index, producer, &d);
        }
        Ok(())
    }

    /// Replaces a registered descriptor; `Err` if the new one would take
    /// the producer over [`MAX_DESCRIPTOR_BYTES_PER_PRODUCER`] (the old one
    /// stays).
    fn update_data_source(
        &mut self,
        producer: ProducerId,
        d: DataSourceDescriptor,
    ) -> Result<(), ()> {
        let Some(p) = self.producers.get_mut(&producer) else {
            return Ok(());
        };
        let id = d.id.unwrap_or(0);
        let Some(slot) = p
            .data_sources
            .iter_mut()
            .find(|x| id != 0 && x.id == Some(id) && x.name == d.name)
        else {
            log::info!(
                "producer {producer}: UpdateDataSource for an unknown data source {:?}/{id}",
                shown(d.name.as_deref().unwrap_or_default())
            );
            return Ok(());
        };
        let bytes = p.descriptor_bytes - slot.encoded_len() + d.encoded_len();
        if bytes > MAX_DESCRIPTOR_BYTES_PER_PRODUCER {
            log::warn!(
                "producer {producer}: refusing UpdateDataSource of {:?}: its descriptors would \
                 take {bytes} B, over the limit of {MAX_DESCRIPTOR_BYTES_PER_PRODUCER} B",
                shown(d.name.as_deref().unwrap_or_default())
            );
            return Err(());
        }
        *slot = d;
        p.descriptor_bytes = bytes;
        Ok(())
    }

    fn unregister_data_source(&mut self, producer: ProducerId, name: String) {
        let Some(p) = self.producers.get_mut(&producer) else {
            return;
        };
        let Some(pos) = p
            .data_sources
            .iter()
            .position(|d| d.name.as_deref() == Some(name.as_str()))
        else {
            log::info!(
                "producer {producer}: UnregisterDataSource of unknown {:?}",
                shown(&name)
            );
            return;
        };
        let removed = p.data_sources.remove(pos);
        p.descriptor_bytes -= removed.encoded_len();
        p.over_data_source_limit = false;
        let still_registered = p
            .data_sources
            .iter()
            .any(|d| d.name.as_deref() == Some(name.as_str()));
        if still_registered {
            return;
        }
        let mut stops = Vec::new();
        for s in self.sessions.values_mut() {
            for inst in s
                .instances
                .iter_mut()
                .filter(|i| i.producer == producer && i.name == name)
            {
                if inst.state != super::session::InstanceState::Stopped {
                    inst.state = super::session::InstanceState::Stopped;
                    stops.push((s.id, inst.id));
                }
            }
        }
        for (sid, id) in stops {
            let stop = crate::protos::get_async_command_response::StopDataSource {
                instance_id: Some(id),
            };
            self.send_command(producer, Cmd::StopDataSource(stop), None);
            self.notify_instance_state(sid, producer, &name, false);
            self.maybe_finalize(sid);
        }
    }

    fn open_command_stream(&mut self, producer: ProducerId, to: PendingReply) {
        let Some(p) = self.producers.get_mut(&producer) else {
            return;
        };
        let conn = p.conn;
        let queued: Vec<(Bytes, Option<OwnedFd>)> = p.queued.drain(..).collect();
        p.commands = Some(to.clone());
        for (bytes, fd) in queued {
            self.push_command(conn, &to, bytes, fd);
        }
    }

    fn push_command(&mut self, conn: ConnId, to: &PendingReply, bytes: Bytes, fd: Option<OwnedFd>) {
        if to.drop_reply() {
            return;
        }
        self.out.push_back(super::Output::Reply {
            conn,
            to: to.clone(),
            body: super::ReplyBody::Ok(bytes),
            has_more: true,
            fd,
        });
    }

    /// Sends a command on a producer's `GetAsyncCommand` stream (queued
    /// until the stream is open).
    pub(super) fn send_command(&mut self, producer: ProducerId, cmd: Cmd, fd: Option<OwnedFd>) {
        let Some(p) = self.producers.get_mut(&producer) else {
            return;
        };
        let bytes = crate::protos::to_raw(&GetAsyncCommandResponse { cmd: Some(cmd) });
        match p.commands.clone() {
            Some(to) => {
                let conn = p.conn;
                self.push_command(conn, &to, bytes, fd);
            }
            None if p.queued.len() >= MAX_QUEUED_COMMANDS => {
                let conn = p.conn;
                self.disconnect_peer(conn, PeerFault::CommandStreamNeverOpened(producer));
            }
            None => p.queued.push_back((bytes, fd)),
        }
    }

    /// A producer connection closed: scrape what it left in its SMB, end
    /// its sequences and instances, forget it.
    pub(super) fn producer_gone(&mut self, producer: ProducerId) {
        self.scrape_producer(producer, None);
        for (_, buf) in self.buffers.values_mut() {
            buf.producer_gone(producer);
        }
        let mut touched = Vec::new();
        let mut stopped = Vec::new();
        for s in self.sessions.values_mut() {
            let mut any = false;
            for inst in s.instances.iter_mut().filter(|i| i.producer == producer) {
                if inst.state != super::session::InstanceState::Stopped {
                    inst.state = super::session::InstanceState::Stopped;
                    stopped.push((s.id, inst.name.clone()));
                }
                any = true;
            }
            let mut flushes = BTreeMap::new();
            for (&id, f) in s.flushes.iter_mut() {
                if f.pending.remove(&producer) && f.pending.is_empty() {
                    flushes.insert(id, ());
                }
            }
            if any || !flushes.is_empty() {
                touched.push((s.id, flushes.into_keys().collect::<Vec<_>>()));
            }
        }
        for (sid, name) in stopped {
            self.notify_instance_state(sid, producer, &name, false);
        }
        if let Some(p) = self.producers.remove(&producer) {
            log::info!("producer {producer} {:?} disconnected", shown(&p.name));
        }
        for (sid, flushes) in touched {
            for f in flushes {
                self.complete_flush(sid, f, true);
            }
            self.maybe_finalize(sid);
        }
    }
}
