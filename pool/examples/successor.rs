//! Seed 004: a workflow step whose items complete at nearly the same time
//! must start its successor once, not once per completion.
//!
//! ```text
//! cargo run -p flotilla-pool --example successor
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p flotilla-pool --example successor
//! ```
//!
//! Fifty "item completed" handlers on three nodes each decide that all
//! siblings are done and dispatch the successor `validate`. Admission is one
//! Lua script on Redis, so exactly one dispatch is admitted (I3); the others
//! get `JobExists`. With an idempotency window, completions that arrive
//! after the successor already finished (a redelivered message, a slow
//! listener) get `AlreadyDispatched` instead of starting it again.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use flotilla_pool::{DispatchOptions, Error, Job, Node, NodeOptions, TaskHandler, Worker};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Default)]
struct Outcomes {
    started: usize,
    exists: usize,
    already: usize,
}

/// `completions` concurrent "item completed" handlers, spread over `nodes`,
/// each dispatching the successor.
async fn complete(
    nodes: &[Node],
    key: &str,
    completions: usize,
    options: &DispatchOptions,
) -> Result<Outcomes, Error> {
    let mut calls = Vec::new();
    for i in 0..completions {
        let (node, options, key) = (
            nodes[i % nodes.len()].clone(),
            options.clone(),
            key.to_string(),
        );
        calls.push(tokio::spawn(async move {
            node.dispatch_job_with(&key, format!("triggered by item {i}"), &options)
                .await
        }));
    }
    let mut outcomes = Outcomes::default();
    for call in calls {
        match call.await.expect("completion task") {
            Ok(()) => outcomes.started += 1,
            Err(Error::JobExists(_)) => outcomes.exists += 1,
            Err(Error::AlreadyDispatched { .. }) => outcomes.already += 1,
            Err(other) => return Err(other),
        }
    }
    Ok(outcomes)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = flotilla_testkit::redis_for_example()?;
    let pool = format!("successor-example-{}", std::process::id());
    let starts = Arc::new(AtomicUsize::new(0));
    let mut nodes = Vec::new();
    let mut workers = Vec::new();
    for _ in 0..3 {
        let client = flotilla_testkit::client(&url).await?;
        let node = Node::join(&client, &pool, NodeOptions::default()).await?;
        let starts = Arc::clone(&starts);
        let handler = TaskHandler::new(move |job: Job, cancel: CancellationToken| {
            starts.fetch_add(1, Ordering::SeqCst);
            async move {
                println!(
                    "  >> {} started ({})",
                    job.key,
                    String::from_utf8_lossy(&job.payload)
                );
                cancel.cancelled().await;
                Ok(())
            }
        });
        workers.push(Worker::new(&node, handler).await?);
        nodes.push(node);
    }

    let once = DispatchOptions::default().idempotency_window(Duration::from_secs(600));
    println!("50 items complete at once on 3 nodes; each dispatches `validate`:");
    let first = complete(&nodes, "validate", 50, &once).await?;
    println!(
        "  admitted {}, JobExists {}, AlreadyDispatched {}; successor starts: {}",
        first.started,
        first.exists,
        first.already,
        starts.load(Ordering::SeqCst)
    );

    nodes[0].stop_job("validate").await?;
    println!("`validate` finished; 50 late completions arrive (10 min idempotency window):");
    let late = complete(&nodes, "validate", 50, &once).await?;
    println!(
        "  admitted {}, JobExists {}, AlreadyDispatched {}; successor starts: {}",
        late.started,
        late.exists,
        late.already,
        starts.load(Ordering::SeqCst)
    );

    // The same late completion without a window starts a finished successor
    // again: admission alone only guards against *concurrent* duplicates.
    let before = starts.load(Ordering::SeqCst);
    nodes[0].dispatch_job("validate-2", &b"first"[..]).await?;
    nodes[0].stop_job("validate-2").await?;
    let plain = complete(&nodes, "validate-2", 1, &DispatchOptions::default()).await?;
    println!(
        "without a window, one late completion after the successor finished: admitted {} (successor started {} times)",
        plain.started,
        starts.load(Ordering::SeqCst) - before
    );

    nodes[0].shutdown().await?;
    for node in &nodes[1..] {
        node.close().await?;
    }
    Ok(())
}
