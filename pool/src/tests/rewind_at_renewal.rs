//! A re-read of a worker's inbox scheduled after events kept failing waits
//! a delay grown with them (up to 5 s). Once what refused them is over, a
//! delay that long lets the pending guards of the refused entries run out
//! before they are read again (chaos soak seed 1601: entries refused while
//! the pool recovered were swept and went round the orphan sweep). The
//! node's next renewal runs the scheduled re-read at once, and leaves a
//! worker with none scheduled its pacing.

use super::*;

/// A server, and a node of one worker with worker TTL `ttl` on it (the
/// server is returned to keep it running).
async fn one_worker(prefix: &str, ttl: Duration) -> (RedisServer, Node, Worker) {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name(prefix);
    let options = NodeOptions::default().worker_ttl(ttl);
    let node = Node::join(&client, &name, options).await.unwrap();
    let worker = Worker::new(&node, Counting::default()).await.unwrap();
    (server, node, worker)
}

/// Waits until `worker`'s scheduled rewind has run, failing after
/// `deadline` with `what`.
async fn rewind_runs_within(worker: &Worker, deadline: Duration, what: &'static str) {
    wait_until(deadline, what, || async { !worker.inner.rewind_state().1 })
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewind_scheduled_with_a_grown_delay_runs_at_the_next_renewal() {
    // Renewals every 2 s, well under the 5 s delay below.
    let (_server, node, worker) = one_worker("rewind-at-renewal", Duration::from_secs(6)).await;
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
    rewind_runs_within(
        &worker,
        Duration::from_millis(3500),
        "the scheduled rewind ran at the next renewal, well before its 5 s delay",
    )
    .await;
    node.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_with_no_rewind_scheduled_leaves_the_next_one_its_delay() {
    // The first renewal comes 10 s after the join: the test calls the
    // renewal's step itself, and no real one runs meanwhile.
    let (_server, node, worker) = one_worker("rewind-not-scheduled", Duration::from_secs(30)).await;

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
    rewind_runs_within(
        &worker,
        Duration::from_secs(1),
        "the scheduled rewind ran at the renewal",
    )
    .await;
    node.close().await.unwrap();
}
