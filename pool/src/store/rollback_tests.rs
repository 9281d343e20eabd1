//! What a rollback recovery writes: a stop it carried out stands
//! again (`stop_stands.lua`), a node's recovery mark holds the recovery
//! window open while it reconciles (`recovery_mark.lua`), and a record or
//! a suspended job is not trusted while the pool recovers. What it gives
//! back: `give_back_tests.rs`.

use super::jobs::Routed;
use super::workers::Recovery;
use super::*;
use fred::prelude::HashesInterface;

#[tokio::test]
async fn a_stop_stands_again_over_an_older_state_but_not_over_a_newer_run() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    // The older state shows the stopped run pending (admitted, not started).
    let stopped = f.admitted("s1", "w1").await;
    assert_eq!(
        s.stop_stands("s1", stopped).await.unwrap(),
        StopStands::Removed
    );
    let (_, record, guard) = s.job_records("s1").await.unwrap();
    assert!(record.is_none() && guard.is_none(), "{record:?} {guard:?}");
    // No copy of the stopped run re-asserts over it.
    let stored = codec::stored(0, &body("s1"));
    assert_eq!(
        s.reassert("s1", "w1", stopped, stored, Reassert::Running, TTL)
            .await
            .unwrap(),
        Reasserted::Lost
    );
    // A dispatch after the stop (a newer token) is left alone.
    let newer = f.admitted("s2", "w1").await;
    assert_eq!(
        s.stop_stands("s2", newer - 1).await.unwrap(),
        StopStands::Newer
    );
    assert!(s.job_records("s2").await.unwrap().2.is_some(), "guard kept");
    assert_eq!(s.stop_stands("nothing", 5).await.unwrap(), StopStands::None);
}

#[tokio::test]
async fn the_recovery_window_lasts_while_a_node_reconciles() {
    let f = &fixture().await;
    let s = &f.store;
    let ttl = Duration::from_secs(1);
    // A request for a key Redis does not know waits while the pool
    // recovers ('pending'), and is not found otherwise.
    let recovering = || async {
        let routed = s
            .to_owner("absent", "-", "inbox", "notify", bytes::Bytes::new(), ttl)
            .await
            .unwrap();
        routed == Routed::Pending
    };
    assert!(!recovering().await);
    let opened = std::time::Instant::now();
    assert_eq!(s.begin_recovery(ttl).await.unwrap(), Recovery::Opened);
    assert!(recovering().await);
    // A node reconciling past the window's own end holds it open.
    while opened.elapsed() < ttl + ttl / 2 {
        assert_eq!(
            s.recovery_mark("n1", ttl, true).await.unwrap(),
            RecoveryMark::Set
        );
        assert!(recovering().await, "held open by n1's mark");
        tokio::time::sleep(ttl / 5).await;
    }
    // It ends when the last node is done, not a TTL later.
    assert_eq!(
        s.recovery_mark("n1", ttl, false).await.unwrap(),
        RecoveryMark::Cleared
    );
    assert!(
        !recovering().await,
        "n1 is done and the window's own end passed"
    );

    // The mark of a node that died lapses within a TTL.
    assert_eq!(s.begin_recovery(ttl).await.unwrap(), Recovery::Opened);
    assert_eq!(
        s.recovery_mark("n2", ttl, true).await.unwrap(),
        RecoveryMark::Set
    );
    flotilla_testkit::wait_until(
        Duration::from_secs(10),
        "a dead node's mark lapses",
        || async { !recovering().await },
    )
    .await
    .unwrap();
    // No mark reaches past 10 TTLs from the window's start.
    let short = Duration::from_millis(10);
    assert_eq!(
        s.recovery_mark("n3", short, true).await.unwrap(),
        RecoveryMark::Late
    );
    assert!(!recovering().await);
}

