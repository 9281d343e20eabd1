//! `wait_revision` around a resync that found Redis behind the replica.

use std::time::Duration;

use fred::prelude::*;

use super::Map;
use crate::options::MapOptions;
use crate::replica::State;

const DEADLINE: Duration = Duration::from_secs(10);

/// A resync that read Redis before a write and is stored after the
/// writer started waiting (the replica was ahead: Redis had restarted
/// empty) wakes every waiter. The write is in Redis, so `wait_revision`
/// must keep waiting until the replica shows it, not return with the
/// replica still without it.
#[tokio::test]
async fn a_waiter_released_by_a_regression_waits_for_a_write_redis_kept() {
    let server = flotilla_testkit::RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let options = MapOptions::default().revision_check(None);
    let map = Map::join(&client, "wait-regression", options)
        .await
        .unwrap();
    map.set_and_wait("before", "1").await.unwrap();
    let before = map.revision();

    // A write Redis has and the replica has not heard of (no message).
    let keys = &map.inner.keys;
    let written: u64 = client.incr(keys.revision.as_str()).await.unwrap();
    let _: () = client
        .hset(keys.hash.as_str(), ("after", "2"))
        .await
        .unwrap();
    assert_eq!(written, before + 1);

    let waiter = {
        let map = map.clone();
        tokio::spawn(async move { map.wait_revision(written).await })
    };
    registered(&map).await;
    assert!(!waiter.is_finished(), "the replica is behind the write");

    // The regression: a snapshot read before the write, stored now.
    let shared = &map.inner.shared;
    let version = shared.load().version + 1;
    shared.store(
        State {
            data: imbl::HashMap::new(),
            rev: 0,
            version,
        },
        None,
        true,
    );
    tokio::time::sleep(Duration::from_millis(200)).await; // give a wrong wake-up time to show
    assert!(
        !waiter.is_finished(),
        "woken at revision {} while Redis holds {written}",
        map.revision()
    );

    map.resync().await.unwrap();
    tokio::time::timeout(DEADLINE, waiter)
        .await
        .expect("the waiter returns once the replica has the write")
        .unwrap()
        .unwrap();
    assert!(map.revision() >= written);
    assert_eq!(map.get("after").as_deref(), Some("2"));
    map.close().await;
}

/// A waiter for a write Redis lost returns after the resync that showed
/// the loss (nothing would ever bring the replica to its revision).
#[tokio::test]
async fn a_waiter_for_a_write_redis_lost_returns_after_the_regression() {
    let server = flotilla_testkit::RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let options = MapOptions::default().revision_check(None);
    let map = Map::join(&client, "wait-lost", options).await.unwrap();
    map.set_and_wait("before", "1").await.unwrap();
    let lost = map.revision() + 1;

    let waiter = {
        let map = map.clone();
        tokio::spawn(async move { map.wait_revision(lost).await })
    };
    registered(&map).await;
    assert!(!waiter.is_finished());

    let _: i64 = client.del(map.inner.keys.revision.as_str()).await.unwrap();
    map.resync().await.unwrap();
    tokio::time::timeout(DEADLINE, waiter)
        .await
        .expect("a waiter for a lost write returns")
        .unwrap()
        .unwrap();
    map.close().await;
}

/// Waits until a waiter is registered on `map`.
async fn registered(map: &Map) {
    flotilla_testkit::wait_until(DEADLINE, "the waiter registered", || async {
        map.inner.shared.waiting() > 0
    })
    .await
    .unwrap();
}
