//! Worker processes for tests: spawn `flotilla-test-worker`, wait for its
//! ready line, signal it. The child is killed when dropped.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::requests::Requester;
use crate::schedules::ScheduleSpec;

/// The line a worker process prints once its workers are registered,
/// followed by their ids as a JSON array.
pub const READY_PREFIX: &str = "READY ";

/// How to start a worker process.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// Path of the `flotilla-test-worker` binary.
    pub binary: PathBuf,
    /// Redis URL (possibly a fault proxy's).
    pub redis_url: String,
    /// Pool name.
    pub pool: String,
    /// Worker TTL.
    pub ttl: Duration,
    /// Workers in the process.
    pub workers: usize,
    /// Ledger file.
    pub ledger: PathBuf,
    /// How long each handler `stop` takes: a random duration in this range
    /// (milliseconds), like closing a connection. `(0, 0)`: at once.
    pub stop_ms: (u64, u64),
    /// Whether the process's node mirrors the pool's jobs and pending maps
    /// (`NodeOptions::mirror_jobs`).
    pub mirror_jobs: bool,
    /// Some keys' runs end on their own (`--lifecycle`, see
    /// [`crate::lifecycle`]).
    pub lifecycle: bool,
    /// The process's node id (`NodeOptions::node_id`); `None`: a fresh one.
    pub node_id: Option<String>,
    /// Longest time a handler `start` takes after its start line is
    /// written (ms; each takes a random time up to it): a job that does
    /// slow work, e.g. connects somewhere, before `start` returns. 0: none.
    pub start_max_ms: u64,
    /// Lanes per worker (`NodeOptions::worker_lanes`); 0: the library's
    /// default.
    pub worker_lanes: usize,
    /// The process takes dispatches and stops on its stdin (`--requests`,
    /// see [`crate::requests`]).
    pub requests: bool,
    /// The process runs the chaos schedule (see [`crate::schedules`]).
    pub schedule: Option<ScheduleSpec>,
}

/// A running worker process.
#[derive(Debug)]
pub struct WorkerProcess {
    child: Child,
    pid: u32,
    /// Worker ids it registered.
    pub workers: Vec<String>,
    /// Its ledger file.
    pub ledger: PathBuf,
    /// Its request channel, when started with
    /// [`requests`](WorkerSpec::requests).
    pub requester: Option<Requester>,
}

