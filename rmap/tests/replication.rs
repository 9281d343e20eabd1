//! Replicas under concurrency, late joins and Redis restarts.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use flotilla_rmap::{Map, MapEventKind, MapOptions};
use flotilla_testkit::{RedisServer, ServerOptions, unique_name};
use fred::prelude::*;
use futures::StreamExt;
use rand::Rng;
use support::{DEADLINE, converged, env, join};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_replicas_with_random_concurrent_writes_converge() {
    let env = env().await;
    let name = unique_name("converge");
    let mut maps = Vec::new();
    for _ in 0..8 {
        let client = flotilla_testkit::client(&env.server.url()).await.unwrap();
        maps.push(join(&client, &name).await);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for map in maps.clone() {
        let (stop, ops) = (stop.clone(), ops.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let (key, choice, n) = {
                    let mut rng = rand::rng();
                    (
                        format!("k{}", rng.random_range(0..100)),
                        rng.random_range(0..8),
                        rng.random_range(0..1000),
                    )
                };
                let value = n.to_string();
                let result = match choice {
                    0..=2 => map.set(&key, &value).await.map(drop),
                    3 => map.delete(&key).await.map(drop),
                    4 => map.set_if_not_exists(&key, &value).await.map(drop),
                    5 => {
                        let current = map.get(&key).unwrap_or_default();
                        map.test_and_set(&key, &current, &value).await.map(drop)
                    }
                    6 => map
                        .append_unique_values(&format!("l{}", n % 10), &[&value])
                        .await
                        .map(drop),
                    _ => map
                        .remove_values(&format!("l{}", n % 10), &[&value])
                        .await
                        .map(drop),
                };
                // A key may hold a list or a number; only Malformed is expected.
                if let Err(e) = result {
                    assert!(matches!(e, flotilla_rmap::Error::Malformed { .. }), "{e}");
                }
                ops.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(3)).await; // the load phase itself, not a wait for a condition
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    assert!(
        ops.load(Ordering::Relaxed) > 1000,
        "too few writes: {}",
        ops.load(Ordering::Relaxed)
    );
    let redis: HashMap<String, String> =
        env.client.hgetall(&maps[0].keys_info().hash).await.unwrap();
    let rev: u64 = env.client.get(&maps[0].keys_info().revision).await.unwrap();
    for map in &maps {
        map.wait_for(DEADLINE, |m| m.revision() == rev)
            .await
            .unwrap();
        assert_eq!(*map.snapshot(), redis);
    }
    for map in &maps {
        map.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_if_not_exists_race_has_exactly_one_winner() {
    let env = env().await;
    let name = unique_name("race");
    let map = join(&env.client, &name).await;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let map = map.clone();
        tasks.push(tokio::spawn(async move {
            map.set_if_not_exists("claim", &format!("t{i}"))
                .await
                .unwrap()
        }));
    }
    let mut winners = 0;
    for t in tasks {
        if t.await.unwrap() {
            winners += 1;
        }
    }
    assert_eq!(winners, 1);
    converged(&env.client, &map).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_set_and_wait_all_return_seeing_their_own_write() {
    let env = env().await;
    let name = unique_name("waiters");
    let map = join(&env.client, &name).await;
    let mut tasks = Vec::new();
    for i in 0..64 {
        let map = map.clone();
        tasks.push(tokio::spawn(async move {
            let key = format!("w{i}");
            map.set_and_wait(&key, "mine").await.unwrap();
            // Nobody else writes this key: the write must be visible locally.
            assert_eq!(map.get(&key).as_deref(), Some("mine"));
        }));
    }
    tokio::time::timeout(DEADLINE, async {
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await
    .expect("every set_and_wait returned");
    assert_eq!(map.len(), 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_while_writes_are_in_flight_converges() {
    let env = env().await;
    let name = unique_name("late");
    let writer = join(&env.client, &name).await;
    let stop = Arc::new(AtomicBool::new(false));
    let task = {
        let (writer, stop) = (writer.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                writer
                    .set(&format!("k{}", i % 500), &i.to_string())
                    .await
                    .unwrap();
                i += 1;
            }
            i
        })
    };
    // Joins happen while the writer runs.
    let mut late = Vec::new();
    for _ in 0..4 {
        let client = flotilla_testkit::client(&env.server.url()).await.unwrap();
        let map = join(&client, &name).await;
        let events = map.subscribe();
        late.push((map, events));
        tokio::time::sleep(Duration::from_millis(50)).await; // spread the joins over the write phase
    }
    stop.store(true, Ordering::Relaxed);
    let written = task.await.unwrap();
    assert!(written > 100, "{written}");
    for (map, events) in &mut late {
        converged(&env.client, map).await;
        let event = tokio::time::timeout(DEADLINE, events.next())
            .await
            .unwrap()
            .unwrap();
        assert!(
            matches!(event.kind, MapEventKind::Set | MapEventKind::Resynced),
            "{event:?}"
        );
    }
}

async fn restart_under_a_joined_map(aof: bool) {
    let mut server = RedisServer::start_with(ServerOptions::default().aof(aof)).unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = unique_name(if aof { "restart-aof" } else { "restart-mem" });
    let a = join(&client, &name).await;
    let other = flotilla_testkit::client(&server.url()).await.unwrap();
    let b = join(&other, &name).await;
    for i in 0..20 {
        a.set(&format!("k{i}"), "before").await.unwrap();
    }
    b.wait_for(DEADLINE, |m| m.len() == 20).await.unwrap();
    let mut events = b.subscribe();

    server.restart().unwrap();

    // Writes work again once the client has reconnected.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        match a.set("after", "1").await {
            Ok(_) => break,
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::debug!(%e, "waiting for Redis");
                tokio::time::sleep(Duration::from_millis(50)).await; // retry pace while Redis restarts
            }
            Err(e) => panic!("writes did not come back: {e}"),
        }
    }
    a.set_and_wait("after2", "2").await.unwrap();
    assert_eq!(a.get("after2").as_deref(), Some("2"));
    converged(&client, &a).await;
    converged(&client, &b).await;
    if aof {
        assert_eq!(b.len(), 22);
    } else {
        // Without persistence the old content is gone and replicas follow.
        assert_eq!(b.len(), 2);
    }
    // b resynced after its subscriber reconnected.
    tokio::time::timeout(DEADLINE, async {
        while let Some(e) = events.next().await {
            if e.kind == MapEventKind::Resynced {
                break;
            }
        }
    })
    .await
    .expect("a Resynced event");
    a.close().await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_with_aof_resyncs() {
    restart_under_a_joined_map(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_without_persistence_resyncs() {
    restart_under_a_joined_map(false).await;
}

#[tokio::test]
async fn resync_reloads_changes_made_behind_the_maps_back() {
    let env = env().await;
    let map = Map::join(
        &env.client,
        &unique_name("manual"),
        MapOptions::default().revision_check(None),
    )
    .await
    .unwrap();
    map.set("k", "v").await.unwrap();
    // An out-of-band change (no publish) is invisible until a resync.
    let _: () = env
        .client
        .hset(&map.keys_info().hash, ("x", "y"))
        .await
        .unwrap();
    map.resync().await.unwrap();
    assert_eq!(map.get("x").as_deref(), Some("y"));
    assert_eq!(map.get("k").as_deref(), Some("v"));
}

#[tokio::test]
async fn revision_check_heals_an_expired_map() {
    let env = env().await;
    let map = Map::join(
        &env.client,
        &unique_name("check"),
        MapOptions::default().revision_check(Some(Duration::from_millis(100))),
    )
    .await
    .unwrap();
    map.set_and_wait("k", "v").await.unwrap();
    // Keys vanish without a message (as on expiry).
    let _: () = env
        .client
        .del(vec![
            map.keys_info().hash.clone(),
            map.keys_info().revision.clone(),
        ])
        .await
        .unwrap();
    map.wait_for(DEADLINE, |m| m.is_empty()).await.unwrap();
}

/// Redis went back in time under a live replica (what a restart from an
/// older snapshot looks like to the data, here without dropping the
/// connection, so the replica cannot resync first): the revision counter is
/// below the replica's. A `set_and_wait` must still return only once the
/// replica shows the write, never at once on the stale revision.
#[tokio::test]
async fn rollback_of_the_revision_never_lets_set_and_wait_return_early() {
    let env = env().await;
    let name = unique_name("rollback-rev");
    let a = join(&env.client, &name).await;
    a.set_and_wait("k", "old").await.unwrap();
    let keys = a.keys_info().clone();
    let old_rev: String = env.client.get(&keys.revision).await.unwrap();
    for i in 0..5 {
        a.set_and_wait("k", &format!("lost-{i}")).await.unwrap();
    }
    // The rollback: content and revision as they were after "old".
    let _: () = env.client.hset(&keys.hash, ("k", "old")).await.unwrap();
    let _: () = env
        .client
        .set(&keys.revision, old_rev, None, None, false)
        .await
        .unwrap();
    for i in 0..5 {
        let value = format!("after-{i}");
        a.set_and_wait("k", &value).await.unwrap();
        assert_eq!(a.get("k").as_deref(), Some(value.as_str()), "write {i}");
    }
    converged(&env.client, &a).await;
}

/// A real rollback (the server killed and started again from an older
/// snapshot) under two replicas: every `set_and_wait` returns with the
/// writer's replica showing the write, and both replicas converge.
#[tokio::test]
async fn rollback_restart_keeps_set_and_wait_honest() {
    let mut server = RedisServer::start_with(ServerOptions::default().aof(true))
        .expect("redis-server must be installed (apt-get install redis-server)");
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = unique_name("rollback-restart");
    let a = join(&client, &name).await;
    let b = join(&client, &name).await;
    a.set_and_wait("k", "old").await.unwrap();
    let snapshot = server.save_snapshot().unwrap();
    for i in 0..20 {
        a.set_and_wait(&format!("k{i}"), "lost").await.unwrap();
    }
    server.roll_back(&snapshot).unwrap();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut written = 0;
    while written < 20 {
        let value = format!("after-{written}");
        match a.set_and_wait("k", &value).await {
            Ok(_) => {
                assert_eq!(a.get("k").as_deref(), Some(value.as_str()));
                written += 1;
            }
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::debug!(error = %e, "redis not back yet");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("no write after the rollback: {e}"),
        }
    }
    converged(&client, &a).await;
    converged(&client, &b).await;
}

/// Redis lost the map (a `FLUSHALL`) without going back in time: the next
/// write starts a new revision sequence, and every replica that held a
/// revision is told so as soon as that write's message arrives, before
/// any resync. A map's very first write is no restart.
#[tokio::test]
async fn a_write_after_the_map_vanished_tells_every_replica_its_sequence_restarted() {
    let env = env().await;
    let name = unique_name("sequence-restart");
    // No periodic revision check: only the message can tell.
    let options = || MapOptions::default().revision_check(None);
    let a = Map::join(&env.client, &name, options()).await.unwrap();
    let b = Map::join(&env.client, &name, options()).await.unwrap();
    let mut a_restarts = a.sequence_restarts();
    let mut b_restarts = b.sequence_restarts();
    a.set_and_wait("k", "v").await.unwrap();
    b.wait_for(DEADLINE, |m| m.get("k").as_deref() == Some("v"))
        .await
        .unwrap();
    assert!(
        !b_restarts.has_changed().unwrap() && !a_restarts.has_changed().unwrap(),
        "the map's first write counted as a restarted sequence"
    );
    let _: () = env.client.flushall(false).await.unwrap();
    a.set("after", "loss").await.unwrap();
    for (who, restarts) in [
        ("the writer", &mut a_restarts),
        ("the other replica", &mut b_restarts),
    ] {
        tokio::time::timeout(DEADLINE, restarts.changed())
            .await
            .unwrap_or_else(|_| panic!("{who} was not told the sequence restarted"))
            .unwrap();
    }
    converged(&env.client, &b).await;
    assert_eq!(b.get("k"), None, "the replica kept what Redis lost");
}
