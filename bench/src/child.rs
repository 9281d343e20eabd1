//! Worker processes: the hidden `worker` subcommand (the bench binary run
//! again) and the parent's handle on such a process.

use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use flotilla_pool::{Handler, HandlerError, Job, Node, NodeOptions, Worker};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use crate::BoxError;

/// Arguments of the hidden `worker` subcommand.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// Redis URL.
    #[arg(long)]
    pub url: String,
    /// Pool to join.
    #[arg(long)]
    pub pool: String,
    /// Worker TTL in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub ttl_ms: u64,
    /// Workers to host.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Do not mirror the pool's jobs and pending maps
    /// (`NodeOptions::mirror_jobs(false)`). Without it the node mirrors
    /// them (`mirror_jobs(true)`, set explicitly).
    #[arg(long)]
    pub no_job_replicas: bool,
    /// Run on a current-thread Tokio runtime (default: multi-thread).
    #[arg(long)]
    pub current_thread: bool,
}

/// The Tokio runtime of the worker processes (`--worker-runtime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WorkerRuntime {
    /// A multi-thread runtime with one worker thread per core.
    Multi,
    /// A current-thread runtime.
    Current,
}

/// The runtime every worker process of this run gets, set once from the
/// command line before any section starts one.
static WORKER_RUNTIME: std::sync::OnceLock<WorkerRuntime> = std::sync::OnceLock::new();

/// Sets the runtime of the worker processes started from now on (the
/// first call wins).
pub fn set_worker_runtime(runtime: WorkerRuntime) {
    let _ = WORKER_RUNTIME.set(runtime);
}

/// What a worker process reports once its workers are registered.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Ready {
    pid: u32,
    workers: Vec<String>,
}

/// A handler that does nothing (so the process's memory is the pool's).
struct Noop;

