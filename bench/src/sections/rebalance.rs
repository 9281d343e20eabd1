//! Rebalance: 8 workers run the jobs; a 9th joins; how many jobs move (and
//! how many would ideally) and how long until every job runs where it
//! should.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use flotilla_pool::{Node, NodeOptions, Worker};
use futures::StreamExt;

use crate::probe::Probe;
use crate::report::{Figure, Report};
use crate::sections::failover::settle;
use crate::{BoxError, Ctx};

const WORKERS: usize = 8;
const JOBS: usize = 9_000;

/// Runs the section.
pub async fn run(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    let ttl = ctx.opts.ttl();
    let pool = flotilla_testkit::unique_name("bench-rebalance");
    // Mirroring the jobs map: `settle` reads the replica.
    let options = NodeOptions::default().worker_ttl(ttl).mirror_jobs(true);
    let node = Node::join(&ctx.client, &pool, options).await?;
    let probe = Probe::default();
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        workers.push(Worker::new(&node, probe.clone()).await?);
    }
    ctx.progress("rebalance", &format!("{JOBS} jobs on {WORKERS} workers"));
    let keys: Vec<String> = (0..JOBS).map(|i| format!("rb-{i}")).collect();
    let mut admitted = futures::stream::iter(keys.iter().map(|k| node.dispatch_job(k, &b"{}"[..])))
        .buffer_unordered(ctx.opts.concurrency.max(1));
    while let Some(result) = admitted.next().await {
        result?;
    }
    drop(admitted);
    settle(&node, &keys).await?;
    let starts_before = probe.starts.load(Ordering::Relaxed);
    let stops_before = probe.stops.load(Ordering::Relaxed);

    ctx.progress("rebalance", "adding worker 9");
    let t0 = Instant::now();
    let added = Worker::new(&node, probe.clone()).await?;
    // The ring includes the new worker once some key is placed on it.
    flotilla_testkit::wait_until(Duration::from_secs(10), "new worker in the ring", || {
        let node = node.clone();
        let (keys, id) = (&keys, added.id());
        async move {
            keys.iter()
                .any(|k| node.placement(k).as_deref() == Some(id))
        }
    })
    .await?;
    settle(&node, &keys).await?;
    let elapsed = t0.elapsed();
    let placed_on_new = keys
        .iter()
        .filter(|k| node.placement(k).as_deref() == Some(added.id()))
        .count();
    let moved = probe.starts.load(Ordering::Relaxed) - starts_before;
    let stopped = probe.stops.load(Ordering::Relaxed) - stops_before;
    let ideal = JOBS as f64 / (WORKERS + 1) as f64;
    report.push(
        Figure::new("rebalance", "moved", "jobs moved adding 1 worker to 8")
            .value(moved as f64, "jobs")
            .at_most(
                1.1 * ideal,
                format!("<= 1.1 x jobs/(N+1) = {:.0}", 1.1 * ideal),
            )
            .detail(format!(
                "{JOBS} jobs; ideal {ideal:.0}; {placed_on_new} hash to the new worker; {stopped} stops"
            )),
    );
    report.push(
        Figure::new("rebalance", "time", "rebalance done (join → all placed)")
            .value(elapsed.as_secs_f64(), "s")
            .at_most(
                2.0 * ttl.as_secs_f64(),
                format!("<= 2 x TTL = {:.1} s", 2.0 * ttl.as_secs_f64()),
            )
            .detail(format!("worker TTL {} ms", ttl.as_millis())),
    );
    drop(added);
    drop(workers);
    node.shutdown().await?;
    Ok(())
}
