//! Every operation of a map, with both outcomes of the conditional ones.

mod support;

use std::time::Duration;

use flotilla_rmap::{Error, Map, MapEventKind, MapOptions, MapTtl};
use flotilla_testkit::unique_name;
use fred::prelude::*;
use futures::StreamExt;
use support::{DEADLINE, converged, env, join};

#[tokio::test]
async fn set_get_delete_and_conditionals() {
    let env = env().await;
    let name = unique_name("ops");
    let a = join(&env.client, &name).await;
    let b = join(&env.client, &name).await;
    assert!(a.is_empty());
    assert_eq!(a.name(), name);

    assert_eq!(a.set("k", "1").await.unwrap(), None);
    assert_eq!(
        a.set_and_wait("k", "2").await.unwrap().as_deref(),
        Some("1")
    );
    assert_eq!(a.get("k").as_deref(), Some("2"));
    b.wait_for(DEADLINE, |m| m.get("k").as_deref() == Some("2"))
        .await
        .unwrap();
    assert!(b.contains_key("k"));
    assert_eq!(b.len(), 1);
    assert_eq!(b.keys(), vec!["k".to_string()]);

    // set_if_not_exists: both outcomes.
    assert!(!a.set_if_not_exists("k", "x").await.unwrap());
    assert!(a.set_if_not_exists("n", "x").await.unwrap());
    // test_and_set: both outcomes.
    assert!(!a.test_and_set("k", "nope", "3").await.unwrap());
    assert!(!a.test_and_set("missing", "", "3").await.unwrap());
    assert!(a.test_and_set("k", "2", "3").await.unwrap());
    // test_and_delete: both outcomes.
    assert!(!a.test_and_delete("k", "2").await.unwrap());
    assert!(a.test_and_delete("k", "3").await.unwrap());
    assert!(!a.test_and_delete("k", "3").await.unwrap());
    // delete: both outcomes.
    assert_eq!(a.delete("n").await.unwrap().as_deref(), Some("x"));
    assert_eq!(a.delete("n").await.unwrap(), None);

    // inc
    assert_eq!(a.inc("c", 5).await.unwrap(), 5);
    assert_eq!(a.inc("c", -7).await.unwrap(), -2);
    assert_eq!(a.inc("big", i64::MAX - 1).await.unwrap(), i64::MAX - 1);
    assert!(matches!(
        a.inc("big", 2).await,
        Err(Error::Malformed { .. })
    ));
    a.set("text", "hello").await.unwrap();
    assert!(matches!(
        a.inc("text", 1).await,
        Err(Error::Malformed { .. })
    ));

    converged(&env.client, &a).await;
    converged(&env.client, &b).await;
    assert_eq!(b.get("c").as_deref(), Some("-2"));
    let revision = a.revision();
    assert!(revision >= 10, "revision {revision}");

    // reset
    a.reset().await.unwrap();
    b.wait_for(DEADLINE, |m| m.is_empty()).await.unwrap();
    converged(&env.client, &a).await;
    a.close().await;
    b.close().await;
}

#[tokio::test]
async fn list_values() {
    let env = env().await;
    let name = unique_name("lists");
    let a = join(&env.client, &name).await;
    let b = join(&env.client, &name).await;

    assert_eq!(a.append_values("l", &["x", "y"]).await.unwrap(), ["x", "y"]);
    assert_eq!(
        a.append_values("l", &["x", "a/b", "ü \"q\""])
            .await
            .unwrap(),
        ["x", "y", "x", "a/b", "ü \"q\""]
    );
    assert_eq!(
        a.append_unique_values("l", &["y", "z", "z"]).await.unwrap(),
        ["x", "y", "x", "a/b", "ü \"q\"", "z"]
    );
    assert_eq!(
        a.remove_values("l", &["x", "nope"]).await.unwrap(),
        ["y", "a/b", "ü \"q\"", "z"]
    );
    b.wait_for(DEADLINE, |m| {
        m.get_values("l").is_some_and(|l| l.len() == 4)
    })
    .await
    .unwrap();
    assert_eq!(b.get_values("l").unwrap(), ["y", "a/b", "ü \"q\"", "z"]);
    // Stored as a JSON array, readable in redis-cli.
    let raw: String = env.client.hget(&a.keys_info().hash, "l").await.unwrap();
    let parsed: Vec<String> = serde_json::from_str(&raw).unwrap();
    assert_eq!(parsed.len(), 4);

    // Removing everything deletes the key.
    assert!(
        a.remove_values("l", &["y", "a/b", "ü \"q\"", "z"])
            .await
            .unwrap()
            .is_empty()
    );
    assert!(a.remove_values("l", &["y"]).await.unwrap().is_empty());
    b.wait_for(DEADLINE, |m| !m.contains_key("l"))
        .await
        .unwrap();
    // Appending nothing to a missing key changes nothing.
    assert!(a.append_values("l", &[]).await.unwrap().is_empty());
    assert!(!a.contains_key("l"));

    // A value that is not a list is refused, not clobbered.
    a.set("s", "plain").await.unwrap();
    assert!(matches!(
        a.append_values("s", &["v"]).await,
        Err(Error::Malformed { .. })
    ));
    assert!(matches!(
        a.remove_values("s", &["v"]).await,
        Err(Error::Malformed { .. })
    ));
    assert_eq!(a.get_values("s"), None);
    converged(&env.client, &b).await;
}

