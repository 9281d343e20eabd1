//! A schedule on three nodes: only the leader runs the producer, once per
//! interval pool-wide; jobs follow the producer's set; closing the leader
//! hands the schedule over at once.
//!
//! ```text
//! cargo run -p flotilla-pool --example scheduler
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p flotilla-pool --example scheduler
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use flotilla_pool::{Job, Node, NodeOptions, Schedule, ScheduleOptions, TaskHandler, Worker};
use tokio_util::sync::CancellationToken;

/// The tenants that should have a sync job, changing over time (in a real
/// system: a database query).
fn active_tenants(round: u64) -> Vec<(String, Bytes)> {
    let first = round / 3; // every third run, the oldest tenant leaves and a new one joins
    (first..first + 3)
        .map(|t| {
            (
                format!("tenant-{t}"),
                Bytes::from(format!("{{\"tenant\":{t}}}")),
            )
        })
        .collect()
}

fn leader(schedules: &[Option<Schedule>]) -> Option<usize> {
    schedules
        .iter()
        .position(|s| s.as_ref().is_some_and(Schedule::is_leader))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = flotilla_testkit::redis_for_example()?;
    let pool = format!("scheduler-example-{}", std::process::id());
    let rounds = Arc::new(AtomicU64::new(0));
    let mut nodes = Vec::new();
    let mut workers = Vec::new();
    let mut schedules = Vec::new();
    for n in 0..3 {
        let client = flotilla_testkit::client(&url).await?;
        let node = Node::join(
            &client,
            &pool,
            NodeOptions::default().node_id(format!("node-{n}")),
        )
        .await?;
        let handler = TaskHandler::new(move |job: Job, cancel: CancellationToken| async move {
            println!(
                "    node-{n}: start {} (token {})",
                job.key, job.fencing_token
            );
            cancel.cancelled().await;
            println!("    node-{n}: stop  {}", job.key);
            Ok(())
        });
        workers.push(Worker::new(&node, handler).await?);
        nodes.push(node);
    }
    // Every node competes for the schedule; only the leader produces.
    for (n, node) in nodes.iter().enumerate() {
        let rounds = Arc::clone(&rounds);
        let schedule = node
            .schedule_with(
                "tenant-sync",
                Duration::from_millis(500),
                ScheduleOptions::default().leader_ttl(Duration::from_secs(3)),
                move || {
                    let round = rounds.fetch_add(1, Ordering::SeqCst);
                    async move {
                        let jobs = active_tenants(round);
                        let keys: Vec<&str> = jobs.iter().map(|(k, _)| k.as_str()).collect();
                        println!("  node-{n} (leader) produces run {round}: {keys:?}");
                        Ok(jobs)
                    }
                },
            )
            .await?;
        schedules.push(Some(schedule));
    }

    tokio::time::sleep(Duration::from_millis(3_200)).await;
    let Some(first) = leader(&schedules) else {
        return Err("no leader".into());
    };
    println!("closing node-{first}'s schedule (a rolling deploy)...");
    let closed = Instant::now();
    if let Some(schedule) = schedules[first].take() {
        schedule.close().await?;
    }
    while leader(&schedules).is_none() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!(
        "node-{} leads {:?} after the close",
        leader(&schedules).unwrap_or_default(),
        closed.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(3_000)).await;

    let mut running = nodes[0].lookup_job_keys().await?;
    running.sort();
    println!("running now: {running:?}");
    for schedule in schedules.into_iter().flatten() {
        schedule.close().await?;
    }
    nodes[0].shutdown().await?;
    for node in &nodes[1..] {
        node.close().await?;
    }
    Ok(())
}
