//! The routing scripts' statuses: hand-offs, entry moves and their
//! refusals, against a real Redis through [`PoolStore`] alone.

use super::*;

#[tokio::test]
async fn routing_scripts_answer_each_status() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    f.register("w2").await;
    let route = |key: &'static str, owner: &'static str, event: &'static str| async move {
        s.to_owner(key, owner, &f.inbox(owner), event, body(key), TTL)
            .await
            .unwrap()
    };
    f.admitted("j1", "w1").await;
    assert_eq!(route("j1", "-", "notify").await, Routed::Pending);
    let t1 = {
        let ids = f.entry_ids("w1").await;
        let token = match s.job_records("j1").await.unwrap().2 {
            Some(guard) => records::pending_guard(&guard).unwrap().0,
            None => panic!("no guard"),
        };
        let start = f.start("j1", token, "w1", &ids[0]);
        assert_eq!(s.claim_start(&start, TTL, TTL).await.unwrap(), Claimed::Ok);
        token
    };
    assert_eq!(
        route("j1", "w2", "notify").await,
        Routed::Moved("w1".into())
    );
    assert_eq!(route("j1", "w1", "notify").await, Routed::Queued);
    assert!(matches!(
        route("nope", "-", "stop").await,
        Routed::NotFound(Some(_))
    ));
    // A stop answered "not found" is a tombstone: a copy of the key held
    // by a worker cut off while Redis lost its record cannot re-assert
    // over it later (the stop would be undone). A notify leaves none.
    let stored = |key| codec::stored(0, &body(key));
    assert_eq!(
        s.reassert("nope", "w1", 100, stored("nope"), Reassert::Running, TTL)
            .await
            .unwrap(),
        Reasserted::Lost
    );
    assert_eq!(route("nope2", "-", "notify").await, Routed::NotFound(None));
    assert_eq!(
        s.reassert("nope2", "w1", 100, stored("nope2"), Reassert::Running, TTL)
            .await
            .unwrap(),
        Reasserted::Ok
    );

    let hand = |from: &'static str, to: &'static str| f.handoff("j1", from, to, None);
    assert_eq!(hand("w2", "w2").await, Handoff::NotOwner);
    assert_eq!(hand("w1", "w-gone").await, Handoff::NoTarget);
    let Handoff::Ok { token: t2 } = hand("w1", "w2").await else {
        panic!("not handed off");
    };
    assert!(t2 > t1, "a new token");

    // A stop at w2 for the run with token `target`, w2 holding (`held`) a
    // run with token `kept` it leaves going on (both `None`: not known /
    // none).
    let stop_at = |key: &'static str, held: Option<u64>, target: Option<u64>, kept: Option<u64>| async move {
        s.stopped(StopDone {
            key,
            worker: "w2",
            inbox: &f.inbox("w2"),
            entry_id: "1-1",
            reply: None,
            held,
            held_past_lease: false,
            dispatch: None,
            worker_ttl: TTL,
            target,
            kept,
        })
        .await
        .unwrap()
    };
    let stop_run = |key: &'static str, target: Option<u64>, kept: Option<u64>| {
        stop_at(key, Some(t2), target, kept)
    };
    let stop = |key: &'static str| stop_run(key, None, None);
    assert_eq!(stop("j1").await, Stopped::Retry, "pending at w2");
    // An older run re-asserted while the hand-off waits gives way to it,
    // and says the newer start has not happened yet (changing nothing).
    assert_eq!(
        s.reassert("j1", "w1", t2 - 1, stored("j1"), Reassert::Suspended, TTL)
            .await
            .unwrap(),
        Reasserted::Pending
    );
    let entry = f.entry_ids("w2").await.pop().unwrap();
    let start = f.start("j1", t2, "w2", &entry);
    assert_eq!(s.claim_start(&start, TTL, TTL).await.unwrap(), Claimed::Ok);
    // A stop sent for an older run of the key leaves the newer one.
    let stale = stop_run("j1", Some(t2 - 1), None).await;
    assert_eq!(stale, Stopped::Retry, "stop for an older run");
    // (The `Ok` below shows the record was kept both times.)
    // The record names the run the stop was sent for, but the worker runs a
    // newer one (Redis went back in time to before its start): the worker
    // leaves it, and the record stays for the newer run's re-assertion.
    let behind = stop_run("j1", Some(t2), Some(t2 + 7)).await;
    assert_eq!(behind, Stopped::Retry, "the worker runs a newer run");
    assert_eq!(stop("j1").await, Stopped::Ok);
    // Again, at a worker that no longer holds it: `Retry`, without a
    // tombstone (the request may be an old one, answered long ago).
    assert_eq!(stop_at("j1", None, None, None).await, Stopped::Retry);
    // The dispatcher, if it still waits, routes it again: "not found",
    // and a tombstone: no older copy re-asserts over it.
    assert!(matches!(
        route("j1", "-", "stop").await,
        Routed::NotFound(Some(_))
    ));
    assert_eq!(
        s.reassert("j1", "w1", t2, stored("j1"), Reassert::Running, TTL)
            .await
            .unwrap(),
        Reasserted::Lost
    );

    // A worker stopped the run it held, but Redis has no record of the key
    // (lost with its data): `Retry`, and no tombstone, which would refuse
    // a newer run of the key that Redis lost too.
    assert_eq!(
        stop_at("lost", Some(500), Some(500), None).await,
        Stopped::Retry
    );
    assert_eq!(
        s.reassert("lost", "w1", 501, stored("lost"), Reassert::Running, TTL)
            .await
            .unwrap(),
        Reasserted::Ok,
        "a newer run re-asserts"
    );

    f.orphan("o1", "w1").await;
    assert_eq!(route("o1", "-", "notify").await, Routed::Pending);
    let Routed::Stopped(tombstone) = route("o1", "-", "stop").await else {
        panic!("a stop of an orphan ends it");
    };
    let counter: u64 = s.client.hget(keys::fencing(&s.pool), "o1").await.unwrap();
    assert_eq!(tombstone, counter, "the answer names the tombstone token");
    let orphan = f.handoff("o1", "-", "w1", None).await;
    assert_eq!(orphan, Handoff::NoPayload);

    let queued = f.entry_ids("w1").await;
    let id = &queued[0];
    assert_eq!(f.move_entry(id, "w1", "w-gone").await, Moved::NoTarget);
    assert_eq!(f.move_entry(id, "w1", "w2").await, Moved::Ok);
    assert_eq!(f.move_entry(id, "w1", "w2").await, Moved::Gone);

    f.orphan("o2", "w1").await;
    f.lose_epoch().await;
    let orphan = f.handoff("o2", "-", "w1", None).await;
    assert_eq!(orphan, Handoff::Recovering);

    // While the pool recovers (Redis went back in time), a stop that finds
    // no record may have been routed by a stale record released since: the
    // run may go on elsewhere, not re-asserted yet. Not "not found".
    let stale_route = s
        .stopped(StopDone {
            key: "gone",
            worker: "w2",
            inbox: &f.inbox("w2"),
            entry_id: "1-2",
            reply: None,
            held: None,
            held_past_lease: false,
            dispatch: None,
            worker_ttl: TTL,
            target: None,
            kept: None,
        })
        .await
        .unwrap();
    assert_eq!(stale_route, Stopped::Retry, "recovering");
}