#[async_trait]
impl Handler for Noop {
    async fn start(&self, _job: Job) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn stop(&self, _key: &str) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// Runs the `worker` subcommand: join, host the workers, print one
/// [`Ready`] line, and run until stdin closes (the parent ended) or the
/// process is killed. It exits without `close`: the parent decides what
/// happens to the pool (kill, shutdown).
pub async fn run_worker(args: WorkerArgs) -> Result<(), BoxError> {
    let client = flotilla_testkit::client(&args.url).await?;
    let options = NodeOptions::default()
        .worker_ttl(Duration::from_millis(args.ttl_ms))
        .mirror_jobs(!args.no_job_replicas);
    let node = Node::join(&client, &args.pool, options).await?;
    let mut workers = Vec::with_capacity(args.workers);
    for _ in 0..args.workers {
        workers.push(Worker::new(&node, Noop).await?);
    }
    let ready = Ready {
        pid: std::process::id(),
        workers: workers.iter().map(|w| w.id().to_string()).collect(),
    };
    println!("{}", serde_json::to_string(&ready)?);
    // Blocks until the parent closes our stdin (or ends).
    tokio::task::spawn_blocking(|| {
        use std::io::Read;
        let mut buf = [0u8; 64];
        while let Ok(n) = std::io::stdin().read(&mut buf) {
            if n == 0 {
                break;
            }
        }
    })
    .await?;
    drop(workers);
    std::process::exit(0)
}

/// A running worker process (killed when dropped).
#[derive(Debug)]
pub struct WorkerProcess {
    child: Child,
    _stdin: Option<ChildStdin>,
    /// Its process id.
    pub pid: u32,
    /// Ids of the workers it hosts.
    pub workers: Vec<String>,
}

impl WorkerProcess {
    /// Starts `bench worker …` (its node mirroring the jobs and pending maps
    /// when `mirror_jobs`) and waits (up to `ready_within`) until its
    /// workers are registered.
    pub async fn spawn(
        url: &str,
        pool: &str,
        ttl: Duration,
        workers: usize,
        mirror_jobs: bool,
        ready_within: Duration,
    ) -> Result<WorkerProcess, BoxError> {
        let exe = std::env::current_exe()?;
        let mut command = Command::new(exe);
        command.arg("worker");
        if !mirror_jobs {
            command.arg("--no-job-replicas");
        }
        if WORKER_RUNTIME.get() == Some(&WorkerRuntime::Current) {
            command.arg("--current-thread");
        }
        let mut child = command
            .args(["--url", url, "--pool", pool])
            .args(["--ttl-ms", &ttl.as_millis().to_string()])
            .args(["--workers", &workers.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().ok_or("worker process without stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(ready_within, lines.next_line())
            .await
            .map_err(|_| format!("worker process not ready within {ready_within:?}"))??
            .ok_or("worker process exited before it was ready")?;
        let ready: Ready = serde_json::from_str(&line)?;
        Ok(WorkerProcess {
            child,
            _stdin: stdin,
            pid: ready.pid,
            workers: ready.workers,
        })
    }

    /// Sends SIGKILL.
    pub fn kill(&mut self) -> Result<(), BoxError> {
        self.child.start_kill()?;
        Ok(())
    }

    /// Waits for the process to end (after [`kill`](Self::kill) or once
    /// stdin is closed by dropping this value's pipe).
    pub async fn wait(mut self) -> Result<(), BoxError> {
        self._stdin = None;
        tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await??;
        Ok(())
    }
}

/// Arguments of the hidden `join-probe` subcommand.
#[derive(Debug, clap::Args)]
pub struct JoinProbeArgs {
    /// Redis URL.
    #[arg(long)]
    pub url: String,
    /// Pool to join.
    #[arg(long)]
    pub pool: String,
    /// Join without replicas of the jobs and pending maps
    /// (`NodeOptions::mirror_jobs(false)`). Without it the node mirrors
    /// them (`mirror_jobs(true)`, set explicitly).
    #[arg(long)]
    pub no_job_replicas: bool,
}

/// What `join-probe` measures: a node joining in a fresh process, so its
/// RSS growth is the node's memory and nothing recycled from earlier work.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct JoinProbe {
    /// `Node::join` duration in milliseconds.
    pub join_ms: f64,
    /// Jobs the node knows when `join` returned (its replica's; 0 without
    /// one).
    pub jobs: usize,
    /// RSS just before `Node::join` (client connected), bytes.
    pub rss_before: Option<u64>,
    /// RSS right after `Node::join`, bytes.
    pub rss_after: Option<u64>,
    /// CPU seconds the process spent in `Node::join` (all its threads).
    pub cpu_s: Option<f64>,
}

/// Runs the `join-probe` subcommand: joins `pool` once, prints one
/// [`JoinProbe`] line, closes the node.
pub async fn run_join_probe(args: JoinProbeArgs) -> Result<(), BoxError> {
    let client = flotilla_testkit::client(&args.url).await?;
    let rss_before = crate::redis_stats::rss_bytes(None);
    let cpu_before = crate::redis_stats::process_cpu_seconds();
    let t0 = std::time::Instant::now();
    let options = NodeOptions::default().mirror_jobs(!args.no_job_replicas);
    let node = Node::join(&client, &args.pool, options).await?;
    let join_ms = t0.elapsed().as_secs_f64() * 1000.0;
    let cpu_after = crate::redis_stats::process_cpu_seconds();
    let rss_after = crate::redis_stats::rss_bytes(None);
    let probe = JoinProbe {
        join_ms,
        jobs: node.job_keys().len(),
        rss_before,
        rss_after,
        cpu_s: cpu_before.zip(cpu_after).map(|(b, a)| a - b),
    };
    println!("{}", serde_json::to_string(&probe)?);
    node.close().await?;
    Ok(())
}

/// Runs `bench join-probe` in a new process and returns what it measured.
pub async fn join_probe(url: &str, pool: &str, mirror_jobs: bool) -> Result<JoinProbe, BoxError> {
    let exe = std::env::current_exe()?;
    let mut command = Command::new(exe);
    command.arg("join-probe");
    if !mirror_jobs {
        command.arg("--no-job-replicas");
    }
    let output = command
        .args(["--url", url, "--pool", pool])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .output()
        .await?;
    if !output.status.success() {
        return Err(format!("join-probe failed ({})", output.status).into());
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .ok_or("join-probe printed nothing")?;
    Ok(serde_json::from_str(line)?)
}
