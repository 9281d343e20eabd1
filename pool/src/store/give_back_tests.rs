//! What a recovery gives back and what it stops giving back: a job
//! handed off comes back as an orphan where Redis went back to before the
//! hand-off and nothing newer happened to it (`handoff_stands.lua`), and
//! a remembered job whose run ended since, or that still waits to start,
//! is named by `handoffs_ended.lua`.

use super::*;
use fred::prelude::HashesInterface;

#[tokio::test]
async fn a_hand_off_stands_again_only_where_redis_went_back_to_before_it() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    let stored = |key: &str| codec::stored(0, &body(key));
    // Redis knows nothing of the key (an empty restart, or a job admitted
    // after the state Redis went back to): the payload comes back.
    assert_eq!(
        s.handoff_stands("h0", 50, stored("h0")).await.unwrap(),
        HandoffStands::Restored
    );
    assert!(s.payload("h0").await.unwrap().is_some());
    // A stop of the run since, made to stand by the node that asked for it,
    // takes it again, and no later give-back returns it.
    assert_eq!(s.stop_stands("h0", 60).await.unwrap(), StopStands::Removed);
    assert!(s.payload("h0").await.unwrap().is_none());
    assert_eq!(
        s.handoff_stands("h0", 50, stored("h0")).await.unwrap(),
        HandoffStands::Current
    );
    // The key's counter is older than the hand-off's token and nothing
    // else is there: the payload comes back, once.
    let older = f.admitted("h1", "w1").await;
    s.stop_stands("h1", older).await.unwrap(); // record, guard, payload gone
    let counter: u64 = f
        .store
        .client
        .hget(keys::fencing(&f.store.pool), "h1")
        .await
        .unwrap();
    assert_eq!(
        s.handoff_stands("h1", counter + 10, stored("h1"))
            .await
            .unwrap(),
        HandoffStands::Restored
    );
    assert!(s.payload("h1").await.unwrap().is_some());
    // The give-back raised the key's counter to the hand-off's token (a
    // stop of an older run must see the newer one): Redis now holds it.
    assert_eq!(
        s.handoff_stands("h1", counter + 10, stored("h1"))
            .await
            .unwrap(),
        HandoffStands::Current
    );
    // Pending (admitted again): kept.
    let admitted = f.admitted("h2", "w1").await;
    assert_eq!(
        s.handoff_stands("h2", admitted + 10, stored("h2"))
            .await
            .unwrap(),
        HandoffStands::Kept
    );
    // Redis holds the hand-off's token, or a newer one (a stop's
    // tombstone, a newer start): nothing comes back.
    let newer = f.admitted("h3", "w1").await;
    s.stop_stands("h3", newer).await.unwrap();
    for token in [newer, newer + 1] {
        assert_eq!(
            s.handoff_stands("h3", token, stored("h3")).await.unwrap(),
            HandoffStands::Current
        );
    }
    assert!(s.payload("h3").await.unwrap().is_none());
}

/// The creation time of `key`'s stored payload.
async fn created_of(s: &PoolStore, key: &str) -> u64 {
    let stored: bytes::Bytes = s.client.hget(keys::payloads(&s.pool), key).await.unwrap();
    let end = stored.iter().position(|b| *b == b' ').unwrap();
    std::str::from_utf8(&stored[..end])
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn a_hand_off_ended_only_once_its_key_is_gone_at_or_past_its_token() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    // Pending (admitted, the hand-off's run not started): not ended.
    let pending = f.admitted("e1", "w1").await;
    // Stopped at the hand-off's token: ended; a hand-off of a newer token
    // than Redis holds (Redis went back to before it): not ended.
    let stopped = f.admitted("e2", "w1").await;
    s.stop_stands("e2", stopped).await.unwrap();
    let counter: u64 = s.client.hget(keys::fencing(&s.pool), "e2").await.unwrap();
    // Given back as an orphan (a payload, no record): not ended.
    s.handoff_stands("e3", 7, codec::stored(0, &body("e3")))
        .await
        .unwrap();
    // Started by its new owner (a record): neither ended nor waiting.
    let stored = codec::stored(0, &body("e4"));
    s.reassert("e4", "w1", 9, stored, Reassert::Running, TTL)
        .await
        .unwrap();
    let asked = [
        ("e1".to_string(), pending, 0),
        ("e2".to_string(), stopped, 0),
        ("e2".to_string(), counter + 1, 0),
        ("e3".to_string(), 7, 0),
        ("unknown".to_string(), 1, 0), // no counter: Redis forgot the key
        ("e4".to_string(), 9, 0),
    ];
    let answer = s.handoffs_ended(&asked).await.unwrap();
    assert_eq!(answer.ended, [(1, counter)]);
    // Redis alone holds these, started nowhere yet: the worker keeps
    // remembering them.
    // (The fixture's admissions and `codec::stored(0, …)` both store a
    // creation time of 0.)
    assert_eq!(answer.waiting, [(0, created_of(s, "e1").await), (3, 0)]);
    let answer = s.handoffs_ended(&[]).await.unwrap();
    assert!(answer.ended.is_empty() && answer.waiting.is_empty() && answer.passed.is_empty());
}

