//! Fleet scale: what a dispatch costs as the pool gains processes. For
//! each K of `--fleet-nodes`, a fresh pool with K worker processes (one
//! node and one worker each) and one client-only dispatcher in this
//! process, which admits `--fleet-jobs` jobs with `--concurrency` in
//! flight. Per K: jobs/s, Redis CPU per job, the CPU of every process (this
//! one and the K children) per job, Redis commands per job and Redis bytes
//! sent per job (replication to every mirroring node is what grows with K).
//! Each K runs twice: with mirroring nodes (`NodeOptions::mirror_jobs(true)`
//! on every node) and with lean nodes (`mirror_jobs(false)`, the library's
//! default, on every node); `--fleet-modes` picks.

use std::time::Instant;

use fred::types::InfoKind;
use futures::StreamExt;

use crate::redis_stats::{
    CommandStats, info_field, process_cpu_seconds, process_cpu_seconds_of, redis_cpu_seconds,
};
use crate::report::{Figure, Report};
use crate::{BoxError, Ctx};

/// Whether the nodes of a round mirror the jobs and pending maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FleetMode {
    /// `mirror_jobs(true)` on every node: every node mirrors them.
    Mirror,
    /// `mirror_jobs(false)` (the library's default) on every node.
    Lean,
}

impl FleetMode {
    /// The prefix of the mode's figure ids and labels (none for `Mirror`,
    /// so that its ids stay those of earlier runs).
    fn prefix(self) -> (&'static str, &'static str) {
        match self {
            FleetMode::Mirror => ("", ""),
            FleetMode::Lean => ("lean_", "lean nodes, "),
        }
    }
}

/// What one K measured.
struct Round {
    mode: FleetMode,
    nodes: usize,
    jobs_per_s: f64,
    redis_cpu_us: f64,
    all_cpu_us: f64,
    commands: f64,
    bytes_out: f64,
}