/// Errors of spawning or signalling a worker process.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProcessError {
    /// The binary could not be run.
    #[error("cannot run {0}: {1}")]
    Spawn(PathBuf, #[source] std::io::Error),
    /// The process exited or printed no ready line in time.
    #[error("worker process not ready: {0}")]
    NotReady(String),
    /// A signal could not be sent.
    #[error("signal {0:?} to {1}: {2}")]
    Signal(Signal, u32, #[source] nix::Error),
}

/// A worker process started and not ready yet.
#[derive(Debug)]
pub struct StartingWorker {
    child: Child,
    pid: u32,
    lines: Lines<BufReader<ChildStdout>>,
    ledger: PathBuf,
    stdin: Option<ChildStdin>,
}

impl StartingWorker {
    /// The OS process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Reads the process's output until its ready line: the worker ids, or
    /// `None` if it exited first. Cancel-safe: a call cut short by a
    /// timeout loses no line.
    pub async fn ready_line(&mut self) -> Option<Vec<String>> {
        while let Ok(Some(line)) = self.lines.next_line().await {
            if let Some(ids) = line.strip_prefix(READY_PREFIX) {
                return serde_json::from_str::<Vec<String>>(ids).ok();
            }
        }
        None
    }

    /// Waits (up to `timeout`) for the ready line.
    ///
    /// # Errors
    /// [`ProcessError::NotReady`].
    pub async fn ready(mut self, timeout: Duration) -> Result<WorkerProcess, ProcessError> {
        let pid = self.pid;
        let workers = match tokio::time::timeout(timeout, self.ready_line()).await {
            Ok(Some(w)) => w,
            Ok(None) => return Err(ProcessError::NotReady(format!("pid {pid} exited"))),
            Err(_) => {
                return Err(ProcessError::NotReady(format!(
                    "pid {pid}: no ready line within {timeout:?}"
                )));
            }
        };
        // Keep draining stdout so the child never blocks on a full pipe
        // (its replies, when it takes requests).
        let mut lines = self.lines;
        let requester = match self.stdin {
            Some(stdin) => Some(Requester::new(pid, stdin, lines)),
            None => {
                tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                None
            }
        };
        Ok(WorkerProcess {
            child: self.child,
            pid,
            workers,
            ledger: self.ledger,
            requester,
        })
    }

    /// `SIGKILL`s the process, ready or not, and reaps it.
    ///
    /// # Errors
    /// [`ProcessError::Signal`].
    pub async fn sigkill(mut self) -> Result<(), ProcessError> {
        kill(Pid::from_raw(self.pid as i32), Signal::SIGKILL)
            .map_err(|e| ProcessError::Signal(Signal::SIGKILL, self.pid, e))?;
        let _ = self.child.wait().await;
        Ok(())
    }
}

impl WorkerProcess {
    /// Spawns a worker process and waits (up to `ready_timeout`) for its
    /// ready line.
    ///
    /// # Errors
    /// [`ProcessError::Spawn`], [`ProcessError::NotReady`].
    pub async fn spawn(spec: &WorkerSpec, ready_timeout: Duration) -> Result<Self, ProcessError> {
        Self::start(spec)?.ready(ready_timeout).await
    }

    /// Starts a worker process without waiting for it to be ready.
    ///
    /// # Errors
    /// [`ProcessError::Spawn`], [`ProcessError::NotReady`] (no output).
    pub fn start(spec: &WorkerSpec) -> Result<StartingWorker, ProcessError> {
        let mut command = Command::new(&spec.binary);
        if !spec.mirror_jobs {
            command.arg("--no-job-replicas");
        }
        if spec.lifecycle {
            command.arg("--lifecycle");
        }
        if let Some(id) = &spec.node_id {
            command.arg("--node-id").arg(id);
        }
        if spec.start_max_ms > 0 {
            command
                .arg("--start-max-ms")
                .arg(spec.start_max_ms.to_string());
        }
        if spec.worker_lanes > 0 {
            command
                .arg("--worker-lanes")
                .arg(spec.worker_lanes.to_string());
        }
        if spec.requests {
            command.arg("--requests");
        }
        if let Some(schedule) = &spec.schedule {
            command.args(schedule.args());
        }
        let mut child = command
            .arg("--redis")
            .arg(&spec.redis_url)
            .arg("--pool")
            .arg(&spec.pool)
            .arg("--ttl-ms")
            .arg(spec.ttl.as_millis().to_string())
            .arg("--workers")
            .arg(spec.workers.to_string())
            .arg("--ledger")
            .arg(&spec.ledger)
            .arg("--stop-min-ms")
            .arg(spec.stop_ms.0.to_string())
            .arg("--stop-max-ms")
            .arg(spec.stop_ms.1.max(spec.stop_ms.0).to_string())
            .stdin(if spec.requests {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| ProcessError::Spawn(spec.binary.clone(), e))?;
        let pid = child.id().unwrap_or(0);
        let Some(stdout) = child.stdout.take() else {
            return Err(ProcessError::NotReady("no stdout".into()));
        };
        let stdin = child.stdin.take();
        Ok(StartingWorker {
            child,
            pid,
            lines: BufReader::new(stdout).lines(),
            ledger: spec.ledger.clone(),
            stdin,
        })
    }

    /// The OS process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends `signal`.
    ///
    /// # Errors
    /// [`ProcessError::Signal`].
    pub fn signal(&self, signal: Signal) -> Result<(), ProcessError> {
        kill(Pid::from_raw(self.pid as i32), signal)
            .map_err(|e| ProcessError::Signal(signal, self.pid, e))
    }

    /// `SIGKILL`s the process and reaps it.
    ///
    /// # Errors
    /// [`ProcessError::Signal`].
    pub async fn sigkill(&mut self) -> Result<(), ProcessError> {
        self.signal(Signal::SIGKILL)?;
        let _ = self.child.wait().await;
        Ok(())
    }

    /// `SIGTERM`s the process (it closes its node, handing its jobs over)
    /// and waits up to `timeout` for it to exit, then kills it. Returns
    /// whether it exited by itself.
    ///
    /// # Errors
    /// [`ProcessError::Signal`].
    pub async fn terminate(&mut self, timeout: Duration) -> Result<bool, ProcessError> {
        self.signal(Signal::SIGTERM)?;
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(_) => Ok(true),
            Err(_) => {
                self.sigkill().await?;
                Ok(false)
            }
        }
    }

    /// Whether the process has exited.
    pub fn has_exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }
}

/// The `flotilla-test-worker` binary next to the running executable (the
/// same cargo target directory), or `None`.
pub fn sibling_worker_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir, dir.parent().unwrap_or(Path::new("/nonexistent"))]
        .iter()
        .map(|d| d.join("flotilla-test-worker"))
        .find(|p| p.is_file())
}
