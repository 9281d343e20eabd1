//! The pool over TLS (`rediss://`) as a restricted ACL user: the user may
//! touch only `fl:*` keys and channels and has no dangerous commands, and
//! every main flow works (join, workers, dispatch, notify, stop, lock).

mod support;

use std::time::Duration;

use flotilla_pool::{ClusterLock, LockOptions, Node, Worker};
use flotilla_testkit::{RedisServer, ServerOptions};
use fred::prelude::*;
use support::{Ledger, eventually, fast};

/// The ACL rule documented in the pool README for a Flotilla user.
const FLOTILLA_ACL: &[&str] = &[
    "on",
    ">s3cret",
    "resetkeys",
    "~fl:*",
    "resetchannels",
    "&fl:*",
    "-@all",
    "+@read",
    "+@write",
    "+@stream",
    "+@hash",
    "+@string",
    "+@keyspace",
    "+@scripting",
    "+@pubsub",
    "+@connection",
    "+time",
    "-@dangerous",
    "+client|unblock",
    "+info",
];

/// Creates user `flotilla` with `rules` on the server of `admin`.
async fn set_user(admin: &Client, rules: &[&str]) {
    let mut args = vec!["SETUSER".to_string(), "flotilla".to_string()];
    args.extend(rules.iter().map(|s| s.to_string()));
    let _: Value = admin
        .custom(
            fred::types::CustomCommand::new_static(
                "ACL",
                fred::types::ClusterHash::FirstKey,
                false,
            ),
            args,
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_over_tls_as_a_restricted_user() {
    let server = RedisServer::start_with(ServerOptions::default().tls(true)).unwrap();
    let admin = flotilla_testkit::client(&server.url()).await.unwrap();
    set_user(&admin, FLOTILLA_ACL).await;

    let url = server
        .tls_url()
        .unwrap()
        .replace("rediss://", "rediss://flotilla:s3cret@");
    let client = flotilla_testkit::client(&url).await.unwrap();
    // The user really is restricted: other keys and dangerous commands are refused.
    let refused: Result<(), _> = client.set("other:key", "x", None, None, false).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("NOPERM")),
        "{refused:?}"
    );
    let flush: Result<(), _> = client.flushall(false).await;
    assert!(
        flush
            .as_ref()
            .is_err_and(|e| e.to_string().contains("NOPERM")),
        "FLUSHALL is refused to the flotilla user: {flush:?}"
    );
    let config: Result<Value, _> = client.config_get("maxmemory").await;
    assert!(config.is_err(), "CONFIG is refused to the flotilla user");
    // INFO is granted: the scripts compare the server's run id on every
    // call, so that a restart or failover that lost writes is seen by the
    // first script after it (pool README, Guarantees).
    let info: String = client
        .info(Some(fred::types::InfoKind::Server))
        .await
        .unwrap();
    assert!(info.contains("run_id:"), "{info}");

    let pool = flotilla_testkit::unique_name("tls");
    let ledger = Ledger::default();
    let node = Node::join(&client, &pool, fast()).await.unwrap();
    let other_client = flotilla_testkit::client(&url).await.unwrap();
    let other = Node::join(&other_client, &pool, fast()).await.unwrap();
    let _w1 = Worker::new(&node, ledger.handler("w1")).await.unwrap();
    let _w2 = Worker::new(&other, ledger.handler("w2")).await.unwrap();
    eventually("both workers seen", Duration::from_secs(5), || {
        node.pool_workers().len() == 2 && other.pool_workers().len() == 2
    })
    .await;
    for i in 0..20 {
        node.dispatch_job(&format!("tls-{i}"), &b"secret payload"[..])
            .await
            .unwrap();
    }
    assert_eq!(ledger.running().len(), 20);
    other.notify_worker("tls-3", &b"hello"[..]).await.unwrap();
    eventually("notify delivered", Duration::from_secs(5), || {
        ledger.notes().iter().any(|(k, _)| k == "tls-3")
    })
    .await;
    other.stop_job("tls-3").await.unwrap();
    assert_eq!(ledger.running().len(), 19);
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());

    let lock = ClusterLock::new(&client, "tls-lock", LockOptions::default()).unwrap();
    let guard = lock.try_acquire().await.unwrap();
    guard.release().await.unwrap();

    // Closing hands the node's jobs to the other node's worker, over TLS.
    node.close().await.unwrap();
    eventually("jobs moved to w2", Duration::from_secs(10), || {
        let running = ledger.running();
        running.len() == 19 && running.values().all(|w| w == "w2")
    })
    .await;
    other.shutdown().await.unwrap();
}

/// A user without `INFO`: the nodes cannot read the server's run id, and
/// the pool still works (the scripts skip that comparison; each node warns
/// once instead of retrying without pause).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_runs_for_a_user_without_info() {
    let server = RedisServer::start().unwrap();
    let admin = flotilla_testkit::client(&server.url()).await.unwrap();
    let without_info: Vec<&str> = FLOTILLA_ACL
        .iter()
        .copied()
        .filter(|rule| *rule != "+info")
        .collect();
    set_user(&admin, &without_info).await;
    let url = server.url().replace("redis://", "redis://flotilla:s3cret@");
    let client = flotilla_testkit::client(&url).await.unwrap();
    let info: Result<String, _> = client.info(None).await;
    assert!(info.is_err(), "INFO is refused to this user");

    let pool = flotilla_testkit::unique_name("no-info");
    let ledger = Ledger::default();
    let node = Node::join(&client, &pool, fast()).await.unwrap();
    let _w = Worker::new(&node, ledger.handler("w1")).await.unwrap();
    for i in 0..5 {
        node.dispatch_job(&format!("k-{i}"), &b"p"[..])
            .await
            .unwrap();
    }
    assert_eq!(ledger.running().len(), 5);
    node.stop_job("k-1").await.unwrap();
    assert_eq!(ledger.running().len(), 4);
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    node.shutdown().await.unwrap();
}
