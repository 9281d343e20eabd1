//! The Flotilla benchmark: dispatch throughput and latency, Redis commands
//! per dispatch, failover, rebalance, scale, rmap and stream figures, and
//! optionally the same dispatch workload on BullMQ. See `bench/README.md`.
//!
//! ```text
//! cargo run --release -p flotilla-bench --bin bench
//! cargo run --release -p flotilla-bench --bin bench -- --peer bullmq
//! cargo run --release -p flotilla-bench --bin bench -- --only dispatch --json
//! ```
#![forbid(unsafe_code)]

mod child;
mod monitor;
mod peer;
mod probe;
mod redis_stats;
mod report;
mod sections;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use fred::prelude::*;
use fred::types::InfoKind;

use crate::report::{Report, SectionError};
use crate::sections::fleet::FleetMode;

// A service's allocator is its own choice; this one is the program's, and
// the report names it (`allocator`). glibc's malloc cost the client about a
// sixth more CPU per dispatch (README, "The allocator").
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The allocator this build of the program uses, as the report names it.
pub const ALLOCATOR_NAME: &str = if cfg!(feature = "jemalloc") {
    "jemalloc"
} else {
    "system"
};

/// Errors of the benchmark: anything, reported as text.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Flotilla benchmark. Starts a private redis-server unless REDIS_URL is set.
#[derive(Debug, Parser)]
#[command(name = "bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Jobs of the dispatch throughput run (and of the peer's run).
    #[arg(long, default_value_t = 20_000)]
    jobs: usize,
    /// Dispatches in flight (and the peer's worker concurrency).
    #[arg(long, default_value_t = 100)]
    concurrency: usize,
    /// Skip the 100,000-job / 500-worker scale section.
    #[arg(long)]
    skip_scale: bool,
    /// Run only these sections (repeat or comma-separate).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Section>,
    /// Print one JSON document (schema in bench/README.md) instead of the table.
    #[arg(long)]
    json: bool,
    /// Also run the same dispatch workload on a peer job queue.
    #[arg(long, value_enum)]
    peer: Option<peer::Peer>,
    /// Where the peer is installed with npm (default: <target dir>/bench-peer/bullmq).
    #[arg(long)]
    peer_dir: Option<PathBuf>,
    /// With `--peer`: pairs of throughput runs, Flotilla then the peer, each
    /// on a fresh pool and queue; the ratio is also given as the median of
    /// the pairs' (the first pair is the dispatch section's run and the
    /// peer's full run).
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Worker TTL of the failover and rebalance pools, in milliseconds.
    #[arg(long, default_value_t = 2_000)]
    ttl_ms: u64,
    /// Worker processes killed in the failover section.
    #[arg(long, default_value_t = 5)]
    kills: usize,
    /// Jobs dispatched per kill in the failover section (the victim, one of
    /// three workers, takes about a third of them).
    #[arg(long, default_value_t = 150)]
    failover_jobs: usize,
    /// Running jobs of the scale section.
    #[arg(long, default_value_t = 100_000)]
    scale_jobs: usize,
    /// Workers of the scale section.
    #[arg(long, default_value_t = 500)]
    scale_workers: usize,
    /// Running jobs of the idle section.
    #[arg(long, default_value_t = 200_000)]
    idle_jobs: usize,
    /// Worker processes (one node, one worker each) of the idle section.
    #[arg(long, default_value_t = 8)]
    idle_nodes: usize,
    /// Length of the idle section's measuring window, in seconds.
    #[arg(long, default_value_t = 30)]
    idle_seconds: u64,
    /// Worker processes of each round of the fleet section
    /// (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 4, 16, 48])]
    fleet_nodes: Vec<usize>,
    /// Jobs dispatched in each round of the fleet section.
    #[arg(long, default_value_t = 20_000)]
    fleet_jobs: usize,
    /// Node kinds of the fleet section (comma-separated): `mirror`
    /// (`NodeOptions::mirror_jobs(true)`) and `lean` (`mirror_jobs(false)`,
    /// the library's default).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [FleetMode::Mirror, FleetMode::Lean])]
    fleet_modes: Vec<FleetMode>,
    /// Nodes without workers beside one worker process, in the fleet
    /// section's idle-node round (0: no such round).
    #[arg(long, default_value_t = 16)]
    fleet_idle_nodes: usize,
    /// Tokio runtime of every worker process the benchmark starts:
    /// `multi` (a multi-thread runtime, one thread per core) or `current`
    /// (a current-thread runtime: one thread).
    #[arg(long, value_enum, default_value_t = child::WorkerRuntime::Multi)]
    worker_runtime: child::WorkerRuntime,
    /// Worker threads of the benchmark process's own multi-thread Tokio
    /// runtime, which runs the dispatchers and the dispatch section's
    /// workers (default: one per core). On a machine that also runs Redis,
    /// fewer threads than cores leave Redis a core of its own (README, "The
    /// benchmark process's threads").
    #[arg(long)]
    threads: Option<usize>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Hosts workers for the failover and scale sections (run by the
    /// benchmark itself).
    #[command(hide = true)]
    Worker(child::WorkerArgs),
    /// Joins a pool once in a fresh process and reports time and memory
    /// (run by the benchmark itself).
    #[command(hide = true)]
    JoinProbe(child::JoinProbeArgs),
}

