//! rmap figures: local `get` cost, write round trips, Redis commands per
//! write, and the time for a replica to join a large map.
//!
//! `cargo run --release -p flotilla-rmap --example rmap_bench` (uses
//! `REDIS_URL`, or starts a private redis-server).

use std::time::{Duration, Instant};

use flotilla_rmap::{Map, MapOptions};
use fred::prelude::*;
use hdrhistogram::Histogram;

const ROUND_TRIPS: usize = 5_000;
const BIG_MAP: usize = 100_000;

fn report(label: &str, h: &Histogram<u64>) {
    println!(
        "{label:<28} p50 {:>7.1} µs   p99 {:>7.1} µs   ({} samples)",
        h.value_at_quantile(0.50) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
        h.len()
    );
}

async fn calls(client: &Client) -> Result<u64, Box<dyn std::error::Error>> {
    Ok(flotilla_testkit::command_stats(client)
        .await?
        .into_iter()
        .map(|(name, calls)| if name == "info" { 0 } else { calls })
        .sum())
}

async fn stats(client: &Client) -> Result<Vec<(String, u64)>, Box<dyn std::error::Error>> {
    Ok(flotilla_testkit::command_stats(client).await?)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = flotilla_testkit::redis_for_example()?;
    let client = flotilla_testkit::client(&url).await?;
    let name = flotilla_testkit::unique_name("bench");
    let map = Map::join(&client, &name, MapOptions::default()).await?;

    // Local reads.
    for i in 0..1_000 {
        map.set(&format!("k{i}"), "value").await?;
    }
    map.wait_for(Duration::from_secs(10), |m| m.len() == 1_000)
        .await?;
    let keys: Vec<String> = (0..1_000).map(|i| format!("k{i}")).collect();
    let reads = 2_000_000;
    let start = Instant::now();
    let mut hits = 0usize;
    for i in 0..reads {
        if map.get(&keys[i % keys.len()]).is_some() {
            hits += 1;
        }
    }
    let per_get = start.elapsed().as_nanos() as f64 / reads as f64;
    assert_eq!(hits, reads);
    println!("local get (1,000 keys)       {per_get:.1} ns/op");

    // set round trip.
    let mut h = Histogram::<u64>::new(3)?;
    for i in 0..ROUND_TRIPS {
        let t = Instant::now();
        map.set(&format!("k{}", i % 1_000), "v").await?;
        h.record(t.elapsed().as_nanos() as u64)?;
    }
    report("set round trip", &h);

    // set_and_wait round trip.
    let mut h = Histogram::<u64>::new(3)?;
    for i in 0..ROUND_TRIPS {
        let t = Instant::now();
        map.set_and_wait(&format!("k{}", i % 1_000), "w").await?;
        h.record(t.elapsed().as_nanos() as u64)?;
    }
    report("set_and_wait round trip", &h);

    // Redis commands per set (INFO commandstats delta; INFO itself excluded).
    let before_total = calls(&client).await?;
    let before = stats(&client).await?;
    let n = 1_000u64;
    for i in 0..n {
        map.set(&format!("k{i}"), "c").await?;
    }
    let after_total = calls(&client).await?;
    let after = stats(&client).await?;
    let mut delta: Vec<(String, u64)> = after
        .into_iter()
        .filter(|(name, _)| name != "info")
        .map(|(name, c)| {
            let b = before
                .iter()
                .find(|(n2, _)| *n2 == name)
                .map_or(0, |(_, c)| *c);
            (name, c - b)
        })
        .filter(|(_, d)| *d > 0)
        .collect();
    delta.sort();
    let detail: Vec<String> = delta
        .iter()
        .map(|(name, d)| format!("{name} {:.2}", *d as f64 / n as f64))
        .collect();
    println!(
        "redis commands per set       {:.2} ({})",
        (after_total - before_total) as f64 / n as f64,
        detail.join(", ")
    );
    map.destroy().await?;

    // Join a map of 100,000 keys.
    let big = flotilla_testkit::unique_name("bench-big");
    let writer = Map::join(&client, &big, MapOptions::default()).await?;
    let hash = writer.keys_info().hash.clone();
    for chunk in 0..(BIG_MAP / 1_000) {
        let pairs: Vec<(String, String)> = (0..1_000)
            .map(|i| {
                let k = chunk * 1_000 + i;
                (format!("job-{k:06}"), format!("worker-{:03}:{k}", k % 500))
            })
            .collect();
        // Bulk fill behind the map's back (one HSET per 1,000 keys), then
        // one replicated write so the revision exists.
        let _: () = client.hset(&hash, pairs).await?;
    }
    writer.set("fill-done", "1").await?;
    let other = flotilla_testkit::client(&url).await?;
    let t = Instant::now();
    let joined = Map::join(&other, &big, MapOptions::default()).await?;
    let join_time = t.elapsed();
    assert_eq!(joined.len(), BIG_MAP + 1);
    println!(
        "join a map of {BIG_MAP} keys     {:.1} ms",
        join_time.as_secs_f64() * 1000.0
    );
    let t = Instant::now();
    let snap = joined.snapshot();
    println!(
        "first snapshot() of it       {:.1} ms ({} keys)",
        t.elapsed().as_secs_f64() * 1000.0,
        snap.len()
    );
    let mut h = Histogram::<u64>::new(3)?;
    for i in 0..1_000 {
        let t = Instant::now();
        joined.set_and_wait(&format!("job-{i:06}"), "moved").await?;
        h.record(t.elapsed().as_nanos() as u64)?;
    }
    report("set_and_wait, 100k-key map", &h);
    let job_keys: Vec<String> = (0..BIG_MAP)
        .step_by(7)
        .map(|k| format!("job-{k:06}"))
        .collect();
    let t = Instant::now();
    let reads = 1_000_000;
    for i in 0..reads {
        assert!(joined.get(&job_keys[i % job_keys.len()]).is_some());
    }
    println!(
        "local get (100k-key map)     {:.1} ns/op",
        t.elapsed().as_nanos() as f64 / reads as f64
    );
    writer.destroy().await?;
    joined.close().await;
    Ok(())
}
