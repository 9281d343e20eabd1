//! Lock and leader-lease figures: acquire/release round trip, contention
//! throughput, Redis commands per acquire, and leader failover time (leader
//! cut off without releasing, and graceful release).
//!
//! ```text
//! cargo run --release -p flotilla-pool --example lock_bench
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --release -p flotilla-pool --example lock_bench
//! ```
//!
//! Without `REDIS_URL` a private `redis-server` is started. The leader
//! failover part puts each lease behind its own TCP fault proxy so that a
//! "kill" (the leader's connection goes silent; nothing is released) can be
//! measured without killing this process.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flotilla_pool::{ClusterLock, LeaderLease, LeaderOptions, LockOptions};
use flotilla_testkit::{FaultProxy, command_stats};
use fred::prelude::*;
use hdrhistogram::Histogram;

const ROUNDS: u64 = 5_000;
const CONTENTION_TASKS: usize = 16;
const CONTENTION_CLIENTS: usize = 4;
const CONTENTION_FOR: Duration = Duration::from_secs(3);
const FAILOVERS: usize = 5;
const LEADER_TTL: Duration = Duration::from_secs(1);

async fn evalsha_calls(client: &Client) -> Result<u64, Box<dyn std::error::Error>> {
    Ok(command_stats(client)
        .await?
        .into_iter()
        .filter(|(name, _)| name == "evalsha" || name == "eval")
        .map(|(_, calls)| calls)
        .sum())
}

fn lock_options() -> LockOptions {
    LockOptions::default()
        .ttl(Duration::from_secs(5))
        .retry_interval(Duration::from_millis(5))
}

fn micros(h: &Histogram<u64>, q: f64) -> String {
    format!("{:.0} µs", h.value_at_quantile(q) as f64)
}

async fn round_trip(client: &Client, run: u32) -> Result<(), Box<dyn std::error::Error>> {
    let lock = ClusterLock::new(client, &format!("bench-rt-{run}"), lock_options())?;
    lock.try_acquire().await?.release().await?; // loads the scripts
    let mut acquire = Histogram::<u64>::new(3)?;
    let mut both = Histogram::<u64>::new(3)?;
    let before = evalsha_calls(client).await?;
    for _ in 0..ROUNDS {
        let start = Instant::now();
        let guard = lock.try_acquire().await?;
        acquire.record(start.elapsed().as_micros() as u64)?;
        guard.release().await?;
        both.record(start.elapsed().as_micros() as u64)?;
    }
    let calls = evalsha_calls(client).await? - before;
    println!("uncontended, {ROUNDS} rounds on one connection:");
    println!(
        "  acquire round trip            p50 {}, p99 {}",
        micros(&acquire, 0.5),
        micros(&acquire, 0.99)
    );
    println!(
        "  acquire + release round trip  p50 {}, p99 {}",
        micros(&both, 0.5),
        micros(&both, 0.99)
    );
    println!(
        "  redis commands per acquire+release: {:.2} (EVALSHA; INFO commandstats)",
        calls as f64 / ROUNDS as f64
    );
    Ok(())
}

async fn contention(url: &str, probe: &Client, run: u32) -> Result<(), Box<dyn std::error::Error>> {
    let name = format!("bench-contended-{run}");
    let mut clients = Vec::new();
    for _ in 0..CONTENTION_CLIENTS {
        clients.push(flotilla_testkit::client(url).await?);
    }
    // (token, enter, exit) of every critical section.
    let ledger = Arc::new(Mutex::new(Vec::<(u64, Instant, Instant)>::new()));
    let before = evalsha_calls(probe).await?;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..CONTENTION_TASKS {
        let lock = ClusterLock::new(
            &clients[i % CONTENTION_CLIENTS],
            &name,
            lock_options().owner_id(format!("task-{i}")),
        )?;
        let ledger = Arc::clone(&ledger);
        tasks.push(tokio::spawn(async move {
            while started.elapsed() < CONTENTION_FOR {
                let Ok(guard) = lock.acquire(Duration::from_secs(5)).await else {
                    continue;
                };
                let enter = Instant::now();
                let exit = Instant::now();
                let token = guard.token();
                let _ = guard.release().await;
                if let Ok(mut ledger) = ledger.lock() {
                    ledger.push((token, enter, exit));
                }
            }
        }));
    }
    for task in tasks {
        task.await?;
    }
    let elapsed = started.elapsed();
    let calls = evalsha_calls(probe).await? - before;
    let mut ledger = ledger.lock().map_err(|_| "ledger poisoned")?.clone();
    ledger.sort_by_key(|e| e.1);
    let overlaps = ledger.windows(2).filter(|w| w[0].2 > w[1].1).count();
    let out_of_order = ledger.windows(2).filter(|w| w[0].0 >= w[1].0).count();
    let n = ledger.len() as f64;
    println!(
        "contention: {CONTENTION_TASKS} tasks on {CONTENTION_CLIENTS} clients, one lock, {elapsed:.1?}:"
    );
    println!(
        "  {:.0} acquisitions/s ({} in total); overlapping holders: {overlaps}; tokens out of order: {out_of_order}",
        n / elapsed.as_secs_f64(),
        ledger.len()
    );
    println!(
        "  redis commands per acquisition under contention: {:.2} (incl. refused attempts and the release)",
        calls as f64 / n
    );
    Ok(())
}

