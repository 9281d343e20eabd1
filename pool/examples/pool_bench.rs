//! Pool benchmark: dispatch throughput and latency, Redis commands per
//! dispatch, failover time, rebalance movement.
//!
//! ```text
//! cargo run --release -p flotilla-pool --example pool_bench
//! cargo run --release -p flotilla-pool --example pool_bench -- --jobs 20000 --concurrency 200
//! ```
//! Starts a private redis-server unless REDIS_URL is set.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dashmap::DashMap;
use flotilla_pool::{Handler, HandlerError, Job, Node, NodeOptions, Worker};
use flotilla_testkit::FaultProxy;
use hdrhistogram::Histogram;

/// A no-op handler that records when each job started.
#[derive(Clone, Default)]
struct Probe {
    started: Arc<DashMap<String, Instant>>,
    starts: Arc<AtomicU64>,
}

#[async_trait]
impl Handler for Probe {
    async fn start(&self, job: Job) -> Result<(), HandlerError> {
        self.started.insert(job.key, Instant::now());
        self.starts.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    async fn stop(&self, key: &str) -> Result<(), HandlerError> {
        self.started.remove(key);
        Ok(())
    }
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn commands(client: &fred::prelude::Client) -> HashMap<String, u64> {
    flotilla_testkit::command_stats(client)
        .await
        .unwrap_or_default()
        .into_iter()
        .collect()
}

fn delta(before: &HashMap<String, u64>, after: &HashMap<String, u64>) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect();
    out.sort_by_key(|e| std::cmp::Reverse(e.1));
    out
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let jobs = arg("--jobs", 20_000);
    let concurrency = arg("--concurrency", 200);
    let workers_n = arg("--workers", 4);
    let (url, _server) = flotilla_testkit::redis_for_example()?;
    let client = flotilla_testkit::client(&url).await?;
    let pool = flotilla_testkit::unique_name("bench");
    let options = NodeOptions::default().worker_ttl(Duration::from_secs(10));
    let node = Node::join(&client, &pool, options.clone()).await?;
    let probe = Probe::default();
    let mut workers = Vec::new();
    for _ in 0..workers_n {
        workers.push(Worker::new(&node, probe.clone()).await?);
    }
    println!(
        "flotilla pool benchmark: {jobs} jobs, concurrency {concurrency}, {workers_n} workers, one process"
    );

    // Latency: one dispatch at a time.
    let mut to_started = Histogram::<u64>::new(3)?;
    let mut to_ok = Histogram::<u64>::new(3)?;
    let lat_n = 2000.min(jobs);
    let before = commands(&client).await;
    for i in 0..lat_n {
        let key = format!("lat-{i}");
        let t0 = Instant::now();
        node.dispatch_job(&key, &b"{}"[..]).await?;
        let done = t0.elapsed();
        if let Some(at) = probe.started.get(&key) {
            to_started.record(at.duration_since(t0).as_micros() as u64)?;
        }
        to_ok.record(done.as_micros() as u64)?;
    }
    let after = commands(&client).await;
    let per = delta(&before, &after);
    let total: u64 = per.iter().map(|(_, v)| v).sum();
    println!(
        "latency (sequential, {lat_n}): dispatch->started p50 {} us, p99 {} us, p99.9 {} us; dispatch->Ok p50 {} us, p99 {} us",
        to_started.value_at_quantile(0.5),
        to_started.value_at_quantile(0.99),
        to_started.value_at_quantile(0.999),
        to_ok.value_at_quantile(0.5),
        to_ok.value_at_quantile(0.99)
    );
    println!(
        "redis commands per dispatch (INFO commandstats, incl. calls made inside scripts and by background tasks): {:.2} total",
        total as f64 / lat_n as f64
    );
    for (name, calls) in per.iter().take(12) {
        println!(
            "  {name:<14} {:.3} per dispatch",
            *calls as f64 / lat_n as f64
        );
    }

    // Throughput: `concurrency` dispatches in flight.
    let next = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let node = node.clone();
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= jobs {
                    return Ok::<(), flotilla_pool::Error>(());
                }
                node.dispatch_job(&format!("tp-{i}"), &b"{}"[..]).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "throughput: {jobs} jobs dispatched and started in {secs:.2} s = {:.0} jobs/s",
        jobs as f64 / secs
    );
    node.shutdown().await?;

    // Rebalance: 8 workers, add 1.
    let pool = flotilla_testkit::unique_name("bench-rebalance");
    let rb_jobs = 4000;
    let node = Node::join(&client, &pool, options.clone()).await?;
    let probe = Probe::default();
    let mut ws = Vec::new();
    for _ in 0..8 {
        ws.push(Worker::new(&node, probe.clone()).await?);
    }
    for i in 0..rb_jobs {
        node.dispatch_job(&format!("rb-{i}"), &b"{}"[..]).await?;
    }
    let starts_before = probe.starts.load(Ordering::Relaxed);
    let t0 = Instant::now();
    let added = Worker::new(&node, probe.clone()).await?;
    let expected: usize = (0..rb_jobs)
        .filter(|i| node.placement(&format!("rb-{i}")).as_deref() == Some(added.id()))
        .count();
    while added.job_keys().len() < expected && t0.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let moved = probe.starts.load(Ordering::Relaxed) - starts_before;
    println!(
        "rebalance: add 1 worker to 8 with {rb_jobs} jobs: {moved} moved (ideal {:.0}, bound 1.1x = {:.0}) in {:?}",
        rb_jobs as f64 / 9.0,
        1.1 * rb_jobs as f64 / 9.0,
        t0.elapsed()
    );
    node.shutdown().await?;

    // Failover: a worker whose connection is cut (as a killed process).
    let ttl = Duration::from_secs(2);
    let mut failovers = Vec::new();
    for round in 0..3 {
        let pool = flotilla_testkit::unique_name("bench-failover");
        let opts = NodeOptions::default().worker_ttl(ttl);
        let survivor = Node::join(&client, &pool, opts.clone()).await?;
        let probe = Probe::default();
        let _w = Worker::new(&survivor, probe.clone()).await?;
        let proxy = FaultProxy::start(flotilla_testkit_addr(&url)?).await?;
        let victim_client = flotilla_testkit::client(&proxy.url()).await?;
        let victim = Node::join(&victim_client, &pool, opts.clone()).await?;
        let vprobe = Probe::default();
        let vw = Worker::new(&victim, vprobe.clone()).await?;
        for i in 0..200 {
            survivor
                .dispatch_job(&format!("f{round}-{i}"), &b"{}"[..])
                .await?;
        }
        let victim_jobs = vw.job_keys();
        let t0 = Instant::now();
        proxy.cut();
        while !victim_jobs.iter().all(|k| probe.started.contains_key(k)) && t0.elapsed() < ttl * 5 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        failovers.push(t0.elapsed());
        survivor.shutdown().await?;
        drop(victim);
    }
    failovers.sort();
    println!(
        "failover (worker cut off, ttl {:?}): {:?} (target <= 1.5 x ttl = {:?})",
        ttl,
        failovers,
        ttl * 3 / 2
    );
    Ok(())
}

fn flotilla_testkit_addr(url: &str) -> Result<std::net::SocketAddr, Box<dyn std::error::Error>> {
    let hostport = url
        .trim_start_matches("redis://")
        .rsplit('@')
        .next()
        .unwrap_or_default()
        .split('/')
        .next()
        .unwrap_or_default()
        .replace("localhost", "127.0.0.1");
    Ok(hostport.parse()?)
}
