//! Every node notices, within its TTL, that Redis lost the pool's data on
//! a server that kept running (`FLUSHALL`: no new run id). It must: a
//! node that answered for a stop makes it stand again during the recovery
//! window, which the first node to notice opens for one TTL. Soak seed 1404
//! (TTL 600 ms): a paused holder came back right after a `FLUSHALL` and gave
//! back the jobs it held as orphans; the nodes that had stopped them since
//! noticed the flush only at their identity check, every 2 s, after the
//! orphan sweep had started them again.

use super::*;

/// Short enough that a fixed 2 s between identity checks misses it.
const TTL: Duration = Duration::from_millis(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_notices_a_flush_within_its_ttl() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("flush-notice");
    let lean = NodeOptions::default().mirror_jobs(false).worker_ttl(TTL);
    let worker_node = Node::join(&client, &name, lean.clone()).await.unwrap();
    let _worker = Worker::new(&worker_node, Counting::default())
        .await
        .unwrap();
    let client_only = Node::join(&client, &name, lean.client_only(true))
        .await
        .unwrap();
    let mut noticed = Vec::new();
    for node in [&worker_node, &client_only] {
        let mut restarts = node.inner.server_restarts.subscribe();
        restarts.borrow_and_update();
        noticed.push(restarts);
    }
    flushall(&client).await;
    let flushed = std::time::Instant::now();
    for (what, restarts) in ["the worker's node", "the client-only node"]
        .into_iter()
        .zip(&mut noticed)
    {
        let left = TTL.saturating_sub(flushed.elapsed());
        tokio::time::timeout(left, restarts.changed())
            .await
            .unwrap_or_else(|_| panic!("{what} did not notice the flush within a TTL ({TTL:?})"))
            .unwrap();
    }
    client_only.close().await.unwrap();
    worker_node.close().await.unwrap();
}