/// Runs the section.
pub async fn run(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    let mut rounds = Vec::new();
    for &nodes in &ctx.opts.fleet_nodes {
        for &mode in &ctx.opts.fleet_modes {
            let round = measure(ctx, nodes.max(1), mode).await?;
            ctx.progress(
            "fleet",
            &format!(
                "{}K={}: {:.0} jobs/s, Redis {:.1} µs/job, all processes {:.1} µs/job, {:.1} commands/job, {:.0} B out/job",
                round.mode.prefix().1,
                round.nodes,
                round.jobs_per_s,
                round.redis_cpu_us,
                round.all_cpu_us,
                round.commands,
                round.bytes_out
            ),
        );
            rounds.push(round);
        }
    }
    let shape = |r: &Round| {
        format!(
            "{} jobs, {} in flight, one client-only dispatcher, {} worker processes{}",
            ctx.opts.fleet_jobs,
            ctx.opts.concurrency,
            r.nodes,
            match r.mode {
                FleetMode::Mirror => "; every node mirrors the jobs and pending maps",
                FleetMode::Lean => "; no node mirrors the jobs and pending maps",
            }
        )
    };
    for r in &rounds {
        let k = r.nodes;
        let (id, label) = r.mode.prefix();
        report.push(
            Figure::new(
                "fleet",
                format!("{id}k{k}_jobs_per_s"),
                format!("{label}K={k}: throughput"),
            )
            .value(r.jobs_per_s, "jobs/s")
            .detail(shape(r)),
        );
        report.push(
            Figure::new(
                "fleet",
                format!("{id}k{k}_redis_cpu"),
                format!("{label}K={k}: Redis CPU"),
            )
            .value(r.redis_cpu_us, "µs/job")
            .detail("INFO cpu (user + sys) over the dispatch window"),
        );
        report.push(
            Figure::new(
                "fleet",
                format!("{id}k{k}_all_cpu"),
                format!("{label}K={k}: CPU of all processes"),
            )
            .value(r.all_cpu_us, "µs/job")
            .detail("this process and every worker process (/proc/<pid>/stat), not Redis"),
        );
        report.push(
            Figure::new(
                "fleet",
                format!("{id}k{k}_commands"),
                format!("{label}K={k}: Redis commands"),
            )
            .value(r.commands, "/job")
            .detail("INFO commandstats, every command of every client"),
        );
        report.push(
            Figure::new(
                "fleet",
                format!("{id}k{k}_bytes_out"),
                format!("{label}K={k}: Redis bytes out"),
            )
            .value(r.bytes_out, "B/job")
            .detail("INFO stats total_net_output_bytes: replies and change messages"),
        );
    }
    if ctx.opts.fleet_idle_nodes > 0 {
        for &mode in &ctx.opts.fleet_modes {
            let idle = ctx.opts.fleet_idle_nodes;
            // The K=1 pool measured right before and right after the round
            // with idle nodes, compared with their mean: this VM's speed
            // drifts within seconds, and the K=1 round of the table above
            // ran a minute earlier.
            let before = measure(ctx, 1, mode).await?;
            let idle_round = measure_idle_nodes(ctx, idle, mode).await?;
            let after = measure(ctx, 1, mode).await?;
            let k1_jobs_per_s = (before.jobs_per_s + after.jobs_per_s) / 2.0;
            let k1_redis_cpu_us = (before.redis_cpu_us + after.redis_cpu_us) / 2.0;
            let cpu_us = idle_round.node_cpu_us;
            let (id, label) = mode.prefix();
            ctx.progress(
                "fleet",
                &format!(
                    "{label}{idle} idle nodes: {cpu_us:.2} µs per node per dispatch, {:.0} jobs/s, Redis {:.1} µs/job",
                    idle_round.jobs_per_s, idle_round.redis_cpu_us
                ),
            );
            report.push(
                Figure::new(
                    "fleet",
                    format!("{id}idle_node_cpu"),
                    format!("{label}idle node CPU per pool-wide dispatch"),
                )
                .value(cpu_us, "µs")
                .at_most(1.0, "< 1 µs")
                .detail(format!(
                    "{} jobs to one worker process; CPU of {idle} processes whose nodes host no worker, / jobs / nodes",
                    ctx.opts.fleet_jobs
                )),
            );
            // The same pool as K=1, with the idle nodes beside it: what
            // nodes that take no part in a dispatch cost the pool.
            report.push(
                Figure::new(
                    "fleet",
                    format!("{id}idle{idle}_vs_k1"),
                    format!("{label}K=1 with {idle} idle nodes: throughput / K=1"),
                )
                .value(idle_round.jobs_per_s / k1_jobs_per_s * 100.0, "%")
                .at_least(90.0, ">= 90%")
                .detail(format!(
                    "{:.0} jobs/s with {idle} idle nodes; without, {:.0} right before and {:.0} right after (mean {k1_jobs_per_s:.0}; separate pools)",
                    idle_round.jobs_per_s, before.jobs_per_s, after.jobs_per_s
                )),
            );
            report.push(
                Figure::new(
                    "fleet",
                    format!("{id}idle{idle}_vs_k1_redis_cpu"),
                    format!("{label}K=1 with {idle} idle nodes: Redis CPU / K=1"),
                )
                .value(idle_round.redis_cpu_us / k1_redis_cpu_us, "x")
                .at_most(1.2, "<= 1.2x")
                .detail(format!(
                    "{:.1} µs/job with {idle} idle nodes; without, {:.1} right before and {:.1} right after (mean {k1_redis_cpu_us:.1})",
                    idle_round.redis_cpu_us, before.redis_cpu_us, after.redis_cpu_us
                )),
            );
        }
    }
    // The target compares the 16-node pool with the 1-node one.
    for &mode in &ctx.opts.fleet_modes {
        let (id, label) = mode.prefix();
        let one = rounds.iter().find(|r| r.mode == mode && r.nodes == 1);
        let sixteen = rounds.iter().find(|r| r.mode == mode && r.nodes == 16);
        if let (Some(one), Some(sixteen)) = (one, sixteen) {
            report.push(
                Figure::new(
                    "fleet",
                    format!("{id}k16_vs_k1"),
                    format!("{label}K=16 throughput / K=1"),
                )
                .value(sixteen.jobs_per_s / one.jobs_per_s * 100.0, "%")
                .at_least(90.0, ">= 90%"),
            );
            report.push(
                Figure::new(
                    "fleet",
                    format!("{id}k16_vs_k1_redis_cpu"),
                    format!("{label}K=16 Redis CPU / K=1"),
                )
                .value(sixteen.redis_cpu_us / one.redis_cpu_us, "x")
                .at_most(1.2, "<= 1.2x"),
            );
        }
    }
    Ok(())
}