/// Three leases, each behind its own proxy. Returns (cut-off failover,
/// graceful hand-over).
async fn failover(
    url_addr: std::net::SocketAddr,
    run: u32,
    i: usize,
) -> Result<(Duration, Duration), Box<dyn std::error::Error>> {
    let name = format!("bench-leader-{run}-{i}");
    let mut proxies = Vec::new();
    let mut leases = Vec::new();
    for n in 0..3 {
        let proxy = FaultProxy::start(url_addr).await?;
        let client = flotilla_testkit::client(&proxy.url()).await?;
        let options = LeaderOptions::default()
            .ttl(LEADER_TTL)
            .owner_id(format!("lease-{n}"))
            .op_timeout(Duration::from_millis(300));
        leases.push(Some(LeaderLease::start(&client, &name, options).await?));
        proxies.push(proxy);
    }
    let leader = |leases: &[Option<LeaderLease>]| {
        leases
            .iter()
            .position(|l| l.as_ref().is_some_and(LeaderLease::is_leader))
    };
    let first = wait_for(|| leader(&leases)).await?;
    proxies[first].black_hole();
    let cut = Instant::now();
    let second = wait_for(|| leader(&leases).filter(|&i| i != first)).await?;
    let killed = cut.elapsed();
    let closing = leases[second].take().ok_or("lease")?;
    let closed = Instant::now();
    closing.close().await?;
    wait_for(|| leader(&leases).filter(|&i| i != first)).await?;
    let graceful = closed.elapsed();
    proxies[first].heal();
    for lease in leases.into_iter().flatten() {
        let _ = lease.close().await;
    }
    Ok((killed, graceful))
}

async fn wait_for(
    mut found: impl FnMut() -> Option<usize>,
) -> Result<usize, Box<dyn std::error::Error>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(i) = found() {
            return Ok(i);
        }
        if Instant::now() > deadline {
            return Err("no leader within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn summary(samples: &mut [Duration]) -> String {
    samples.sort();
    let ms = |d: &Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
    let list: Vec<String> = samples.iter().map(ms).collect();
    format!(
        "median {}, max {} ({})",
        ms(&samples[samples.len() / 2]),
        ms(&samples[samples.len() - 1]),
        list.join(", ")
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, server) = flotilla_testkit::redis_for_example()?;
    let client = flotilla_testkit::client(&url).await?;
    let run = std::process::id();
    let info: String = client.info(Some(fred::types::InfoKind::Server)).await?;
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?");
    println!("lock_bench against redis {version} at {url}");

    round_trip(&client, run).await?;
    contention(&url, &client, run).await?;

    match &server {
        Some(server) => {
            let mut killed = Vec::new();
            let mut graceful = Vec::new();
            for i in 0..FAILOVERS {
                let (k, g) = failover(server.addr(), run, i).await?;
                killed.push(k);
                graceful.push(g);
            }
            println!("leader failover, 3 leases, ttl {LEADER_TTL:?}, {FAILOVERS} runs:");
            println!(
                "  leader cut off (no release) → new leader: {}",
                summary(&mut killed)
            );
            println!(
                "  graceful close → new leader:              {}",
                summary(&mut graceful)
            );
        }
        None => println!(
            "leader failover: skipped (needs a private server for the fault proxies; unset REDIS_URL)"
        ),
    }
    Ok(())
}