/// A rollback whose lost writes no revision the node compares shows (it
/// mirrors no jobs, and no keep-alive renewal was lost): the first script
/// after it still sees a new server by its run id, before the node's own
/// check after its reconnect, and admits nothing until the workers
/// re-asserted. A save alone (the same run id) is no restart. The scripts
/// read the run id on every call: they used to read it only when LASTSAVE
/// had changed, which a restart within the second of the last save does
/// not change (`tests/recovery_window.rs` admitted a key twice that way).
#[tokio::test]
async fn the_first_script_after_a_restart_sees_it_without_any_revision() {
    // At once: the new server may well have the old one's LASTSAVE.
    let f = lost_in_a_rollback().await;

    let again = || async {
        let lost = f.admission("lost", "w1", 3);
        f.store.admit(&f.limits(), &[lost]).await.map(|a| a[0])
    };
    let answer = loop {
        match again().await {
            Ok(answer) => break answer,
            // Until the client is back (a restart takes it down).
            Err(crate::error::Error::Unavailable(_) | crate::error::Error::Timeout(_)) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(
        answer,
        Admitted::Recovering,
        "a key admitted in the lost writes is admitted again"
    );
}

/// The run id of the server `s`'s client talks to, read without a script
/// (as a node that joined after a restart knows it).
pub(super) async fn current_run_id(s: &PoolStore) -> String {
    loop {
        match s
            .client
            .info::<String>(Some(fred::types::InfoKind::Server))
            .await
        {
            Ok(info) => {
                let line = info.lines().find_map(|l| l.strip_prefix("run_id:"));
                return line.expect("INFO server has a run_id").trim().to_string();
            }
            // Until the client is back (a restart takes it down).
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// A node that knows only the server after a rollback (it joined after
/// the restart) compares nothing its scripts could see changed: the pool's
/// record of the server its scripts last ran on shows the restart, and the
/// key the rollback forgot is not admitted again.
#[tokio::test]
async fn a_node_that_knows_only_the_new_server_still_sees_the_restart() {
    let f = lost_in_a_rollback().await;

    let new_server = current_run_id(&f.store).await;
    f.store.note_server(ServerIdentity {
        run_id: new_server,
        generation: "1".into(),
    });
    let lost = f.admission("lost", "w1", 3);
    assert_eq!(
        f.store.admit(&f.limits(), &[lost]).await.unwrap()[0],
        Admitted::Recovering,
        "a key admitted in the lost writes is admitted again"
    );
}

/// The identity check opens the window for a restart no script has seen
/// yet, and records the new server: the window it opened ends after its
/// TTL, and neither a later check nor a later admission opens another
/// (an idle pool is not held up by a restart long past).
#[tokio::test]
async fn the_identity_check_opens_one_window_per_restart() {
    let mut f = fixture_mirroring(false).await;
    f.register("w1").await;
    let ttl = Duration::from_millis(300);
    let limits = AdmitLimits {
        worker_ttl: ttl,
        ..f.limits()
    };
    let s = &f.store;
    s.note_server(s.server_identity(ttl).await.unwrap());
    let snapshot = f.server.save_snapshot().unwrap();
    f.server.roll_back(&snapshot).unwrap();
    current_run_id(&f.store).await;

    let server = f.store.server_identity(ttl).await.unwrap();
    f.store.note_server(server);
    let opened_at = std::time::Instant::now();
    let a = f.admission("a", "w1", 1);
    assert_eq!(
        f.store.admit(&limits, &[a]).await.unwrap()[0],
        Admitted::Recovering,
        "the check opened the window"
    );
    // Nothing holds it open: it ends after its TTL.
    tokio::time::sleep_until((opened_at + ttl).into()).await;
    let again = f.store.server_identity(ttl).await.unwrap();
    f.store.note_server(again);
    let a = f.admission("a", "w1", 2);
    assert!(
        matches!(
            f.store.admit(&limits, &[a]).await.unwrap()[0],
            Admitted::Ok { .. }
        ),
        "no second window for the same restart"
    );
}

/// A lean node's store with worker "w1" that admitted "a", then "lost"
/// after a snapshot, and Redis rolled back to that snapshot at once: the
/// script-side view of a key still running that Redis forgot.
async fn lost_in_a_rollback() -> Fixture {
    let mut f = fixture_mirroring(false).await;
    f.register("w1").await;
    let s = &f.store;
    s.note_server(s.server_identity(TTL).await.unwrap());
    assert!(matches!(admit_one(&f, "a", 1).await, Admitted::Ok { .. }));
    let snapshot = f.server.save_snapshot().unwrap();
    assert!(matches!(
        admit_one(&f, "lost", 2).await,
        Admitted::Ok { .. }
    ));
    f.server.roll_back(&snapshot).unwrap();
    f
}

/// Admits `key` for "w1" alone.
async fn admit_one(f: &Fixture, key: &str, request: u64) -> Admitted {
    f.admit(&f.limits(), f.admission(key, "w1", request)).await
}

/// A start recorded while the pool recovered from a loss of Redis's data
/// (`record_starts.lua`: the guard and payload gone, the worker's run the
/// only one) leaves an owner record without a payload. A hand-off of that
/// job must not take the record and then find nothing to hand on (the
/// job ran nowhere after its worker was removed: chaos soak seed 96), and
/// the worker's re-assertion gives the payload back.
#[tokio::test]
async fn a_record_without_its_payload_survives_a_hand_off_and_gets_it_back() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    f.register("w2").await;
    let token = f.admitted("r1", "w1").await;
    s.maps.pending_map().delete("r1").await.unwrap();
    s.maps
        .jobs_map()
        .set("r1", &format!("w1 {token}"))
        .await
        .unwrap();
    let _: i64 = s.client.hdel(keys::payloads(&s.pool), "r1").await.unwrap();
    let handed = f.handoff("r1", "w1", "w2", None).await;
    assert_eq!(handed, Handoff::NoPayload);
    let (_, record, _) = s.job_records("r1").await.unwrap();
    assert_eq!(
        record.as_deref(),
        Some(format!("w1 {token}").as_str()),
        "the record stays where nothing could be handed on"
    );
    let stored = codec::stored(7, &body("r1"));
    assert_eq!(
        s.reassert("r1", "w1", token, stored.clone(), Reassert::Running, TTL)
            .await
            .unwrap(),
        Reasserted::Ok
    );
    assert_eq!(
        s.payload("r1").await.unwrap().as_deref(),
        Some(&stored[..]),
        "the re-assertion gave the payload back"
    );
}

#[tokio::test]
async fn a_run_re_asserted_over_its_own_older_record_brings_its_own_payload() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    let (stopped, newer) = (2_000_000, 6_000_000);
    let old = codec::stored(1_000, &body("old"));
    let new = codec::stored(5_500, &body("new"));
    let running = Reassert::Running;
    // The older state Redis went back to: this worker runs the run it
    // stopped since (an earlier admission, with its payload).
    assert_eq!(
        s.reassert("k", "w1", stopped, old.clone(), running, TTL)
            .await
            .unwrap(),
        Reasserted::Ok
    );
    // The worker runs a newer admission of the key and re-asserts it.
    assert_eq!(
        s.reassert("k", "w1", newer, new.clone(), running, TTL)
            .await
            .unwrap(),
        Reasserted::Ok
    );
    assert_eq!(
        s.payload("k").await.unwrap(),
        Some(new.clone()),
        "the running admission's payload, not the stopped one's"
    );
    // The older stop, made to stand, leaves the newer run and its payload,
    // even once its record is lost again.
    assert_eq!(
        s.stop_stands("k", stopped).await.unwrap(),
        StopStands::Newer
    );
    s.maps.jobs_map().delete("k").await.unwrap();
    s.stop_stands("k", stopped).await.unwrap();
    assert_eq!(s.payload("k").await.unwrap(), Some(new));
}

/// A job held suspended (stopped on a lease loss, or for a hand-off that
/// could not be made) is not restarted from the record Redis shows while
/// the pool recovers: after a rollback that record may be one the lost
/// writes had replaced (a cleanup moved the job, and its new owner runs
/// it but has not re-asserted yet). It waits for the window's end, when
/// every running copy has re-asserted: then it is the worker's again, or
/// it moved.
#[tokio::test]
async fn a_suspended_job_is_not_resumed_while_the_pool_recovers() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    f.register("w2").await;
    let stored = |key| codec::stored(0, &body(key));
    // The state Redis went back to: w1 owns both jobs.
    for key in ["kept", "moved"] {
        assert_eq!(
            s.reassert(key, "w1", 100, stored(key), Reassert::Running, TTL)
                .await
                .unwrap(),
            Reasserted::Ok
        );
    }
    let ttl = Duration::from_millis(400);
    assert_eq!(s.begin_recovery(ttl).await.unwrap(), Recovery::Opened);
    for key in ["kept", "moved"] {
        assert_eq!(
            s.resume(key, "w1", ttl).await.unwrap(),
            Resumed::Recovering,
            "{key}: held back while the pool recovers"
        );
    }
    // The run the lost writes had started on w2 re-asserts meanwhile.
    assert_eq!(
        s.reassert("moved", "w2", 200, stored("moved"), Reassert::Running, ttl)
            .await
            .unwrap(),
        Reasserted::Ok
    );
    flotilla_testkit::wait_until(Duration::from_secs(10), "the window ends", || async {
        s.resume("kept", "w1", ttl).await.unwrap() != Resumed::Recovering
    })
    .await
    .unwrap();
    assert_eq!(s.resume("moved", "w1", ttl).await.unwrap(), Resumed::Moved);
    let (_, record, _) = s.job_records("kept").await.unwrap();
    let token: u64 = record
        .as_deref()
        .and_then(|r| r.strip_prefix("w1 "))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("kept is w1's again: {record:?}"));
    assert!(token > 100, "with a new token: {token}");
}

/// A pool with no epoch is new, or lost its data. A join on a server that
/// held the pool's epoch before a `FLUSHALL` opens the recovery window
/// (the server kept running, so no run id shows the loss, and a node that
/// joins first would otherwise admit a key a cut-off worker still runs);
/// a pool the server never held starts at once.
#[tokio::test]
async fn a_join_after_a_flush_opens_the_recovery_window() {
    let f = fixture().await;
    let s = &f.store;
    assert!(!s.create_epoch(TTL).await.unwrap(), "the epoch is there");
    let _: () = s.client.flushall(false).await.unwrap();
    let new_pool = flotilla_testkit::unique_name("store");
    let other = PoolStore::join(&s.client, &new_pool, Duration::from_secs(10), false)
        .await
        .unwrap();
    assert!(
        !other.create_epoch(TTL).await.unwrap(),
        "a pool this server never held is new"
    );
    assert!(
        s.create_epoch(TTL).await.unwrap(),
        "the join finds the pool's data lost"
    );
    assert!(
        !s.create_epoch(TTL).await.unwrap(),
        "the window is opened once"
    );
    let answer = s
        .admit(&f.limits(), &[f.admission("k", "w1", 1)])
        .await
        .unwrap();
    assert_eq!(answer[0], Admitted::Recovering, "nothing is admitted");
    other.maps.close().await;
}

/// A stop of an older run, made to stand after a rollback, leaves the
/// payload of a newer run of the same admission that Redis holds only as
/// an orphan: a hand-off a worker gave back (Redis lost it), or a run a
/// worker held suspended and left to the orphan sweep. Both runs share the
/// payload's admission time, and the older run's stop took the only copy
/// of the newer one (chaos soak seed 903: job-0092 and job-0238 then ran
/// nowhere).
#[tokio::test]
async fn an_older_runs_stop_leaves_a_newer_runs_orphan() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    // Redis went back to a state that shows run `older` of "g" admitted
    // and nothing since; its guard is gone (the reconcile released it).
    let older = f.admitted("g", "w1").await;
    let stored = s.payload("g").await.unwrap().expect("admitted");
    s.maps.pending_map().delete("g").await.unwrap();
    // The worker that handed the job off later gives it back.
    let handed = older + 1_000;
    s.handoff_stands("g", handed, stored.clone()).await.unwrap();
    s.stop_stands("g", older).await.unwrap();
    assert_eq!(
        s.payload("g").await.unwrap(),
        Some(stored),
        "the given-back run's payload"
    );

    // The other order: the older run's stop stands first (it takes the
    // payload and raises the counter just above its token), then the
    // hand-off is given back, and the payload with it.
    let older = f.admitted("b", "w1").await;
    let stored = s.payload("b").await.unwrap().expect("admitted");
    s.maps.pending_map().delete("b").await.unwrap();
    s.stop_stands("b", older).await.unwrap();
    assert_eq!(
        s.handoff_stands("b", older + 1_000, stored.clone())
            .await
            .unwrap(),
        HandoffStands::Restored
    );
    assert_eq!(
        s.payload("b").await.unwrap(),
        Some(stored),
        "the given-back run's payload"
    );

    // The same for a run a worker held suspended through the loss.
    let older = f.admitted("o", "w1").await;
    let stored = s.payload("o").await.unwrap().expect("admitted");
    s.maps.pending_map().delete("o").await.unwrap();
    s.begin_recovery(TTL).await.unwrap();
    assert_eq!(
        s.reassert(
            "o",
            "w1",
            older + 1_000,
            stored.clone(),
            Reassert::Suspended,
            TTL
        )
        .await
        .unwrap(),
        Reasserted::Orphaned
    );
    s.stop_stands("o", older).await.unwrap();
    assert_eq!(
        s.payload("o").await.unwrap(),
        Some(stored),
        "the suspended run's payload"
    );
}

