//! A close while another close runs (a pool shutdown closes every node on
//! its own, and the application may close it too) returns once the node is
//! closed. Before, it returned at once: the demo's worker processes exited
//! while the shutdown's close still ran, their node entries stayed, and
//! the pool's shutdown waited its 10 s deadline for them.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_close_returns_once_the_first_has_closed_the_node() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("second-close");
    // Renewals every second: the first writes the node's entry.
    let options = NodeOptions::default().worker_ttl(Duration::from_secs(3));
    let node = Node::join(&client, &name, options).await.unwrap();
    // Every stop takes 300 ms, so the first close is busy that long.
    let handler = HookOnStop::default();
    let slow_stop: StopHook = Box::new(|| Box::pin(tokio::time::sleep(Duration::from_millis(300))));
    assert!(handler.hook.set(slow_stop).is_ok());
    let _worker = Worker::new(&node, handler.clone()).await.unwrap();
    node.dispatch_job("k", &b"p"[..]).await.unwrap();
    wait_until(Duration::from_secs(5), "the job runs", || async {
        handler.counts.starts.load(Ordering::SeqCst) == 1
    })
    .await
    .unwrap();

    // The node's entry, written at its first renewal, is what a pool
    // shutdown waits to see gone.
    let nodes = node.inner.store.maps.nodes.keys_info().hash.clone();
    let entry = || async {
        let entry: Option<String> = client.hget(&nodes, node.inner.id.as_str()).await.unwrap();
        entry
    };
    wait_until(
        Duration::from_secs(5),
        "the node's entry in Redis",
        || async { entry().await.is_some() },
    )
    .await
    .unwrap();

    let first = {
        let node = node.clone();
        tokio::spawn(async move { node.close().await })
    };
    wait_until(Duration::from_secs(5), "the first close began", || async {
        node.inner.closed.load(Ordering::Acquire)
    })
    .await
    .unwrap();
    node.close().await.unwrap();
    assert_eq!(
        handler.counts.stops.load(Ordering::SeqCst),
        1,
        "the second close returned before the job was stopped"
    );
    assert_eq!(
        entry().await,
        None,
        "the second close returned with the node's entry still in Redis"
    );
    first.await.unwrap().unwrap();
}
