//! A worker's jobs through a rollback's aftermath: a lease lost while the
//! worker reconciles with Redis must not have the reconcile take the jobs
//! the lease loss just suspended for jobs that ended here and release
//! their records, or the resume that follows finds them "moved" and they
//! run nowhere (chaos soak seed 92: an empty restart, then Redis frozen
//! for 3.7 s while the worker's reconcile read its records; the lease
//! lapsed meanwhile and 37 jobs were lost). And a job whose payload Redis
//! lost moves with its worker's removal (seed 96).

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lost_during_a_reconcile_keeps_the_suspended_jobs() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("reconcile-lease");
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    // Mirroring, as the soak's nodes were (the test names the jobs hash
    // through the replica).
    let options = NodeOptions::default()
        .mirror_jobs(true)
        .worker_ttl(Duration::from_secs(10))
        .dispatch_timeout(Duration::from_secs(8));
    let node = Node::join(&client, &name, options).await.unwrap();
    let handler = Counting::default();
    let worker = Worker::new(&node, handler.clone()).await.unwrap();
    let keys: Vec<String> = (0..40).map(|i| format!("r{i}")).collect();
    for key in &keys {
        node.dispatch_job(key, &b"p"[..]).await.unwrap();
    }
    // Records naming the worker for jobs it does not run, as a rollback
    // leaves them: the reconcile releases each, one round trip or two
    // apiece, which gives the lease loss below time to land midway.
    let jobs_hash = node.inner.store.maps.jobs_map().keys_info().hash.clone();
    let fakes: Vec<(String, String)> = (0..3000)
        .map(|i| (format!("gone{i}"), format!("{} 1", worker.id())))
        .collect();
    let _: () = client.hset(&jobs_hash, fakes).await.unwrap();
    let total = keys.len() + 3000;

    let reconcile = {
        let inner = node.inner.clone();
        let worker = worker.inner.clone();
        tokio::spawn(async move { inner.reconcile(&worker).await })
    };
    wait_until(
        Duration::from_secs(20),
        "the reconcile released a first record",
        || async {
            let len: usize = client.hlen(&jobs_hash).await.unwrap();
            len < total
        },
    )
    .await
    .unwrap();
    // The lease lapses now: every job moves to the suspended set.
    node.inner.lose_lease(tokio::time::Instant::now()).await;
    reconcile.await.unwrap().unwrap();

    // The next renewal resumes the suspended jobs that are still the
    // worker's: all of them.
    let result = wait_until(
        Duration::from_secs(20),
        "every job runs again after the lease came back",
        || async { keys.iter().all(|k| worker.job_token(k).is_some()) },
    )
    .await;
    let lost: Vec<&String> = keys
        .iter()
        .filter(|k| worker.job_token(k).is_none())
        .collect();
    assert!(
        result.is_ok(),
        "{} of {} jobs run nowhere: {lost:?}",
        lost.len(),
        keys.len()
    );
    node.close().await.unwrap();
}

/// A job whose payload Redis does not hold (its start recorded while the
/// pool recovered from a data loss, before the worker re-asserted it)
/// moves with its worker's removal: the worker gives its copy back before
/// handing it on (chaos soak seed 96: the hand-off took the record, found
/// no payload, and the job ran nowhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_without_its_payload_in_redis_moves_when_its_worker_is_removed() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("no-payload-retire");
    let (client, a, b, wa, wb, _handler_a) = two_nodes(&server, &name).await;
    let key = key_placed_on(&a, &wa).await;
    a.dispatch_job(&key, &b"p"[..]).await.unwrap();
    let payloads = crate::keys::payloads(&a.inner.store.pool);
    let removed: i64 = client.hdel(&payloads, key.as_str()).await.unwrap();
    assert_eq!(removed, 1);
    a.remove_worker(&wa).await.unwrap();
    wait_until(
        Duration::from_secs(10),
        "the job runs on the other worker",
        || async { wb.job_token(&key).is_some() },
    )
    .await
    .unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A start whose claim Redis took but whose reply the worker never got
