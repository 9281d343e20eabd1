//! Redis restarts under a running pool: with AOF the pool heals and keeps
//! every job; without persistence workers re-register and re-assert (I2).

mod support;

use std::time::Duration;

use flotilla_pool::Worker;
use flotilla_testkit::{RedisServer, ServerOptions};
use support::{Ledger, eventually, fast};

async fn restart_case(aof: bool) {
    support::init_tracing();
    let mut server = RedisServer::start_with(ServerOptions::default().aof(aof)).unwrap();
    let pool = flotilla_testkit::unique_name(if aof { "restart-aof" } else { "restart-mem" });
    let ledger = Ledger::default();
    let mut nodes = Vec::new();
    let mut workers = Vec::new();
    for i in 0..2 {
        let client = flotilla_testkit::client(&server.url()).await.unwrap();
        // Mirroring: the test checks that both replicas heal.
        let node = flotilla_pool::Node::join(&client, &pool, fast().mirror_jobs(true))
            .await
            .unwrap();
        workers.push(
            Worker::new(&node, ledger.handler(&format!("w{i}")))
                .await
                .unwrap(),
        );
        nodes.push(node);
    }
    for i in 0..40 {
        nodes[i % 2]
            .dispatch_job(&format!("r{i}"), &b"payload"[..])
            .await
            .unwrap();
    }
    server.restart().unwrap();
    // Every job keeps running (on some worker), the pool's Redis state
    // comes back to list all 40, and new dispatches work again.
    let probe = flotilla_testkit::client(&server.url()).await.unwrap();
    let (jobs_key, payloads_key) = (
        format!("fl:{{{pool}}}:map:jobs"),
        format!("fl:{{{pool}}}:payloads"),
    );
    flotilla_testkit::wait_until(
        Duration::from_secs(20),
        "jobs and payloads back in redis",
        || {
            let probe = probe.clone();
            let (j, p) = (jobs_key.clone(), payloads_key.clone());
            async move {
                let jobs: u64 = fred::prelude::HashesInterface::hlen(&probe, &j)
                    .await
                    .unwrap_or(0);
                let payloads: u64 = fred::prelude::HashesInterface::hlen(&probe, &p)
                    .await
                    .unwrap_or(0);
                jobs == 40 && payloads == 40
            }
        },
    )
    .await
    .unwrap();
    eventually("replicas healed", Duration::from_secs(20), || {
        nodes[0].job_keys().len() == 40 && nodes[1].job_keys().len() == 40
    })
    .await;
    eventually("each job runs", Duration::from_secs(20), || {
        ledger.running().len() == 40
    })
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match nodes[0].dispatch_job("after-restart", &b"x"[..]).await {
            Ok(()) => break,
            Err(e) if std::time::Instant::now() < deadline => {
                tracing::debug!(error = %e, "dispatch after restart not yet possible");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("dispatch after restart: {e}"),
        }
    }
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    let payload = nodes[1].job_payload("r7").await.unwrap();
    assert_eq!(
        payload.as_deref(),
        Some(&b"payload"[..]),
        "payload restored"
    );
    for n in nodes {
        n.close().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_with_aof_heals_without_loss() {
    restart_case(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_without_persistence_workers_reassert_jobs() {
    restart_case(false).await;
}

/// A rollback (Redis restarted from a snapshot a few dispatches old)
/// restores an older fencing counter for a key; the next start of the key
/// must still get a token above every token it ever had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_never_reissues_a_job_token() {
    support::init_tracing();
    let mut server = RedisServer::start_with(ServerOptions::default().aof(true)).unwrap();
    let pool = flotilla_testkit::unique_name("rollback-tokens");
    let ledger = Ledger::default();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let node = flotilla_pool::Node::join(&client, &pool, fast())
        .await
        .unwrap();
    let _worker = Worker::new(&node, ledger.handler("w0")).await.unwrap();
    node.dispatch_job("k", &b"p"[..]).await.unwrap();
    let snapshot = server.save_snapshot().unwrap();
    for _ in 0..2 {
        node.stop_job("k").await.unwrap();
        node.dispatch_job("k", &b"p"[..]).await.unwrap();
    }
    let before = ledger.tokens("k");
    assert_eq!(before.len(), 3);
    server.roll_back(&snapshot).unwrap();
    // Once the pool answers again: stop whatever runs and start it anew.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let stopped = node.stop_job("k").await;
        let started = match stopped {
            Ok(()) | Err(flotilla_pool::Error::JobNotFound(_)) => {
                node.dispatch_job("k", &b"p"[..]).await
            }
            Err(e) => Err(e),
        };
        match started {
            Ok(()) => break,
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::debug!(error = %e, "pool not ready after the rollback yet");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("no start after the rollback: {e}"),
        }
    }
    let after = ledger.tokens("k");
    let newest = *after.last().unwrap();
    assert!(
        before.iter().all(|t| newest > *t),
        "token {newest} after the rollback; before: {before:?}"
    );
    let mut sorted = after.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(
        sorted.len(),
        after.len(),
        "a token was issued twice: {after:?}"
    );
    node.close().await.unwrap();
}

/// Redis goes back in time under a running pool: killed and started again
/// from a snapshot taken before a stretch of normal work — dispatches,
/// stops, a worker joining and jobs handed to it. Redis is then neither
/// empty nor current. Afterwards every job that was not stopped runs exactly
/// once and Redis records it where it runs (re-asserted, the newer token
/// winning over stale records), every stop made in the lost stretch holds
/// (stale records released, replayed starts refused), a running key is
/// never admitted again, and no fencing token repeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_keeps_every_job_and_every_stop() {
    rollback_case(true).await;
}

/// The same with nodes that do not mirror the jobs and pending maps
/// (`NodeOptions::mirror_jobs(false)`): they see Redis go back in time
/// through the keep-alive map, which every node mirrors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_keeps_every_job_and_every_stop_without_job_replicas() {
    rollback_case(false).await;
}

