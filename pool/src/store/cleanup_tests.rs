//! The dead-worker cleanup while the pool recovers from a data loss or a
//! rollback (`claim_cleanup.lua`): no cleanup is claimed until every node
//! has made its stops stand.

use super::rollback_tests::current_run_id;
use super::*;

#[tokio::test]
async fn no_cleanup_is_claimed_while_the_pool_recovers() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    s.maps.keepalive.set("w1", "1000").await.unwrap(); // silent for ages
    // The older state Redis went back to may show the dead worker owning a
    // run stopped since, whose stop is not made to stand yet.
    s.begin_recovery(TTL).await.unwrap();
    let claim = s
        .claim_cleanup("w1", "n-test", TTL, u64::MAX)
        .await
        .unwrap();
    assert_eq!(claim.status, ClaimStatus::Recovering);
    assert!(claim.silent_ms > TTL.as_millis() as u64, "{claim:?}");
    assert_eq!(s.maps.cleanup.get("w1"), None, "no claim taken");
}

/// A claim on `worker` by node `node`, made at server time `since_ms`.
async fn claim(f: &Fixture, worker: &str, node: &str, since_ms: u64) {
    f.store
        .maps
        .cleanup
        .set(worker, &format!("{node} {since_ms}"))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_worker_that_renews_clears_a_claim_on_it_older_than_a_ttl() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    f.register("w2").await;
    let stored = codec::stored(0, &body("r"));
    s.reassert("r", "w1", 7, stored, Reassert::Running, TTL)
        .await
        .unwrap();
    // Redis went back to a moment within a cleanup of w1 that finished
    // since: the claim is back, its cleaner is done, and w1 lives on.
    claim(f, "w1", "n-done", 1000).await;
    assert_eq!(
        s.resume("r", "w1", TTL).await.unwrap(),
        Resumed::Claimed,
        "held back"
    );
    assert_eq!(
        s.resume("r", "w2", TTL).await.unwrap(),
        Resumed::Moved,
        "not w2's"
    );
    let renewal = s
        .keepalive("n-test", TTL, 0, ["w1".to_string(), "w2".to_string()])
        .await
        .unwrap();
    assert!(renewal.unknown.is_empty(), "{:?}", renewal.unknown);
    s.maps
        .cleanup
        .wait_for(Duration::from_secs(10), |m| !m.contains_key("w1"))
        .await
        .expect("the stale claim goes");
    assert!(
        matches!(s.resume("r", "w1", TTL).await.unwrap(), Resumed::Token(_)),
        "w1 resumes"
    );
    // A claim within the TTL (a cleanup going on) stays.
    claim(f, "w2", "n-busy", renewal.server_ms).await;
    s.keepalive("n-test", TTL, 0, ["w2".to_string()])
        .await
        .unwrap();
    assert!(s.maps.cleanup.get("w2").is_some(), "a fresh claim stays");
}

/// A node's renewals keep its own claim on a worker it is closing
/// (`retire_worker`: "<node> closing"), however long the close takes:
/// cleared, it put the leaving worker back in every node's ring, and other
/// nodes handed it jobs it never read (chaos soak seed 1002). Another
/// node's "closing" claim is a close whose node stopped renewing: it goes.
#[tokio::test]
async fn a_closing_nodes_renewal_keeps_its_own_closing_claim() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    f.register("w2").await;
    s.maps.cleanup.set("w1", "n-test closing").await.unwrap();
    s.maps.cleanup.set("w2", "n-gone closing").await.unwrap();
    s.keepalive("n-test", TTL, 0, ["w1".to_string(), "w2".to_string()])
        .await
        .unwrap();
    s.maps
        .cleanup
        .wait_for(Duration::from_secs(10), |m| !m.contains_key("w2"))
        .await
        .expect("another node's stale claim goes");
    assert_eq!(
        s.maps.cleanup.get("w1").as_deref(),
        Some("n-test closing"),
        "the renewing node's own close goes on"
    );
}