/// A stop carried out while the pool recovers from a rollback, of a run
/// its worker held suspended (its lease had lapsed) and the older state
/// names, does not answer `Ok` yet, and outranks every run of the key
/// issued before it. Chaos soak seed 1404 (`c60fe8a`): job-0371 was moved
/// by a cleanup while its holder was paused; the rollback lost the move
/// and named the holder again, which carried out a stop asked meanwhile
/// and answered `Ok`. The moved run (a newer token, held suspended by its
/// worker) then came back as an orphan and the sweep started it again:
/// the stop was undone. A run that went on under a lease that held cannot
/// have been moved: its stop is answered at once, and outranks them too.
#[tokio::test]
async fn a_stop_made_while_the_pool_recovers_waits_and_outranks_runs_issued_before_it() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    f.register("w2").await;
    let mut runs = Vec::new();
    for key in ["k", "r"] {
        let older = f.admitted(key, "w1").await;
        let id = f.entry_ids("w1").await.pop().unwrap();
        let start = f.start(key, older, "w1", &id);
        assert_eq!(s.claim_start(&start, TTL, TTL).await.unwrap(), Claimed::Ok);
        let stored = s.payload(key).await.unwrap().expect("admitted");
        runs.push((key, older, id, stored));
    }
    f.lose_epoch().await;
    for ((key, older, id, stored), held_past_lease) in runs.into_iter().zip([true, false]) {
        // A run issued on w2 by a cleanup whose writes Redis lost: a newer
        // token Redis no longer shows (the state it went back to names
        // w1's run).
        let moved = older + 1_000;
        let stop = s
            .stopped(StopDone {
                key,
                worker: "w1",
                inbox: &f.inbox("w1"),
                entry_id: &id,
                reply: None,
                held: Some(older),
                held_past_lease,
                dispatch: None,
                worker_ttl: TTL,
                target: Some(older),
                kept: None,
            })
            .await
            .unwrap();
        let expected = if held_past_lease {
            Stopped::Retry
        } else {
            Stopped::Ok
        };
        assert_eq!(
            stop, expected,
            "{key}: held past its lease: {held_past_lease}"
        );
        assert_eq!(
            s.reassert(key, "w2", moved, stored, Reassert::Suspended, TTL)
                .await
                .unwrap(),
            Reasserted::Lost,
            "{key}: a run issued before the stop came back after it"
        );
        assert_eq!(s.payload(key).await.unwrap(), None);
    }
}