/// After an empty restart, the payload a hand-off of an older run gives
/// back must not stand in for a newer run of the key: a worker that ran
/// the key again since (a newer dispatch, a newer token) and suspended it
/// on a lease loss re-asserts it with its own payload, and the old run's
/// stop, made to stand after that, leaves it. Whichever order the nodes'
/// recoveries take (found by the chaos run's cut-with-empty-restart fault:
/// the newer run's only payload went with the old stop).
#[tokio::test]
async fn an_older_run_given_back_does_not_stand_in_for_a_newer_one() {
    let f = &fixture().await;
    let s = &f.store;
    let (handed_off, newer) = (5_000_000, 6_000_000);
    let old = codec::stored(1_000, &body("old"));
    let new = codec::stored(5_500, &body("new"));
    let suspended = Reassert::Suspended;
    // An empty restart: the first script opens the recovery window.
    let _: () = s.client.flushall(false).await.unwrap();
    // The hand-off's node first, then the worker of the newer run.
    assert_eq!(
        s.handoff_stands("a", handed_off, old.clone())
            .await
            .unwrap(),
        HandoffStands::Restored
    );
    assert_eq!(
        s.reassert("a", "w2", newer, new.clone(), suspended, TTL)
            .await
            .unwrap(),
        Reasserted::Orphaned
    );
    assert_eq!(
        s.stop_stands("a", handed_off).await.unwrap(),
        StopStands::None
    );
    assert_eq!(
        s.payload("a").await.unwrap(),
        Some(new.clone()),
        "the newer run's payload"
    );
    // The worker of the newer run first.
    assert_eq!(
        s.reassert("b", "w2", newer, new.clone(), suspended, TTL)
            .await
            .unwrap(),
        Reasserted::Orphaned
    );
    assert_eq!(
        s.handoff_stands("b", handed_off, old).await.unwrap(),
        HandoffStands::Current,
        "the newer run's token is the key's counter"
    );
    assert_eq!(
        s.stop_stands("b", handed_off).await.unwrap(),
        StopStands::None
    );
    assert_eq!(s.payload("b").await.unwrap(), Some(new));
}

#[tokio::test]
async fn a_hand_off_given_back_replaces_an_older_admissions_orphan_payload() {
    let f = &fixture().await;
    let s = &f.store;
    let (stopped, handed_off) = (2_000_000, 6_000_000);
    let old = codec::stored(1_000, &body("old"));
    let new = codec::stored(5_500, &body("new"));
    // The older state Redis went back to: an orphan of an admission whose
    // run was stopped since (its payload, no record, no guard).
    let _: () = s
        .client
        .hset(s.maps.payloads_key(), ("k", old.clone()))
        .await
        .unwrap();
    assert_eq!(
        s.handoff_stands("k", handed_off, new.clone())
            .await
            .unwrap(),
        HandoffStands::Restored
    );
    assert_eq!(s.payload("k").await.unwrap(), Some(new.clone()));
    // The older run's stop, made to stand, then leaves the handed-off job.
    s.stop_stands("k", stopped).await.unwrap();
    assert_eq!(s.payload("k").await.unwrap(), Some(new.clone()));
    // A payload of the same admission or a newer one is kept.
    assert_eq!(
        s.handoff_stands("k", handed_off + 1, old).await.unwrap(),
        HandoffStands::Kept
    );
    assert_eq!(s.payload("k").await.unwrap(), Some(new));
}
