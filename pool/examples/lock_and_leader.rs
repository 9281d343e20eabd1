//! Locks, leader leases and the distributed ticker in a few seconds.
//!
//! ```text
//! cargo run -p flotilla-pool --example lock_and_leader
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p flotilla-pool --example lock_and_leader
//! ```
//!
//! Without `REDIS_URL` a private `redis-server` is started and stopped.

use std::time::{Duration, Instant};

use flotilla_pool::{
    ClusterLock, Error, LeaderLease, LeaderOptions, LockOptions, Ticker, TickerOptions,
};
use fred::prelude::*;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = flotilla_testkit::redis_for_example()?;
    let client = flotilla_testkit::client(&url).await?;
    let run = std::process::id();

    // --- ClusterLock: one executor per execution id (seed 000).
    let name = format!("example-execution-{run}");
    let executor_a = ClusterLock::new(
        &client,
        &name,
        LockOptions::default().owner_id("executor-a"),
    )?;
    let executor_b = ClusterLock::new(
        &client,
        &name,
        LockOptions::default().owner_id("executor-b"),
    )?;
    let guard = executor_a.acquire(Duration::from_secs(1)).await?;
    println!(
        "executor-a holds {name} with fencing token {}",
        guard.token()
    );
    match executor_b.try_acquire().await {
        Err(Error::LockHeld { .. }) => println!(
            "executor-b refused: {}",
            executor_b.try_acquire().await.unwrap_err()
        ),
        other => println!("unexpected: {other:?}"),
    }
    if let Some(info) = executor_b.info().await? {
        println!("holder record: {info}");
    }
    guard.refresh().await?; // rate-limited: no Redis call this soon after acquiring
    guard.release().await?;
    let guard = executor_b.try_acquire().await?;
    println!("executor-b took over with token {}", guard.token());
    guard.release().await?;

    // --- LeaderLease: one scheduler among processes (seed 002).
    let lease = format!("example-scheduler-{run}");
    let options = |owner: &str| {
        LeaderOptions::default()
            .ttl(Duration::from_secs(3))
            .owner_id(owner)
    };
    let first = LeaderLease::start(&client, &lease, options("scheduler-1")).await?;
    let second = LeaderLease::start(&client, &lease, options("scheduler-2")).await?;
    first.wait_until_leader().await?;
    println!("scheduler-1 leads: {}", first.is_leader());
    if let Err(refused) = second.try_become_leader().await {
        println!("scheduler-2: {refused}");
    }
    let handover = Instant::now();
    first.close().await?; // a rolling deploy: release on shutdown
    second.wait_until_leader().await?;
    println!(
        "scheduler-2 leads {:?} after scheduler-1 closed",
        handover.elapsed()
    );
    if let Some(holder) = second.holder().await? {
        println!("leader record: {holder}");
    }
    second.close().await?;

    // --- Ticker: one tick per interval across processes.
    let ticker_name = format!("example-ticker-{run}");
    let interval = Duration::from_millis(200);
    let mut tickers = Vec::new();
    for _ in 0..2 {
        tickers
            .push(Ticker::start(&client, &ticker_name, interval, TickerOptions::default()).await?);
    }
    let until = tokio::time::Instant::now() + Duration::from_millis(1_000);
    let (mut a, mut b) = (tickers.remove(0), tickers.remove(0));
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(until) => break,
            Some(tick) = a.next() => println!("ticker A owns slot {}", tick.slot),
            Some(tick) = b.next() => println!("ticker B owns slot {}", tick.slot),
        }
    }
    a.close().await;
    b.close().await;
    client.quit().await?;
    Ok(())
}