async fn rollback_case(mirror_jobs: bool) {
    support::init_tracing();
    let mut server = RedisServer::start_with(ServerOptions::default().aof(true)).unwrap();
    let pool = flotilla_testkit::unique_name("rollback");
    let ledger = Ledger::default();
    let mut nodes = Vec::new();
    let mut workers = Vec::new();
    for i in 0..3 {
        let client = flotilla_testkit::client(&server.url()).await.unwrap();
        nodes.push(
            flotilla_pool::Node::join(&client, &pool, fast().mirror_jobs(mirror_jobs))
                .await
                .unwrap(),
        );
        if i < 2 {
            workers.push(
                Worker::new(&nodes[i], ledger.handler(&format!("w{i}")))
                    .await
                    .unwrap(),
            );
        }
    }
    let before: Vec<String> = (0..30).map(|i| format!("a{i}")).collect();
    for k in &before {
        nodes[0].dispatch_job(k, &b"p"[..]).await.unwrap();
    }
    let snapshot = server.save_snapshot().unwrap();

    // The stretch Redis will lose.
    let after: Vec<String> = (0..20).map(|i| format!("b{i}")).collect();
    for k in &after {
        nodes[1].dispatch_job(k, &b"p"[..]).await.unwrap();
    }
    let stopped: Vec<String> = before[..10].to_vec();
    for k in &stopped {
        nodes[2].stop_job(k).await.unwrap();
    }
    workers.push(Worker::new(&nodes[2], ledger.handler("w2")).await.unwrap());
    let should_run: Vec<String> = before[10..].iter().chain(&after).cloned().collect();
    eventually(
        "jobs handed to the new worker",
        Duration::from_secs(10),
        || {
            let running = ledger.running();
            running.values().filter(|w| *w == "w2").count() > 3
                && should_run.iter().all(|k| running.contains_key(k))
        },
    )
    .await;
    let tokens_before: std::collections::HashMap<String, Vec<u64>> = should_run
        .iter()
        .chain(&stopped)
        .map(|k| (k.clone(), ledger.tokens(k)))
        .collect();

    server.roll_back(&snapshot).unwrap();
    // At once, before any replica had time to notice: a key stopped in the
    // lost stretch is not running, whatever the restored record says, so it
    // is admitted (once the pool has recovered), never answered JobExists.
    let racing = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match nodes[1].dispatch_job(&stopped[1], &b"p"[..]).await {
            Ok(()) => break,
            Err(flotilla_pool::Error::JobExists(_)) => {
                panic!("{} answered JobExists while it runs nowhere", stopped[1])
            }
            Err(e) if tokio::time::Instant::now() < racing => {
                tracing::debug!(error = %e, "redis not back yet");
            }
            Err(e) => panic!("no answer after the rollback: {e}"),
        }
    }
    // A key started in the lost stretch runs, so it is not admitted again.
    let racing = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match nodes[0].dispatch_job(&after[2], &b"p"[..]).await {
            Err(flotilla_pool::Error::JobExists(_)) => break,
            Ok(()) => panic!("{} admitted again while it runs", after[2]),
            Err(e) if tokio::time::Instant::now() < racing => {
                tracing::debug!(error = %e, "redis not back yet");
            }
            Err(e) => panic!("no answer after the rollback: {e}"),
        }
    }
    let should_run: Vec<String> = should_run
        .iter()
        .chain(std::iter::once(&stopped[1]))
        .cloned()
        .collect();
    let stopped: Vec<String> = std::iter::once(&stopped[0])
        .chain(&stopped[2..])
        .cloned()
        .collect();

    // Redis ends up recording exactly what runs, where it runs.
    let probe = flotilla_testkit::client(&server.url()).await.unwrap();
    let jobs_key = format!("fl:{{{pool}}}:map:jobs");
    let payloads_key = format!("fl:{{{pool}}}:payloads");
    let ids: std::collections::HashMap<String, String> = workers
        .iter()
        .enumerate()
        .map(|(i, w)| (format!("w{i}"), w.id().to_string()))
        .collect();
    let converged = || {
        let probe = probe.clone();
        let (jobs_key, payloads_key) = (jobs_key.clone(), payloads_key.clone());
        let running = ledger.running();
        let (should_run, stopped, ids) = (should_run.clone(), stopped.clone(), ids.clone());
        async move {
            let jobs: std::collections::HashMap<String, String> =
                fred::prelude::HashesInterface::hgetall(&probe, &jobs_key)
                    .await
                    .unwrap_or_default();
            let payloads: Vec<String> =
                fred::prelude::HashesInterface::hkeys(&probe, &payloads_key)
                    .await
                    .unwrap_or_default();
            running.len() == should_run.len()
                && should_run.iter().all(|k| {
                    running.get(k).is_some_and(|w| {
                        jobs.get(k)
                            .is_some_and(|r| r.split(' ').next() == Some(ids[w].as_str()))
                    })
                })
                && stopped
                    .iter()
                    .all(|k| !jobs.contains_key(k) && !payloads.contains(k))
                && jobs.len() == should_run.len()
        }
    };
    if let Err(e) = flotilla_testkit::wait_until(
        Duration::from_secs(20),
        "redis records what runs",
        converged,
    )
    .await
    {
        let running = ledger.running();
        let jobs: std::collections::HashMap<String, String> =
            fred::prelude::HashesInterface::hgetall(&probe, &jobs_key)
                .await
                .unwrap_or_default();
        panic!("{e}\nrunning: {running:?}\njobs map: {jobs:?}\nids: {ids:?}");
    }
    assert_eq!(ledger.violations(), Vec::<String>::new(), "I1");

    // A running key is not admitted again; a stopped one is.
    for k in [&after[0], &before[15]] {
        assert!(
            matches!(
                nodes[0].dispatch_job(k, &b"p"[..]).await,
                Err(flotilla_pool::Error::JobExists(_))
            ),
            "{k} admitted twice"
        );
    }
    nodes[0].dispatch_job(&stopped[0], &b"p"[..]).await.unwrap();
    nodes[1].stop_job(&after[1]).await.unwrap();
    assert!(!ledger.running().contains_key(&after[1]));

    // Fencing tokens never repeat and increase per key.
    for (k, old) in tokens_before {
        let all = ledger.tokens(&k);
        assert!(all.windows(2).all(|w| w[0] < w[1]), "{k}: {all:?}");
        assert!(all.len() >= old.len());
    }
    assert_eq!(ledger.violations(), Vec::<String>::new(), "I1");
    for n in &nodes {
        n.close().await.unwrap();
    }
}
