//! A node back within a fraction of its TTL after a Redis outage.
//!
//! After an outage every worker's last renewal is older than the TTL on
//! server time, so the first node back opens a recovery window of one TTL
//! and, once it is over, claims the cleanup of every worker whose node has
//! not renewed yet. A node whose reconnect backoff had grown to a second
//! came back after that with a 600 ms TTL (chaos soak seed 1404): its
//! workers were cleaned up as dead, and a run one of them had finished,
//! whose end a rollback just before the outage had lost, was started again
//! elsewhere (`I2 finish undone`): the finishing worker, which makes such
//! an end stand again, was out of reach for the whole window.

use std::time::Instant;

use super::*;

/// With a 600 ms TTL, every node reconnects within half a TTL of Redis's
/// return after outages long enough for a reconnect backoff to reach its
/// longest pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_is_back_within_half_a_ttl_of_redis_after_an_outage() {
    let mut server = RedisServer::start().unwrap();
    let ttl = Duration::from_millis(600);
    let name = flotilla_testkit::unique_name("outage-return");
    let options = NodeOptions::default().worker_ttl(ttl);
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(
            Node::connect(&server.url(), &name, options.clone())
                .await
                .unwrap(),
        );
    }
    // A user's client built with the policy the library advises.
    let mut builder = flotilla_testkit::builder(&server.url()).unwrap();
    builder.set_policy(crate::reconnect_policy(&options));
    let client = builder.build().unwrap();
    client.init().await.unwrap();
    nodes.push(Node::join(&client, &name, options).await.unwrap());

    // Three outages, each long enough for a backoff of 10 ms doubling up
    // to 1 s to reach 1 s: with pauses of a second, a node's next attempt
    // falls anywhere in the second after Redis is back, so one outage
    // alone could miss the fault.
    let mut late = Vec::new();
    for outage_ms in [2500, 2900, 3300] {
        server.kill();
        wait_until(Duration::from_secs(10), "every node saw Redis go", || {
            let down = nodes.iter().all(|n| !n.client().is_connected());
            async move { down }
        })
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(outage_ms)).await;
        server.start_again().unwrap();
        let back = Instant::now();
        for (i, node) in nodes.iter().enumerate() {
            wait_until(Duration::from_secs(10), "the node reconnected", || {
                let up = node.client().is_connected();
                async move { up }
            })
            .await
            .unwrap();
            let after = back.elapsed();
            if after > ttl / 2 {
                late.push((outage_ms, i, after));
            }
        }
    }
    assert!(
        late.is_empty(),
        "nodes back later than half a TTL ({:?}) after Redis (outage ms, node, when): {late:?}",
        ttl / 2
    );
    for node in nodes {
        node.close().await.unwrap();
    }
}
