//! Seed 004: many concurrent completions each try to dispatch the same
//! successor; it starts exactly once (I3), and with an idempotency window
//! late completions do not start it again after it finished.

mod support;

use std::time::Duration;

use flotilla_pool::{DispatchOptions, Error, Node, Worker};
use support::{Env, Ledger, fast};

/// What one completion saw when it tried to dispatch the successor.
#[derive(Debug, Default)]
struct Outcomes {
    started: usize,
    exists: usize,
    already: usize,
}

async fn complete_all(nodes: &[Node], completions: usize, options: &DispatchOptions) -> Outcomes {
    let mut calls = Vec::new();
    for i in 0..completions {
        let (node, options) = (nodes[i % nodes.len()].clone(), options.clone());
        calls.push(tokio::spawn(async move {
            // "Item i completed; all siblings are done (as far as I can
            // tell): dispatch the successor."
            node.dispatch_job_with("validate", format!("from item {i}"), &options)
                .await
        }));
    }
    let mut outcomes = Outcomes::default();
    for call in calls {
        match call.await.expect("completion task") {
            Ok(()) => outcomes.started += 1,
            Err(Error::JobExists(_)) => outcomes.exists += 1,
            Err(Error::AlreadyDispatched { .. }) => outcomes.already += 1,
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    outcomes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_completions_start_the_successor_once() {
    let env = Env::new("successor");
    let ledger = Ledger::default();
    let mut nodes = Vec::new();
    let mut workers = Vec::new();
    for i in 0..3 {
        let node = env.node(fast()).await;
        workers.push(
            Worker::new(&node, ledger.handler(&format!("w{i}")))
                .await
                .unwrap(),
        );
        nodes.push(node);
    }
    let once = DispatchOptions::default().idempotency_window(Duration::from_secs(20));

    let first = complete_all(&nodes, 50, &once).await;
    assert_eq!(first.started, 1, "{first:?}");
    assert_eq!(first.exists + first.already, 49, "{first:?}");
    assert_eq!(ledger.starts("validate"), 1);

    // The successor finishes; completions that arrive late (redelivered
    // messages, slow listeners) must not start it again.
    nodes[0].stop_job("validate").await.unwrap();
    let late = complete_all(&nodes, 50, &once).await;
    assert_eq!(late.started, 0, "{late:?}");
    assert_eq!(late.already, 50, "{late:?}");
    assert_eq!(ledger.starts("validate"), 1);
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    for node in nodes {
        node.close().await.unwrap();
    }
}
