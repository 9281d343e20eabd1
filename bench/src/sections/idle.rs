//! Idle cost: `--idle-jobs` running jobs on `--idle-nodes` worker processes
//! (one node and one worker each, default options: no replicas of the jobs
//! and pending maps), then nothing happens
//! for `--idle-seconds`: the Redis CPU and the CPU of the worker processes
//! over that window is what an idle pool costs (keep-alives, cleanup
//! sweeps, orphan and stale-pending sweeps).

use std::time::{Duration, Instant};

use flotilla_pool::{Node, NodeOptions};
use futures::StreamExt;

use crate::child::WorkerProcess;
use crate::redis_stats::{process_cpu_seconds_of, redis_cpu_seconds};
use crate::report::{Figure, Report};
use crate::{BoxError, Ctx};

/// Runs the section.
pub async fn run(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    let jobs = ctx.opts.idle_jobs;
    let nodes = ctx.opts.idle_nodes.max(1);
    let window = Duration::from_secs(ctx.opts.idle_seconds.max(1));
    let pool = flotilla_testkit::unique_name("bench-idle");
    let ttl = NodeOptions::default().worker_ttl;
    ctx.progress("idle", &format!("starting {nodes} worker processes"));
    let mirror_jobs = NodeOptions::default().mirror_jobs;
    let (dispatcher, children) = start_fleet(ctx, &pool, nodes, mirror_jobs).await?;

    ctx.progress("idle", &format!("dispatching {jobs} jobs"));
    let t0 = Instant::now();
    let mut admitted = futures::stream::iter((0..jobs).map(|i| {
        let node = dispatcher.clone();
        async move { node.dispatch_job(&format!("idle-{i:06}"), &b"{}"[..]).await }
    }))
    .buffer_unordered(ctx.opts.concurrency.max(1) * 2);
    while let Some(result) = admitted.next().await {
        result?;
    }
    drop(admitted);
    ctx.progress(
        "idle",
        &format!(
            "{jobs} running after {:.1} s; idle for {window:?}",
            t0.elapsed().as_secs_f64()
        ),
    );
    // The dispatcher leaves: only the worker nodes remain, as in a pool
    // whose producers are elsewhere.
    dispatcher.close().await?;
    // Let the dispatch's tail (replication, last replies) settle first.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let pids: Vec<u32> = children.iter().map(|c| c.pid).collect();
    let nodes_cpu = |pids: &[u32]| -> Option<f64> {
        pids.iter()
            .map(|pid| process_cpu_seconds_of(Some(*pid)))
            .sum()
    };
    let redis_before = redis_cpu_seconds(&ctx.client).await?;
    let nodes_before = nodes_cpu(&pids);
    let t0 = Instant::now();
    tokio::time::sleep(window).await;
    let elapsed = t0.elapsed().as_secs_f64();
    let redis_after = redis_cpu_seconds(&ctx.client).await?;
    let nodes_after = nodes_cpu(&pids);

    let shape = format!(
        "{jobs} jobs on {nodes} idle worker processes, default options (TTL {ttl:?}), {elapsed:.0} s window"
    );
    report.push(
        Figure::new("idle", "redis_cpu", "idle: Redis CPU")
            .value((redis_after - redis_before) / elapsed * 100.0, "%")
            .at_most(1.0, "< 1% of a core")
            .detail(format!("INFO cpu (user + sys); {shape}")),
    );
    let nodes_figure = Figure::new("idle", "nodes_cpu", "idle: worker processes CPU");
    let nodes_figure = match (nodes_before, nodes_after) {
        (Some(b), Some(a)) => nodes_figure.value((a - b) / elapsed * 100.0, "%"),
        _ => nodes_figure.unit("%"),
    };
    report.push(
        nodes_figure
            .at_most(2.0, "< 2% of a core, all together")
            .detail(format!(
                "/proc/<pid>/stat of every worker process, summed; {shape}"
            )),
    );

    ctx.progress("idle", "stopping the worker processes");
    for child in children {
        child.wait().await?;
    }
    // The workers exited without closing: delete what they left.
    delete_pool_keys(ctx, &pool).await
}

/// Starts `nodes` worker processes on `pool` (one node and one worker
/// each, default options but `mirror_jobs`) and a client-only dispatcher
/// here, and waits until every worker is registered.
pub(crate) async fn start_fleet(
    ctx: &Ctx,
    pool: &str,
    nodes: usize,
    mirror_jobs: bool,
) -> Result<(Node, Vec<WorkerProcess>), BoxError> {
    let ttl = NodeOptions::default().worker_ttl;
    let spawns = (0..nodes).map(|_| {
        WorkerProcess::spawn(
            &ctx.url,
            pool,
            ttl,
            1,
            mirror_jobs,
            Duration::from_secs(120),
        )
    });
    let children = futures::future::try_join_all(spawns).await?;
    let dispatcher = Node::join(
        &ctx.client,
        pool,
        NodeOptions::default()
            .client_only(true)
            .mirror_jobs(mirror_jobs)
            .dispatch_timeout(Duration::from_secs(60)),
    )
    .await?;
    flotilla_testkit::wait_until(Duration::from_secs(60), "all workers registered", || {
        let node = dispatcher.clone();
        async move { node.pool_workers().len() == nodes }
    })
    .await?;
    Ok((dispatcher, children))
}

/// Deletes every key of `pool`, by SCAN pages.
pub(crate) async fn delete_pool_keys(ctx: &Ctx, pool: &str) -> Result<(), BoxError> {
    use fred::prelude::*;
    let pattern = format!("fl:{{{pool}}}:*");
    let mut cursor = "0".to_string();
    loop {
        let (next, found): (String, Vec<String>) = ctx
            .client
            .scan_page(cursor, pattern.clone(), Some(1000), None)
            .await?;
        if !found.is_empty() {
            let _: i64 = ctx.client.del(found).await?;
        }
        if next == "0" {
            return Ok(());
        }
        cursor = next;
    }
}
