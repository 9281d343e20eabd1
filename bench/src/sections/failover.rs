//! Failover: a worker process is killed with SIGKILL; the time from the kill
//! until every job it owned has started on a surviving worker.

use std::time::{Duration, Instant};

use flotilla_pool::{Node, NodeOptions, Worker};
use hdrhistogram::Histogram;

use crate::child::WorkerProcess;
use crate::probe::Probe;
use crate::report::{Figure, Report};
use crate::{BoxError, Ctx};

const SURVIVORS: usize = 2;

/// Runs the section.
pub async fn run(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    let ttl = ctx.opts.ttl();
    let pool = flotilla_testkit::unique_name("bench-failover");
    // Mirroring the jobs map: the victim's jobs are found in its replica.
    let options = NodeOptions::default().worker_ttl(ttl).mirror_jobs(true);
    let node = Node::join(&ctx.client, &pool, options).await?;
    let joined = Instant::now();
    let probe = Probe::default();
    let mut survivors = Vec::new();
    for _ in 0..SURVIVORS {
        survivors.push(Worker::new(&node, probe.clone()).await?);
    }
    let mut keys: Vec<String> = Vec::new();
    let mut times = Histogram::<u64>::new(3)?;
    let mut moved_total = 0usize;
    for round in 0..ctx.opts.kills {
        let mut victim =
            WorkerProcess::spawn(&ctx.url, &pool, ttl, 1, true, Duration::from_secs(30)).await?;
        let victim_id = victim.workers.first().cloned().ok_or("no victim worker")?;
        flotilla_testkit::wait_until(Duration::from_secs(10), "victim in the ring", || {
            let node = node.clone();
            let id = victim_id.clone();
            async move {
                node.pool_workers()
                    .iter()
                    .any(|w| w.id == id && !w.cleaning)
            }
        })
        .await?;
        for i in 0..ctx.opts.failover_jobs {
            let key = format!("f{round}-{i}");
            node.dispatch_job(&key, &b"{}"[..]).await?;
            keys.push(key);
        }
        // Rebalance onto the victim settles: every job at its placement.
        settle(&node, &keys).await?;
        let victim_keys: Vec<String> = keys
            .iter()
            .filter(|k| node.job_owner(k).is_some_and(|(w, _)| w == victim_id))
            .cloned()
            .collect();
        // A node judges nobody dead during its first TTL.
        if let Some(wait) = (ttl + Duration::from_millis(100)).checked_sub(joined.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        ctx.progress(
            "failover",
            &format!(
                "kill {}/{}: pid {}, {} jobs",
                round + 1,
                ctx.opts.kills,
                victim.pid,
                victim_keys.len()
            ),
        );
        let killed = Instant::now();
        victim.kill()?;
        let limit = ttl * 10;
        flotilla_testkit::wait_until(limit, "victim's jobs started elsewhere", || {
            let probe = probe.clone();
            let victim_keys = victim_keys.clone();
            async move {
                victim_keys
                    .iter()
                    .all(|k| probe.started_at(k).is_some_and(|at| at > killed))
            }
        })
        .await?;
        let last = victim_keys
            .iter()
            .filter_map(|k| probe.started_at(k))
            .max()
            .unwrap_or(killed);
        times.record(last.saturating_duration_since(killed).as_millis().max(1) as u64)?;
        moved_total += victim_keys.len();
        victim.wait().await?;
    }
    let detail = format!(
        "{} kills, worker TTL {} ms, {:.0} jobs per killed worker, {SURVIVORS} surviving workers",
        ctx.opts.kills,
        ttl.as_millis(),
        moved_total as f64 / ctx.opts.kills.max(1) as f64
    );
    let limit_ms = ttl.as_millis() as f64 * 1.5;
    report.push(
        Figure::new("failover", "p50", "failover after SIGKILL p50")
            .value(times.value_at_quantile(0.5) as f64 / 1000.0, "s")
            .detail(detail.clone()),
    );
    report.push(
        Figure::new("failover", "p99", "failover after SIGKILL p99")
            .value(times.value_at_quantile(0.99) as f64 / 1000.0, "s")
            .at_most(
                limit_ms / 1000.0,
                format!("<= 1.5 x TTL = {:.1} s", limit_ms / 1000.0),
            )
            .detail(format!(
                "max {:.2} s; {detail}",
                times.max() as f64 / 1000.0
            )),
    );
    drop(survivors);
    node.shutdown().await?;
    Ok(())
}

/// Waits until every key is owned by its placement under `node`'s view
/// (its replica of the jobs map: `node` mirrors it).
pub async fn settle(node: &Node, keys: &[String]) -> Result<(), BoxError> {
    flotilla_testkit::wait_until(Duration::from_secs(60), "jobs at their placement", || {
        let node = node.clone();
        async move {
            keys.iter()
                .all(|k| match (node.job_owner(k), node.placement(k)) {
                    (Some((owner, _)), Some(placed)) => owner == placed,
                    _ => false,
                })
        }
    })
    .await?;
    Ok(())
}
