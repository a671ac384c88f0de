//! The data source types of this process and their registration with the
//! service: the narrow interface through which the layers below the
//! runtime reach the process-wide producer state (what Perfetto's
//! `tracing_muxer.h` declares for its SDK). A data source registers here
//! ([`TypeRegistry::register`]); track events reserve their type and
//! advertise it when the program first uses them
//! ([`TypeRegistry::reserve`], [`TypeRegistry::advertise`]). The runtime
//! (`crate::runtime`) builds on the same registry and adds the service's
//! commands.
//!
//! # Invariants
//!
//! * Registrations and updates are queued under one lock, each followed by
//!   an [`Outgoing::Sync`] carrying the new registration generation; a new
//!   connection's opening takes the same lock, so a data source registered
//!   meanwhile reaches it exactly once, and an update never overtakes its
//!   registration.
//! * Names are unique among the types the service may know, except that a
//!   reserved type not advertised yet yields its name to one the program
//!   registers: that one is the process's data source of that name, and the
//!   reserved one is never advertised.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};

use crate::connection::outbox::{DescriptorInfo, Outbox, Outgoing};
use crate::data_source::{DataSourceHandler, DataSourceOptions, DataSourceType, Instance};
use crate::error::RegisterError;

/// The data source types of a process and the outbox their registrations
/// go through.
pub(crate) struct TypeRegistry {
    types: RwLock<Vec<Arc<DataSourceType>>>,
    outbox: Arc<Outbox>,
    next_id: AtomicU64,
    /// Orders registrations and updates among themselves and with a new
    /// connection's opening (module docs).
    registration: Mutex<()>,
    /// Bumped with every registration or update queued for the service
    /// (each is followed by an [`Outgoing::Sync`] carrying the new value;
    /// see [`TypeRegistry::registrations`]).
    registrations: AtomicU64,
}

/// What [`TypeRegistry::advertise`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Advertised {
    /// Queued a registration or an update, or had nothing to do.
    Done,
    /// Nothing: the program registered a data source of the same name.
    NameTaken,
}

/// The process's registry (created on first use, its outbox closed until a
/// connection opens it).
pub(crate) fn registry() -> &'static TypeRegistry {
    static REGISTRY: OnceLock<TypeRegistry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let outbox = Arc::new(Outbox::new());
        // Nothing is sent until a connection opens the outbox.
        outbox.set_closed(true);
        TypeRegistry::new(outbox)
    })
}

impl TypeRegistry {
    /// An empty registry queueing its registrations in `outbox`.
    pub(crate) fn new(outbox: Arc<Outbox>) -> Self {
        TypeRegistry {
            types: RwLock::new(Vec::new()),
            outbox,
            next_id: AtomicU64::new(1),
            registration: Mutex::new(()),
            registrations: AtomicU64::new(1),
        }
    }

    /// The outbox to the service.
    pub(crate) fn outbox(&self) -> &Arc<Outbox> {
        &self.outbox
    }

    /// Every type, in registration order.
    pub(crate) fn types(&self) -> Vec<Arc<DataSourceType>> {
        self.types.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Registers the program's data source `name` and advertises it.
    pub(crate) fn register(
        &self,
        name: &str,
        options: DataSourceOptions,
        handler: Arc<dyn DataSourceHandler>,
    ) -> Result<Arc<DataSourceType>, RegisterError> {
        if name.is_empty() {
            return Err(RegisterError::EmptyName);
        }
        let _order = self.registration_order();
        let mut types = self.types.write().unwrap_or_else(|e| e.into_inner());
        // A reserved type not advertised yet yields its name (a bridge
        // forwarding a firmware's `track_event` chunks, in a program that
        // never used track events itself).
        if types
            .iter()
            .any(|t| t.name == name && (!t.reserved || t.advertised.load(Ordering::Acquire)))
        {
            return Err(RegisterError::AlreadyRegistered(name.to_owned()));
        }
        let ty = self.push(&mut types, name, options, handler, false, None);
        drop(types);
        self.push_registration(Outgoing::RegisterDataSource(descriptor(&ty)));
        Ok(ty)
    }

    /// Reserves the crate's own data source `name`, not advertised until
    /// [`TypeRegistry::advertise`]; `describe` computes its
    /// `TrackEventDescriptor` each time it is advertised.
    pub(crate) fn reserve(
        &self,
        name: &str,
        options: DataSourceOptions,
        handler: Arc<dyn DataSourceHandler>,
        describe: Option<fn() -> Vec<u8>>,
    ) -> Arc<DataSourceType> {
        let mut types = self.types.write().unwrap_or_else(|e| e.into_inner());
        self.push(&mut types, name, options, handler, true, describe)
    }

    fn push(
        &self,
        types: &mut Vec<Arc<DataSourceType>>,
        name: &str,
        options: DataSourceOptions,
        handler: Arc<dyn DataSourceHandler>,
        reserved: bool,
        describe: Option<fn() -> Vec<u8>>,
    ) -> Arc<DataSourceType> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let ty = Arc::new(DataSourceType::new(
            types.len(),
            id,
            name.to_owned(),
            options,
            handler,
            reserved,
            describe,
        ));
        types.push(ty.clone());
        ty
    }