/// A failed run's restart that reaches Redis while the pool recovers from
/// a rollback: the record naming the failed run may be one the lost writes
/// had replaced (the job moved and was stopped on request elsewhere), and a
/// new token issued over it outranks that stop when it is made to stand
/// again. Chaos soak seed 1439 (`2343aea`, job-1107): the restart, due while
/// its process was cut off, went out on the reconnect to a Redis rolled
/// back to the cut's start; the stop of the job's next run (on the worker
/// a cleanup had moved it to) then found a newer record and did not stand,
/// and the job resumed. The restart waits for the recovery instead, held
/// like a suspended job until a renewal settles it.
#[tokio::test]
async fn a_restart_waits_while_the_pool_recovers() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    let token = f.admitted("k", "w1").await;
    let id = f.entry_ids("w1").await.pop().unwrap();
    let start = f.start("k", token, "w1", &id);
    assert_eq!(s.claim_start(&start, TTL, TTL).await.unwrap(), Claimed::Ok);
    f.lose_epoch().await;
    assert_eq!(
        s.restart_job("k", "w1", token, TTL).await.unwrap(),
        Restarted::Recovering,
        "a restart over a record Redis went back to"
    );
    let (_, record, _) = s.job_records("k").await.unwrap();
    assert_eq!(record, Some(format!("w1 {token}")), "nothing written");
}

