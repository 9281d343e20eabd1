//! The test support crate itself, against a real redis-server.

use std::time::Duration;

use flotilla_testkit::{FaultProxy, RedisServer, ServerOptions};
use fred::prelude::*;

#[tokio::test]
async fn starts_answers_and_restarts_with_aof() {
    let mut server = RedisServer::start_with(ServerOptions::default().aof(true)).unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let _: () = client.set("k", "v", None, None, false).await.unwrap();
    let port = server.port();
    server.restart().unwrap();
    assert_eq!(server.port(), port);
    flotilla_testkit::wait_until(Duration::from_secs(10), "reconnect", || {
        let client = client.clone();
        async move { client.ping::<String>(None).await.is_ok() }
    })
    .await
    .unwrap();
    let value: Option<String> = client.get("k").await.unwrap();
    assert_eq!(value.as_deref(), Some("v"), "AOF keeps data over a restart");
}

#[tokio::test]
async fn restart_without_persistence_loses_data() {
    let mut server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let _: () = client.set("k", "v", None, None, false).await.unwrap();
    server.restart().unwrap();
    let probe = flotilla_testkit::client(&server.url()).await.unwrap();
    let value: Option<String> = probe.get("k").await.unwrap();
    assert_eq!(value, None);
}

#[tokio::test]
async fn proxy_forwards_cuts_and_heals() {
    let server = RedisServer::start().unwrap();
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let client = flotilla_testkit::client(&proxy.url()).await.unwrap();
    let pong: String = client.ping(None).await.unwrap();
    assert_eq!(pong, "PONG");
    proxy.cut();
    let err = tokio::time::timeout(Duration::from_secs(8), client.ping::<String>(None)).await;
    assert!(!matches!(err, Ok(Ok(_))), "a cut proxy must not answer");
    proxy.heal();
    flotilla_testkit::wait_until(Duration::from_secs(10), "ping after heal", || {
        let client = client.clone();
        async move { client.ping::<String>(None).await.is_ok() }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn command_stats_counts_calls() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    for _ in 0..3 {
        let _: () = client.set("a", "1", None, None, false).await.unwrap();
    }
    let stats = flotilla_testkit::command_stats(&client).await.unwrap();
    let set = stats.iter().find(|(n, _)| n == "set").map(|(_, c)| *c);
    assert_eq!(set, Some(3));
}
