//! The ring a node places keys by follows its membership replicas even
//! when it missed their change events (examples CI: the producer joined
//! while its two worker processes registered; the registrations reached
//! its replica between its first ring and its ring task's subscriptions,
//! so `pool_workers()` showed both workers and every dispatch waited 30 s
//! for an owner and failed with `NoActiveWorker`).

use std::time::Duration;

use super::*;
use crate::routing::Ring;

/// A client-only node of `server`'s pool `name` and a worker node with
/// one worker, both seen by the client-only node's replica.
async fn producer_and_worker(server: &RedisServer, name: &str) -> (Node, Node, Worker) {
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let options = NodeOptions::default().dispatch_timeout(Duration::from_secs(2));
    let producer = Node::join(&client, name, options.clone().client_only(true))
        .await
        .unwrap();
    let node = Node::join(&client, name, options).await.unwrap();
    let worker = Worker::new(&node, Counting::default()).await.unwrap();
    wait_until(
        Duration::from_secs(5),
        "the producer's ring places keys",
        || {
            let placed = producer.placement("k").is_some();
            async move { placed }
        },
    )
    .await
    .unwrap();
    (producer, node, worker)
}

/// The ring as built before the worker registered: no owner for any key.
fn forget_ring(node: &Node) {
    node.inner
        .ring
        .store(Arc::new(Ring::new(Vec::<String>::new())));
    assert_eq!(node.placement("k"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_reads_the_replicas_when_its_ring_has_no_owner() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("ring-view");
    let (producer, node, worker) = producer_and_worker(&server, &name).await;
    forget_ring(&producer);

    producer.dispatch_job("k", &b"p"[..]).await.unwrap();
    wait_until(Duration::from_secs(5), "the job runs", || {
        let running = worker.job_token("k").is_some();
        async move { running }
    })
    .await
    .unwrap();
    producer.close().await.unwrap();
    node.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_task_starts_from_the_replicas_it_subscribed_to() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("ring-task");
    let (producer, node, worker) = producer_and_worker(&server, &name).await;
    forget_ring(&producer);

    // A ring task started after the change it has no event of (the join's
    // window): it builds the ring from the replicas at once.
    let task = tokio::spawn(producer.inner.clone().ring_loop());
    wait_until(Duration::from_secs(5), "the ring places the key", || {
        let owner = producer.placement("k");
        async move { owner.is_some() }
    })
    .await
    .unwrap();
    assert_eq!(producer.placement("k").as_deref(), Some(worker.id()));
    producer.close().await.unwrap();
    task.await.unwrap();
    node.close().await.unwrap();
}