#[tokio::test]
async fn a_cleaner_whose_claim_is_gone_moves_nothing() {
    let f = &fixture().await;
    let s = &f.store;
    for w in ["w1", "w2"] {
        f.register(w).await;
    }
    let stored = codec::stored(0, &body("r"));
    s.reassert("r", "w1", 7, stored, Reassert::Running, TTL)
        .await
        .unwrap();
    f.admitted("q", "w1").await;
    let queued = f.entry_ids("w1").await[0].clone();
    let (from_inbox, to_inbox) = (f.inbox("w1"), f.inbox("w2"));
    let entry = |cleaner| EntryMove {
        from: "w1",
        from_inbox: &from_inbox,
        to: "w2",
        to_inbox: &to_inbox,
        id: &queued,
        name: "start",
        payload: body("q"),
        requeue: Requeue {
            key: Some("q"),
            cleaner: Some(cleaner),
        },
        worker_ttl: TTL,
        pending_ttl: TTL,
        floor_ms: None,
    };
    // Another node holds the claim (it took it over, or w1 came back and
    // cleared this cleaner's, and a new one was made).
    claim(f, "w1", "n-other", 1000).await;
    let handed = f.handoff("r", "w1", "w2", Some("n-me")).await;
    assert_eq!(handed, Handoff::ClaimLost);
    assert_eq!(s.move_entry(entry("n-me")).await.unwrap(), Moved::ClaimLost);
    assert_eq!(
        s.drop_entry("w1", &from_inbox, &queued, Some("n-me"))
            .await
            .unwrap(),
        Dropped::ClaimLost
    );
    assert_eq!(f.entry_ids("w1").await, std::slice::from_ref(&queued));
    let inbox = f.inbox("w1");
    assert_eq!(
        s.remove_worker("w1", &inbox, Some("n-me")).await.unwrap(),
        Removed::NotClaimed
    );
    assert!(s.maps.workers.get("w1").is_some(), "w1 stays registered");
    // With its own claim the cleaner moves everything and removes w1.
    claim(f, "w1", "n-me", 1000).await;
    let handed = f.handoff("r", "w1", "w2", Some("n-me")).await;
    assert!(matches!(handed, Handoff::Ok { .. }), "{handed:?}");
    assert_eq!(s.move_entry(entry("n-me")).await.unwrap(), Moved::Ok);
    assert_eq!(
        s.remove_worker("w1", &inbox, Some("n-me")).await.unwrap(),
        Removed::Ok
    );
}

/// A cleanup claimed on the state a rollback went back to (seed 1404): the
/// older state may show a dead worker owning jobs a cleanup moved since, and
/// which run where they went; a second cleanup would start them again while
/// they run. A cleaner that has seen the newer state is refused, and its
/// claim opens the recovery window for every later one.
#[tokio::test]
async fn no_cleanup_is_claimed_on_the_state_a_rollback_went_back_to() {
    let mut f = fixture_mirroring(false).await;
    f.register("dead").await;
    let s = &f.store;
    s.note_server(s.server_identity(TTL).await.unwrap());
    s.maps.keepalive.set("dead", "1000").await.unwrap(); // silent for ages
    let snapshot = f.server.save_snapshot().unwrap();
    // The first cleanup, which the rollback loses.
    assert_eq!(
        s.claim_cleanup("dead", "n-first", TTL, u64::MAX)
            .await
            .unwrap()
            .status,
        ClaimStatus::Claimed
    );
    f.server.roll_back(&snapshot).unwrap();
    current_run_id(&f.store).await;

    let claim = f
        .store
        .claim_cleanup("dead", "n-test", TTL, u64::MAX)
        .await
        .unwrap();
    assert_eq!(
        claim.status,
        ClaimStatus::Recovering,
        "a cleanup claimed on the older state"
    );
    let claimed: Option<String> = f
        .store
        .client
        .hget(f.store.maps.cleanup.keys_info().hash.clone(), "dead")
        .await
        .unwrap();
    assert_eq!(claimed, None, "no claim taken");
    // A node that knows only the new server is refused too: the window
    // the first claim opened holds.
    let server = f.store.server_identity(TTL).await.unwrap();
    f.store.note_server(server);
    assert_eq!(
        f.store
            .claim_cleanup("dead", "n-other", TTL, u64::MAX)
            .await
            .unwrap()
            .status,
        ClaimStatus::Recovering
    );
}