/// The next event, within `DEADLINE`.
async fn next_event(events: &mut flotilla_rmap::MapEvents) -> flotilla_rmap::MapEvent {
    tokio::time::timeout(DEADLINE, events.next())
        .await
        .expect("no event before the deadline")
        .expect("event stream ended")
}

/// Reads events until `Resynced` (deadline `DEADLINE`), returning those
/// before it.
async fn events_until_resynced(
    events: &mut flotilla_rmap::MapEvents,
) -> Vec<(MapEventKind, Option<String>)> {
    let mut before = Vec::new();
    loop {
        let e = tokio::time::timeout(DEADLINE, events.next())
            .await
            .expect("no Resynced event before the deadline")
            .expect("event stream ended");
        if e.kind == MapEventKind::Resynced {
            return before;
        }
        before.push((e.kind, e.key));
    }
}

#[tokio::test]
async fn subscribers_see_events_and_close_ends_everything() {
    let env = env().await;
    let name = unique_name("events");
    let a = join(&env.client, &name).await;
    let mut events = a.subscribe();
    let expected = vec![
        (MapEventKind::Set, Some("k".to_string())),
        (MapEventKind::Delete, Some("k".to_string())),
        (MapEventKind::Reset, None),
    ];

    // Writes that nobody resyncs over: each is delivered, in revision order.
    a.set("k", "v").await.unwrap();
    a.delete("k").await.unwrap();
    a.reset().await.unwrap();
    let mut kinds = Vec::new();
    for _ in 0..3 {
        let e = tokio::time::timeout(DEADLINE, events.next())
            .await
            .unwrap()
            .unwrap();
        kinds.push((e.kind, e.key));
    }
    assert_eq!(kinds, expected);
    // A resync gives exactly one Resynced.
    a.resync().await.unwrap();
    assert_eq!(events_until_resynced(&mut events).await, vec![]);

    // Writes followed at once by a resync (the contract in the README): each
    // write's event comes in revision order, or the write is covered by the
    // Resynced that follows; the resync gives exactly one Resynced, and
    // nothing covered by it comes later.
    for round in 0..20 {
        a.set("k", "v").await.unwrap();
        a.delete("k").await.unwrap();
        a.reset().await.unwrap();
        a.resync().await.unwrap();
        let before = events_until_resynced(&mut events).await;
        let mut rest = expected.iter();
        assert!(
            before.iter().all(|e| rest.any(|x| x == e)),
            "round {round}: {before:?} is not an ordered part of {expected:?}"
        );
        // The next event is the next write's, not a late one or a second
        // Resynced.
        let marker = format!("after-{round}");
        a.set(&marker, "v").await.unwrap();
        let e = next_event(&mut events).await;
        assert_eq!(
            (e.kind, e.key),
            (MapEventKind::Set, Some(marker.clone())),
            "round {round}"
        );
        a.delete(&marker).await.unwrap();
        let e = next_event(&mut events).await;
        assert_eq!(
            (e.kind, e.key),
            (MapEventKind::Delete, Some(marker)),
            "round {round}"
        );
    }

    // A slow subscriber is never waited for: it gets one coalesced Resynced.
    let slow = Map::join(&env.client, &name, MapOptions::default().event_buffer(4))
        .await
        .unwrap();
    let mut slow_events = slow.subscribe();
    for i in 0..50 {
        slow.set(&format!("k{i}"), "v").await.unwrap();
    }
    slow.wait_for(DEADLINE, |m| m.len() == 50).await.unwrap();
    let mut got = Vec::new();
    while let Ok(Some(e)) =
        tokio::time::timeout(Duration::from_millis(200), slow_events.next()).await
    {
        got.push(e.kind);
    }
    assert_eq!(got.len(), 5, "{got:?}");
    assert_eq!(got.last(), Some(&MapEventKind::Resynced));

    a.close().await;
    a.close().await; // idempotent
    assert!(matches!(a.set("k", "v").await, Err(Error::Closed)));
    assert!(matches!(a.resync().await, Err(Error::Closed)));
    assert!(matches!(
        a.wait_for(DEADLINE, |_| false).await,
        Err(Error::Closed)
    ));
    // The stream ends (after whatever was still buffered).
    tokio::time::timeout(DEADLINE, async { while events.next().await.is_some() {} })
        .await
        .unwrap();
    slow.close().await;
}

