//! The Flotilla demo: a pool of worker PROCESSES, jobs dispatched, one
//! worker process killed with SIGKILL and its jobs moving to the others, a
//! worker process added and the pool rebalancing — with timings, and a
//! summary at the end.
//!
//! ```text
//! scripts/demo                                   # the README's first command
//! cargo run --release -q -p flotilla-examples --bin demo -- --hold 60
//! ```
//!
//! Uses `REDIS_URL` when set, otherwise starts a private `redis-server`.
//! Worker processes are this binary re-executed with the hidden `worker`
//! subcommand; they are killed if the demo fails, so none is left behind.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use clap::Parser;
use flotilla_examples::children::{Children, Output};
use flotilla_examples::fmt::{human, percentile, short};
use flotilla_examples::worker_process::{self, WorkerArgs};
use flotilla_examples::{BoxError, fmt};
use flotilla_pool::{Node, NodeOptions};
use flotilla_testkit::wait_until;
use fred::prelude::ClientLike;

/// The Flotilla demo.
#[derive(Debug, Parser)]
#[command(about = "Flotilla demo: worker processes, a SIGKILL, failover and rebalance")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Worker processes at the start (at least 2).
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// Jobs to dispatch.
    #[arg(long, default_value_t = 30)]
    jobs: usize,
    /// Worker TTL in milliseconds (a killed worker's jobs move after about this long).
    #[arg(long, default_value_t = 2_000)]
    ttl_ms: u64,
    /// Keep the pool running this many seconds at the end, to look at it with poolctl.
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    hold: u64,
    /// Keep the pool running at the end until Ctrl-C.
    #[arg(long)]
    linger: bool,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Run as one worker process of the demo.
    #[command(hide = true)]
    Worker(WorkerArgs),
}

/// Rows of the summary table.
#[derive(Debug, Default)]
struct Summary(Vec<(String, String)>);

impl Summary {
    fn row(&mut self, phase: impl Into<String>, result: impl Into<String>) {
        self.0.push((phase.into(), result.into()));
    }

    fn print(&self) {
        let width = self.0.iter().map(|(p, _)| p.len()).max().unwrap_or(0);
        let rule = format!("+-{}-+-{}", "-".repeat(width), "-".repeat(64));
        println!("{rule}");
        println!("| {:width$} | result", "phase");
        println!("{rule}");
        for (phase, result) in &self.0 {
            println!("| {phase:width$} | {result}");
        }
        println!("{rule}");
    }
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
    if cli.workers < 2 || cli.jobs == 0 {
        return Err("the demo needs --workers 2 or more and --jobs 1 or more".into());
    }
    let started = Instant::now();
    let (url, server) = flotilla_testkit::redis_for_example()?;
    flotilla_examples::check_url(&url)?;
    let pool = flotilla_testkit::unique_name("demo");
    let ttl = Duration::from_millis(cli.ttl_ms);
    println!("Flotilla demo");
    match &server {
        Some(_) => println!("  Redis: {url} (a private redis-server; set REDIS_URL to use yours)"),
        None => println!("  Redis: {url} (REDIS_URL)"),
    }
    println!("  pool:  {pool}, worker TTL {}", human(ttl));
    println!("  watch it from another terminal while it runs:");
    println!(
        "    poolctl watch --redis {url} --pool {pool} --worker-ttl {}ms\n",
        cli.ttl_ms
    );

    // Declared after the server so that on any error the workers are
    // killed first, then the server.
    let mut children = Children::default();
    let interruptible = cli.hold == 0 && !cli.linger; // else `hold` owns Ctrl-C
    let result = tokio::select! {
        result = run(&cli, &url, &pool, ttl, &mut children) => result,
        _ = tokio::signal::ctrl_c(), if interruptible => Err("interrupted".into()),
    };
    if result.is_err() {
        children.kill_all().await;
    }
    let summary = result?;
    println!("\nsummary (whole demo {}):", human(started.elapsed()));
    summary.print();
    drop(server);
    Ok(())
}