/// The sections, in running order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Section {
    /// Throughput, latency, commands per dispatch.
    Dispatch,
    /// Failover after SIGKILL of a worker process.
    Failover,
    /// Adding a 9th worker to 8.
    Rebalance,
    /// 100,000 jobs on 500 workers: memory, node join.
    Scale,
    /// 200,000 jobs on 8 idle nodes: Redis and node CPU.
    Idle,
    /// Dispatch cost with 1, 4, 16 and 48 worker processes.
    Fleet,
    /// Replicated map figures.
    Rmap,
    /// Stream figures.
    Stream,
}

/// Options the sections read.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Opts {
    /// `--jobs`.
    pub jobs: usize,
    /// `--concurrency`.
    pub concurrency: usize,
    /// `--ttl-ms`.
    pub ttl_ms: u64,
    /// `--kills`.
    pub kills: usize,
    /// `--failover-jobs`.
    pub failover_jobs: usize,
    /// `--scale-jobs`.
    pub scale_jobs: usize,
    /// `--scale-workers`.
    pub scale_workers: usize,
    /// `--idle-jobs`.
    pub idle_jobs: usize,
    /// `--idle-nodes`.
    pub idle_nodes: usize,
    /// `--idle-seconds`.
    pub idle_seconds: u64,
    /// `--fleet-nodes`.
    pub fleet_nodes: Vec<usize>,
    /// `--fleet-jobs`.
    pub fleet_jobs: usize,
    /// `--fleet-modes`.
    pub fleet_modes: Vec<FleetMode>,
    /// `--fleet-idle-nodes`.
    pub fleet_idle_nodes: usize,
    /// `--rounds`.
    pub rounds: usize,
}

impl Opts {
    /// Worker TTL of the failover and rebalance pools.
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }
}

/// What every section gets.
#[derive(Debug)]
pub struct Ctx {
    /// Redis URL.
    pub url: String,
    /// A connected client.
    pub client: Client,
    /// Options.
    pub opts: Opts,
    started: Instant,
}

