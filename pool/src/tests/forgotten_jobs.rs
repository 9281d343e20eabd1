//! A worker that re-asserts a job it runs or holds suspended and finds a
//! record of a newer run elsewhere gives the job up. When that answer came
//! from a primary that stalled through its failover (it woke, answered the
//! clients still connected to it, and a Sentinel then demoted it, its
//! writes gone), the promoted side still records the job under the worker
//! that gave it up, and nobody there runs it. The worker's recovery from
//! that failover releases such a record as stale; the payload must stay,
//! for the orphan sweep, as it does for a hand-off the stalled primary
//! made. Chaos soak seed 1562 (`--sentinel`): a worker process paused
//! through one failover and cut off by the next gave up 263 suspended jobs
//! on the woken primary, then released their records and payloads on the
//! promoted one; 34 ran nowhere and were admitted again as new. So is a
//! run the worker left to the orphan sweep.

use fred::types::Value;

use super::*;

/// A Redis server, a client, and a pool named after `name` of one node
/// (mirroring the jobs map, TTL 3 s, orphans requeued after 1 s) with one
/// worker.
async fn one_worker_pool(name: &str) -> (RedisServer, fred::prelude::Client, Node, Worker) {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name(name);
    let options = NodeOptions::default()
        .mirror_jobs(true)
        .worker_ttl(Duration::from_secs(3))
        .orphan_grace(Duration::from_secs(1));
    let node = Node::join(&client, &name, options).await.unwrap();
    let worker = Worker::new(&node, Counting::default()).await.unwrap();
    (server, client, node, worker)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_given_up_to_a_run_the_next_primary_never_saw_runs_again() {
    given_up_to_a_run_the_next_primary_never_saw(false).await;
}

/// The same when the answer came from the promoted side to a node that
/// wrote to the stalled primary (its suspended jobs re-assert yielding),
/// and a second failover then promotes a replica of the stalled branch,
/// which records the jobs here. Chaos soak seed 1605 (`--sentinel`): a
/// worker process paused through one failover woke on the stalled primary,
/// gave `job-1299` up on the promoted side, and released its record and
/// payload on the side promoted next; the load admitted it again as new
/// 17 s later (`I3` double admission, eight keys).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_given_up_while_yielding_runs_again_when_the_next_primary_records_it_here() {
    given_up_to_a_run_the_next_primary_never_saw(true).await;
}

/// Two jobs (one running, one suspended) given up to newer runs recorded
/// elsewhere, then recorded here again by the side promoted next: released
/// as stale, they keep their payloads and run again. `diverged`: the node
/// had written to a primary that stalled through its failover.
async fn given_up_to_a_run_the_next_primary_never_saw(diverged: bool) {
    let (_server, client, node, worker) = one_worker_pool("forgotten-jobs").await;
    let keys = ["running", "suspended"];
    for key in keys {
        node.dispatch_job(key, &b"f"[..]).await.unwrap();
    }
    let tokens: Vec<u64> = keys.iter().map(|k| worker.job_token(k).unwrap()).collect();
    // One of them held suspended, as after a lease loss.
    let (key, job) = worker.inner.jobs.remove("suspended").unwrap();
    worker.inner.suspended.lock().await.insert(key, job);

    // The stalled primary: a cleanup that ran there moved both jobs to a
    // worker that only that primary knows, with newer tokens.
    let store = &node.inner.store;
    let jobs_hash = store.maps.jobs_map().keys_info().hash.clone();
    let fencing = crate::keys::fencing(&node.inner.pool);
    for (key, token) in keys.iter().zip(&tokens) {
        let newer = token + 1_000;
        let _: i64 = client
            .hset(&jobs_hash, (*key, format!("w-elsewhere {newer}")))
            .await
            .unwrap();
        let _: i64 = client
            .hset(&fencing, (*key, newer.to_string()))
            .await
            .unwrap();
    }
    if diverged {
        node.inner.store.diverged_for(Duration::from_secs(60));
    }
    {
        let _ops = worker.inner.ops.write().await;
        node.inner.reassert_all(&worker.inner).await.unwrap();
    }
    assert!(
        worker.job_token("running").is_none(),
        "the running job stops here, a newer run recorded elsewhere"
    );
    assert!(
        !worker
            .inner
            .suspended
            .lock()
            .await
            .contains_key("suspended"),
        "the suspended job is given up, a newer run recorded elsewhere"
    );

    // The promoted side never saw that cleanup: both records name this
    // worker with their old tokens, and so does the counter.
    for (key, token) in keys.iter().zip(&tokens) {
        let _: i64 = client
            .hset(&jobs_hash, (*key, format!("{} {token}", worker.id())))
            .await
            .unwrap();
        let _: i64 = client
            .hset(&fencing, (*key, token.to_string()))
            .await
            .unwrap();
    }
    node.inner.reconcile(&worker.inner).await.unwrap();
    for key in keys {
        let payload: Value = client.hget(store.maps.payloads_key(), key).await.unwrap();
        assert!(
            !payload.is_null(),
            "{key}, given up here to a run the promoted side never saw, lost its payload with the record"
        );
    }
    // The orphan sweep starts them again.
    wait_until(
        Duration::from_secs(20),
        "both jobs run again, with newer tokens",
        || {
            let again = keys
                .iter()
                .zip(&tokens)
                .all(|(key, token)| worker.job_token(key).is_some_and(|t| t > *token));
            async move { again }
        },
    )
    .await
    .unwrap();
    node.close().await.unwrap();
}

/// A run a worker left to the orphan sweep (it held the job through a
/// data loss and could not take it back while the pool recovered) is not a
/// run that ended there: when Redis then goes back to a state that records
/// that very run under the worker, releasing the record leaves the payload,
/// the job's only copy (chaos soak seed 1562: a failed job left to the
/// sweep at one recovery was released with its payload at the next, and
/// the load admitted it again as new).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_left_to_the_orphan_sweep_keeps_its_payload_when_its_record_comes_back() {
    let (_server, client, node, worker) = one_worker_pool("orphan-record").await;
    node.dispatch_job("left", &b"l"[..]).await.unwrap();
    let token = worker.job_token("left").unwrap();

    // Left to the orphan sweep as `reassert` does for an `Orphaned` answer.
    let (_, job) = worker.inner.jobs.remove("left").unwrap();
    worker.inner.handed_off.record_orphan(
        crate::handoffs::HandedOff::of("left", job.token, &job),
        node.inner.orphan_exposure(),
    );
    // Redis goes back to a state that records the run under the worker.
    let store = &node.inner.store;
    let jobs_hash = store.maps.jobs_map().keys_info().hash.clone();
    let _: i64 = client
        .hset(&jobs_hash, ("left", format!("{} {token}", worker.id())))
        .await
        .unwrap();
    node.inner.reconcile(&worker.inner).await.unwrap();
    let payload: Value = client
        .hget(store.maps.payloads_key(), "left")
        .await
        .unwrap();
    assert!(
        !payload.is_null(),
        "a run left to the orphan sweep lost its payload with its record"
    );
    wait_until(
        Duration::from_secs(20),
        "the job runs again, with a newer token",
        || {
            let again = worker.job_token("left").is_some_and(|t| t > token);
            async move { again }
        },
    )
    .await
    .unwrap();
    node.close().await.unwrap();
}
