//! The chaos driver: worker processes, faults, a recovery window, then the
//! invariant checker over the ledgers. Exits non-zero on any violation.
//!
//! ```text
//! cargo run --release -p flotilla-integration-tests --bin chaos -- --duration 30m
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use flotilla_integration_tests::checker::{CheckOptions, check};
use flotilla_integration_tests::driver::{ChaosOptions, mixed_ledger, run};
use flotilla_integration_tests::ledger::{FaultKind, read_ledger};

/// Command line.
#[derive(Debug, Parser)]
#[command(
    about = "Chaos suite for a Flotilla pool: kills, pauses, partitions, Redis restarts, membership changes"
)]
struct Args {
    /// How long to inject faults: `90s`, `5m`, `1h` (or plain seconds).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    duration: Duration,
    /// Worker processes at the start (4–6 recommended).
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Workers in each worker process (each its own lease and inbox, one
    /// node per process).
    #[arg(long, default_value_t = ChaosOptions::default().workers_per_process)]
    workers_per_process: usize,
    /// Seed of the fault schedule and the load.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Fault kinds to inject, comma-separated: kill, pause, cut,
    /// restart-aof, restart-empty, add, remove, rollback, outage-kill,
    /// failover, freeze-redis, slow, cut-rollback, cut-empty, pause-rollback,
    /// flap, cut-one, deaf, cut-remove, join-kill, pause-remove,
    /// cut-dispatcher, flush, stop-leave, cut-flush-join, rollback-twice,
    /// loss-kill, oom, read-only, drop-clients, restart-dispatcher,
    /// clock-step, frozen-failover, rollback-far, drain (default: all that
    /// apply; failover and frozen-failover only with --sentinel).
    #[arg(long, value_delimiter = ',', value_parser = parse_fault)]
    faults: Vec<FaultKind>,
    /// Worker TTL of every node (ms); with `--recheck`, the TTL the run
    /// used. Fault holds, recovery limits and the checker's windows scale
    /// with it; the handlers' stops must fit in a sixth of it.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(200..))]
    ttl_ms: u64,
    /// Print the summary as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Keep the ledgers in this directory.
    #[arg(long)]
    ledger_dir: Option<PathBuf>,
    /// Only re-check the ledgers (`*.jsonl`) kept in this directory by an
    /// earlier run (I1, I3, I4; I2 too with `--end-ms`), with the
    /// `--ttl-ms`, `--start-max-ms` and `--fail-for-good` it ran with.
    #[arg(long)]
    recheck: Option<PathBuf>,
    /// With `--recheck`: the run's end instant, in ms on the ledgers'
    /// monotonic clock (`mono_ns` / 10^6; e.g. the last fault's end plus
    /// the recovery window). The keys believed running must run then (I2);
    /// the keys lost to two faults at once are listed.
    #[arg(long, requires = "recheck")]
    end_ms: Option<f64>,
    /// Path of the flotilla-test-worker binary (default: next to this one).
    #[arg(long)]
    worker_binary: Option<PathBuf>,
    /// Distinct job keys of the load.
    #[arg(long, default_value_t = ChaosOptions::default().keys)]
    keys: usize,
    /// Run against a Sentinel deployment (primary, replica, three
    /// Sentinels); the faults are then kill, pause, add, remove, failover
    /// and frozen-failover (default: all six).
    #[arg(long)]
    sentinel: bool,
    /// Shortest handler stop (ms).
    #[arg(long, default_value_t = ChaosOptions::default().stop_ms.0)]
    stop_min_ms: u64,
    /// Longest handler stop (ms); at most the workers' stop budget, a
    /// sixth of the TTL (333 for the default 2 s), or the run is refused.
    #[arg(long, default_value_t = ChaosOptions::default().stop_ms.1)]
    stop_max_ms: u64,
    /// Half the nodes do not mirror the jobs and pending maps (every other
    /// worker process, and one of the two dispatching nodes).
    #[arg(long)]
    lean_nodes: bool,
    /// No node mirrors the jobs and pending maps (the library's default):
    /// every worker process and both dispatching nodes.
    #[arg(long, conflicts_with = "lean_nodes")]
    all_lean: bool,
    /// Inject the next fault 0–2 TTLs after the last, while the pool may
    /// still be recovering from it (faults during recoveries); only the
    /// final check requires full recovery.
    #[arg(long)]
    overlap: bool,
    /// Some keys' runs end on their own: 1 in 8 fail every 0.3–4 s (the
    /// pool restarts them after a backoff), 1 in 8 finish 1–8 s after each
    /// start (one run in four of either within 50 ms); a recorded finish must hold like a stop.
    #[arg(long)]
    lifecycle: bool,
    /// With --lifecycle: half the failing keys are dispatched with a policy
    /// of one restart, so their second failure in a row is final (the job
    /// leaves the pool); such an end must hold like a finish.
    #[arg(long, requires = "lifecycle")]
    fail_for_good: bool,
    /// Each worker process started takes the node id of one that ended
    /// (a pod restarted under its name).
    #[arg(long)]
    fixed_node_ids: bool,
    /// Longest time a handler's `start` takes after its start line (ms;
    /// each a random time up to it). 0: at once.
    #[arg(long, default_value_t = 0)]
    start_max_ms: u64,
    /// Lanes per worker in the worker processes (how many keys a worker
    /// handles at once; `NodeOptions::worker_lanes`). 0: the library's
    /// default (16).
    #[arg(long, default_value_t = 0)]
    worker_lanes: usize,
    /// Half the dispatches and stops go through the worker processes' own
    /// nodes (each process takes them on its stdin), which meet the faults
    /// while the calls are in flight.
    #[arg(long)]
    requests_from_workers: bool,
    /// A third of the keys are dispatched with an idempotency window this
    /// long (ms); the checker requires no second windowed admission of a
    /// key within it where Redis kept its data and clock. 0: none.
    #[arg(long, default_value_t = 0)]
    window_ms: u64,
    /// Every worker process runs a schedule over this many keys
    /// (`sched-0` …) whose wanted set rotates during the fault phase; its
    /// leader's starts and stops are checked like dispatches and stops.
    /// 0: none.
    #[arg(long, default_value_t = 0)]
    schedule_keys: usize,
    /// With --sentinel: how many replicas the primary has.
    #[arg(long, default_value_t = 1)]
    sentinel_replicas: usize,
    /// With --sentinel: `min-replicas-to-write` of every server (with
    /// `min-replicas-max-lag 1`), the setting the pool README recommends;
    /// 0: Redis's default (off).
    #[arg(long, default_value_t = 0)]
    min_replicas_to_write: u32,
    /// Load tasks dispatching and stopping at once (at least 1).
    #[arg(long, default_value_t = ChaosOptions::default().load_tasks)]
    load_tasks: usize,
    /// Pause of each load task between two operations (ms).
    #[arg(long, default_value_t = ChaosOptions::default().load_pace.as_millis() as u64)]
    load_pace_ms: u64,
}

fn parse_fault(s: &str) -> Result<FaultKind, String> {
    FaultKind::from_cli_name(s).ok_or_else(|| {
        let names: Vec<&str> = FaultKind::ALL.iter().map(|k| k.cli_name()).collect();
        format!("unknown fault {s:?}; one of {}", names.join(", "))
    })
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    match unit {
        "" | "s" => Ok(Duration::from_secs(n)),
        "ms" => Ok(Duration::from_millis(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        _ => Err(format!("bad duration unit in {s:?} (use ms, s, m or h)")),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Some(dir) = &args.recheck {
        return recheck(dir, &args);
    }
    let mut options = ChaosOptions::default()
        .duration(args.duration)
        .worker_processes(args.workers)
        .workers_per_process(args.workers_per_process)
        .ttl(Duration::from_millis(args.ttl_ms))
        .seed(args.seed)
        .keys(args.keys)
        .stop_ms(args.stop_min_ms, args.stop_max_ms)
        .lean_nodes(args.lean_nodes)
        .all_lean(args.all_lean)
        .overlap(args.overlap)
        .lifecycle(args.lifecycle)
        .fail_for_good(args.fail_for_good)
        .fixed_node_ids(args.fixed_node_ids)
        .start_max_ms(args.start_max_ms)
        .worker_lanes(args.worker_lanes)
        .requests_from_workers(args.requests_from_workers)
        .window_ms(args.window_ms)
        .schedule_keys(args.schedule_keys)
        .sentinel_replicas(args.sentinel_replicas, args.min_replicas_to_write)
        .load(args.load_tasks, Duration::from_millis(args.load_pace_ms));
    let with_sentinel = [
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::AddWorker,
        FaultKind::RemoveWorker,
        FaultKind::Failover,
        FaultKind::FrozenFailover,
        FaultKind::Drain,
    ];
    if args.sentinel {
        options = options.sentinel(true).faults(with_sentinel.to_vec());
    }
    if !args.faults.is_empty() {
        let allowed = |k: &FaultKind| !args.sentinel || with_sentinel.contains(k);
        let sentinel_only = |k: &FaultKind| k.needs_sentinels() && !args.sentinel;
        if let Some(bad) = args.faults.iter().find(|k| !allowed(k) || sentinel_only(k)) {
            eprintln!(
                "chaos: fault {} does not apply {} --sentinel",
                bad.cli_name(),
                if args.sentinel { "with" } else { "without" }
            );
            return ExitCode::from(2);
        }
        options = options.faults(args.faults);
    }
    if let Some(dir) = args.ledger_dir {
        options = options.ledger_dir(dir);
    }
    if let Some(bin) = args.worker_binary {
        options = options.worker_binary(bin);
    }
    let outcome = tokio::select! {
        outcome = run(options) => outcome,
        signal = interrupted() => {
            // Leaving drops the run: its worker processes (killed on drop),
            // proxies and servers end with it, and no fault of its schedule
            // starts a process any more.
            eprintln!("chaos: {signal}: run abandoned, its processes stopped");
            return ExitCode::from(130);
        }
    };
    match outcome {
        Ok(summary) => {
            if args.json {
                println!("{:#}", summary.to_json());
            } else {
                print!("{}", summary.table());
            }
            if summary.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("chaos: {e}");
            ExitCode::from(2)
        }
    }
}

/// Waits for SIGINT or SIGTERM. Both get a handler, so that a run started
/// in the background of a script (where the shell leaves SIGINT ignored)
/// stops on either instead of running on.
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        eprintln!("chaos: no signal handlers; SIGINT and SIGTERM end the run abruptly");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = interrupt.recv() => "SIGINT",
        _ = terminate.recv() => "SIGTERM",
    }
}

/// Checks the ledgers of an earlier run again (`--recheck`), with the
/// TTL, end instant, handler start time and restart policy it ran with.
fn recheck(dir: &std::path::Path, args: &Args) -> ExitCode {
    let (ttl_ms, end_ms, start_max_ms) = (args.ttl_ms, args.end_ms, args.start_max_ms);
    let mut ledgers = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("chaos: {}: {e}", dir.display());
            return ExitCode::from(2);
        }
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "jsonl") {
            match read_ledger(&path) {
                Ok(l) => {
                    if let Some(e) = mixed_ledger(&path, &l) {
                        eprintln!("chaos: {e}");
                        return ExitCode::from(2);
                    }
                    ledgers.push(l);
                }
                Err(e) => {
                    eprintln!("chaos: {}: {e}", path.display());
                    return ExitCode::from(2);
                }
            }
        }
    }
    let ttl = Duration::from_millis(ttl_ms);
    let report = check(
        &ledgers,
        &CheckOptions {
            end_ns: end_ms.map(|ms| (ms * 1e6) as u64),
            restart_within: flotilla_integration_tests::lifecycle::restart_within(
                Duration::from_millis(start_max_ms),
            ),
            final_failures: args.fail_for_good,
            ..CheckOptions::for_ttl(ttl)
        },
    );
    for v in &report.violations {
        println!("VIOLATION: {v}");
    }
    if end_ms.is_some() {
        println!(
            "lost with a killed holder and Redis's data (two faults): {} keys {}",
            report.lost_with_killed_holder.len(),
            report.lost_with_killed_holder.join(" ")
        );
    }
    println!(
        "{} ledgers, {} intervals, {} admissions, {} stale windows, {} moves checked, {} final failures whose log a kill cut short, {} violations",
        ledgers.len(),
        report.intervals,
        report.admissions,
        report.stale_windows,
        report.moves_checked,
        report.final_failures_cut_short,
        report.violations.len()
    );
    if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
