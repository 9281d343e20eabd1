//! Jobs a worker holds stopped while the pool recovers from a data loss or
//! a rollback: one suspended on a lease loss, one stopped for a hand-off
//! that could not be made. Neither runs again from what Redis shows until
//! every running copy has re-asserted: after a rollback the record naming
//! the worker may be one the lost writes had replaced (a cleanup moved the
//! job and its new owner runs it), and after an empty restart Redis knows
//! nothing of a run elsewhere that has not re-asserted yet (found by a
//! chaos soak with a flapping link and a cut of one connection: a worker
//! whose hand-offs failed while it was cut off took its stopped jobs back
//! 40-150 ms after an empty restart and ran them beside their new owner).
//! A closing worker whose lease has lapsed gives its stopped jobs back the
//! same way.

use tokio::time::Instant;

use super::*;
use crate::keys;
use crate::store::records::job_owner;

/// The end of the recovery window (server time, ms) the pool's epoch
/// records.
async fn window_end_ms(client: &fred::prelude::Client, node: &Node) -> u64 {
    let epoch: Option<String> = client
        .hget(keys::fencing(&node.inner.store.pool), keys::EPOCH_FIELD)
        .await
        .unwrap();
    epoch
        .as_deref()
        .and_then(|e| e.rsplit(' ').next())
        .and_then(|until| until.parse().ok())
        .unwrap_or_else(|| panic!("no epoch: {epoch:?}"))
}

/// Redis loses `key`'s record and payload, and the pool's epoch (the next
/// script opens a recovery window).
async fn lose_job_and_epoch(client: &fred::prelude::Client, node: &Node, key: &str) {
    let store = &node.inner.store;
    let pool = store.pool.to_string();
    let jobs_hash = store.maps.jobs_map().keys_info().hash.clone();
    let _: i64 = client.hdel(jobs_hash.as_str(), key).await.unwrap();
    let _: i64 = client.hdel(keys::payloads(&pool), key).await.unwrap();
    let _: i64 = client
        .hdel(keys::fencing(&pool), keys::EPOCH_FIELD)
        .await
        .unwrap();
}

/// Checks that `key` is an orphan for the sweep (no record, its payload
/// back and marked); returns the end of the recovery window (ms).
async fn assert_left_to_the_sweep(client: &fred::prelude::Client, node: &Node, key: &str) -> u64 {
    let store = &node.inner.store;
    let pool = store.pool.to_string();
    let jobs_hash = store.maps.jobs_map().keys_info().hash.clone();
    let record: Option<String> = client.hget(jobs_hash.as_str(), key).await.unwrap();
    assert_eq!(record, None, "taken back while the pool recovers");
    let payload: bool = client.hexists(keys::payloads(&pool), key).await.unwrap();
    assert!(payload, "the payload is back");
    let mark: Option<String> = client.hget(keys::orphan_marks(&pool), key).await.unwrap();
    assert!(mark.is_some(), "marked for the orphan sweep");
    window_end_ms(client, node).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspended_job_resumes_only_once_the_pool_has_recovered() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let node = short_lease_node(&client, "recovery-resume").await;
    let handler = Counting::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();
    node.dispatch_job("k", &b"p"[..]).await.unwrap();
    let first = worker.job_token("k").unwrap();

    // Redis went back in time while the node's lease had lapsed: the
    // record it shows may be older than a run elsewhere.
    let store = &node.inner.store;
    store
        .begin_recovery(node.inner.options.worker_ttl)
        .await
        .unwrap();
    let until_ms = window_end_ms(&client, &node).await;
    node.inner.lose_lease(Instant::now()).await;
    assert!(worker.job_token("k").is_none(), "stopped on lease loss");

    // The renewals (every second) ask to resume it; the window (3 s)
    // holds it back, then it runs here again.
    wait_until(Duration::from_secs(15), "the job resumed", || async {
        worker.job_token("k").is_some()
    })
    .await
    .unwrap();
    let resumed = worker.job_token("k").unwrap();
    // A token is the server time (µs) of the script that issued it.
    assert!(
        resumed / 1000 >= until_ms,
        "resumed at {} ms, within the recovery window (until {until_ms} ms)",
        resumed / 1000
    );
    assert!(resumed > first);
    let jobs_hash = store.maps.jobs_map().keys_info().hash.clone();
    let record: Option<String> = client.hget(jobs_hash.as_str(), "k").await.unwrap();
    assert_eq!(
        record.as_deref().and_then(job_owner),
        Some((worker.id(), resumed))
    );
    assert_eq!(handler.starts.load(Ordering::SeqCst), 2);
    node.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_hand_off_failed_in_a_recovery_is_left_to_the_orphan_sweep() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let node = short_lease_node(&client, "recovery-handoff").await;
    let handler = Counting::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();
    node.dispatch_job("k", &b"p"[..]).await.unwrap();
    worker.job_token("k").unwrap();

    // A hand-off stopped the job here and could not be made; meanwhile
    // Redis lost its data (the key's record, payload and the pool's epoch).
    let (_, job) = worker.inner.jobs.remove("k").unwrap();
    worker.inner.stop_handler("k").await.unwrap();
    lose_job_and_epoch(&client, &node, "k").await;

    node.inner.run_here_again(&worker.inner, "k", job).await;
    // Not run here, not taken back for this worker: an orphan (payload
    // back, marked), which the sweep requeues once the pool has recovered.
    assert!(worker.job_token("k").is_none(), "started in the window");
    assert!(!worker.inner.suspended.lock().await.contains_key("k"));
    let until_ms = assert_left_to_the_sweep(&client, &node, "k").await;

    wait_until(Duration::from_secs(30), "the orphan runs again", || async {
        worker.job_token("k").is_some()
    })
    .await
    .unwrap();
    let token = worker.job_token("k").unwrap();
    assert!(token / 1000 >= until_ms, "requeued within the window");
    assert_eq!(handler.starts.load(Ordering::SeqCst), 2);
    node.close().await.unwrap();
}

