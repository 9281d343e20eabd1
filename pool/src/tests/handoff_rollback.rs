//! A rollback that lands while hand-offs wait at their new owner: the new
//! owner's start entries and the hand-offs' records go back with Redis, and
//! the jobs, stopped here for the hand-off, would run nowhere. The worker
//! that handed them off gives their payloads back; the orphan sweep then
//! runs them again.

use super::*;
use flotilla_testkit::ServerOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_during_hand_offs_loses_no_job() {
    let mut server = RedisServer::start_with(ServerOptions::default().aof(true)).unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("handoff-rollback");
    let options = NodeOptions::default()
        .worker_ttl(Duration::from_secs(2))
        .dispatch_timeout(Duration::from_secs(5));
    let node = Node::join(&client, &name, options).await.unwrap();
    let worker = Worker::new(&node, Counting::default()).await.unwrap();
    let keys: Vec<String> = (0..24).map(|i| format!("h{i}")).collect();
    for k in &keys {
        node.dispatch_job(k, &b"p"[..]).await.unwrap();
    }
    let snapshot = server.save_snapshot().unwrap();

    // A worker registered in Redis that no process hosts: the jobs the
    // ring gives it are handed off into its inbox and never start.
    node.inner
        .store
        .register("w-ghost", r#"{"node":"nowhere"}"#)
        .await
        .unwrap();
    let recent = || worker.inner.handed_off.recent(Duration::from_secs(60));
    wait_until(
        Duration::from_secs(5),
        "jobs handed to the ghost",
        || async { recent().len() >= 3 },
    )
    .await
    .unwrap();
    let handed: Vec<String> = recent().into_iter().map(|h| h.key).collect();
    assert!(handed.iter().all(|k| !worker.job_keys().contains(k)));

    server.roll_back(&snapshot).unwrap();
    // Redis shows the state before the hand-offs: the jobs under this
    // worker, which does not run them. They must run again, here (the ghost
    // is unknown to the restored state).
    if let Err(e) = wait_until(
        Duration::from_secs(30),
        "handed-off jobs run again",
        || async {
            let running = worker.job_keys();
            handed.iter().all(|k| running.contains(k))
        },
    )
    .await
    {
        let running = worker.job_keys();
        let missing: Vec<&String> = handed.iter().filter(|k| !running.contains(k)).collect();
        panic!("{e}: {missing:?} run nowhere");
    }
    node.close().await.unwrap();
}
