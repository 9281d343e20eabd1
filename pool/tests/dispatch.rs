//! Dispatch, stop, notify, message and every typed error, on a real Redis.

mod support;

use std::time::Duration;

use flotilla_pool::{Error, NodeOptions, Worker};
use support::{Env, Ledger, eventually, fast};

#[tokio::test]
async fn dispatch_stop_notify_message_happy_paths() {
    let env = Env::new("happy");
    let ledger = Ledger::default();
    // Mirroring: the node's replica of the jobs map is checked too.
    let node = env.node(fast().mirror_jobs(true)).await;
    let worker = Worker::new(&node, ledger.handler("w1")).await.unwrap();

    node.dispatch_job("job-1", &b"\x00\xffpayload"[..])
        .await
        .unwrap();
    assert_eq!(ledger.starts("job-1"), 1);
    assert_eq!(worker.job_keys(), vec!["job-1".to_string()]);
    let payload = node.job_payload("job-1").await.unwrap().unwrap();
    assert_eq!(&payload[..], b"\x00\xffpayload");
    eventually("job in replica", Duration::from_secs(5), || {
        node.job_keys() == vec!["job-1".to_string()]
    })
    .await;
    let (owner, token) = node.job_owner("job-1").unwrap();
    assert_eq!(owner, worker.id());
    assert!(token >= 1);

    node.notify_worker("job-1", &b"hello"[..]).await.unwrap();
    node.dispatch_message("any-key", &b"msg"[..]).await.unwrap();
    eventually(
        "notify and message delivered",
        Duration::from_secs(5),
        || ledger.notes().len() == 1 && ledger.messages().len() == 1,
    )
    .await;
    assert_eq!(&ledger.notes()[0].1[..], b"hello");

    node.stop_job("job-1").await.unwrap();
    assert!(ledger.running().is_empty());
    assert!(worker.job_keys().is_empty());
    assert_eq!(node.job_payload("job-1").await.unwrap(), None);

    // A stopped key can run again, with a higher fencing token.
    node.dispatch_job("job-1", &b"again"[..]).await.unwrap();
    let tokens = ledger.tokens("job-1");
    assert_eq!(tokens.len(), 2);
    assert!(tokens[1] > tokens[0]);
    node.close().await.unwrap();
}

#[tokio::test]
async fn every_typed_error() {
    let env = Env::new("errors");
    let ledger = Ledger::default();
    let node = env.node(fast().max_payload_size(1024)).await;

    // No worker yet: NoActiveWorker after the dispatch timeout.
    let client_only = env
        .node(
            fast()
                .client_only(true)
                .dispatch_timeout(Duration::from_millis(300)),
        )
        .await;
    assert!(matches!(
        client_only.dispatch_job("k", &b""[..]).await,
        Err(Error::NoActiveWorker(_))
    ));
    assert!(matches!(
        Worker::new(&client_only, ledger.handler("x")).await,
        Err(Error::InvalidOptions { .. })
    ));

    let _worker = Worker::new(&node, ledger.handler("w1")).await.unwrap();
    node.dispatch_job("k", &b""[..]).await.unwrap();
    assert!(matches!(node.dispatch_job("k", &b""[..]).await, Err(Error::JobExists(k)) if k == "k"));
    assert!(matches!(
        client_only.dispatch_job("k", &b""[..]).await,
        Err(Error::JobExists(_))
    ));
    assert!(matches!(
        node.stop_job("missing").await,
        Err(Error::JobNotFound(_))
    ));
    assert!(matches!(
        node.notify_worker("missing", &b""[..]).await,
        Err(Error::JobNotFound(_))
    ));
    for bad in ["", "a{b", "a}b", "tab\there", &"x".repeat(300)] {
        assert!(
            matches!(
                node.dispatch_job(bad, &b""[..]).await,
                Err(Error::InvalidName { .. })
            ),
            "{bad:?} accepted"
        );
    }
    assert!(matches!(
        node.dispatch_job("big", vec![0u8; 2048]).await,
        Err(Error::PayloadTooLarge {
            size: 2048,
            limit: 1024
        })
    ));
    match node.dispatch_job("fail-1", &b""[..]).await {
        Err(Error::StartFailed { key, message }) => {
            assert_eq!(key, "fail-1");
            assert!(message.contains("refused by handler"), "{message}");
        }
        other => panic!("expected StartFailed, got {other:?}"),
    }
    match node.dispatch_job("panic-1", &b""[..]).await {
        Err(Error::StartFailed { message, .. }) => {
            assert!(message.contains("panicked"), "{message}")
        }
        other => panic!("expected StartFailed, got {other:?}"),
    }
    // A failed start leaves nothing behind: the key can be dispatched again
    // (and fails again, cleanly).
    assert!(matches!(
        node.dispatch_job("fail-1", &b""[..]).await,
        Err(Error::StartFailed { .. })
    ));
    // The worker survived the panic.
    node.dispatch_job("after-panic", &b""[..]).await.unwrap();

    assert!(matches!(
        flotilla_pool::NodeOptions::default()
            .worker_ttl(Duration::from_millis(10))
            .validate(),
        Err(Error::InvalidOptions {
            option: "worker_ttl",
            ..
        })
    ));
    client_only.close().await.unwrap();
    node.close().await.unwrap();
    assert!(matches!(
        node.dispatch_job("z", &b""[..]).await,
        Err(Error::Closed)
    ));
}