#[tokio::test]
async fn destroy_removes_keys_and_replicas_see_a_reset() {
    let env = env().await;
    let name = unique_name("destroy");
    let a = join(&env.client, &name).await;
    let b = join(&env.client, &name).await;
    a.set("k", "v").await.unwrap();
    b.wait_for(DEADLINE, |m| m.len() == 1).await.unwrap();
    a.destroy().await.unwrap();
    b.wait_for(DEADLINE, |m| m.is_empty()).await.unwrap();
    let exists: u64 = env
        .client
        .exists(vec![
            a.keys_info().hash.clone(),
            a.keys_info().revision.clone(),
        ])
        .await
        .unwrap();
    assert_eq!(exists, 0);
    assert!(matches!(a.set("k", "v").await, Err(Error::Closed)));
    // The survivor still works (the revision starts again; it resyncs).
    b.set_and_wait("again", "1").await.unwrap();
    assert_eq!(b.get("again").as_deref(), Some("1"));
    b.close().await;
}

#[tokio::test]
async fn wait_for_times_out() {
    let env = env().await;
    let a = join(&env.client, &unique_name("timeout")).await;
    let r = a
        .wait_for(Duration::from_millis(100), |m| m.contains_key("never"))
        .await;
    assert!(matches!(r, Err(Error::Timeout(_))));
    a.close().await;
}

#[tokio::test]
async fn ttl_options_are_applied() {
    let env = env().await;
    let abs = Map::join(
        &env.client,
        &unique_name("ttl-abs"),
        MapOptions::default().ttl(MapTtl::Absolute(Duration::from_secs(100))),
    )
    .await
    .unwrap();
    abs.set("k", "v").await.unwrap();
    let keys = abs.keys_info().clone();
    let pttl = |key: String| {
        let client = env.client.clone();
        async move { client.pttl::<i64, _>(key).await.unwrap() }
    };
    let first = pttl(keys.hash.clone()).await;
    assert!(first > 90_000 && first <= 100_000, "{first}");
    assert!(pttl(keys.revision.clone()).await > 90_000);
    // An absolute TTL is not extended by later writes.
    let _: () = env.client.pexpire(&keys.hash, 50_000, None).await.unwrap();
    abs.set("k2", "v").await.unwrap();
    let after = pttl(keys.hash.clone()).await;
    assert!(after <= 50_000, "{after}");

    let sliding = Map::join(
        &env.client,
        &unique_name("ttl-slide"),
        MapOptions::default().ttl(MapTtl::Sliding(Duration::from_secs(100))),
    )
    .await
    .unwrap();
    sliding.set("k", "v").await.unwrap();
    let keys = sliding.keys_info().clone();
    let _: () = env.client.pexpire(&keys.hash, 50_000, None).await.unwrap();
    sliding.inc("n", 1).await.unwrap();
    let after = pttl(keys.hash.clone()).await;
    assert!(after > 90_000, "sliding TTL refreshed on write: {after}");
    assert!(pttl(keys.revision.clone()).await > 90_000);

    let none = join(&env.client, &unique_name("ttl-none")).await;
    none.set("k", "v").await.unwrap();
    assert_eq!(pttl(none.keys_info().hash.clone()).await, -1);

    assert!(matches!(
        Map::join(
            &env.client,
            "x",
            MapOptions::default().ttl(MapTtl::Sliding(Duration::ZERO))
        )
        .await,
        Err(Error::InvalidOptions(_))
    ));
}

