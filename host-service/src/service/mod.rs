//! The tracing service: what `traced` is to Perfetto.
//!
//! Bottom up:
//!
//! * [`buffer`]: the trace buffers (sans-IO): ring/discard policies,
//!   re-commits, patches, reassembly of packets at read time, loss
//!   reporting and upstream's buffer statistics.
//! * [`validator`]: which producer packets are returned (Perfetto's
//!   `PacketStreamValidator`).
//! * [`trusted`]: the trusted fields appended to every producer packet.
//! * [`shm`]: producers' shared memory buffers (sealed memfds).
//! * [`env`]: clocks and randomness, real or fake.
//! * [`core`]: the whole service behaviour, sans-IO: producer and consumer
//!   ports, sessions, flush/stop protocols, readback and `write_into_file`.

pub mod buffer;
pub mod core;
pub mod env;
pub mod shm;
pub mod trusted;
pub mod validator;
