//! Nodes that do not mirror the jobs and pending maps
//! (`NodeOptions::mirror_jobs(false)`, the default): they subscribe to neither map's
//! changes, yet dispatch, stop, notify, hand jobs over when they leave and
//! answer for their own jobs like any node, and ask Redis for the rest.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use flotilla_pool::fred::prelude::*;
use flotilla_pool::{Error, Worker};
use support::{Env, Ledger, eventually, fast};

/// Subscribers of a sharded channel (`PUBSUB SHARDNUMSUB`).
async fn subscribers(client: &Client, channel: &str) -> u64 {
    let reply: Vec<Value> = client
        .custom(
            flotilla_pool::fred::types::CustomCommand::new_static("PUBSUB", None, false),
            vec!["SHARDNUMSUB", channel],
        )
        .await
        .unwrap();
    reply.get(1).and_then(Value::as_u64).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_without_job_replicas_run_stop_and_clean_up_jobs() {
    support::init_tracing();
    let env = Env::new("mirror-off");
    let probe = flotilla_testkit::client(&env.server.url()).await.unwrap();
    let jobs_channel = format!("fl:{{{}}}:map:jobs:events", env.pool);
    let pending_channel = format!("fl:{{{}}}:map:pending:events", env.pool);
    let ledger = Ledger::default();
    let lean = fast().mirror_jobs(false);
    let a = env.node(lean.clone()).await;
    let b = env.node(lean).await;
    let wa = Worker::new(&a, ledger.handler("wa")).await.unwrap();
    let wb = Worker::new(&b, ledger.handler("wb")).await.unwrap();
    assert_eq!(subscribers(&probe, &jobs_channel).await, 0);
    assert_eq!(subscribers(&probe, &pending_channel).await, 0);

    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    for k in &keys {
        a.dispatch_job(k, &b"p"[..]).await.unwrap();
    }
    eventually("every job runs", Duration::from_secs(10), || {
        ledger.running().len() == keys.len()
    })
    .await;
    let running = ledger.running();
    assert!(
        running.values().any(|w| w == "wa") && running.values().any(|w| w == "wb"),
        "both workers run jobs: {running:?}"
    );

    // Each node answers for its own workers' jobs from memory, and for
    // every job from Redis.
    let ids = [("wa", wa.id().to_string()), ("wb", wb.id().to_string())];
    for k in &keys {
        let worker = &running[k];
        let id = &ids.iter().find(|(n, _)| n == worker).unwrap().1;
        let (local, other) = if worker == "wa" { (&a, &b) } else { (&b, &a) };
        let token = *ledger.tokens(k).last().unwrap();
        assert_eq!(local.job_owner(k), Some((id.clone(), token)), "{k}");
        assert_eq!(other.job_owner(k), None, "{k}: not this node's job");
        assert_eq!(
            other.lookup_job_owner(k).await.unwrap(),
            Some((id.clone(), token)),
            "{k}"
        );
    }
    let all: BTreeSet<String> = keys.iter().cloned().collect();
    let listed: BTreeSet<String> = b.lookup_job_keys().await.unwrap().into_iter().collect();
    assert_eq!(listed, all);
    let local: BTreeSet<String> = a.job_keys().into_iter().collect();
    let on_a: BTreeSet<String> = running
        .iter()
        .filter(|(_, w)| *w == "wa")
        .map(|(k, _)| k.clone())
        .collect();
    assert_eq!(local, on_a);
    assert!(matches!(
        b.dispatch_job(&keys[0], &b"p"[..]).await,
        Err(Error::JobExists(_))
    ));

    // Requests reach the owner on the other node.
    let on_b = running.iter().find(|(_, w)| *w == "wb").unwrap().0.clone();
    a.notify_worker(&on_b, &b"hello"[..]).await.unwrap();
    eventually(
        "the owner got the notification",
        Duration::from_secs(5),
        || ledger.notes().iter().any(|(k, _)| *k == on_b),
    )
    .await;
    a.stop_job(&on_b).await.unwrap();
    assert!(!ledger.running().contains_key(&on_b));
    assert!(matches!(
        a.stop_job("never-dispatched").await,
        Err(Error::JobNotFound(_))
    ));

    // A node that leaves hands its jobs over; the one left runs them all,
    // found in Redis rather than in a replica.
    b.close().await.unwrap();
    let expected = keys.len() - 1;
    eventually("the jobs of b run on a", Duration::from_secs(10), || {
        let running = ledger.running();
        running.len() == expected && running.values().all(|w| w == "wa")
    })
    .await;
    let mut left: Vec<String> = a.job_keys();
    left.sort();
    assert_eq!(left.len(), expected);
    assert_eq!(
        a.pool_workers().iter().map(|w| w.jobs).sum::<usize>(),
        expected
    );
    assert_eq!(ledger.violations(), Vec::<String>::new(), "I1");
    a.close().await.unwrap();
}

/// A mirroring node and a lean one side by side: only the mirroring one
/// subscribes, and its replica shows the jobs the lean one dispatched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_mirroring_nodes_subscribe_to_job_changes() {
    support::init_tracing();
    let env = Env::new("mirror-mixed");
    let probe = flotilla_testkit::client(&env.server.url()).await.unwrap();
    let jobs_channel = format!("fl:{{{}}}:map:jobs:events", env.pool);
    let ledger = Ledger::default();
    let full = env.node(fast().mirror_jobs(true)).await;
    let lean = env.node(fast().mirror_jobs(false)).await;
    let _w = Worker::new(&lean, ledger.handler("w")).await.unwrap();
    assert_eq!(subscribers(&probe, &jobs_channel).await, 1);
    lean.dispatch_job("x", &b"p"[..]).await.unwrap();
    flotilla_testkit::wait_until(Duration::from_secs(5), "the replica shows x", || async {
        full.job_keys() == vec!["x".to_string()]
    })
    .await
    .unwrap();
    assert_eq!(full.job_owner("x"), lean.job_owner("x"));
    lean.close().await.unwrap();
    full.close().await.unwrap();
}
