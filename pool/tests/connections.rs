//! Connections per node: a node holds at most three Redis connections (its
//! client, one subscriber shared by its maps, one blocking reader shared by
//! its workers), whatever its worker count. Counted with `CLIENT LIST` on a
//! private server.

mod support;

use std::time::Duration;

use flotilla_pool::fred::prelude::*;
use flotilla_pool::{Node, Worker};
use support::{Env, Ledger, eventually, fast};

/// The most connections one node may hold.
const MAX_CONNECTIONS: usize = 3;

/// `CLIENT LIST` lines of every connection but the caller's own.
async fn other_connections(inspector: &Client) -> Vec<String> {
    let own: i64 = inspector.client_id().await.unwrap();
    let list: String = inspector
        .client_list::<String, String>(None, None)
        .await
        .unwrap();
    list.lines()
        .filter(|line| !line.starts_with(&format!("id={own} ")))
        .map(|line| {
            // The fields that tell connections apart: id, name, last command.
            line.split(' ')
                .filter(|f| {
                    f.starts_with("id=")
                        || f.starts_with("name=")
                        || f.starts_with("cmd=")
                        || f.starts_with("sub=")
                        || f.starts_with("ssub=")
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

/// The latest keep-alive of the node's workers (server time, ms).
fn last_keepalive(node: &Node) -> u64 {
    node.pool_workers()
        .iter()
        .filter_map(|w| w.keepalive_ms)
        .max()
        .unwrap_or(0)
}

/// Joins a node with `workers` workers on a private server, runs a few jobs
/// on every worker, and returns the node's connections.
async fn connections_of_a_node(prefix: &str, workers: usize) -> Vec<String> {
    let env = Env::new(prefix);
    let inspector = flotilla_testkit::client(&env.server.url()).await.unwrap();
    let node = Node::connect(&env.server.url(), &env.pool, fast())
        .await
        .unwrap();
    let ledger = Ledger::default();
    let mut hosted = Vec::new();
    for i in 0..workers {
        hosted.push(
            Worker::new(&node, ledger.handler(&format!("w{i}")))
                .await
                .unwrap(),
        );
    }
    let jobs = workers * 4;
    for j in 0..jobs {
        node.dispatch_job(&format!("job-{j}"), "p").await.unwrap();
    }
    eventually("every job runs", Duration::from_secs(10), || {
        ledger.running().len() == jobs
    })
    .await;
    // One keep-alive renewal (TTL/3) and a stop on top, so every path that
    // could open a connection has run.
    let renewed = last_keepalive(&node);
    node.stop_job("job-0").await.unwrap();
    eventually("a keep-alive renewal", Duration::from_secs(10), || {
        node.pool_workers()
            .iter()
            .all(|w| w.keepalive_ms.is_some_and(|ms| ms > renewed))
    })
    .await;
    let connections = other_connections(&inspector).await;
    println!(
        "a node with {workers} worker(s) holds {} connection(s):\n  {}",
        connections.len(),
        connections.join("\n  ")
    );
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    node.close().await.unwrap();
    drop(hosted);
    connections
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_one_worker_holds_at_most_three_connections() {
    let connections = connections_of_a_node("conn-1", 1).await;
    assert!(
        connections.len() <= MAX_CONNECTIONS,
        "{} connections: {connections:#?}",
        connections.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_eight_workers_holds_at_most_three_connections() {
    let connections = connections_of_a_node("conn-8", 8).await;
    assert!(
        connections.len() <= MAX_CONNECTIONS,
        "{} connections: {connections:#?}",
        connections.len()
    );
}