    /// Advertises the reserved type `ty` the first time, and again (an
    /// update) when `changed`; not if the program registered a data source
    /// of the same name (that one is the process's then).
    pub(crate) fn advertise(&self, ty: &DataSourceType, changed: bool) -> Advertised {
        if !changed && ty.advertised.load(Ordering::Acquire) {
            return Advertised::Done;
        }
        let _order = self.registration_order();
        if self
            .types()
            .iter()
            .any(|t| !std::ptr::eq(&**t, ty) && t.name == ty.name)
        {
            return Advertised::NameTaken;
        }
        let d = descriptor(ty);
        if !ty.advertised.swap(true, Ordering::AcqRel) {
            self.push_registration(Outgoing::RegisterDataSource(d));
        } else if changed {
            self.push_registration(Outgoing::UpdateDataSource(d));
        }
        Advertised::Done
    }

    /// Queues a registration or update (under the registration lock),
    /// followed by a `Sync` whose reply tells when the service has handled
    /// it and sent the commands it prompted.
    fn push_registration(&self, msg: Outgoing) {
        let generation = self.registrations.fetch_add(1, Ordering::AcqRel) + 1;
        if self.outbox.push(msg) {
            self.outbox.push(Outgoing::Sync(generation));
        }
    }

    /// The registration generation: a connection whose `Sync` replies
    /// reached it has had every registration queued so far handled by
    /// the service, and the commands they prompted (a running session's
    /// `SetupDataSource` and `StartDataSource`) read.
    pub(crate) fn registrations(&self) -> u64 {
        self.registrations.load(Ordering::Acquire)
    }

    /// Holds registrations back while a connection opens.
    pub(crate) fn registration_order(&self) -> MutexGuard<'_, ()> {
        self.registration.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every advertised data source, as a new connection registers them.
    pub(crate) fn descriptors(&self) -> Vec<DescriptorInfo> {
        self.types()
            .iter()
            .filter(|t| t.advertised.load(Ordering::Acquire))
            .map(|t| descriptor(t))
            .collect()
    }

    /// The data source a session's config names: one the program
    /// registered before a reserved one of the same name.
    pub(crate) fn type_named(&self, name: &str) -> Option<Arc<DataSourceType>> {
        let types = self.types();
        let named = || types.iter().rev().filter(|t| t.name == name);
        named()
            .find(|t| !t.reserved)
            .or_else(|| named().next())
            .cloned()
    }

    /// The instance the service knows as `instance_id` (never the startup
    /// instance).
    pub(crate) fn find(&self, instance_id: u64) -> Option<(Arc<DataSourceType>, Arc<Instance>)> {
        if instance_id == crate::data_source::STARTUP_INSTANCE_ID {
            return None;
        }
        self.types()
            .into_iter()
            .find_map(|t| t.find(instance_id).map(|i| (t, i)))
    }
}

/// What the connection registers `ty` with.
fn descriptor(ty: &DataSourceType) -> DescriptorInfo {
    DescriptorInfo {
        name: ty.name.clone(),
        id: ty.id,
        no_flush: ty.options.no_flush,
        track_event_descriptor: ty.describe.map(|describe| describe()),
        extra_fields: ty.options.extra_descriptor_fields.clone(),
    }
}