/// A node that wrote to a primary that stalled through its failover holds
/// suspended jobs with tokens from that server's clock, on a branch the
/// promoted side never saw: a larger token says nothing about which run is
/// newer. While it is marked diverged its suspended jobs re-assert
/// yielding: never over another run's record or guard (chaos soak seed
/// 1472: a suspended copy with the woken primary's token took the record
/// of the run the promoted side had moved to another worker, and both
/// ran). Without the mark, the larger token wins, as after a rollback.
#[tokio::test]
async fn a_diverged_node_s_suspended_jobs_yield_to_the_runs_they_find() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    f.register("w2").await;
    let stored = |key| codec::stored(0, &body(key));
    for key in ["moved", "rolled-back"] {
        assert_eq!(
            s.reassert(key, "w2", 100, stored(key), Reassert::Running, TTL)
                .await
                .unwrap(),
            Reasserted::Ok
        );
    }
    s.diverged_for(Duration::from_secs(60));
    assert_eq!(
        s.reassert(
            "moved",
            "w1",
            200,
            stored("moved"),
            Reassert::Suspended,
            TTL
        )
        .await
        .unwrap(),
        Reasserted::Lost
    );
    let (_, record, _) = s.job_records("moved").await.unwrap();
    assert_eq!(
        record.as_deref(),
        Some("w2 100"),
        "the run found keeps its record"
    );
    let fresh = fixture().await;
    let s2 = &fresh.store;
    fresh.register("w1").await;
    fresh.register("w2").await;
    assert_eq!(
        s2.reassert(
            "rolled-back",
            "w2",
            100,
            stored("rolled-back"),
            Reassert::Running,
            TTL
        )
        .await
        .unwrap(),
        Reasserted::Ok
    );
    assert_ne!(
        s2.reassert(
            "rolled-back",
            "w1",
            200,
            stored("rolled-back"),
            Reassert::Suspended,
            TTL
        )
        .await
        .unwrap(),
        Reasserted::Lost,
        "without the mark the larger token wins"
    );
}