/// A cleanup claimed before Redis went back in time, still under way: the
/// older state may show the dead worker owning jobs this cleanup moved
/// since (their moves lost), which run where they went and have not
/// re-asserted yet. A listing of the older hash can name them again, and a
/// token issued now from the older counter can equal the moved run's. The
/// cleaner moves nothing while the pool recovers, nor on a state older than
/// it has seen; its claim stays, to be taken over once it is a TTL old and
/// the window is over.
#[tokio::test]
async fn a_cleanup_under_way_moves_nothing_while_the_pool_recovers() {
    let f = &fixture().await;
    let s = &f.store;
    for w in ["w1", "w2"] {
        f.register(w).await;
    }
    for key in ["r", "t"] {
        let stored = codec::stored(0, &body(key));
        s.reassert(key, "w1", 7, stored, Reassert::Running, TTL)
            .await
            .unwrap();
    }
    f.admitted("q", "w1").await;
    let queued = f.entry_ids("w1").await[0].clone();
    claim(f, "w1", "n-me", 1000).await;
    // Redis goes back to before what the node has seen (a rollback no
    // node has noticed yet).
    f.go_back_before_seen().await;
    assert_eq!(
        f.handoff("r", "w1", "w2", Some("n-me")).await,
        Handoff::Recovering,
        "a cleaner moved a job on a state older than it has seen"
    );
    // That call opened the recovery window; w2 renews in it, so it may
    // take jobs, but the cleaner still moves nothing.
    s.keepalive("n-test", TTL, 0, vec!["w2".to_string()])
        .await
        .unwrap();
    assert_eq!(
        f.handoff("t", "w1", "w2", Some("n-me")).await,
        Handoff::Recovering,
        "a cleaner moved a job while the pool recovers"
    );
    let (from_inbox, to_inbox) = (f.inbox("w1"), f.inbox("w2"));
    let entry = EntryMove {
        from: "w1",
        from_inbox: &from_inbox,
        to: "w2",
        to_inbox: &to_inbox,
        id: &queued,
        name: "start",
        payload: body("q"),
        requeue: Requeue {
            key: Some("q"),
            cleaner: Some("n-me"),
        },
        worker_ttl: TTL,
        pending_ttl: TTL,
        floor_ms: None,
    };
    assert_eq!(s.move_entry(entry).await.unwrap(), Moved::Recovering);
    assert_eq!(f.entry_ids("w1").await, std::slice::from_ref(&queued));
    for key in ["r", "t"] {
        let (_, record, _) = s.job_records(key).await.unwrap();
        assert_eq!(record.as_deref(), Some("w1 7"), "{key} left with w1");
    }
    assert_eq!(
        s.maps.cleanup.get("w1").as_deref(),
        Some("n-me 1000"),
        "the claim stays, for a takeover after the window"
    );
    // A rebalance or close (no cleaner) is not held back by the window.
    assert!(matches!(
        f.handoff("t", "w1", "w2", None).await,
        Handoff::Ok { .. }
    ));
}

/// A start entry a cleaner moves gets a new token and, with it, a fresh
/// deadline for its pending guard: the new owner gets the whole pending
/// time to claim it. With the old deadline kept (chaos soak seed 1419: a
/// dead worker's entry moved after a recovery and an outage, its guard
/// due within 60 ms of the cleanup's start), the stale-pending sweep removed the guard before the
/// new owner claimed the start; the claim was refused, and the job waited
/// out an orphan's grace with Redis its only holder.
#[tokio::test]
async fn a_start_a_cleaner_moves_gets_a_fresh_pending_deadline() {
    let f = &fixture().await;
    let s = &f.store;
    for w in ["w1", "w2"] {
        f.register(w).await;
    }
    let token = f.admitted("q", "w1").await;
    let entries: Vec<(String, HashMap<String, Bytes>)> = s
        .client
        .xrange(f.inbox("w1"), "-", "+", None)
        .await
        .unwrap();
    let (queued, fields) = entries.into_iter().next().unwrap();
    let pending_hash = s.maps.pending_map().keys_info().hash.clone();
    let guard: String = s.client.hget(&pending_hash, "q").await.unwrap();
    // The guard is almost due.
    let (head, rest) = guard.split_once(' ').unwrap();
    assert_eq!(head, token.to_string());
    let (_, tail) = rest.split_once(' ').unwrap_or((rest, ""));
    let due = format!("{token} 1000 {tail}");
    let _: () = s
        .client
        .hset(&pending_hash, ("q", due.as_str()))
        .await
        .unwrap();
    claim(f, "w1", "n-me", 1000).await;
    let (from_inbox, to_inbox) = (f.inbox("w1"), f.inbox("w2"));
    let entry = EntryMove {
        from: "w1",
        from_inbox: &from_inbox,
        to: "w2",
        to_inbox: &to_inbox,
        id: &queued,
        name: "start",
        payload: fields["p"].clone(),
        requeue: Requeue {
            key: Some("q"),
            cleaner: Some("n-me"),
        },
        worker_ttl: TTL,
        pending_ttl: TTL,
        floor_ms: None,
    };
    assert_eq!(s.move_entry(entry).await.unwrap(), Moved::Ok);
    let moved: String = s.client.hget(&pending_hash, "q").await.unwrap();
    let mut parts = moved.splitn(3, ' ');
    let new_token: u64 = parts.next().unwrap().parse().unwrap();
    let deadline: u64 = parts.next().unwrap().parse().unwrap();
    assert!(new_token > token, "{moved}: a new token");
    let now = crate::store::call::server_time_ms(&s.client).await.unwrap();
    assert!(
        deadline + 1_000 >= now + TTL.as_millis() as u64,
        "{moved}: the deadline is not fresh (now {now})"
    );
    assert_eq!(
        parts.next().unwrap_or(""),
        tail,
        "the rest of the guard is kept"
    );
}