/// A request for one dispatch (`to_owner.lua` ARGV 11, its payload's
/// creation time) reaches the job only while its payload is that
/// dispatch's: a moved run of it is reached at its new owner, another
/// dispatch of the key or none is "not found" with no tombstone.
#[tokio::test]
async fn a_request_for_one_dispatch_reaches_only_that_dispatch() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    f.admitted("j1", "w1").await;
    let created = f.admission_stamp("j1").await;
    let route = |dispatch: u64| async move {
        let request = OwnerRequest {
            owner: "w1",
            owner_inbox: &f.inbox("w1"),
            event: "stop",
            dispatch: Some(dispatch),
            server_floor_ms: None,
            leader: None,
        };
        s.to_owner_of("j1", request, body("j1"), TTL).await.unwrap()
    };
    // Admitted, not started: another dispatch is not found. (A stop of
    // this one would end its unclaimed start: `dead_owner_tests`.)
    assert_eq!(route(created + 1).await, Routed::NotFound(None));
    let ids = f.entry_ids("w1").await;
    let token = match s.job_records("j1").await.unwrap().2 {
        Some(guard) => records::pending_guard(&guard).unwrap().0,
        None => panic!("no guard"),
    };
    let start = f.start("j1", token, "w1", &ids[0]);
    assert_eq!(s.claim_start(&start, TTL, TTL).await.unwrap(), Claimed::Ok);
    assert_eq!(route(created).await, Routed::Queued);
    assert_eq!(route(created - 1).await, Routed::NotFound(None));
    let request = OwnerRequest {
        owner: "w1",
        owner_inbox: &f.inbox("w1"),
        event: "stop",
        dispatch: Some(created),
        server_floor_ms: None,
        leader: None,
    };
    assert_eq!(
        s.to_owner_of("absent", request, body("absent"), TTL)
            .await
            .unwrap(),
        Routed::NotFound(None)
    );
}

/// A schedule leader's stop is routed only while the lease's lock still
/// carries the leader's token: a deposed leader's is refused, with nothing
/// done (the run keeps going, no tombstone), as its admissions are.
#[tokio::test]
async fn a_deposed_schedule_leaders_stop_is_refused() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    let token = f.running("j1", "w1").await;
    let lock = keys::lock(Some(&s.pool), &keys::schedule_lease("nightly"));
    let _: () = s.client.hset(&lock, ("token", "7")).await.unwrap();
    let route = |leader: u64| {
        let lock = lock.clone();
        async move {
            let request = OwnerRequest {
                owner: "w1",
                owner_inbox: &f.inbox("w1"),
                event: "stop",
                dispatch: None,
                server_floor_ms: None,
                leader: Some((&lock, leader)),
            };
            s.to_owner_of("j1", request, body("j1"), TTL).await.unwrap()
        }
    };
    let queued = f.entry_ids("w1").await.len();
    // Deposed (the lock carries another leader's token, or none).
    assert_eq!(route(6).await, Routed::NotLeader);
    let _: () = s.client.del(&lock).await.unwrap();
    assert_eq!(route(7).await, Routed::NotLeader);
    assert_eq!(f.entry_ids("w1").await.len(), queued, "nothing queued");
    assert_eq!(
        s.job_records("j1").await.unwrap().1.as_deref(),
        Some(format!("w1 {token}").as_str()),
        "the run's record is untouched"
    );
    // Still leading: the stop goes to the worker.
    let _: () = s.client.hset(&lock, ("token", "7")).await.unwrap();
    assert_eq!(route(7).await, Routed::Queued);
    assert_eq!(f.entry_ids("w1").await.len(), queued + 1);
}
