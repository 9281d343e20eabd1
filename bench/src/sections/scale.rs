//! Scale: `--scale-jobs` running jobs on `--scale-workers` workers (hosted by
//! worker processes); Redis memory and node memory per job; join time of a
//! fresh node into that pool.

use std::time::{Duration, Instant};

use flotilla_pool::{Node, NodeOptions};
use futures::StreamExt;

use crate::child::WorkerProcess;
use crate::redis_stats::{rss_bytes, used_memory};
use crate::report::{Figure, Report};
use crate::{BoxError, Ctx};

const PROCESSES: usize = 4;

/// Runs the section.
pub async fn run(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    let jobs = ctx.opts.scale_jobs;
    let workers = ctx.opts.scale_workers.max(1);
    let processes = PROCESSES.min(workers);
    let pool = flotilla_testkit::unique_name("bench-scale");
    let options = NodeOptions::default()
        .client_only(true)
        .dispatch_timeout(Duration::from_secs(60))
        .worker_shutdown_ttl(Duration::from_secs(120));
    let node = Node::join(&ctx.client, &pool, options).await?;
    let ttl = NodeOptions::default().worker_ttl;

    ctx.progress(
        "scale",
        &format!("starting {workers} workers in {processes} processes"),
    );
    let t0 = Instant::now();
    let spawns = (0..processes).map(|p| {
        let count = workers / processes + usize::from(p < workers % processes);
        WorkerProcess::spawn(&ctx.url, &pool, ttl, count, Duration::from_secs(300))
    });
    let children = futures::future::try_join_all(spawns).await?;
    flotilla_testkit::wait_until(Duration::from_secs(60), "all workers registered", || {
        let node = node.clone();
        async move { node.pool_workers().len() == workers }
    })
    .await?;
    let workers_ready = t0.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let redis_before = used_memory(&ctx.client).await?;
    let rss_before = rss_bytes(None);
    let children_before: Option<u64> = children.iter().map(|c| rss_bytes(Some(c.pid))).sum();

    ctx.progress("scale", &format!("dispatching {jobs} jobs"));
    let t0 = Instant::now();
    let mut admitted = futures::stream::iter((0..jobs).map(|i| {
        let node = node.clone();
        async move {
            node.dispatch_job(&format!("scale-{i:06}"), &b"{}"[..])
                .await
        }
    }))
    .buffer_unordered(ctx.opts.concurrency.max(1) * 2);
    // Rate per fifth of the run: shows whether dispatch slows as the pool fills.
    let step = (jobs / 5).max(1);
    let mut segments = Vec::new();
    let mut segment_start = Instant::now();
    let mut done = 0usize;
    while let Some(result) = admitted.next().await {
        result?;
        done += 1;
        if done % step == 0 {
            segments.push(step as f64 / segment_start.elapsed().as_secs_f64());
            segment_start = Instant::now();
            ctx.progress("scale", &format!("{done} running"));
        }
    }
    drop(admitted);
    let dispatch_time = t0.elapsed();
    flotilla_testkit::wait_until(Duration::from_secs(60), "jobs map replicated", || {
        let node = node.clone();
        async move { node.job_keys().len() >= jobs }
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let redis_after = used_memory(&ctx.client).await?;
    let rss_after = rss_bytes(None);
    let children_after: Option<u64> = children.iter().map(|c| rss_bytes(Some(c.pid))).sum();

    ctx.progress("scale", "fresh node joins");
    let fresh_client = flotilla_testkit::client(&ctx.url).await?;
    let rss_before_join = rss_bytes(None);
    let t0 = Instant::now();
    let fresh = Node::join(&fresh_client, &pool, NodeOptions::default()).await?;
    let join_time = t0.elapsed();
    let fresh_jobs = fresh.job_keys().len();
    let rss_after_join = rss_bytes(None);

    let per_job = |before: Option<u64>, after: Option<u64>| match (before, after) {
        (Some(b), Some(a)) => Some(a.saturating_sub(b) as f64 / jobs as f64),
        _ => None,
    };
    let shape = format!("{jobs} jobs, {workers} workers in {processes} processes");
    report.push(
        Figure::new("scale", "dispatch_rate", "scale: dispatch rate")
            .value(jobs as f64 / dispatch_time.as_secs_f64(), "jobs/s")
            .detail(format!(
                "{shape}; per fifth: {} jobs/s; workers registered in {:.1} s",
                segments
                    .iter()
                    .map(|r| format!("{r:.0}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                workers_ready.as_secs_f64()
            )),
    );
    report.push(
        Figure::new("scale", "join_time", "scale: fresh node join")
            .value(join_time.as_secs_f64(), "s")
            .at_most(2.0, "< 2 s")
            .detail(format!("{shape}; it saw {fresh_jobs} jobs on return")),
    );
    report.push(
        Figure::new(
            "scale",
            "redis_memory_per_job",
            "scale: Redis used_memory per job",
        )
        .value(
            redis_after.saturating_sub(redis_before) as f64 / jobs as f64,
            "bytes",
        )
        .detail(shape.clone()),
    );
    let mut f = Figure::new(
        "scale",
        "node_rss_per_job",
        "scale: dispatcher node RSS per job",
    );
    if let Some(v) = per_job(rss_before, rss_after) {
        f = f.value(v, "bytes");
    } else {
        f = f.unit("bytes");
    }
    report.push(
        f.at_most(1024.0, "< 1 KiB")
            .detail("RSS growth of this process (one node, replicas of every pool map) while the jobs were dispatched"),
    );
    let mut f = Figure::new(
        "scale",
        "fresh_node_rss_per_job",
        "scale: fresh node RSS per job",
    );
    if let Some(v) = per_job(rss_before_join, rss_after_join) {
        f = f.value(v, "bytes");
    } else {
        f = f.unit("bytes");
    }
    report.push(
        f.at_most(1024.0, "< 1 KiB")
            .detail("RSS growth of this process while the fresh node joined"),
    );
    let mut f = Figure::new(
        "scale",
        "worker_rss_per_job",
        "scale: worker processes RSS per job",
    );
    if let Some(v) = per_job(children_before, children_after) {
        f = f.value(v, "bytes");
    } else {
        f = f.unit("bytes");
    }
    report.push(f.detail(format!(
        "sum over the {processes} worker processes (each one node replicating every job, plus running-job state)"
    )));

    ctx.progress("scale", "shutting the pool down");
    fresh.close().await?;
    node.shutdown().await?;
    for child in children {
        child.wait().await?;
    }
    Ok(())
}
