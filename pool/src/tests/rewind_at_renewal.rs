//! A re-read of a worker's inbox scheduled after events kept failing waits
//! a delay grown with them (up to 5 s). Once what refused them is over, a
//! delay that long lets the pending guards of the refused entries run out
//! before they are read again (chaos soak seed 1601: entries refused while
//! the pool recovered were swept and went round the orphan sweep). The
//! node's next renewal runs the scheduled re-read at once.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewind_scheduled_with_a_grown_delay_runs_at_the_next_renewal() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("rewind-at-renewal");
    // Renewals every 2 s, well under the 5 s delay below.
    let options = NodeOptions::default().worker_ttl(Duration::from_secs(6));
    let node = Node::join(&client, &name, options).await.unwrap();
    let worker = Worker::new(&node, Counting::default()).await.unwrap();
    // Right after a renewal, so that none can have cut anything short yet.
    renewals(&node, 1).await;

    // Six events failed in a row: the next rewind waits 5 s.
    worker.inner.rewind.failed_in_a_row(6);
    worker.inner.clone().rewind(&node.inner);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        worker.inner.rewind_state().1,
        "the rewind waits its delay until a renewal"
    );

    renewals(&node, 1).await;
    let renewed = std::time::Instant::now();
    wait_until(
        Duration::from_secs(1),
        "the scheduled rewind ran at the renewal",
        || async { !worker.inner.rewind_state().1 },
    )
    .await
    .unwrap();
    assert!(renewed.elapsed() < Duration::from_secs(1));
    node.close().await.unwrap();
}
