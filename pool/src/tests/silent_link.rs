//! A node whose command connection goes silent while its other
//! connections, and any it opens, work: a half-open socket, which the
//! kernel reports to nobody. Chaos soak seed 1566 (TTL 1 s): a process
//! came back from a pause after Redis was flushed, with one of its
//! connections cut; its keep-alives timed out on that connection for the
//! whole 2 s of the cut, it re-asserted nothing, and two of its keys were
//! admitted again as new elsewhere. A keep-alive that times out now has
//! the node reconnect, so the next one goes over a new connection.

use super::*;
use flotilla_testkit::{FaultProxy, ProxyMode};

const TTL: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_renews_through_a_new_connection_when_its_own_goes_silent() {
    let server = RedisServer::start().unwrap();
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let client = flotilla_testkit::client(&proxy.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("silent-link");
    let options = NodeOptions::default().mirror_jobs(false).worker_ttl(TTL);
    let node = Node::join(&client, &name, options).await.unwrap();
    let _worker = Worker::new(&node, Counting::default()).await.unwrap();
    // The client's own connection, opened first, carries the keep-alives.
    let commands = proxy.connections()[0];
    proxy.set_mode_of(commands, ProxyMode::BlackHole);
    let cut = tokio::time::Instant::now();
    // The cut lasts until the end: without a new connection no keep-alive
    // gets through at all.
    wait_until(
        3 * TTL,
        "a keep-alive renewed over a new connection, the first one silent",
        || {
            let node = node.inner.clone();
            async move { *node.last_renewal.borrow() > cut }
        },
    )
    .await
    .unwrap();
    proxy.heal();
    node.close().await.unwrap();
}
