//! `shmtrace trigger NAME...`: activates triggers, like `perfetto --trigger`.
//!
//! Connects to the service's producer socket as a producer (triggers are a
//! `ProducerPort` call: any process that may connect as a producer may send
//! them), initializes the connection, sends one `ActivateTriggers` with every
//! name and waits for its acknowledgement. The service decides which
//! sessions the triggers match (`trigger_config` of each session: name,
//! `producer_name_regex` against `--producer-name`, `skip_probability`,
//! `max_per_24_h`); an acknowledged trigger that matches nothing is not an
//! error, as with `perfetto --trigger`.

use super::consumer::{bind, next, CALL_TIMEOUT};
use super::{exit, CliError};
use shmtrace_ipc::protos::{
    producer_port, ActivateTriggersRequest, InitializeConnectionRequest, ProducerPort,
};
use shmtrace_ipc::socket::{producer_socket_name, SocketAddress};
use shmtrace_ipc::ClientError;

/// The producer name the triggers are sent under, unless `--producer-name`.
pub const DEFAULT_PRODUCER_NAME: &str = "shmtrace-trigger";

/// Arguments of `shmtrace trigger`.
#[derive(Debug, Clone, clap::Args)]
pub struct TriggerArgs {
    /// Trigger names to activate.
    #[arg(required = true, value_name = "NAME")]
    pub names: Vec<String>,
    /// The service's producer socket (default: $PERFETTO_PRODUCER_SOCK_NAME,
    /// else /run/perfetto/traced-producer.sock if /run/perfetto exists, else
    /// /tmp/perfetto-producer).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<String>,
    /// The producer name to connect as (what `producer_name_regex` of a
    /// session's trigger is matched against, and what its `trigger` packet
    /// records).
    #[arg(long, value_name = "NAME", default_value = DEFAULT_PRODUCER_NAME)]
    pub producer_name: String,
}

/// Runs `shmtrace trigger`: exit status 0 once the service acknowledged.
pub fn run(args: &TriggerArgs) -> Result<u8, CliError> {
    if let Some(name) = args.names.iter().find(|n| n.is_empty()) {
        return Err(CliError::Usage(format!(
            "invalid trigger name {name:?}: must not be empty"
        )));
    }
    let name = args.socket.clone().unwrap_or_else(|| {
        // A service may listen on several producer sockets: use the first.
        let all = producer_socket_name();
        all.split(',').next().unwrap_or_default().to_owned()
    });
    let address = SocketAddress::parse(&name)?;
    // `_client` keeps the connection until the acknowledgement arrived.
    let (_client, port) = bind::<ProducerPort>(&address, |address, source| {
        CliError::ConnectProducer { address, source }
    })?;
    let ipc = |what| move |source: ClientError| CliError::Ipc { what, source };
    port.start::<producer_port::InitializeConnection>(
        &InitializeConnectionRequest {
            producer_name: Some(args.producer_name.clone()),
            sdk_version: Some(concat!("shmtrace ", env!("CARGO_PKG_VERSION")).into()),
            ..Default::default()
        },
        None,
    )
    .and_then(|mut call| next(&mut call, Some(CALL_TIMEOUT)))
    .map_err(ipc("InitializeConnection"))?;
    port.start::<producer_port::ActivateTriggers>(
        &ActivateTriggersRequest {
            trigger_names: args.names.clone(),
        },
        None,
    )
    .and_then(|mut call| next(&mut call, Some(CALL_TIMEOUT)))
    .map_err(ipc("ActivateTriggers"))?;
    eprintln!(
        "shmtrace: sent {} trigger{} to {address}: {}",
        args.names.len(),
        if args.names.len() == 1 { "" } else { "s" },
        args.names.join(", ")
    );
    Ok(exit::OK)
}