#[tokio::test]
async fn full_inbox_is_pool_full() {
    let env = Env::new("full");
    let ledger = Ledger::default();
    let node = env.node(fast().max_queued_jobs(1)).await;
    let _worker = Worker::new(&node, ledger.handler("w1")).await.unwrap();
    // 50 dispatches in flight at once into an inbox limited to one queued
    // event: the worker cannot drain it as fast as they arrive.
    let mut full = 0;
    let mut ok = 0;
    let mut handles = Vec::new();
    for i in 0..50 {
        let node = node.clone();
        handles.push(tokio::spawn(async move {
            node.dispatch_job(&format!("j{i}"), &b""[..]).await
        }));
    }
    for h in handles {
        match h.await.unwrap() {
            Ok(()) => ok += 1,
            Err(Error::PoolFull(_)) => full += 1,
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!(ok + full, 50);
    assert!(
        full > 0,
        "50 concurrent dispatches into an inbox of 1 must overflow"
    );
    node.close().await.unwrap();
}

#[tokio::test]
async fn shutdown_stops_everything_and_refuses_joins() {
    let env = Env::new("shutdown");
    let ledger = Ledger::default();
    let a = env.node(fast()).await;
    let b = env.node(fast()).await;
    let _wa = Worker::new(&a, ledger.handler("a")).await.unwrap();
    let _wb = Worker::new(&b, ledger.handler("b")).await.unwrap();
    for i in 0..20 {
        a.dispatch_job(&format!("s{i}"), &b""[..]).await.unwrap();
    }
    a.shutdown().await.unwrap();
    eventually("every job stopped", Duration::from_secs(10), || {
        ledger.running().is_empty()
    })
    .await;
    let client = flotilla_testkit::client(&env.server.url()).await.unwrap();
    // The other node closes itself on the flag (writing nothing after the
    // keys are gone); no close call needed.
    eventually("node b closed", Duration::from_secs(10), || b.is_closed()).await;
    let keys: Vec<String> = fred::prelude::ClientLike::custom(
        &client,
        fred::types::CustomCommand::new_static("KEYS", fred::types::ClusterHash::FirstKey, false),
        vec![format!("fl:{{{}}}:*", env.pool)],
    )
    .await
    .unwrap();
    assert!(keys.is_empty(), "pool keys left after shutdown: {keys:?}");
    // Deleted on purpose, not lost: a node that joins the pool again
    // starts it anew, with no recovery window (the server forgot it held
    // the pool's epoch).
    let again = env.node(fast()).await;
    let epoch: Option<String> = fred::prelude::HashesInterface::hget(
        &client,
        format!("fl:{{{}}}:fencing", env.pool),
        "\nepoch",
    )
    .await
    .unwrap();
    assert_eq!(epoch.as_deref(), Some("0 0"), "a new pool's closed epoch");
    again.close().await.unwrap();
    let _ = NodeOptions::default();
}

#[tokio::test]
async fn a_handler_stop_timeout_beyond_the_node_budget_is_refused() {
    let env = Env::new("stopbudget");
    let node = env.node(fast()).await;
    let budget = node.options().stop_timeout;
    let too_long = flotilla_pool::TaskHandler::new(|_job, _cancel| async { Ok(()) })
        .stop_timeout(budget + Duration::from_millis(1));
    match Worker::new(&node, too_long).await {
        Err(Error::InvalidOptions { option, reason }) => {
            assert_eq!(option, "stop_timeout");
            assert!(reason.contains("exceeds"), "{reason}");
        }
        other => panic!("expected InvalidOptions, got {other:?}"),
    }
    let fits =
        flotilla_pool::TaskHandler::new(|_job, _cancel| async { Ok(()) }).stop_timeout(budget);
    let worker = Worker::new(&node, fits).await.unwrap();
    assert!(!worker.id().is_empty());
    node.close().await.unwrap();
}
