//! Config validation: what `EnableTracing` accepts (upstream's checks in
//! `TracingServiceImpl::EnableTracing`, src/tracing/service/tracing_service_impl.cc),
//! and what an accepted config resolves to.

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;
use prost::Message;
use regex::Regex;

use super::{MAX_BUFFERS_PER_SESSION, MAX_DURATION_MS, MAX_SESSIONS, MAX_SESSIONS_PER_UID};
use crate::protos::trace_config::{self};
use crate::protos::{DataSourceConfig, TraceConfig};
use crate::service::buffer::TraceBuffer;
use crate::service::core::filter::TraceFilter;
use crate::service::core::triggers::{self, TriggerSetup};
use crate::service::core::{ConfigError, ConnId, TracingService};

/// A config that passed validation, with what it resolved.
pub(in crate::service::core) struct Validated {
    /// The config.
    pub(super) config: TraceConfig,
    /// Per config data source: its decoded config and buffer index.
    pub(super) data_sources: Vec<(DataSourceConfig, usize)>,
    /// Per config data source: its compiled producer_name_regex_filter.
    pub(super) regexes: Vec<Vec<Regex>>,
    /// Its triggers.
    pub(super) triggers: TriggerSetup,
    /// Its compiled `trace_filter`.
    pub(super) filter: Option<Arc<TraceFilter>>,
}

impl TracingService {
    /// Validates a config for a consumer of `uid` (upstream's checks at the
    /// start of `TracingServiceImpl::EnableTracing`,
    /// src/tracing/service/tracing_service_impl.cc).
    pub(in crate::service::core) fn validate(
        &mut self,
        raw: &Bytes,
        conn: ConnId,
        uid: u32,
        has_fd: bool,
    ) -> Result<Validated, ConfigError> {
        let config = TraceConfig::decode(raw.clone()).map_err(ConfigError::Decode)?;
        match config.lockdown_mode {
            Some(x) if x == trace_config::LockdownModeOperation::LockdownSet as i32 => {
                self.lockdown = true
            }
            Some(x) if x == trace_config::LockdownModeOperation::LockdownClear as i32 => {
                self.lockdown = false
            }
            _ => {}
        }
        if self.consumer(conn).is_some_and(|c| c.session.is_some()) {
            return Err(ConfigError::SessionActive);
        }
        if config.duration_ms.unwrap_or(0) > MAX_DURATION_MS {
            return Err(ConfigError::DurationTooLong);
        }
        let triggers = triggers::validate(&config)?;
        // Upstream refuses a session whose filter does not load rather
        // than run it unfiltered.
        let filter = match &config.trace_filter {
            Some(f) => Some(Arc::new(TraceFilter::new(f)?)),
            None => None,
        };
        // Deflate is done (see the compress module); zstd, which upstream
        // prefers when both are asked, is not.
        if config
            .compression
            .as_ref()
            .is_some_and(|c| c.zstd.is_some())
        {
            return Err(ConfigError::ZstdCompression);
        }
        if config.buffers.len() > MAX_BUFFERS_PER_SESSION {
            return Err(ConfigError::TooManyBuffers(config.buffers.len()));
        }
        let mut names = BTreeSet::new();
        let mut asked = 0u64;
        for (i, b) in config.buffers.iter().enumerate() {
            let size = u64::from(b.size_kb.unwrap_or(0)) * 1024;
            if size == 0 || size > u64::from(u32::MAX) {
                return Err(ConfigError::BufferSize {
                    index: i,
                    size_kb: b.size_kb.unwrap_or(0),
                });
            }
            asked += buffer_capacity(b) as u64;
            if let Some(name) = b.name.as_deref().filter(|n| !n.is_empty()) {
                if !names.insert(name) {
                    return Err(ConfigError::DuplicateBufferName(name.to_owned()));
                }
            }
        }
        let held = self.buffer_bytes_held();
        if held + asked > self.cfg.max_buffer_bytes {
            return Err(ConfigError::BufferMemory {
                asked,
                held,
                limit: self.cfg.max_buffer_bytes,
            });
        }
        let mut data_sources = Vec::new();
        let mut regexes = Vec::new();
        for ds in &config.data_sources {
            let dsc: DataSourceConfig = crate::protos::from_raw(ds.config.as_ref())
                .map_err(ConfigError::DecodeDataSource)?;
            let name = dsc.name.clone().unwrap_or_default();
            let mut index = dsc.target_buffer.unwrap_or(0) as usize;
            if let Some(bname) = dsc.target_buffer_name.as_deref().filter(|n| !n.is_empty()) {
                let by_name = config
                    .buffers
                    .iter()
                    .position(|b| b.name.as_deref() == Some(bname))
                    .ok_or_else(|| ConfigError::NoBufferNamed {
                        data_source: name.clone(),
                        buffer: bname.to_owned(),
                    })?;
                if dsc.target_buffer.is_some_and(|t| t as usize != by_name) {
                    return Err(ConfigError::TargetBufferMismatch(name));
                }
                index = by_name;
            }
            if index >= config.buffers.len() {
                return Err(ConfigError::NoSuchBuffer {
                    data_source: name,
                    index,
                    buffers: config.buffers.len(),
                });
            }
            let mut compiled = Vec::new();
            for pattern in &ds.producer_name_regex_filter {
                let re = Regex::new(&format!("^(?:{pattern})$")).map_err(|source| {
                    ConfigError::ProducerNameRegex {
                        pattern: pattern.clone(),
                        source,
                    }
                })?;
                compiled.push(re);
            }
            regexes.push(compiled);
            data_sources.push((dsc, index));
        }
        if let Some(name) = config
            .unique_session_name
            .as_deref()
            .filter(|n| !n.is_empty())
        {
            if self
                .sessions
                .values()
                .filter(|s| s.state != super::SessionState::ClonedReadOnly)
                .any(|s| s.config.unique_session_name.as_deref() == Some(name))
            {
                return Err(ConfigError::SessionNameTaken(name.to_owned()));
            }
        }
        self.check_semaphores(&config)?;
        // Clones in progress hold a session each.
        let (all, of_uid) = self.sessions_held(uid);
        if all >= MAX_SESSIONS {
            return Err(ConfigError::TooManySessions);
        }
        if of_uid >= MAX_SESSIONS_PER_UID {
            return Err(ConfigError::TooManySessionsForUid(uid));
        }
        if config.write_into_file.unwrap_or(false) {
            let has_path = config.output_path.as_deref().is_some_and(|p| !p.is_empty());
            if has_path == has_fd {
                return Err(ConfigError::WriteIntoFileTarget);
            }
        }
        let free_ids = usize::from(u16::MAX) - self.buffers.len();
        if config.buffers.len() > free_ids {
            return Err(ConfigError::NoBufferIds);
        }
        Ok(Validated {
            config,
            data_sources,
            regexes,
            triggers,
            filter,
        })
    }
}

