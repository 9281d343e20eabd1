//! Stops sent at once after Redis went back in time, before any replica
//! noticed: a job started in the lost stretch, and a job handed to a worker
//! that joined in it. Redis's restored state knows nothing of the first
//! (no record: `JobNotFound` while it runs) and names the old owner of the
//! second (a stop there would drop the record while the new owner runs
//! on). Both stops must wait for the workers to re-assert, then stop the
//! runs for good.

mod support;

use std::time::Duration;

use flotilla_pool::{Error, Node, Worker};
use flotilla_testkit::{RedisServer, ServerOptions};
use support::{Ledger, eventually, fast};

/// Stops `key`, retrying while Redis is not back yet; the first answer
/// that is not `Unavailable`/`Timeout`.
async fn stop_when_back(node: &Node, key: &str) -> Result<(), Error> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match node.stop_job(key).await {
            Err(Error::Unavailable(_) | Error::Timeout(_))
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => return other,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_stops_sent_before_anyone_noticed_hold() {
    support::init_tracing();
    let mut server = RedisServer::start_with(ServerOptions::default().aof(true)).unwrap();
    let pool = flotilla_testkit::unique_name("rollback-stops");
    let ledger = Ledger::default();
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let client = flotilla_testkit::client(&server.url()).await.unwrap();
        nodes.push(Node::join(&client, &pool, fast()).await.unwrap());
    }
    let _w0 = Worker::new(&nodes[0], ledger.handler("w0")).await.unwrap();
    let before: Vec<String> = (0..24).map(|i| format!("a{i}")).collect();
    for k in &before {
        nodes[0].dispatch_job(k, &b"p"[..]).await.unwrap();
    }
    let snapshot = server.save_snapshot().unwrap();

    // The stretch Redis will lose: a job started, a worker joined and took
    // some jobs over.
    nodes[1].dispatch_job("late", &b"p"[..]).await.unwrap();
    let _w1 = Worker::new(&nodes[1], ledger.handler("w1")).await.unwrap();
    eventually(
        "jobs handed to the new worker",
        Duration::from_secs(10),
        // And "late" runs (it may be handed to w1 too): a rollback that
        // lands while its hand-off is in flight makes it an orphan until
        // the sweep runs it again (`a_rollback_during_hand_offs_loses_no_job`),
        // and a stop meanwhile waits for that; not what this test is about.
        || {
            let running = ledger.running();
            running.values().filter(|w| *w == "w1").count() > 2 && running.contains_key("late")
        },
    )
    .await;
    let moved: Vec<String> = ledger
        .running()
        .into_iter()
        .filter(|(k, w)| w == "w1" && k.starts_with('a'))
        .map(|(k, _)| k)
        .take(2)
        .collect();

    server.roll_back(&snapshot).unwrap();
    let mut stopped = vec!["late".to_string()];
    stopped.extend(moved);
    for key in &stopped {
        let answer = stop_when_back(&nodes[0], key).await;
        assert!(
            answer.is_ok(),
            "stop of {key} right after the rollback answered {answer:?} while it ran on {:?}",
            ledger.running().get(key)
        );
        // The stop returns once the owner's handler stopped the run.
        assert!(
            !ledger.running().contains_key(key),
            "{key} still runs after its stop answered Ok"
        );
    }
    // And it holds once the pool has recovered: nothing re-asserted them.
    let probe = flotilla_testkit::client(&server.url()).await.unwrap();
    let jobs_key = format!("fl:{{{pool}}}:map:jobs");
    flotilla_testkit::wait_until(Duration::from_secs(20), "the pool converges", || {
        let (probe, jobs_key) = (probe.clone(), jobs_key.clone());
        let running = ledger.running();
        async move {
            let jobs: std::collections::HashMap<String, String> =
                fred::prelude::HashesInterface::hgetall(&probe, &jobs_key)
                    .await
                    .unwrap_or_default();
            jobs.len() == running.len() && running.keys().all(|k| jobs.contains_key(k))
        }
    })
    .await
    .unwrap();
    for key in &stopped {
        assert!(!ledger.running().contains_key(key), "{key} runs again");
        assert_eq!(nodes[1].job_status(key).await.unwrap(), None, "{key}");
    }
    assert_eq!(ledger.violations(), Vec::<String>::new(), "I1");
    for n in &nodes {
        n.close().await.unwrap();
    }
}
