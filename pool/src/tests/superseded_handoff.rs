//! A hand-off made on a primary that stalled through its failover (its
//! writes lost when a Sentinel demotes it) leaves the promoted side with
//! the record of the run before it, naming the worker that passed the job
//! on. That worker's reconcile releases the record as stale; the payload
//! must stay, the job's only copy there, for the orphan sweep (or the new
//! owner's re-assertion). The hand-off's token came from the stalled
//! primary, so the promoted side's fencing counter does not show it, and
//! the release took the payload too: chaos soak seed 1556 (`--sentinel`
//! with Redis's defaults) had six jobs run nowhere that way.
//!
//! The stalled primary also shows the ends of such jobs under its own
//! tokens (a stop's tombstone from its clock). A worker that passed the job
//! on must not keep that end and make it stand on the promoted side: there
//! it outranked the run the promoted side had moved the job to, took its
//! record, and a new dispatch started the key beside that run (the same
//! soak: an `I1 overlap`).

use std::collections::HashMap;

use flotilla_testkit::Sentinels;
use fred::types::Value;

use super::*;

/// A node (mirroring: the tests name the jobs hash through the replica)
/// whose first worker passed some of 24 jobs to a second one; those two
/// workers, the jobs' tokens before, and a key passed on.
async fn passed_on(
    client: &fred::prelude::Client,
    name: &str,
    ttl: Duration,
) -> (Node, Worker, Worker, HashMap<String, u64>, String) {
    let options = NodeOptions::default().mirror_jobs(true).worker_ttl(ttl);
    let node = Node::join(client, name, options).await.unwrap();
    let w1 = Worker::new(&node, Counting::default()).await.unwrap();
    let keys: Vec<String> = (0..24).map(|i| format!("p{i}")).collect();
    for key in &keys {
        node.dispatch_job(key, &b"p"[..]).await.unwrap();
    }
    let before: HashMap<String, u64> = keys
        .iter()
        .map(|k| (k.clone(), w1.job_token(k).unwrap()))
        .collect();

    // A second worker joins and w1 passes it the keys it now owns.
    let w2 = Worker::new(&node, Counting::default()).await.unwrap();
    wait_until(
        Duration::from_secs(10),
        "the keys placed on w2 run there",
        || {
            let moved = keys
                .iter()
                .filter(|k| node.placement(k).as_deref() == Some(w2.id()))
                .all(|k| w2.job_token(k).is_some() && w1.job_token(k).is_none());
            let some = keys.iter().any(|k| w2.job_token(k).is_some());
            async move { moved && some }
        },
    )
    .await
    .unwrap();
    let passed = keys
        .iter()
        .find(|k| w2.job_token(k).is_some())
        .unwrap()
        .clone();
    (node, w1, w2, before, passed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_from_before_a_hand_off_goes_without_the_payload() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("superseded-handoff");
    let (node, w1, _w2, before, passed) = passed_on(&client, &name, Duration::from_secs(3)).await;

    // Redis goes back to before the hand-off, as the promoted side of a
    // failover through which the hand-off's primary stalled: the record
    // names w1 with its old token, and so does the counter.
    let store = &node.inner.store;
    let old = before[passed.as_str()];
    let jobs_hash = store.maps.jobs_map().keys_info().hash.clone();
    let _: i64 = client
        .hset(&jobs_hash, (passed.as_str(), format!("{} {old}", w1.id())))
        .await
        .unwrap();
    let _: i64 = client
        .hset(
            crate::keys::fencing(&node.inner.pool),
            (passed.as_str(), old.to_string()),
        )
        .await
        .unwrap();

    node.inner.reconcile(&w1.inner).await.unwrap();
    let record: Value = client.hget(&jobs_hash, passed.as_str()).await.unwrap();
    assert!(record.is_null(), "w1's stale record released: {record:?}");
    let payload: Value = client
        .hget(store.maps.payloads_key(), passed.as_str())
        .await
        .unwrap();
    assert!(
        !payload.is_null(),
        "{passed}, passed on to w2 since, lost its payload with w1's stale record"
    );
    node.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ends_a_superseded_primary_shows_of_jobs_passed_on_are_not_kept() {
    let ha = Sentinels::start().unwrap();
    let client = flotilla_testkit::client(&ha.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("superseded-ends");
    // A long TTL: no renewal judges the server before the test does.
    let (node, w1, _w2, _, passed) = passed_on(&client, &name, Duration::from_secs(30)).await;
    let old = ha.primary_port().unwrap();
    let pid = ha.server_pid(old).unwrap();
    assert_eq!(
        node.inner.commands_server().map(|s| s.port),
        Some(old),
        "the node's commands go to the primary"
    );

    // The primary stalls through its failover, and wakes to the clients
    // still connected to it.
    signal("STOP", pid);
    let promoted =
        tokio::task::block_in_place(|| ha.wait_for_failover(old, Duration::from_secs(20)));
    signal("CONT", pid);
    promoted.unwrap();
    // There, the run passed on ends: a stop carried out on the woken
    // primary leaves no record or payload and a tombstone from its clock.
    let woken = flotilla_testkit::client(&format!("redis://127.0.0.1:{old}"))
        .await
        .unwrap();
    let store = &node.inner.store;
    let jobs_hash = store.maps.jobs_map().keys_info().hash.clone();
    let _: i64 = woken.hdel(&jobs_hash, passed.as_str()).await.unwrap();
    let _: i64 = woken
        .hdel(store.maps.payloads_key(), passed.as_str())
        .await
        .unwrap();
    // A token from the woken primary's clock, past any the promoted side
    // issued for the key.
    let tombstone = store.server_time_ms().await.unwrap() * 1000 + 10_000_000;
    let _: i64 = woken
        .hset(
            crate::keys::fencing(&node.inner.pool),
            (passed.as_str(), tombstone.to_string()),
        )
        .await
        .unwrap();
    assert_eq!(
        node.inner.commands_server().map(|s| s.port),
        Some(old),
        "the node's commands still go to the woken primary"
    );

    node.inner.settle_handoffs(&w1.inner).await.unwrap();
    let ended = w1.inner.handed_off.ended();
    assert!(
        ended.is_empty(),
        "w1 keeps ends the superseded primary showed, to make them stand on the promoted side: {ended:?}"
    );
    node.close().await.unwrap();
}
