//! One worker serving pools on two Redis deployments; one of them is killed
//! and restarted while the other keeps dispatching.
//!
//! ```text
//! cargo run -p flotilla-pool --example multihome
//! ```
//!
//! Starts two private `redis-server`s (home1, home2), a multi-home worker
//! serving pool `orders` on both, and one dispatcher per home. It prints
//! the dispatch → started p99 on home2 before and during home1's outage,
//! when home1's breaker opens, the capacity split, and how long home1 takes
//! to come back after its server restarts.

use std::time::{Duration, Instant};

use flotilla_pool::multihome::{
    BreakerState, MultiHomeConfig, MultiHomeOptions, MultiHomeWorker, read_published,
};
use flotilla_pool::{Node, NodeOptions, TaskHandler};
use flotilla_testkit::RedisServer;

const POOL: &str = "orders";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut home1 = RedisServer::start()?;
    let home2 = RedisServer::start()?;
    // What `MultiHomeConfig::from_env` would read from
    // FLOTILLA_REDIS_URLS and FLOTILLA_POOLS.
    let urls = format!("{},{}", home1.url(), home2.url());
    let config = MultiHomeConfig::from_lists(&urls, Some("orders,orders"), POOL)?;
    let node = NodeOptions::default().worker_ttl(Duration::from_secs(3));
    let options = MultiHomeOptions::default()
        .reset_after(Duration::from_secs(2))
        .poll_timeout(Duration::from_secs(1))
        .probe_interval(Duration::from_millis(200))
        .max_concurrent_jobs(Some(2000))
        .node(node.clone());
    let worker = MultiHomeWorker::start(
        config,
        options,
        TaskHandler::new(|job, cancel| async move {
            // job.key is "home1/<key>" or "home2/<key>".
            let _ = job.key;
            cancel.cancelled().await;
            Ok(())
        }),
    )
    .await?;
    print_homes("started", &worker);

    let dispatcher = |url: String| {
        let options = node
            .clone()
            .client_only(true)
            .dispatch_timeout(Duration::from_secs(1));
        async move {
            let client = flotilla_testkit::client(&url).await?;
            Ok::<_, Box<dyn std::error::Error>>(Node::join(&client, POOL, options).await?)
        }
    };
    let (d1, d2) = (
        dispatcher(home1.url()).await?,
        dispatcher(home2.url()).await?,
    );
    d1.dispatch_job("a-1", &b"on home1"[..]).await?;
    timed(&d2, "warm", 50).await?;
    let before = timed(&d2, "before", 300).await?;

    let killed = Instant::now();
    let opened = until(&worker, "home1", BreakerState::Open, killed);
    home1.kill();
    println!("home1's redis-server killed");
    let during = timed(&d2, "during", 300).await?;
    println!(
        "home2 dispatch->started p99: before {:.2} ms, during home1's outage {:.2} ms (300 dispatches each)",
        p99(&before),
        p99(&during)
    );
    println!(
        "home1 breaker open {:.0} ms after the kill",
        opened.await?.as_secs_f64() * 1e3
    );
    print_homes("home1 down", &worker);
    let inspector = flotilla_testkit::client(&home2.url()).await?;
    tokio::time::sleep(Duration::from_millis(500)).await; // one probe round
    for state in read_published(&inspector, POOL).await? {
        let seen: Vec<String> = state
            .homes
            .iter()
            .map(|h| format!("{}={}", h.name, h.state))
            .collect();
        println!(
            "inspector of home2 reads worker {}: {}",
            state.worker,
            seen.join(" ")
        );
    }

    let restarted = Instant::now();
    let closed = until(&worker, "home1", BreakerState::Closed, restarted);
    home1.start_again()?;
    let mut n = 0;
    loop {
        n += 1;
        if d1
            .dispatch_job(&format!("a-back-{n}"), &b""[..])
            .await
            .is_ok()
        {
            break;
        }
        if restarted.elapsed() > Duration::from_secs(30) {
            return Err("home1 did not come back within 30 s".into());
        }
    }
    let resumed = restarted.elapsed();
    println!(
        "home1 back after its restart: breaker closed in {:.0} ms, first dispatch started in {:.0} ms",
        closed.await?.as_secs_f64() * 1e3,
        resumed.as_secs_f64() * 1e3
    );
    print_homes("home1 back", &worker);
    worker.close().await?;
    d1.close().await?;
    d2.close().await?;
    Ok(())
}

fn until(
    worker: &MultiHomeWorker,
    home: &str,
    state: BreakerState,
    since: Instant,
) -> tokio::task::JoinHandle<Duration> {
    let mut rx = worker.breaker_state(home).expect("configured home");
    tokio::spawn(async move {
        let _ = rx.wait_for(|s| *s == state).await;
        since.elapsed()
    })
}

async fn timed(node: &Node, prefix: &str, n: usize) -> Result<Vec<Duration>, flotilla_pool::Error> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        node.dispatch_job(&format!("{prefix}-{i}"), &b""[..])
            .await?;
        out.push(t.elapsed());
    }
    Ok(out)
}

fn p99(samples: &[Duration]) -> f64 {
    let mut s = samples.to_vec();
    s.sort();
    s[(s.len() * 99).div_ceil(100) - 1].as_secs_f64() * 1e3
}

fn print_homes(when: &str, worker: &MultiHomeWorker) {
    for h in worker.homes() {
        println!(
            "[{when}] {}: breaker {}, capacity {:?}, running {}",
            h.name, h.state, h.allotted, h.running
        );
    }
}
