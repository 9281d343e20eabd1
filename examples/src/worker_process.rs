//! A worker process: joins a pool, runs one worker, and prints what it is
//! asked to do. It talks to producers only through Redis.
//!
//! It ends on SIGTERM or Ctrl-C (closing its node hands its jobs to the
//! other workers), and by itself when the pool is shut down.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use flotilla_pool::{Handler, HandlerError, Job, Node, NodeOptions, Worker};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::BoxError;

/// Command-line arguments of a worker process.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// Redis URL (`redis://host:port`, `redis://user:pass@host:port/db`).
    #[arg(long = "redis", env = "REDIS_URL")]
    pub redis: String,
    /// Pool to join.
    #[arg(long, default_value = "orders")]
    pub pool: String,
    /// Label printed in front of this worker's lines.
    #[arg(long, default_value = "worker")]
    pub name: String,
    /// Worker TTL in milliseconds: silence after which the pool declares
    /// this worker dead and moves its jobs.
    #[arg(long, default_value_t = 3_000)]
    pub ttl_ms: u64,
    /// Print nothing but errors.
    #[arg(long)]
    pub quiet: bool,
}

/// The running jobs of a [`PrintingHandler`]: cancel token and task per key.
type RunningJobs = Arc<Mutex<HashMap<String, (CancellationToken, JoinHandle<()>)>>>;

/// A handler that runs each job as a task ticking once a second until it
/// is stopped, and prints starts, stops and notifications.
#[derive(Debug, Clone)]
pub struct PrintingHandler {
    name: String,
    quiet: bool,
    running: RunningJobs,
}

impl PrintingHandler {
    /// A handler whose lines start with `name`; `quiet` prints nothing.
    pub fn new(name: &str, quiet: bool) -> Self {
        PrintingHandler {
            name: name.to_string(),
            quiet,
            running: Arc::default(),
        }
    }

    fn say(&self, line: std::fmt::Arguments<'_>) {
        if !self.quiet {
            println!("{} {line}", self.name);
        }
    }
}

#[async_trait]
impl Handler for PrintingHandler {
    async fn start(&self, job: Job) -> Result<(), HandlerError> {
        self.say(format_args!(
            "start {} (fencing token {}, payload {})",
            job.key,
            job.fencing_token,
            String::from_utf8_lossy(&job.payload)
        ));
        let cancel = CancellationToken::new();
        let token = cancel.clone();
        // A long-lived job: real work would go here, passing
        // job.fencing_token to any storage it writes.
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    () = token.cancelled() => return,
                    _ = ticks.tick() => {}
                }
            }
        });
        let previous = self
            .running
            .lock()
            .map_err(|_| "handler state poisoned")?
            .insert(job.key, (cancel, task));
        if let Some((cancel, task)) = previous {
            cancel.cancel();
            task.abort();
        }
        Ok(())
    }

    async fn stop(&self, key: &str) -> Result<(), HandlerError> {
        let entry = self
            .running
            .lock()
            .map_err(|_| "handler state poisoned")?
            .remove(key);
        if let Some((cancel, task)) = entry {
            cancel.cancel();
            let _ = task.await;
        }
        self.say(format_args!("stop {key}"));
        Ok(())
    }

    async fn notify(&self, key: &str, payload: Bytes) -> Result<(), HandlerError> {
        self.say(format_args!(
            "notify {key}: {}",
            String::from_utf8_lossy(&payload)
        ));
        Ok(())
    }
}

/// Runs a worker process until SIGTERM, Ctrl-C or pool shutdown.
///
/// # Errors
/// When Redis cannot be reached or the pool refuses the node.
pub async fn run(args: WorkerArgs) -> Result<(), BoxError> {
    crate::check_url(&args.redis)?;
    let client = flotilla_testkit::client(&args.redis).await?;
    let options = NodeOptions::default()
        .worker_ttl(Duration::from_millis(args.ttl_ms))
        .worker_shutdown_ttl(Duration::from_secs(5));
    let node = Node::join(&client, &args.pool, options).await?;
    let handler = PrintingHandler::new(&args.name, args.quiet);
    let worker = Worker::new(&node, handler.clone()).await?;
    handler.say(format_args!(
        "joined pool {} as worker {} (pid {})",
        args.pool,
        worker.id(),
        std::process::id()
    ));
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut poll = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = terminate.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            _ = poll.tick() => {
                // A pool shutdown removes every worker; then there is nothing left to do.
                if node.workers().is_empty() {
                    handler.say(format_args!("pool shut down"));
                    break;
                }
            }
        }
    }
    node.close().await?;
    handler.say(format_args!("closed"));
    Ok(())
}
