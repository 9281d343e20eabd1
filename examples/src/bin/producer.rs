//! A producer process: dispatches jobs to a pool whose workers run in other
//! processes; producer and workers talk only through Redis.
//!
//! ```text
//! # self-contained: a private redis-server and two worker processes
//! cargo run -p flotilla-examples --bin producer
//!
//! # against your own Redis and workers started separately
//! export REDIS_URL=redis://127.0.0.1:6379
//! cargo run -p flotilla-examples --bin worker -- --name w1 &
//! cargo run -p flotilla-examples --bin worker -- --name w2 &
//! cargo run -p flotilla-examples --bin producer
//! ```
//!
//! Without `--redis`/`REDIS_URL` nobody else could reach the private Redis,
//! so the producer starts `--workers` (default 2) worker processes itself:
//! the same binary re-executed with the hidden `worker` subcommand, the
//! code of the `worker` binary.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use clap::Parser;
use flotilla_examples::children::Children;
use flotilla_examples::worker_process::{self, WorkerArgs};
use flotilla_examples::{BoxError, fmt};
use flotilla_pool::{Error, Node, NodeOptions};
use fred::prelude::ClientLike;

/// Dispatches jobs to a pool of worker processes.
#[derive(Debug, Parser)]
#[command(about = "Dispatches jobs to a Flotilla pool of worker processes")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Redis URL; without it a private redis-server is started.
    #[arg(long = "redis", env = "REDIS_URL")]
    redis: Option<String>,
    /// Pool to dispatch to.
    #[arg(long, default_value = "orders")]
    pool: String,
    /// Jobs to dispatch.
    #[arg(long, default_value_t = 6)]
    jobs: usize,
    /// Worker processes to start here (default: 2 with a private Redis,
    /// 0 with `--redis`).
    #[arg(long)]
    workers: Option<usize>,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Run as a worker process (what `--workers` starts).
    #[command(hide = true)]
    Worker(WorkerArgs),
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let cli = Cli::parse();
    if let Some(Command::Worker(args)) = cli.command {
        // A quiet worker logs errors only, so its lines do not interleave
        // with the parent's report.
        flotilla_examples::init_tracing_at(if args.quiet { "error" } else { "warn" });
        return worker_process::run(args).await;
    }
    flotilla_examples::init_tracing();
    let (url, server) = match &cli.redis {
        Some(url) => (url.clone(), None),
        None => flotilla_testkit::redis_for_example()?,
    };
    flotilla_examples::check_url(&url)?;
    let spawn = cli.workers.unwrap_or(if server.is_some() { 2 } else { 0 });
    let mut children = Children::default();
    for i in 1..=spawn {
        let name = format!("w{i}");
        children.spawn_self(
            &name,
            &[
                "worker", "--redis", &url, "--pool", &cli.pool, "--name", &name,
            ],
        )?;
    }

    let client = flotilla_testkit::client(&url).await?;
    let options = NodeOptions::default()
        .client_only(true)
        .dispatch_timeout(Duration::from_secs(30));
    let producer = Node::join(&client, &cli.pool, options).await?;
    if spawn == 0 && producer.pool_workers().is_empty() {
        println!(
            "producer: waiting for a worker of pool {:?} (start one: cargo run -p flotilla-examples --bin worker -- --redis {url} --pool {})",
            cli.pool, cli.pool
        );
    }
    flotilla_testkit::wait_until(Duration::from_secs(30), "worker processes", || {
        let have = producer.pool_workers().len();
        async move { have >= spawn.max(1) }
    })
    .await?;

    let keys: Vec<String> = (0..cli.jobs).map(|i| format!("order-{i:02}")).collect();
    for (i, key) in keys.iter().enumerate() {
        let started = Instant::now();
        producer
            .dispatch_job(key, format!("{{\"order\":{i}}}"))
            .await?;
        println!(
            "producer: {key} started in {} on worker {}",
            fmt::human(started.elapsed()),
            owner_label(&producer, key).await
        );
    }
    // Admission is atomic: a second dispatch of a running key is refused.
    match producer.dispatch_job(&keys[0], "again").await {
        Err(Error::JobExists(key)) => println!("producer: {key} again → JobExists (refused)"),
        other => println!("producer: unexpected answer to a duplicate dispatch: {other:?}"),
    }
    producer.notify_worker(&keys[0], "priority changed").await?;
    println!("producer: notified {}'s owner", keys[0]);

    let mut per_worker: HashMap<String, usize> = HashMap::new();
    for key in &keys {
        *per_worker
            .entry(owner_label(&producer, key).await)
            .or_default() += 1;
    }
    println!("producer: jobs per worker {per_worker:?}");
    for key in &keys {
        producer.stop_job(key).await?;
    }
    println!("producer: stopped {} jobs", keys.len());

    if spawn > 0 {
        // Our own workers: shut the pool down; they exit when it is gone.
        producer.shutdown().await?;
        let killed = children.wait_all(Duration::from_secs(10)).await;
        if !killed.is_empty() {
            return Err(format!("worker processes did not exit: {killed:?}").into());
        }
        println!("producer: pool shut down, {spawn} worker processes exited");
    } else {
        producer.close().await?;
    }
    client.quit().await?;
    drop(server);
    Ok(())
}

/// `worker-id (pid N)` of the owner of `key`, as Redis has it (the
/// producer mirrors no jobs: it asks for the few it prints).
async fn owner_label(node: &Node, key: &str) -> String {
    let Ok(Some((owner, _))) = node.lookup_job_owner(key).await else {
        return "?".into();
    };
    let pid = node
        .pool_workers()
        .into_iter()
        .find(|w| w.id == owner)
        .map(|w| w.pid)
        .unwrap_or_default();
    format!("{} (pid {pid})", fmt::short(&owner, 8))
}
