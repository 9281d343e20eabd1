//! A worker that the state Redis went back to does not show registered
//! (a cleanup had just removed it) is registered again by its node's
//! recovery, and the records that state still holds under it, of jobs it
//! no longer runs, are released like any other worker's: registered
//! again, the worker would pass for running them, and neither the orphan
//! sweep nor a cleanup would ever move them (chaos soak seed 1573: a
//! `freeze-redis` had every worker cleaned up, a rollback 0.1 s later went
//! back to a state from before those cleanups moved the jobs, and eight
//! keys sat under their re-registered givers for 33 s, until an empty
//! restart took them).

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_registered_again_in_a_recovery_releases_the_records_it_does_not_run() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("reregistered-reconcile");
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let options = NodeOptions::default()
        .mirror_jobs(true)
        .worker_ttl(Duration::from_secs(2))
        .dispatch_timeout(Duration::from_secs(5));
    let node = Node::join(&client, &name, options).await.unwrap();
    let worker = Worker::new(&node, Counting::default()).await.unwrap();

    // What the rollback left: a record naming the worker for a job it
    // does not run (it had passed the job on under a newer token, which
    // the counter shows), with the job's payload.
    let store = &node.inner.store;
    let jobs_hash = store.maps.jobs_map().keys_info().hash.clone();
    let token: u64 = store.server_time_ms().await.unwrap() * 1000;
    let body = crate::codec::encode(&crate::codec::JobBody {
        key: "k".into(),
        payload: b"p".to_vec(),
        restart: None,
    });
    let payload = crate::codec::stored(token, &body);
    let _: () = client
        .hset(crate::keys::payloads(&name), ("k", payload.to_vec()))
        .await
        .unwrap();
    let _: () = client
        .hset(crate::keys::fencing(&name), ("k", (token + 1).to_string()))
        .await
        .unwrap();
    let _: () = client
        .hset(&jobs_hash, ("k", format!("{} {token}", worker.id())))
        .await
        .unwrap();
    // And without the worker's registration, which the node's replica
    // shows gone, as a cleanup's removal leaves it.
    store.maps.workers.delete(worker.id()).await.unwrap();
    wait_until(
        Duration::from_secs(5),
        "the replica shows the worker gone",
        || async { !store.maps.workers.contains_key(worker.id()) },
    )
    .await
    .unwrap();

    node.inner.reconcile(&worker.inner).await.unwrap();

    let record: Option<String> = client.hget(&jobs_hash, "k").await.unwrap();
    assert_ne!(
        record,
        Some(format!("{} {token}", worker.id())),
        "the record of a job the worker does not run still names it"
    );
    // The payload stays (a newer run was issued): an orphan, which the
    // sweep requeues, and the job runs.
    wait_until(Duration::from_secs(20), "the job runs again", || async {
        worker.job_token("k").is_some()
    })
    .await
    .unwrap();
    node.close().await.unwrap();
}
