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
//! * [`shm`]: the service's policy for producers' shared memory buffers
//!   (sizes it creates, what it adopts); the memory itself is
//!   [`shmtrace_ipc::shm`].
//! * [`env`](mod@env): clocks and randomness, real or fake.
//! * [`core`]: the whole service behaviour, sans-IO: producer and consumer
//!   ports, sessions, flush/stop protocols, readback and `write_into_file`.
//! * [`shell`]: the epoll loop that runs the core on UNIX sockets, and
//!   [`daemon`]: `--background` and logging for `shmtrace serve`.

pub mod buffer;
pub mod core;
pub mod daemon;
pub mod env;
#[doc(hidden)]
pub mod fuzzing;
pub mod shell;
pub mod shm;
pub mod trusted;
pub mod validator;
