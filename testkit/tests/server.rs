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

/// One connection failed alone: the other client's commands go on, the
/// failed one's do not, and a heal brings it back.
#[tokio::test]
async fn proxy_fails_one_connection_alone() {
    let server = RedisServer::start().unwrap();
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let first = flotilla_testkit::client(&proxy.url()).await.unwrap();
    let _: String = first.ping(None).await.unwrap();
    let second = flotilla_testkit::client(&proxy.url()).await.unwrap();
    let _: String = second.ping(None).await.unwrap();
    let open = proxy.connections();
    assert_eq!(open.len(), 2, "one connection per client: {open:?}");
    proxy.set_mode_of(open[0], flotilla_testkit::ProxyMode::BlackHole);
    let stalled =
        tokio::time::timeout(Duration::from_millis(500), first.ping::<String>(None)).await;
    assert!(
        stalled.is_err(),
        "the black-holed connection answered: {stalled:?}"
    );
    for _ in 0..3 {
        let pong: String = second.ping(None).await.unwrap();
        assert_eq!(pong, "PONG", "the other connection forwards");
    }
    let third = flotilla_testkit::client(&proxy.url()).await.unwrap();
    let pong: String = third.ping(None).await.unwrap();
    assert_eq!(pong, "PONG", "a new connection forwards");
    proxy.heal();
    flotilla_testkit::wait_until(Duration::from_secs(10), "ping after heal", || {
        let first = first.clone();
        async move { first.ping::<String>(None).await.is_ok() }
    })
    .await
    .unwrap();
}

/// A deaf proxy lets commands through and holds the replies: the server runs
/// them, the client hears nothing until the heal, and then hears it all.
#[tokio::test]
async fn a_deaf_proxy_runs_commands_and_holds_their_replies() {
    let server = RedisServer::start().unwrap();
    let direct = flotilla_testkit::client(&server.url()).await.unwrap();
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let client = flotilla_testkit::client(&proxy.url()).await.unwrap();
    let _: String = client.ping(None).await.unwrap();
    proxy.deafen();
    let incr = tokio::spawn({
        let client = client.clone();
        async move { client.incr::<i64, _>("deaf-counter").await }
    });
    flotilla_testkit::wait_until(Duration::from_secs(10), "the command ran", || {
        let direct = direct.clone();
        async move {
            direct
                .get::<Option<i64>, _>("deaf-counter")
                .await
                .ok()
                .flatten()
                == Some(1)
        }
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!incr.is_finished(), "a reply came through a deaf link");
    proxy.heal();
    let value = tokio::time::timeout(Duration::from_secs(10), incr)
        .await
        .expect("the held reply arrives after the heal")
        .unwrap()
        .unwrap();
    assert_eq!(value, 1);
}

#[tokio::test]
async fn a_slow_proxy_delays_each_way_and_heals() {
    let server = RedisServer::start().unwrap();
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let client = flotilla_testkit::client(&proxy.url()).await.unwrap();
    let delay = Duration::from_millis(150);
    proxy.slow_down(delay);
    let sent = tokio::time::Instant::now();
    let pongs = tokio::join!(
        client.ping::<String>(None),
        client.ping::<String>(None),
        client.ping::<String>(None)
    );
    let round_trip = sent.elapsed();
    for pong in [pongs.0, pongs.1, pongs.2] {
        assert_eq!(pong.unwrap(), "PONG");
    }
    assert!(
        round_trip >= delay * 2,
        "a round trip through the slow link took {round_trip:?}, less than twice {delay:?}"
    );
    assert!(
        round_trip < delay * 2 + Duration::from_secs(5),
        "pipelined commands wait for the link once, not once each: {round_trip:?}"
    );
    proxy.heal();
    let _: String = client.ping(None).await.unwrap();
    let sent = tokio::time::Instant::now();
    let _: String = client.ping(None).await.unwrap();
    assert!(sent.elapsed() < delay * 2, "a healed link is fast again");
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