impl Ctx {
    /// Progress on stderr (stdout carries the table or the JSON).
    pub fn progress(&self, section: &str, what: &str) {
        eprintln!(
            "[{:>6.1}s] {section}: {what}",
            self.started.elapsed().as_secs_f64()
        );
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logs();
    let mut builder = match &cli.command {
        Some(Command::Worker(args)) if args.current_thread => {
            tokio::runtime::Builder::new_current_thread()
        }
        _ => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            if let Some(threads) = cli.threads {
                builder.worker_threads(threads.max(1));
            }
            builder
        }
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Some(Command::Worker(args)) => child::run_worker(args).await.map(|()| true),
            Some(Command::JoinProbe(args)) => child::run_join_probe(args).await.map(|()| true),
            None => bench(cli).await,
        }
    });
    match result {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs the selected sections; `Ok(false)` when one failed.
async fn bench(cli: Cli) -> Result<bool, BoxError> {
    child::set_worker_runtime(cli.worker_runtime);
    let (url, server) = flotilla_testkit::redis_for_example()?;
    let client = flotilla_testkit::client(&url).await?;
    let redis_version = redis_stats::info_field(&client, InfoKind::Server, "redis_version")
        .await
        .unwrap_or_default();
    let opts = Opts {
        jobs: cli.jobs.max(1),
        concurrency: cli.concurrency.max(1),
        ttl_ms: cli.ttl_ms,
        kills: cli.kills.max(1),
        failover_jobs: cli.failover_jobs.max(1),
        scale_jobs: cli.scale_jobs.max(1),
        scale_workers: cli.scale_workers.max(1),
        idle_jobs: cli.idle_jobs.max(1),
        idle_nodes: cli.idle_nodes.max(1),
        idle_seconds: cli.idle_seconds.max(1),
        fleet_nodes: cli.fleet_nodes.clone(),
        fleet_jobs: cli.fleet_jobs.max(1),
        fleet_modes: cli.fleet_modes.clone(),
        fleet_idle_nodes: cli.fleet_idle_nodes,
        rounds: cli.rounds.max(1),
    };
    let ctx = Ctx {
        url,
        client,
        opts: opts.clone(),
        started: Instant::now(),
    };
    let mut report = Report {
        schema: report::SCHEMA,
        redis_version,
        allocator: ALLOCATOR_NAME,
        private_redis: server.is_some(),
        options: serde_json::json!({
            "opts": opts,
            "skip_scale": cli.skip_scale,
            "only": cli.only.iter().map(|s| format!("{s:?}").to_lowercase()).collect::<Vec<_>>(),
            "peer": cli.peer.map(|p| format!("{p:?}").to_lowercase()),
            "threads": tokio::runtime::Handle::current().metrics().num_workers(),
        }),
        figures: Vec::new(),
        errors: Vec::new(),
    };
    let selected = |s: Section| {
        (cli.only.is_empty() || cli.only.contains(&s)) && !(s == Section::Scale && cli.skip_scale)
    };
    for section in Section::value_variants() {
        if !selected(*section) {
            continue;
        }
        let name = format!("{section:?}").to_lowercase();
        let result = match section {
            Section::Dispatch => sections::dispatch::run(&ctx, &mut report).await,
            Section::Failover => sections::failover::run(&ctx, &mut report).await,
            Section::Rebalance => sections::rebalance::run(&ctx, &mut report).await,
            Section::Scale => sections::scale::run(&ctx, &mut report).await,
            Section::Idle => sections::idle::run(&ctx, &mut report).await,
            Section::Fleet => sections::fleet::run(&ctx, &mut report).await,
            Section::Rmap => sections::rmap::run(&ctx, &mut report).await,
            Section::Stream => sections::stream::run(&ctx, &mut report).await,
        };
        if let Err(e) = result {
            ctx.progress(&name, &format!("FAILED: {e}"));
            report.errors.push(SectionError {
                section: name,
                error: e.to_string(),
            });
        }
    }
    if let Some(peer::Peer::Bullmq) = cli.peer {
        let dir = cli.peer_dir.clone().unwrap_or_else(peer::default_dir);
        if let Err(e) = peer::run(&ctx, &mut report, &dir).await {
            ctx.progress("peer", &format!("FAILED: {e}"));
            report.errors.push(SectionError {
                section: "peer".into(),
                error: e.to_string(),
            });
        }
    }
    ctx.progress("done", "");
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "Flotilla benchmark (Redis {}, {}, {} allocator)",
            report.redis_version,
            if report.private_redis {
                "private server"
            } else {
                "REDIS_URL"
            },
            report.allocator
        );
        print!("{}", report.table());
    }
    drop(server);
    Ok(report.errors.is_empty())
}

/// Logs to stderr at the levels `RUST_LOG` names, when it is set: the
/// figures can then be taken with the logging a service runs with (every
/// span and event the library enables at that level costs CPU per job).
/// Without it nothing is logged, and tracing costs next to nothing.
fn init_logs() {
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    }
}