/// A cleanup that found no worker to take a dead worker's job releases it
/// to the orphan sweep only while its claim on the worker holds. A worker
/// that renewed while the cleanup waited for its ring cleared the claim and
/// resumed the job under a new record; releasing that record left the run
/// unknown to Redis, and a stop was answered from the orphan while the run
/// went on (soak seed 1439: `I2 stop undone`, job-0878, 3.5 s).
#[tokio::test]
async fn a_cleanup_releases_a_job_only_while_its_claim_holds() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    let stored = codec::stored(0, &body("r"));
    s.reassert("r", "w1", 7, stored, Reassert::Running, TTL)
        .await
        .unwrap();
    // The claim was cleared by w1's renewal (or taken by another cleaner).
    assert_eq!(
        s.release_owner("r", "w1", Some("n-test")).await.unwrap(),
        Released::ClaimLost
    );
    claim(f, "w1", "n-other", 1000).await;
    assert_eq!(
        s.release_owner("r", "w1", Some("n-test")).await.unwrap(),
        Released::ClaimLost
    );
    assert!(s.job_records("r").await.unwrap().1.is_some(), "kept");
    // Its own claim: released, the payload left to the orphan sweep.
    claim(f, "w1", "n-test", 1000).await;
    assert_eq!(
        s.release_owner("r", "w1", Some("n-test")).await.unwrap(),
        Released::Released
    );
    assert_eq!(s.job_records("r").await.unwrap().1, None);
    assert!(s.payload("r").await.unwrap().is_some());
}

/// Redis's pulse field: (last keep-alive served, return to serving), ms.
async fn pulse(s: &PoolStore) -> (u64, u64) {
    let pulse: String = s
        .client
        .hget(keys::fencing(&s.pool).as_str(), keys::PULSE_FIELD)
        .await
        .unwrap();
    let (last, resumed) = pulse.split_once(' ').unwrap();
    (last.parse().unwrap(), resumed.parse().unwrap())
}

async fn set_pulse(s: &PoolStore, last: u64, resumed: u64) {
    let _: i64 = s
        .client
        .hset(
            keys::fencing(&s.pool).as_str(),
            (keys::PULSE_FIELD, format!("{last} {resumed}")),
        )
        .await
        .unwrap();
}

/// Redis's pulse (`note_pulse` in `scripts/base.lua`): a worker's silence
/// counts only while Redis served keep-alives. Silent for two TTLs while
/// Redis served nobody (frozen), it is alive; once Redis serves again, its
/// silence counts from then; silent while Redis served others, it is dead.
#[tokio::test]
async fn silence_counts_only_while_redis_served_keep_alives() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    let ttl_ms = TTL.as_millis() as u64;
    let now = s
        .keepalive("n-test", TTL, 0, ["w1".to_string()])
        .await
        .unwrap()
        .server_ms;
    // The first pulse knows of no stall.
    assert_eq!(pulse(s).await, (now, 0));
    let claim = || async {
        s.claim_cleanup("w1", "n-test", TTL, u64::MAX)
            .await
            .unwrap()
    };

    // Everyone's last keep-alive two TTLs ago: Redis served none since.
    let old = now - 2 * ttl_ms;
    s.maps.keepalive.set("w1", &old.to_string()).await.unwrap();
    set_pulse(s, old, old).await;
    let judged = claim().await;
    assert_eq!(judged.status, ClaimStatus::Alive, "{judged:?}");

    // Another node's keep-alive is served: Redis is back, and w1's
    // silence counts from then.
    let back = s
        .keepalive("n-other", TTL, 0, Vec::<String>::new())
        .await
        .unwrap()
        .server_ms;
    assert_eq!(pulse(s).await, (back, back));
    let judged = claim().await;
    assert_eq!(judged.status, ClaimStatus::Alive, "{judged:?}");
    assert!(judged.silent_ms < ttl_ms, "{judged:?}");

    // Redis served keep-alives all along while w1 said nothing: dead.
    set_pulse(s, back, old).await;
    let judged = claim().await;
    assert_eq!(judged.status, ClaimStatus::Claimed, "{judged:?}");
    assert!(judged.silent_ms > 2 * ttl_ms - 1_000, "{judged:?}");
}