#[tokio::test]
async fn invalid_names_are_refused() {
    let env = env().await;
    for bad in ["", "a{b", "b}", "new\nline", &"x".repeat(129)] {
        let r = Map::join(&env.client, bad, MapOptions::default()).await;
        assert!(
            matches!(
                r,
                Err(Error::InvalidName {
                    what: "map name",
                    ..
                })
            ),
            "{bad:?}: {r:?}"
        );
    }
    let r = Map::join(&env.client, "ok", MapOptions::default().hash_tag("t{")).await;
    assert!(matches!(
        r,
        Err(Error::InvalidName {
            what: "hash tag",
            ..
        })
    ));
    let tagged = Map::join(&env.client, "jobs", MapOptions::default().hash_tag("pool1"))
        .await
        .unwrap();
    assert_eq!(tagged.keys_info().hash, "fl:{pool1}:map:jobs");
    tagged.close().await;
}

#[tokio::test]
async fn prelude_used_by_an_external_script_is_replicated() {
    use fred::types::scripts::Script;
    let env = env().await;
    let tag = unique_name("pool");
    let jobs = Map::join(&env.client, "jobs", MapOptions::default().hash_tag(&tag))
        .await
        .unwrap();
    let pending = Map::join(&env.client, "pending", MapOptions::default().hash_tag(&tag))
        .await
        .unwrap();
    pending.set_and_wait("job1", "deadline").await.unwrap();
    // One script changes two maps atomically, as the pool's scripts do.
    let script = Script::from_lua(flotilla_rmap::lua::with_prelude(
        "local rev = rmap_set(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2])\n\
         local deleted = rmap_del(KEYS[4], KEYS[5], KEYS[6], ARGV[1])\n\
         local again = rmap_del(KEYS[4], KEYS[5], KEYS[6], ARGV[1])\n\
         return {rev, deleted, again}",
    ));
    let (j, p) = (jobs.keys_info().clone(), pending.keys_info().clone());
    let (rev, deleted, again): (u64, u64, u64) = script
        .evalsha_with_reload(
            &env.client,
            vec![j.hash, j.revision, j.channel, p.hash, p.revision, p.channel],
            vec!["job1", "worker-7"],
        )
        .await
        .unwrap();
    assert_eq!((deleted, again), (1, 0));
    assert!(
        rev > 1_000_000_000_000_000,
        "revisions start at server time in µs: {rev}"
    );
    jobs.wait_revision(rev).await.unwrap();
    assert_eq!(jobs.get("job1").as_deref(), Some("worker-7"));
    pending
        .wait_for(DEADLINE, |m| !m.contains_key("job1"))
        .await
        .unwrap();
    converged(&env.client, &jobs).await;
    converged(&env.client, &pending).await;
}

#[tokio::test]
async fn a_batch_of_changes_is_one_revision_and_replicated() {
    use fred::types::scripts::Script;
    let env = env().await;
    let tag = unique_name("batch");
    let jobs = Map::join(&env.client, "jobs", MapOptions::default().hash_tag(&tag))
        .await
        .unwrap();
    jobs.set_and_wait("gone", "x").await.unwrap();
    let before = jobs.revision();
    // Values with the separators of the wire format in them.
    let script = Script::from_lua(flotilla_rmap::lua::with_prelude(
        "local b = rmap_batch(KEYS[1], KEYS[2], KEYS[3])\n\
         rmap_batch_set(b, 'a', 'v:1')\n\
         rmap_batch_set(b, 'b:2', '')\n\
         local deleted = rmap_batch_del(b, 'gone')\n\
         local again = rmap_batch_del(b, 'gone')\n\
         rmap_batch_set(b, 'a', '3:c')\n\
         local added = rmap_batch_set_nx(b, 'n', 'x:1')\n\
         local kept = rmap_batch_set_nx(b, 'a', 'not set')\n\
         local rev = rmap_batch_flush(b)\n\
         local empty = rmap_batch_flush(rmap_batch(KEYS[1], KEYS[2], KEYS[3]))\n\
         return {rev, deleted, again, tostring(empty), added, kept}",
    ));
    let j = jobs.keys_info().clone();
    let (rev, deleted, again, empty, added, kept): (u64, u64, u64, String, u64, u64) = script
        .evalsha_with_reload(
            &env.client,
            vec![j.hash, j.revision, j.channel],
            Vec::<String>::new(),
        )
        .await
        .unwrap();
    assert_eq!((deleted, again), (1, 0));
    assert_eq!((added, kept), (1, 0), "set_nx sets only a missing field");
    assert_eq!(rev, before + 1, "one revision for the whole batch");
    assert_eq!(empty, "false", "an empty batch publishes nothing");
    jobs.wait_revision(rev).await.unwrap();
    assert_eq!(jobs.get("a").as_deref(), Some("3:c"));
    assert_eq!(jobs.get("b:2").as_deref(), Some(""));
    assert_eq!(jobs.get("gone"), None);
    assert_eq!(jobs.get("n").as_deref(), Some("x:1"));
    converged(&env.client, &jobs).await;
}