/// One pool with `nodes` worker processes: dispatch, measure, tear down.
async fn measure(ctx: &Ctx, nodes: usize, mode: FleetMode) -> Result<Round, BoxError> {
    let jobs = ctx.opts.fleet_jobs.max(1);
    let pool = flotilla_testkit::unique_name("bench-fleet");
    ctx.progress(
        "fleet",
        &format!("{}K={nodes}: starting worker processes", mode.prefix().1),
    );
    let (dispatcher, children) =
        super::idle::start_fleet(ctx, &pool, nodes, mode == FleetMode::Mirror).await?;

    let pids: Vec<u32> = children.iter().map(|c| c.pid).collect();
    let all_cpu = || -> Option<f64> {
        let children: Option<f64> = pids
            .iter()
            .map(|pid| process_cpu_seconds_of(Some(*pid)))
            .sum();
        Some(children? + process_cpu_seconds()?)
    };
    let bytes_out = || info_field(&ctx.client, InfoKind::Stats, "total_net_output_bytes");
    let commands_before = CommandStats::read(&ctx.client).await?;
    let bytes_before: f64 = bytes_out().await?.parse()?;
    let redis_before = redis_cpu_seconds(&ctx.client).await?;
    let cpu_before = all_cpu();
    let t0 = Instant::now();
    let mut admitted = futures::stream::iter((0..jobs).map(|i| {
        let node = dispatcher.clone();
        async move {
            node.dispatch_job(&format!("fleet-{i:06}"), &b"{}"[..])
                .await
        }
    }))
    .buffer_unordered(ctx.opts.concurrency.max(1));
    while let Some(result) = admitted.next().await {
        result?;
    }
    drop(admitted);
    let elapsed = t0.elapsed().as_secs_f64();
    let redis_after = redis_cpu_seconds(&ctx.client).await?;
    let cpu_after = all_cpu();
    let bytes_after: f64 = bytes_out().await?.parse()?;
    let commands = CommandStats::read(&ctx.client)
        .await?
        .since(&commands_before);
    let n = jobs as f64;
    let round = Round {
        mode,
        nodes,
        jobs_per_s: n / elapsed,
        redis_cpu_us: (redis_after - redis_before) * 1e6 / n,
        all_cpu_us: match (cpu_before, cpu_after) {
            (Some(b), Some(a)) => (a - b) * 1e6 / n,
            _ => f64::NAN,
        },
        commands: commands.total() as f64 / n,
        bytes_out: (bytes_after - bytes_before) / n,
    };

    dispatcher.close().await?;
    for child in children {
        child.wait().await?;
    }
    super::idle::delete_pool_keys(ctx, &pool).await?;
    Ok(round)
}

/// What the idle-node round measured.
struct IdleRound {
    /// CPU of the idle nodes per dispatch per node.
    node_cpu_us: f64,
    /// Throughput of the one worker process.
    jobs_per_s: f64,
    /// Redis CPU per job.
    redis_cpu_us: f64,
}

/// One worker process takes `--fleet-jobs` dispatches while `idle` more
/// processes host a node each and no worker: their CPU per dispatch per
/// node (what a pool-wide dispatch costs a node that takes no part in it),
/// the throughput and Redis's CPU per job.
async fn measure_idle_nodes(
    ctx: &Ctx,
    idle: usize,
    mode: FleetMode,
) -> Result<IdleRound, BoxError> {
    let jobs = ctx.opts.fleet_jobs.max(1);
    let pool = flotilla_testkit::unique_name("bench-fleet-idle");
    let mirror = mode == FleetMode::Mirror;
    let (dispatcher, worker) = super::idle::start_fleet(ctx, &pool, 1, mirror).await?;
    let ttl = flotilla_pool::NodeOptions::default().worker_ttl;
    let spawns = (0..idle).map(|_| {
        crate::child::WorkerProcess::spawn(
            &ctx.url,
            &pool,
            ttl,
            0,
            mirror,
            std::time::Duration::from_secs(120),
        )
    });
    let idle_nodes = futures::future::try_join_all(spawns).await?;
    // Their joins' own work (first ticks, first renewals) done, as in the
    // idle section: the window measures dispatches only.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let pids: Vec<u32> = idle_nodes.iter().map(|c| c.pid).collect();
    let idle_cpu = || -> Option<f64> {
        pids.iter()
            .map(|pid| process_cpu_seconds_of(Some(*pid)))
            .sum()
    };
    let before = idle_cpu();
    let redis_before = redis_cpu_seconds(&ctx.client).await?;
    let t0 = Instant::now();
    let mut admitted = futures::stream::iter((0..jobs).map(|i| {
        let node = dispatcher.clone();
        async move { node.dispatch_job(&format!("idle-{i:06}"), &b"{}"[..]).await }
    }))
    .buffer_unordered(ctx.opts.concurrency.max(1));
    while let Some(result) = admitted.next().await {
        result?;
    }
    drop(admitted);
    let elapsed = t0.elapsed().as_secs_f64();
    let redis_after = redis_cpu_seconds(&ctx.client).await?;
    let after = idle_cpu();
    dispatcher.close().await?;
    for child in worker.into_iter().chain(idle_nodes) {
        child.wait().await?;
    }
    super::idle::delete_pool_keys(ctx, &pool).await?;
    let n = jobs as f64;
    Ok(IdleRound {
        node_cpu_us: match (before, after) {
            (Some(b), Some(a)) => (a - b) * 1e6 / n / idle as f64,
            _ => f64::NAN,
        },
        jobs_per_s: n / elapsed,
        redis_cpu_us: (redis_after - redis_before) * 1e6 / n,
    })
}
