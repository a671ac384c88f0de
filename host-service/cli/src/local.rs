//! A tracing service inside the `shmtrace` process, on private sockets:
//! what `shmtrace demo` and `shmtrace import` record through (the same
//! code paths as a deployment: the service's epoll shell, real sockets,
//! a real producer and consumer).

use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::CliError;
use shmtrace_service::service::core::TracingService;
use shmtrace_service::service::env::SystemEnvironment;
use shmtrace_service::service::shell::{self, Shell, ShellConfig};

/// How long the service may take to come up.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

/// A private directory (mode 0700) for the sockets, removed when dropped.
#[derive(Debug)]
pub struct SocketDir(PathBuf);

impl SocketDir {
    /// Creates `shmtrace-<what>-<pid>-<nanos>` under the temporary
    /// directory (or `/tmp` if that path is long: socket paths are limited
    /// to 107 bytes).
    pub fn create(what: &str) -> Result<Self, CliError> {
        let base = std::env::temp_dir();
        let base = if base.as_os_str().len() > 60 {
            PathBuf::from("/tmp")
        } else {
            base
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = base.join(format!("shmtrace-{what}-{}-{nanos:x}", std::process::id()));
        let io = |action| {
            let dir = dir.clone();
            move |source| CliError::Io {
                action,
                path: dir,
                source,
            }
        };
        std::fs::create_dir(&dir).map_err(io("create"))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io("restrict"))?;
        Ok(SocketDir(dir))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// A socket path in it.
    pub fn socket(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for SocketDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The service running on a thread of this process until dropped.
#[derive(Debug)]
pub struct InProcessService {
    stop: UnixStream,
    thread: Option<JoinHandle<()>>,
}

impl InProcessService {
    /// Binds the sockets of `config` and runs the service; `Err` says why
    /// it did not come up.
    pub fn start(config: ShellConfig) -> Result<Self, String> {
        let (stop_read, stop) = UnixStream::pair().map_err(|e| e.to_string())?;
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("shmtrace-service".into())
            .spawn(move || {
                let shell = match Shell::bind(&config) {
                    Ok(shell) => shell,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                let core = TracingService::new(
                    shell::system_service_config(),
                    Box::new(SystemEnvironment),
                );
                if let Err(e) = shell.run(core, Some(stop_read.as_fd())) {
                    log::error!("the in-process tracing service stopped: {e}");
                }
            })
            .map_err(|e| e.to_string())?;
        let service = InProcessService {
            stop,
            thread: Some(thread),
        };
        match ready_rx.recv_timeout(STARTUP_TIMEOUT) {
            Ok(Ok(())) => Ok(service),
            Ok(Err(e)) => Err(format!("the tracing service did not start: {e}")),
            Err(_) => Err("the tracing service did not start in time".into()),
        }
    }
}

impl Drop for InProcessService {
    fn drop(&mut self) {
        let _ = self.stop.write_all(b"x");
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