async fn run(
    cli: &Cli,
    url: &str,
    pool: &str,
    ttl: Duration,
    children: &mut Children,
) -> Result<Summary, BoxError> {
    let mut summary = Summary::default();
    let client = flotilla_testkit::client(url).await?;
    let options = NodeOptions::default()
        .worker_ttl(ttl)
        .worker_shutdown_ttl(Duration::from_secs(10));
    // The dispatcher watches every job move, so it mirrors the jobs map (the
    // worker processes need only their own jobs).
    let dispatcher = Node::join(&client, pool, options.client_only(true).mirror_jobs(true)).await?;

    // 1. Worker processes.
    let t0 = Instant::now();
    let mut labels: HashMap<u32, String> = HashMap::new();
    for i in 1..=cli.workers {
        let label = format!("worker-{i}");
        let pid = spawn_worker(children, url, pool, ttl, &label)?;
        labels.insert(pid, label);
    }
    wait_workers(&dispatcher, cli.workers).await?;
    println!(
        "started {} worker processes (pids {}) — all joined in {}",
        cli.workers,
        pids(&labels),
        human(t0.elapsed())
    );

    // 2. Dispatch.
    let keys: Vec<String> = (0..cli.jobs).map(|i| format!("customer-{i:02}")).collect();
    let t0 = Instant::now();
    let mut latencies = Vec::with_capacity(keys.len());
    for (i, key) in keys.iter().enumerate() {
        let one = Instant::now();
        dispatcher
            .dispatch_job(key, format!("{{\"customer\":{i}}}"))
            .await?;
        latencies.push(one.elapsed());
    }
    let total = t0.elapsed();
    latencies.sort();
    all_running(&dispatcher, &keys).await?;
    let dispatch_line = format!(
        "{} jobs in {}; dispatch→started p50 {:.2} ms, max {:.2} ms",
        keys.len(),
        human(total),
        ms(percentile(&latencies, 50.0)),
        ms(percentile(&latencies, 100.0)),
    );
    println!("\ndispatched {dispatch_line}");
    print_spread(&dispatcher, &labels, &keys);
    summary.row("dispatch", dispatch_line);

    // 3. SIGKILL one worker process.
    let victim = "worker-2";
    let victim_pid = children.pid(victim).ok_or("worker-2 not running")?;
    let victim_id = worker_id_of(&dispatcher, victim_pid).ok_or("worker-2 not registered")?;
    let before: BTreeMap<String, (String, u64)> = owners(&dispatcher, &keys);
    let lost: Vec<&String> = before
        .iter()
        .filter(|(_, (w, _))| *w == victim_id)
        .map(|(k, _)| k)
        .collect();
    println!(
        "\nSIGKILL {victim} (pid {victim_pid}), which runs {} jobs; they move once it has been silent for the TTL ({})",
        lost.len(),
        human(ttl)
    );
    let t0 = Instant::now();
    children.kill(victim).await?;
    let mut declared_dead = None;
    let mut moved_at: BTreeMap<String, (Duration, String, u64)> = BTreeMap::new();
    let deadline = t0 + ttl * 4 + Duration::from_secs(10);
    loop {
        let workers = dispatcher.pool_workers();
        let victim_info = workers.iter().find(|w| w.id == victim_id);
        if declared_dead.is_none() && victim_info.is_none_or(|w| w.cleaning) {
            declared_dead = Some(t0.elapsed());
        }
        for key in &lost {
            if moved_at.contains_key(*key) {
                continue;
            }
            if let Some((owner, token)) = dispatcher.job_owner(key)
                && owner != victim_id
            {
                moved_at.insert((*key).clone(), (t0.elapsed(), owner, token));
            }
        }
        if moved_at.len() == lost.len() && victim_info.is_none() {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "only {} of {} jobs moved within {}",
                moved_at.len(),
                lost.len(),
                human(deadline - t0)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let declared = declared_dead.unwrap_or_default();
    println!("  {victim} declared dead after {}", human(declared));
    let mut times = Vec::new();
    for (key, (after, owner, token)) in &moved_at {
        let old_token = before.get(key).map(|(_, t)| *t).unwrap_or_default();
        println!(
            "  {key}  {victim} → {:<9} after {:>8}  (fencing token {old_token} → {token})",
            label_of(&dispatcher, &labels, owner),
            human(*after)
        );
        times.push(*after);
    }
    times.sort();
    let failover_line = format!(
        "{} jobs of {victim} running elsewhere after {} (first {}); declared dead after {}; TTL {}",
        lost.len(),
        human(percentile(&times, 100.0)),
        human(percentile(&times, 0.0)),
        human(declared),
        human(ttl)
    );
    println!("  {failover_line}");
    print_spread(&dispatcher, &labels, &keys);
    summary.row(format!("SIGKILL {victim}"), failover_line);

    // 4. Add a worker process: the pool rebalances.
    let newcomer = format!("worker-{}", cli.workers + 1);
    let before: BTreeMap<String, (String, u64)> = owners(&dispatcher, &keys);
    let live = cli.workers; // the survivors plus the newcomer
    let t0 = Instant::now();
    let pid = spawn_worker(children, url, pool, ttl, &newcomer)?;
    labels.insert(pid, newcomer.clone());
    println!("\nadding {newcomer} (pid {pid})");
    wait_workers(&dispatcher, live).await?;
    let joined = t0.elapsed();
    let new_id = worker_id_of(&dispatcher, pid).unwrap_or_default();
    // Settled: every job runs on the worker the ring assigns it, and the
    // ring already counts the newcomer (it wins some keys; with very few
    // jobs it may win none, so that part gives up after one TTL).
    wait_until(ttl * 2 + Duration::from_secs(10), "rebalance", || {
        let settled = keys.iter().all(|k| {
            matches!((dispatcher.job_owner(k), dispatcher.placement(k)),
                (Some((owner, _)), Some(placed)) if owner == placed)
        });
        let ring_has_newcomer = keys
            .iter()
            .any(|k| dispatcher.placement(k).as_deref() == Some(new_id.as_str()));
        let ok = settled && (ring_has_newcomer || t0.elapsed() > joined + ttl);
        async move { ok }
    })
    .await?;
    let rebalanced = t0.elapsed();
    let after = owners(&dispatcher, &keys);
    let moved = keys
        .iter()
        .filter(|k| before.get(*k).map(|o| &o.0) != after.get(*k).map(|o| &o.0))
        .count();
    let to_newcomer = after.values().filter(|(w, _)| *w == new_id).count();
    let ideal = keys.len() as f64 / live as f64;
    let rebalance_line = format!(
        "joined in {}, settled {}; moved {moved} jobs ({to_newcomer} to {newcomer}), ideal jobs/(N+1) = {ideal:.1}",
        human(joined),
        human(rebalanced),
    );
    println!("  {rebalance_line}");
    print_spread(&dispatcher, &labels, &keys);
    summary.row(format!("add {newcomer}"), rebalance_line);

    // 5. Check and finish.
    all_running(&dispatcher, &keys).await?;
    let live_ids: Vec<String> = dispatcher
        .pool_workers()
        .into_iter()
        .map(|w| w.id)
        .collect();
    let on_live = keys
        .iter()
        .filter(|k| {
            dispatcher
                .job_owner(k)
                .is_some_and(|(o, _)| live_ids.contains(&o))
        })
        .count();
    summary.row(
        "end state",
        format!(
            "{on_live}/{} jobs running, each on one live worker of {}",
            keys.len(),
            live_ids.len()
        ),
    );
    if on_live != keys.len() {
        return Err(format!("only {on_live} of {} jobs on live workers", keys.len()).into());
    }
    hold(cli, url, pool).await;

    let t0 = Instant::now();
    dispatcher.shutdown().await?;
    let killed = children.wait_all(Duration::from_secs(10)).await;
    let shutdown_line = format!(
        "pool shut down in {}; {} worker processes exited{}",
        human(t0.elapsed()),
        live,
        if killed.is_empty() {
            String::new()
        } else {
            format!(" ({} had to be killed: {killed:?})", killed.len())
        }
    );
    println!("\n{shutdown_line}");
    summary.row("shutdown", shutdown_line);
    client.quit().await?;
    Ok(summary)
}

/// Starts one worker process of the demo; returns its pid.
fn spawn_worker(
    children: &mut Children,
    url: &str,
    pool: &str,
    ttl: Duration,
    label: &str,
) -> Result<u32, BoxError> {
    let ttl_ms = ttl.as_millis().to_string();
    children.spawn_self_with(
        label,
        &[
            "worker", "--redis", url, "--pool", pool, "--name", label, "--ttl-ms", &ttl_ms,
            "--quiet",
        ],
        Output::Quiet,
    )
}

/// Waits until `count` workers are registered and none is being cleaned up.
async fn wait_workers(node: &Node, count: usize) -> Result<(), BoxError> {
    wait_until(Duration::from_secs(30), "worker processes to join", || {
        let workers = node.pool_workers();
        let ok = workers.len() == count && workers.iter().all(|w| !w.cleaning);
        async move { ok }
    })
    .await?;
    Ok(())
}

/// Waits until the node's replica shows every key running.
async fn all_running(node: &Node, keys: &[String]) -> Result<(), BoxError> {
    wait_until(Duration::from_secs(10), "every job running", || {
        let ok = keys.iter().all(|k| node.job_owner(k).is_some());
        async move { ok }
    })
    .await?;
    Ok(())
}

/// Owner and fencing token of each key, from the node's replica.
fn owners(node: &Node, keys: &[String]) -> BTreeMap<String, (String, u64)> {
    keys.iter()
        .filter_map(|k| node.job_owner(k).map(|o| (k.clone(), o)))
        .collect()
}

fn worker_id_of(node: &Node, pid: u32) -> Option<String> {
    node.pool_workers()
        .into_iter()
        .find(|w| w.pid == pid)
        .map(|w| w.id)
}

fn label_of(node: &Node, labels: &HashMap<u32, String>, worker_id: &str) -> String {
    node.pool_workers()
        .into_iter()
        .find(|w| w.id == worker_id)
        .and_then(|w| labels.get(&w.pid).cloned())
        .unwrap_or_else(|| short(worker_id, 10).to_string())
}

fn pids(labels: &HashMap<u32, String>) -> String {
    let mut pids: Vec<u32> = labels.keys().copied().collect();
    pids.sort();
    pids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Prints how many jobs each live worker process runs.
fn print_spread(node: &Node, labels: &HashMap<u32, String>, keys: &[String]) {
    let mut rows: BTreeMap<String, (u32, String, usize)> = BTreeMap::new();
    for w in node.pool_workers() {
        let label = labels
            .get(&w.pid)
            .cloned()
            .unwrap_or_else(|| fmt::short(&w.id, 10).to_string());
        rows.insert(label, (w.pid, w.id, 0));
    }
    for key in keys {
        if let Some((owner, _)) = node.job_owner(key)
            && let Some(row) = rows.values_mut().find(|r| r.1 == owner)
        {
            row.2 += 1;
        }
    }
    for (label, (pid, id, jobs)) in rows {
        println!(
            "    {label:<9} pid {pid:<7} {:<12} {jobs:>3} {}",
            short(&id, 12),
            "#".repeat(jobs)
        );
    }
}

/// With `--hold` or `--linger`, keeps the pool running for a look with poolctl.
async fn hold(cli: &Cli, url: &str, pool: &str) {
    if cli.hold == 0 && !cli.linger {
        return;
    }
    println!(
        "\nthe pool keeps running; look at it with:\n  poolctl watch --redis {url} --pool {pool} --worker-ttl {}ms",
        cli.ttl_ms
    );
    if cli.linger {
        println!("  (Ctrl-C ends the demo)");
        let _ = tokio::signal::ctrl_c().await;
    } else {
        println!("  (for {} s; Ctrl-C ends it sooner)", cli.hold);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(cli.hold)) => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
}