impl TracingService {
    /// `session_semaphores` (upstream's check in
    /// `TracingServiceImpl::EnableTracing`): for each semaphore `config`
    /// declares, the running sessions (not stopped, not clones) that
    /// declare it must number at most the smallest `max_other_session_count`
    /// of all of them and of `config`'s.
    fn check_semaphores(&self, config: &TraceConfig) -> Result<(), ConfigError> {
        for sem in &config.session_semaphores {
            let name = sem.name.as_deref().unwrap_or_default();
            let holders: Vec<u64> = self
                .sessions
                .values()
                .filter(|s| {
                    !matches!(
                        s.state,
                        super::SessionState::Disabled | super::SessionState::ClonedReadOnly
                    )
                })
                .flat_map(|s| &s.config.session_semaphores)
                .filter(|h| h.name.as_deref().unwrap_or_default() == name)
                .map(|h| h.max_other_session_count.unwrap_or(0))
                .collect();
            let Some(&smallest) = holders.iter().min() else {
                continue;
            };
            let mine = sem.max_other_session_count.unwrap_or(0);
            if holders.len() as u64 > mine.min(smallest) {
                return Err(ConfigError::SemaphoreTaken {
                    name: name.to_owned(),
                    holders: holders.len() as u64,
                    mine,
                    smallest,
                });
            }
        }
        Ok(())
    }
}

/// The bytes a buffer of `config` takes (at least [`TraceBuffer::MIN_SIZE`]).
pub(super) fn buffer_capacity(config: &crate::protos::trace_config::BufferConfig) -> usize {
    (config.size_kb.unwrap_or(0) as usize * 1024).max(TraceBuffer::MIN_SIZE)
}
