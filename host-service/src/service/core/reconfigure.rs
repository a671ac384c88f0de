//! `ConsumerPort.ChangeTraceConfig`, limited to what upstream allows: the
//! `producer_name_filter` / `producer_name_regex_filter` of the session's
//! data sources.
//!
//! For each data source of the session, the first data source of the new
//! config with the same name gives the new filters (a data source missing
//! from the new config keeps its filters). Producers that now pass the
//! filters and have no instance in the session yet get one — set up, and
//! started if the session is. Instances already running are left alone
//! (narrowing a filter stops nothing), and every other difference in the new
//! config is ignored, as upstream does; both are logged. A new config that
//! does not decode, or a regex that does not compile, fails the call and
//! changes nothing. A session that is neither configured nor started is left
//! as is (the call still succeeds, like upstream's).

use regex::Regex;

use super::session::SessionState;
use super::{ConfigError, ProducerId, SessionId, TracingService};
use crate::protos::{DataSourceConfig, DataSourceDescriptor, TraceConfig};

/// The new filters of one data source of the session.
struct NewFilters {
    index: usize,
    names: Vec<String>,
    patterns: Vec<String>,
    regexes: Vec<Regex>,
}

fn ds_name(ds: &crate::protos::trace_config::DataSource) -> Option<String> {
    crate::protos::from_raw::<DataSourceConfig>(ds.config.as_ref())
        .ok()?
        .name
}

impl TracingService {
    /// Applies `raw` (a serialized `TraceConfig`) to session `sid`; `Err`
    /// says why nothing was changed.
    pub(super) fn change_trace_config(
        &mut self,
        sid: SessionId,
        raw: &[u8],
    ) -> Result<(), ConfigError> {
        let new = <TraceConfig as prost::Message>::decode(raw).map_err(ConfigError::DecodeNew)?;
        let Some(s) = self.sessions.get(&sid) else {
            return Ok(());
        };
        if !matches!(s.state, SessionState::Configured | SessionState::Started) {
            log::info!("session {sid}: ChangeTraceConfig on a session that is not running");
            return Ok(());
        }
        let new_names: Vec<Option<String>> = new.data_sources.iter().map(ds_name).collect();
        let mut changes = Vec::new();
        for (index, ds) in s.config.data_sources.iter().enumerate() {
            let name = ds_name(ds);
            let Some(i) = new_names.iter().position(|n| *n == name) else {
                log::info!("session {sid}: ChangeTraceConfig lacks data source {name:?}");
                continue;
            };
            let updated = &new.data_sources[i];
            let mut regexes = Vec::new();
            for pattern in &updated.producer_name_regex_filter {
                regexes.push(Regex::new(&format!("^(?:{pattern})$")).map_err(|source| {
                    ConfigError::ProducerNameRegex {
                        pattern: pattern.clone(),
                        source,
                    }
                })?);
            }
            changes.push(NewFilters {
                index,
                names: updated.producer_name_filter.clone(),
                patterns: updated.producer_name_regex_filter.clone(),
                regexes,
            });
        }
        let mut ignored = new.clone();
        let mut current = s.config.clone();
        for ds in ignored
            .data_sources
            .iter_mut()
            .chain(&mut current.data_sources)
        {
            ds.producer_name_filter.clear();
            ds.producer_name_regex_filter.clear();
        }
        if ignored != current {
            log::info!(
                "session {sid}: ChangeTraceConfig changes more than producer name filters; \
                 only those are applied"
            );
        }
        let Some(s) = self.sessions.get_mut(&sid) else {
            return Ok(());
        };
        for c in &changes {
            if let Some(ds) = s.config.data_sources.get_mut(c.index) {
                ds.producer_name_filter = c.names.clone();
                ds.producer_name_regex_filter = c.patterns.clone();
            }
        }
        for c in changes {
            if let Some(r) = s.regexes.get_mut(c.index) {
                *r = c.regexes;
            }
        }
        let entries = s.config.data_sources.len();
        for index in 0..entries {
            // Producers with an instance in the session count as set up.
            let Some(s) = self.sessions.get(&sid) else {
                return Ok(());
            };
            let set_up: Vec<ProducerId> = s.instances.iter().map(|i| i.producer).collect();
            let candidates: Vec<(ProducerId, DataSourceDescriptor)> = self
                .producers
                .iter()
                .filter(|(id, _)| !set_up.contains(id))
                .flat_map(|(&id, p)| p.data_sources.iter().map(move |d| (id, d.clone())))
                .collect();
            for (producer, desc) in candidates {
                self.maybe_setup_instance(sid, index, producer, &desc);
            }
        }
        Ok(())
    }
}