/// What Redis shows a closing worker of its job, past its lease.
enum Shown {
    /// Nothing: Redis lost its data (the job's record and payload, and the
    /// pool's epoch).
    Nothing,
    /// The record naming the worker, while the pool recovers from a
    /// rollback that may have brought it back.
    ItsRecord,
}

/// A worker whose lease has lapsed (the watchdog has not acted yet, so a
/// cleanup may have moved its job) closes while Redis shows `shown` of its
/// job. The job stops there, is neither taken back by the closing worker
/// nor handed to the other one in the window, and is an orphan the sweep
/// requeues once every running copy has re-asserted.
async fn a_close_past_the_lease_leaves_the_job_to_the_sweep(prefix: &str, shown: Shown) {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let node = short_lease_node(&client, prefix).await;
    let handler = Counting::default();
    let closing = Worker::new(&node, handler.clone()).await.unwrap();
    let other = Worker::new(&node, handler.clone()).await.unwrap();
    let key = key_placed_on(&node, &closing).await;
    node.dispatch_job(&key, &b"p"[..]).await.unwrap();
    closing.job_token(&key).unwrap();

    closing.inner.lease_lost.store(true, Ordering::SeqCst);
    match shown {
        Shown::Nothing => lose_job_and_epoch(&client, &node, &key).await,
        Shown::ItsRecord => {
            node.inner
                .store
                .begin_recovery(node.inner.options.worker_ttl)
                .await
                .unwrap();
        }
    }

    node.remove_worker(&closing).await.unwrap();
    assert_eq!(handler.stops.load(Ordering::SeqCst), 1);
    assert!(other.job_token(&key).is_none(), "handed on in the window");
    let until_ms = assert_left_to_the_sweep(&client, &node, &key).await;

    wait_until(Duration::from_secs(30), "the orphan runs again", || async {
        other.job_token(&key).is_some()
    })
    .await
    .unwrap();
    let token = other.job_token(&key).unwrap();
    assert!(token / 1000 >= until_ms, "requeued within the window");
    assert_eq!(handler.starts.load(Ordering::SeqCst), 2);
    node.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_a_closing_worker_stopped_past_its_lease_is_left_to_the_orphan_sweep() {
    a_close_past_the_lease_leaves_the_job_to_the_sweep("recovery-close", Shown::Nothing).await;
}

/// As above, but Redis kept the record naming the closing worker: a
/// rollback brought it back (a cleanup had moved the job during the lease
/// loss, and its new owner, which runs it, has not re-asserted yet). The
/// close may not hand the job on from that record while the pool recovers:
/// the hand-off's token would outrank the run elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closing_worker_does_not_hand_on_from_a_rolled_back_record_past_its_lease() {
    a_close_past_the_lease_leaves_the_job_to_the_sweep("recovery-close-record", Shown::ItsRecord)
        .await;
}