/// (Redis died right after running the claim) is still in the worker's
/// inbox, and the record names the worker with that start's token. The
/// reconcile after the restart keeps that record: the worker's next read
/// of the entry claims it again (a retry after a lost reply) and starts
/// the job (chaos soak seed 102: the reconcile released the record and the
/// payload as a job not running here, the claim then found the start
/// superseded, and the job ran nowhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_start_still_in_the_inbox_survives_a_reconcile() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("claimed-start");
    let (node, worker, _handler) = pool(&server, &name).await;
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    // Without a lease the worker leaves the start in its inbox.
    node.inner.lose_lease(tokio::time::Instant::now()).await;
    let dispatch = {
        let node = node.clone();
        tokio::spawn(async move { node.dispatch_job("k", &b"p"[..]).await })
    };
    let pending_hash = node.inner.store.maps.pending_map().keys_info().hash.clone();
    let jobs_hash = node.inner.store.maps.jobs_map().keys_info().hash.clone();
    wait_until(Duration::from_secs(10), "the start is admitted", || async {
        let guard: Option<String> = client.hget(&pending_hash, "k").await.unwrap();
        guard.is_some()
    })
    .await
    .unwrap();
    let guard: String = client.hget(&pending_hash, "k").await.unwrap();
    let token: u64 = guard.split(' ').next().unwrap().parse().unwrap();
    // What claim_start.lua leaves behind: the guard gone, the record
    // naming the worker with the entry's token, the entry in the inbox.
    let _: i64 = client.hdel(&pending_hash, "k").await.unwrap();
    let _: i64 = client
        .hset(&jobs_hash, ("k", format!("{} {token}", worker.id())))
        .await
        .unwrap();

    node.inner.reconcile(&worker.inner).await.unwrap();

    let result = wait_until(
        Duration::from_secs(20),
        "the job runs once the lease is back",
        || async { worker.job_token("k") == Some(token) },
    )
    .await;
    let record: Option<String> = client.hget(&jobs_hash, "k").await.unwrap();
    assert!(
        result.is_ok(),
        "the job runs nowhere: record {record:?}, local token {:?}",
        worker.job_token("k")
    );
    dispatch.abort();
    node.close().await.unwrap();
}

/// A job suspended on lease loss, whose record Redis no longer holds when
/// the lease comes back (Redis went back to a state before the worker
/// re-asserted it, and the worker's reconcile had not run yet), is
/// re-asserted, not forgotten: nothing else knows it (chaos soak seed 104:
/// an empty restart, a rollback to before the re-assertion, then Redis
/// frozen past the lease; the resume found no record and forgot the job,
/// which ran nowhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspended_job_whose_record_redis_lost_resumes() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("resume-unrecorded");
    let (node, worker, _handler) = pool(&server, &name).await;
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    node.dispatch_job("k", &b"p"[..]).await.unwrap();
    let first = worker.job_token("k").unwrap();
    node.inner.lose_lease(tokio::time::Instant::now()).await;
    assert_eq!(worker.job_token("k"), None);
    // Redis as it was before the job was recorded: nothing about the key.
    let pool_name = node.inner.store.pool.clone();
    let jobs_hash = node.inner.store.maps.jobs_map().keys_info().hash.clone();
    let hashes = [
        jobs_hash.clone(),
        crate::keys::payloads(&pool_name),
        crate::keys::fencing(&pool_name),
    ];
    forget_in_redis(&client, &hashes, "k").await;

    let result = wait_until(
        Duration::from_secs(20),
        "the job runs again once the lease is back",
        || async { worker.job_token("k").is_some_and(|t| t > first) },
    )
    .await;
    let record: Option<String> = client.hget(&jobs_hash, "k").await.unwrap();
    assert!(result.is_ok(), "the job runs nowhere: record {record:?}");
    node.close().await.unwrap();
}
