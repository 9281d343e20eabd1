//! Idempotency window on dispatch: a key admitted within the window is not
//! started again, even after it finished; after the window it is; of many
//! concurrent windowed dispatches exactly one starts; a start the handler
//! refused does not hold the window.

mod support;

use std::time::Duration;

use flotilla_pool::{DispatchOptions, Error, Worker};
use support::{Env, Ledger, fast};

fn window(ms: u64) -> DispatchOptions {
    DispatchOptions::default().idempotency_window(Duration::from_millis(ms))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_within_the_window_even_after_stop_then_accepted() {
    let env = Env::new("idem");
    let ledger = Ledger::default();
    let node = env.node(fast()).await;
    let _worker = Worker::new(&node, ledger.handler("w0")).await.unwrap();
    let once = window(1_500);

    node.dispatch_job_with("report", &b"v1"[..], &once)
        .await
        .unwrap();
    // Still running: the usual JobExists.
    assert!(matches!(
        node.dispatch_job_with("report", &b"v1"[..], &once).await,
        Err(Error::JobExists(_))
    ));
    node.stop_job("report").await.unwrap();
    // Finished, but within the window: refused, with the time left.
    let retry_after = match node.dispatch_job_with("report", &b"v2"[..], &once).await {
        Err(Error::AlreadyDispatched { key, retry_after }) => {
            assert_eq!(key, "report");
            assert!(
                retry_after <= Duration::from_millis(1_500) && !retry_after.is_zero(),
                "{retry_after:?}"
            );
            retry_after
        }
        other => panic!("expected AlreadyDispatched, got {other:?}"),
    };
    assert_eq!(ledger.starts("report"), 1);
    // The window ends on Redis server time: past `retry_after` it is accepted.
    tokio::time::sleep(retry_after + Duration::from_millis(20)).await;
    node.dispatch_job_with("report", &b"v2"[..], &once)
        .await
        .unwrap();
    assert_eq!(ledger.starts("report"), 2);
    assert_eq!(
        node.job_payload("report").await.unwrap().as_deref(),
        Some(&b"v2"[..])
    );
    // A dispatch without a window neither checks nor writes markers.
    node.stop_job("report").await.unwrap();
    node.dispatch_job("report", &b"v3"[..]).await.unwrap();
    assert_eq!(ledger.starts("report"), 3);
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    node.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_dispatches_within_the_window_start_once() {
    let env = Env::new("idem-race");
    let ledger = Ledger::default();
    let mut nodes = Vec::new();
    let mut workers = Vec::new();
    for i in 0..3 {
        let node = env.node(fast()).await;
        workers.push(
            Worker::new(&node, ledger.handler(&format!("w{i}")))
                .await
                .unwrap(),
        );
        nodes.push(node);
    }
    let once = window(10_000);
    let mut calls = Vec::new();
    for i in 0..30 {
        let (node, once) = (nodes[i % 3].clone(), once.clone());
        calls.push(tokio::spawn(async move {
            node.dispatch_job_with("successor", &b""[..], &once).await
        }));
    }
    let mut ok = 0;
    for call in calls {
        match call.await.unwrap() {
            Ok(()) => ok += 1,
            Err(Error::JobExists(_) | Error::AlreadyDispatched { .. }) => {}
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    assert_eq!(ok, 1, "exactly one dispatch is admitted");
    assert_eq!(ledger.starts("successor"), 1);
    for node in nodes {
        node.close().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_start_does_not_hold_the_window_and_bad_window_is_refused() {
    let env = Env::new("idem-fail");
    let ledger = Ledger::default();
    let node = env.node(fast()).await;
    let _worker = Worker::new(&node, ledger.handler("w0")).await.unwrap();
    let once = window(60_000);
    for _ in 0..2 {
        // The handler refuses keys starting with "fail-": each attempt
        // reaches the handler again instead of AlreadyDispatched.
        assert!(matches!(
            node.dispatch_job_with("fail-successor", &b""[..], &once)
                .await,
            Err(Error::StartFailed { .. })
        ));
    }
    let zero = DispatchOptions::default().idempotency_window(Duration::ZERO);
    assert!(matches!(
        node.dispatch_job_with("k", &b""[..], &zero).await,
        Err(Error::InvalidOptions {
            option: "idempotency_window",
            ..
        })
    ));
    node.close().await.unwrap();
}
