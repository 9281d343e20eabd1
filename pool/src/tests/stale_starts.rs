//! Start entries that are stale when read: moved on to another worker, or
//! older than a hand-off this worker made of the key since (Redis went
//! back in time to before the hand-off). Neither may start, not even
//! briefly.

use super::*;
use crate::handoffs::HandedOff;

/// A start entry that was moved on (another worker runs the key with the
/// same or a newer token) is dropped, never started: a worker that was cut
/// off or paused with it in hand must not run the key, not even briefly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_start_for_a_key_running_elsewhere_is_dropped() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("stale");
    let (node, worker, handler) = pool(&server, &name).await;
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let other = Node::join(
        &client,
        &name,
        NodeOptions::default().worker_ttl(Duration::from_secs(10)),
    )
    .await
    .unwrap();
    let other_handler = Counting::default();
    let other_worker = Worker::new(&other, other_handler.clone()).await.unwrap();
    wait_until(Duration::from_secs(5), "both workers seen", || async {
        node.pool_workers().len() == 2 && other.pool_workers().len() == 2
    })
    .await
    .unwrap();
    // A key the other worker runs.
    let key = key_placed_on(&node, &other_worker).await;
    node.dispatch_job(&key, &b"p"[..]).await.unwrap();
    let token = other_worker.job_token(&key).unwrap();
    wait_until(
        Duration::from_secs(5),
        "replica knows the owner",
        || async { node.job_owner(&key).is_some() },
    )
    .await
    .unwrap();
    // The same start, as if it had also stayed in this worker's hands, and
    // an older one.
    let inbox = node.inner.inbox(worker.id()).unwrap();
    for stale in [token, token - 1] {
        inbox.add("start", start_entry(&key, stale)).await.unwrap();
    }
    wait_until(Duration::from_secs(5), "stale starts dropped", || async {
        inbox.len().await.unwrap() == 0
    })
    .await
    .unwrap();
    assert_eq!(handler.starts.load(Ordering::SeqCst), 0, "stale start ran");
    assert_eq!(other_worker.job_token(&key), Some(token));
    other.close().await.unwrap();
    node.close().await.unwrap();
}

/// Redis went back to before this worker handed `key` on: the older run's
/// start entry is in its inbox again, with that run's pending guard, so a
/// claim in Redis would accept it. The run handed on may have been stopped
/// since, elsewhere: the worker drops the entry (`Handoffs::supersede`).
/// A start newer than the hand-off (the key handed back) still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_older_than_a_hand_off_made_here_is_dropped() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("superseded");
    let (node, worker, handler) = pool(&server, &name).await;
    let key = "handed-on";
    let handed = 5000u64;
    worker.inner.handed_off.record(HandedOff {
        key: key.to_string(),
        token: handed,
        admitted: 0,
        body: bytes::Bytes::from_static(b"p"),
    });
    // What the rollback brought back: the older run's guard and entry,
    // read after a doubt (the claim path, which would accept it).
    let pending = node.inner.store.maps.pending_map();
    pending.set(key, &live_guard(handed - 1)).await.unwrap();
    node.inner.freshness.invalidate("test");
    let inbox = node.inner.inbox(worker.id()).unwrap();
    inbox
        .add("start", start_entry(key, handed - 1))
        .await
        .unwrap();
    wait_until(
        Duration::from_secs(5),
        "the older start dropped",
        || async { inbox.len().await.unwrap() == 0 },
    )
    .await
    .unwrap();
    assert_eq!(handler.starts.load(Ordering::SeqCst), 0, "older start ran");
    assert!(worker.job_token(key).is_none());

    // The key handed back to this worker later: a newer start runs.
    pending.set(key, &live_guard(handed + 1)).await.unwrap();
    inbox
        .add("start", start_entry(key, handed + 1))
        .await
        .unwrap();
    wait_until(Duration::from_secs(5), "the newer start ran", || async {
        worker.job_token(key) == Some(handed + 1)
    })
    .await
    .unwrap();
    assert_eq!(handler.starts.load(Ordering::SeqCst), 1);
    node.close().await.unwrap();
}
