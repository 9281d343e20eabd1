//! A re-read of a worker's inbox scheduled after events kept failing waits
//! a delay grown with them (up to 5 s). Once what refused them is over, a
//! delay that long lets the pending guards of the refused entries run out
//! before they are read again (chaos soak seed 1601: entries refused while
//! the pool recovered were swept and went round the orphan sweep). The
//! node's next renewal runs the scheduled re-read at once, and leaves a
//! worker with none scheduled its pacing.

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
    // Six events failed in a row: the next rewind waits 5 s, unless the
    // next renewal (at most 2 s away) cuts it short. (Whether the renewal
    // before it had run its own step yet does not matter: that would only
    // run it sooner.)
    worker.inner.rewind.failed_in_a_row(6);
    worker.inner.clone().rewind(&node.inner);
    assert!(
        worker.inner.rewind_state().1,
        "the rewind waits its delay until a renewal"
    );
    let scheduled = std::time::Instant::now();
    wait_until(
        Duration::from_millis(3500),
        "the scheduled rewind ran at the next renewal, well before its 5 s delay",
        || async { !worker.inner.rewind_state().1 },
    )
    .await
    .unwrap();
    assert!(scheduled.elapsed() < Duration::from_millis(3500));
    node.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_with_no_rewind_scheduled_leaves_the_next_one_its_delay() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("rewind-not-scheduled");
    // The first renewal comes 10 s after the join: the test calls the
    // renewal's step itself, and no real one runs meanwhile.
    let options = NodeOptions::default().worker_ttl(Duration::from_secs(30));
    let node = Node::join(&client, &name, options).await.unwrap();
    let worker = Worker::new(&node, Counting::default()).await.unwrap();

    // Events failed, but no rewind is scheduled when the renewal comes.
    worker.inner.rewind.failed_in_a_row(6);
    node.inner.rewinds_due();
    worker.inner.clone().rewind(&node.inner);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        worker.inner.rewind_state().1,
        "a rewind scheduled after the renewal waits its delay (5 s)"
    );

    // The next renewal cuts it short.
    node.inner.rewinds_due();
    wait_until(
        Duration::from_secs(1),
        "the scheduled rewind ran at the renewal",
        || async { !worker.inner.rewind_state().1 },
    )
    .await
    .unwrap();
    node.close().await.unwrap();
}
