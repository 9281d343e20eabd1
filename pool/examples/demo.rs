//! The Flotilla demo: a pool with three workers, jobs dispatched, a worker
//! lost and its jobs moved, a worker added and the pool rebalanced.
//!
//! ```text
//! cargo run --release -p flotilla-pool --example demo
//! ```
//! Uses REDIS_URL when set, otherwise starts a private redis-server.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use flotilla_pool::{Node, NodeOptions, TaskHandler, Worker};
use flotilla_testkit::FaultProxy;

fn spread(node: &Node) -> String {
    let mut by_worker = BTreeMap::new();
    for w in node.pool_workers() {
        by_worker.insert(w.id[..10].to_string(), w.jobs);
    }
    by_worker
        .iter()
        .map(|(w, n)| format!("{w}…: {n:>2} {}", "#".repeat(*n)))
        .collect::<Vec<_>>()
        .join("\n  ")
}

async fn wait_until(deadline: Duration, mut check: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + deadline;
    while Instant::now() < end {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    check()
}

fn handler(name: &'static str) -> impl flotilla_pool::Handler {
    TaskHandler::new(move |job, cancel| async move {
        tracing::debug!(worker = name, key = %job.key, token = job.fencing_token, "running");
        cancel.cancelled().await;
        Ok(())
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = flotilla_testkit::redis_for_example()?;
    println!("Flotilla demo — Redis at {url}");
    let ttl = Duration::from_secs(3);
    let options = NodeOptions::default().worker_ttl(ttl);
    let pool = flotilla_testkit::unique_name("demo");
    println!("pool {pool:?}\n");

    // The dispatcher shows the whole pool's jobs, so it mirrors the jobs
    // map; the worker nodes need only their own.
    let dispatcher = Node::join(
        &flotilla_testkit::client(&url).await?,
        &pool,
        options.clone().client_only(true).mirror_jobs(true),
    )
    .await?;
    // Each worker node reaches Redis through its own loopback proxy, so the
    // demo can cut one off exactly as a crash or a network partition would.
    let mut nodes = Vec::new();
    let mut proxies = Vec::new();
    for name in ["alpha", "beta", "gamma"] {
        let proxy = FaultProxy::start(addr_of(&url)?).await?;
        let node = Node::join(
            &flotilla_testkit::client(&proxy.url()).await?,
            &pool,
            options.clone(),
        )
        .await?;
        Worker::new(&node, handler(name)).await?;
        nodes.push(node);
        proxies.push(proxy);
    }
    let t0 = Instant::now();
    for i in 0..30 {
        dispatcher
            .dispatch_job(&format!("customer-{i:02}"), format!("{{\"id\":{i}}}"))
            .await?;
    }
    println!(
        "dispatched 30 jobs in {:?}; each started exactly once:\n  {}\n",
        t0.elapsed(),
        spread(&dispatcher)
    );

    // Lose a node without a goodbye: cut its connection. Its lease lapses
    // (it stops its own jobs), and another node cleans it up.
    let lost = nodes.remove(1);
    let lost_jobs = lost
        .pool_workers()
        .iter()
        .filter(|w| w.node == lost.id())
        .map(|w| w.jobs)
        .sum::<usize>();
    println!(
        "cutting off node {}… with {lost_jobs} jobs (worker ttl {ttl:?})…",
        &lost.id()[..10]
    );
    let t0 = Instant::now();
    let lost_workers = lost.workers();
    proxies[1].cut();
    let moved = wait_until(ttl * 4, || {
        dispatcher
            .pool_workers()
            .iter()
            .all(|w| !lost_workers.contains(&w.id))
    })
    .await;
    println!(
        "{} after {:?}:\n  {}\n",
        if moved {
            "its jobs moved"
        } else {
            "still moving"
        },
        t0.elapsed(),
        spread(&dispatcher)
    );

    let newcomer = Node::join(
        &flotilla_testkit::client(&url).await?,
        &pool,
        options.clone(),
    )
    .await?;
    let t0 = Instant::now();
    Worker::new(&newcomer, handler("delta")).await?;
    wait_until(Duration::from_secs(5), || {
        dispatcher.pool_workers().iter().all(|w| w.jobs > 0)
    })
    .await;
    println!(
        "added a worker; rebalanced in {:?}:\n  {}\n",
        t0.elapsed(),
        spread(&dispatcher)
    );

    let running = dispatcher.job_keys().len();
    dispatcher.shutdown().await?;
    drop(lost);
    println!(
        "summary: 30 jobs dispatched, 1 node lost and its jobs moved, 1 worker added; {running} jobs running at the end; pool shut down"
    );
    Ok(())
}

/// The `host:port` of a `redis://` URL.
fn addr_of(url: &str) -> Result<std::net::SocketAddr, Box<dyn std::error::Error>> {
    let rest = url.split("://").nth(1).unwrap_or(url);
    let hostport = rest
        .rsplit('@')
        .next()
        .unwrap_or(rest)
        .split('/')
        .next()
        .unwrap_or_default();
    let hostport = hostport.replace("localhost", "127.0.0.1");
    Ok(std::net::ToSocketAddrs::to_socket_addrs(&hostport)?
        .next()
        .ok_or("REDIS_URL has no address")?)
}
