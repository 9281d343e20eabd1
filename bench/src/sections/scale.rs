//! Scale: `--scale-jobs` running jobs on `--scale-workers` workers (hosted by
//! worker processes); Redis memory and node memory per job; join time of a
//! fresh node into that pool.

use std::time::{Duration, Instant};

use flotilla_pool::{Node, NodeOptions};
use futures::StreamExt;

use crate::child::{WorkerProcess, join_probe};
use crate::redis_stats::{redis_cpu_seconds, rss_bytes, used_memory};
use crate::report::{Figure, Report};
use crate::{BoxError, Ctx};

const PROCESSES: usize = 4;
/// Fresh joins measured into the full pool (the figure is their median).
const JOIN_ROUNDS: usize = 3;

/// Runs the section.
pub async fn run(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    let jobs = ctx.opts.scale_jobs;
    let workers = ctx.opts.scale_workers.max(1);
    let processes = PROCESSES.min(workers);
    let pool = flotilla_testkit::unique_name("bench-scale");
    // The dispatcher mirrors the jobs map: it waits for its replica to
    // show every job.
    let options = NodeOptions::default()
        .client_only(true)
        .mirror_jobs(true)
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
        WorkerProcess::spawn(&ctx.url, &pool, ttl, count, true, Duration::from_secs(300))
    });
    let children = futures::future::try_join_all(spawns).await?;
    flotilla_testkit::wait_until(Duration::from_secs(60), "all workers registered", || {
        let node = node.clone();
        async move { node.pool_workers().len() == workers }
    })
    .await?;
    let workers_ready = t0.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A node's fixed memory (runtime, connections, channel buffers), from a
    // join into the pool before it has jobs.
    let empty = join_probe(&ctx.url, &pool, true).await?;
    let lean_empty = join_probe(&ctx.url, &pool, false).await?;
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
        if done.is_multiple_of(step) {
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

    ctx.progress("scale", "fresh node joins (new process)");
    // Three joins, each in a new process: one join's time moves a lot with
    // whatever else the machine does, so the figure is their median.
    let mut joins = Vec::new();
    for _ in 0..JOIN_ROUNDS {
        let redis_cpu = redis_cpu_seconds(&ctx.client).await?;
        let probe = join_probe(&ctx.url, &pool, true).await?;
        let redis_cpu = redis_cpu_seconds(&ctx.client).await? - redis_cpu;
        joins.push((probe, redis_cpu));
    }
    joins.sort_by(|a, b| a.0.join_ms.total_cmp(&b.0.join_ms));
    let join_times = joins
        .iter()
        .map(|(p, _)| format!("{:.2}", p.join_ms / 1000.0))
        .collect::<Vec<_>>()
        .join(", ");
    let (fresh, fresh_redis_cpu) = joins.swap_remove(JOIN_ROUNDS / 2);
    let lean = join_probe(&ctx.url, &pool, false).await?;

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
            .value(fresh.join_ms / 1000.0, "s")
            .at_most(2.0, "< 2 s")
            .detail(format!(
                "{shape}; median of {JOIN_ROUNDS} joins ({join_times} s), each in a new process; that one saw {} jobs on return, its process used {:.2} s of CPU and Redis {:.2} s meanwhile; {:.0} ms into the pool without jobs",
                fresh.jobs,
                fresh.cpu_s.unwrap_or(f64::NAN),
                fresh_redis_cpu,
                empty.join_ms
            )),
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
    let growth = |p: &crate::child::JoinProbe| Some(p.rss_after?.saturating_sub(p.rss_before?));
    let marginal = match (growth(&fresh), growth(&empty)) {
        (Some(full), Some(base)) => Some(full.saturating_sub(base) as f64 / jobs as f64),
        _ => None,
    };
    report.push(
        bytes_figure(
            "node_rss_per_job",
            "scale: node memory per job (fresh node)",
            marginal,
        )
        .at_most(1024.0, "< 1 KiB")
        .detail(format!(
            "RSS growth of a new process across Node::join, minus the same join into the pool without jobs ({:.1} MiB fixed); {:.0} bytes/job without that subtraction",
            growth(&empty).unwrap_or(0) as f64 / (1024.0 * 1024.0),
            per_job(fresh.rss_before, fresh.rss_after).unwrap_or(f64::NAN)
        )),
    );
    report.push(
        Figure::new("scale", "lean_join_time", "scale: fresh lean node join")
            .value(lean.join_ms / 1000.0, "s")
            .at_most(2.0, "< 2 s")
            .detail(format!(
                "{shape}; NodeOptions::mirror_jobs(false); {:.0} ms into the pool without jobs",
                lean_empty.join_ms
            )),
    );
    let lean_marginal = match (growth(&lean), growth(&lean_empty)) {
        (Some(full), Some(base)) => Some(full as f64 - base as f64),
        _ => None,
    };
    report.push(
        bytes_figure(
            "lean_node_rss_growth",
            "scale: lean node memory for the pool's jobs",
            lean_marginal,
        )
        .detail(format!(
            "RSS growth across Node::join with mirror_jobs(false) into the pool with {jobs} jobs, minus the same into the pool without jobs: whatever the pool holds, a lean node keeps only its own workers' jobs"
        )),
    );
    report.push(
        bytes_figure(
            "dispatcher_rss_per_job",
            "scale: dispatcher process RSS per job",
            per_job(rss_before, rss_after),
        )
        .detail("RSS growth of this process (a client-only node) while dispatching; reuses memory freed by earlier sections, so a lower bound"),
    );
    report.push(
        bytes_figure(
            "worker_rss_per_job",
            "scale: worker processes RSS per job",
            per_job(children_before, children_after),
        )
        .detail(format!(
            "sum over the {processes} worker processes (each one node replicating every job, plus running-job state)"
        )),
    );

    ctx.progress("scale", "shutting the pool down");
    node.shutdown().await?;
    for child in children {
        child.wait().await?;
    }
    Ok(())
}

/// A figure in bytes, unmeasured when `/proc` was not available.
fn bytes_figure(id: &'static str, label: &str, value: Option<f64>) -> Figure {
    let f = Figure::new("scale", id, label);
    match value {
        Some(v) => f.value(v, "bytes"),
        None => f.unit("bytes"),
    }
}