/// A batch made while nobody subscribes to the map's channel sends no
/// message (building it is most of a batch's cost in Lua) but still moves
/// the revision; a replica that joins later reads the change from the hash,
/// and once one listens, the next batch reaches it as a message.
#[tokio::test]
async fn a_batch_nobody_listens_to_sends_no_message_but_moves_the_revision() {
    use fred::types::scripts::Script;
    let env = env().await;
    let tag = unique_name("unheard");
    let keys = flotilla_rmap::MapKeys::new("jobs", Some(&tag)).unwrap();
    let script = Script::from_lua(flotilla_rmap::lua::with_prelude(
        "local b = rmap_batch(KEYS[1], KEYS[2], KEYS[3])\n\
         rmap_batch_set(b, ARGV[1], ARGV[2])\n\
         return rmap_batch_flush(b)",
    ));
    let run = |field: &'static str, value: &'static str| {
        let keys = keys.clone();
        let script = script.clone();
        let client = env.client.clone();
        async move {
            let rev: u64 = script
                .evalsha_with_reload(
                    &client,
                    vec![keys.hash, keys.revision, keys.channel],
                    vec![field, value],
                )
                .await
                .unwrap();
            rev
        }
    };
    let spublish_calls = || async {
        let stats: String = env
            .client
            .info(Some(fred::types::InfoKind::CommandStats))
            .await
            .unwrap();
        stats
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_spublish:calls="))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let published_before = spublish_calls().await;
    let first = run("a", "1").await;
    let second = run("b", "2").await;
    assert_eq!(second, first + 1, "each batch is a revision, heard or not");
    assert_eq!(
        spublish_calls().await,
        published_before,
        "no message while nobody listens"
    );
    let jobs = Map::join(&env.client, "jobs", MapOptions::default().hash_tag(&tag))
        .await
        .unwrap();
    assert_eq!(jobs.revision(), second);
    assert_eq!(jobs.get("a").as_deref(), Some("1"));
    assert_eq!(jobs.get("b").as_deref(), Some("2"));
    let third = run("c", "3").await;
    assert_eq!(third, second + 1);
    assert!(
        spublish_calls().await > published_before,
        "a listener gets the message"
    );
    jobs.wait_revision(third).await.unwrap();
    assert_eq!(jobs.get("c").as_deref(), Some("3"));
    converged(&env.client, &jobs).await;
}

/// A large map is read whole when a replica joins, which can take longer
/// than a command timeout set for single commands: the snapshot has its own
/// deadline (`MapOptions::snapshot_timeout`). A slow read is made here by
/// pausing Redis's writers (`CLIENT PAUSE … WRITE` holds scripts that may
/// write, as the snapshot's marker does), not by size, so that the test
/// does not depend on the machine's speed.
#[tokio::test]
async fn a_slow_snapshot_joins_past_the_client_command_timeout() {
    let env = env().await;
    let name = unique_name("slow-snapshot");
    let writer = join(&env.client, &name).await;
    writer.set("k", "v").await.unwrap();
    // Clients whose commands time out after 1 s.
    let hasty = || async {
        let client = flotilla_testkit::builder(&env.server.url())
            .unwrap()
            .with_performance_config(|p| p.default_command_timeout = Duration::from_secs(1))
            .build()
            .unwrap();
        client.init().await.unwrap();
        client
    };
    let too_short = MapOptions::default().snapshot_timeout(Duration::from_secs(1));
    let client = hasty().await;
    pause_writers(&env.client, 3_000).await;
    assert!(
        Map::join(&client, &name, too_short).await.is_err(),
        "a snapshot read within 1 s while Redis holds writers for 3 s"
    );
    let client = hasty().await;
    pause_writers(&env.client, 3_000).await;
    let started = std::time::Instant::now();
    let map = Map::join(&client, &name, MapOptions::default())
        .await
        .unwrap();
    assert!(
        started.elapsed() > Duration::from_secs(1),
        "the read was held"
    );
    assert_eq!(map.get("k").as_deref(), Some("v"));
    map.close().await;
    writer.close().await;
}

/// `CLIENT PAUSE ms WRITE`.
async fn pause_writers(client: &Client, ms: u64) {
    let _: () = client
        .custom(
            fred::types::CustomCommand::new_static("CLIENT", None, false),
            vec!["PAUSE".to_string(), ms.to_string(), "WRITE".to_string()],
        )
        .await
        .unwrap();
}
