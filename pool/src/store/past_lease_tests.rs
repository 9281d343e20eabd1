//! A hand-off by an owner that held its job past its lease
//! ([`Mover::OwnerPastLease`], a close of a job stopped on a lease loss).
//! A cleanup may have moved the job meanwhile, on writes a rollback took
//! back, so the record naming the owner cannot vouch for it until every
//! running copy has re-asserted: `handoff.lua` refuses while the pool
//! recovers, and on a state older than the caller has seen (a rollback
//! its node has not noticed yet), where an owner under a lease that held
//! hands on as before.

use super::*;

/// `handoff.lua` of `key` from `from` to `to` by `mover`.
async fn hand(f: &Fixture, key: &str, from: &str, to: &str, mover: Mover<'_>) -> Handoff {
    let inbox = f.inbox(to);
    let to = Receiver {
        worker: to,
        inbox: &inbox,
        floor_ms: None,
    };
    f.store
        .handoff(key, from, to, TTL, TTL, mover)
        .await
        .unwrap()
        .0
}

/// Records `keys` as run by `w1` with token 100.
async fn run_on_w1(s: &PoolStore, keys: &[&str]) {
    for key in keys {
        let stored = codec::stored(0, &body(key));
        let outcome = s
            .reassert(key, "w1", 100, stored, Reassert::Running, TTL)
            .await
            .unwrap();
        assert_eq!(outcome, Reasserted::Ok, "{key}");
    }
}

#[tokio::test]
async fn a_job_held_past_the_lease_is_not_handed_on_from_an_older_state() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    f.register("w2").await;
    run_on_w1(s, &["a", "b"]).await;
    // Redis goes back to before what the node has seen (a rollback the
    // node has not noticed yet).
    f.go_back_before_seen().await;

    assert_eq!(
        hand(f, "a", "w1", "w2", Mover::OwnerPastLease).await,
        Handoff::Recovering,
        "handed on from a state older than the node has seen"
    );
    // That call opened the recovery window: refused there too.
    assert_eq!(
        hand(f, "a", "w1", "w2", Mover::OwnerPastLease).await,
        Handoff::Recovering,
        "handed on while the pool recovers"
    );
    let (_, record, _) = s.job_records("a").await.unwrap();
    assert_eq!(
        record.as_deref(),
        Some("w1 100"),
        "the record is left as it was"
    );
    // Once the target renewed in the window, an owner whose lease held
    // hands on as before; one past its lease still waits.
    s.keepalive("n-test", TTL, 0, vec!["w2".to_string()])
        .await
        .unwrap();
    assert_eq!(
        hand(f, "a", "w1", "w2", Mover::OwnerPastLease).await,
        Handoff::Recovering
    );
    assert!(
        matches!(
            hand(f, "b", "w1", "w2", Mover::Owner).await,
            Handoff::Ok { .. }
        ),
        "a run under a lease that held is the owner's to hand on"
    );
}

/// The end of a run its worker ran past its lease (seed 1413: the worker's
/// process was paused, a cleanup moved the job, a rollback took the move
/// back, and the run that finished as the process came back was recorded
/// as the job's end, with the moved run, newer, about to re-assert) waits
/// for the recovery to be over. A run under a lease that held ends as
/// before.
#[tokio::test]
async fn the_end_of_a_run_past_its_lease_waits_for_the_recovery() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    run_on_w1(s, &["past", "held"]).await;
    assert_eq!(s.begin_recovery(TTL).await.unwrap(), Recovery::Opened);
    assert_eq!(
        s.record_job_end("past", "w1", 100, EndArgs::Finished, true, TTL)
            .await
            .unwrap(),
        EndRecorded::Retry,
        "the end of a run past its lease recorded while the pool recovers"
    );
    let (_, record, _) = s.job_records("past").await.unwrap();
    assert_eq!(
        record.as_deref(),
        Some("w1 100"),
        "the record is left as it was"
    );
    assert!(
        matches!(
            s.record_job_end("held", "w1", 100, EndArgs::Finished, false, TTL)
                .await
                .unwrap(),
            EndRecorded::Finished { .. }
        ),
        "a run under a lease that held ends at once"
    );
}

/// A finished job leaves a tombstone token (chaos soak seed 1414: a run a
/// cleanup had moved the job to, on writes a rollback took back, was cut
/// off past the recovery window; the end of the old run was recorded
/// after the window, and the moved run, re-asserted later, took the
/// finished job back).
#[tokio::test]
async fn a_finished_job_is_not_taken_back_by_a_run_issued_before_its_end() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    f.register("w2").await;
    run_on_w1(s, &["done"]).await;
    assert!(matches!(
        s.record_job_end("done", "w1", 100, EndArgs::Finished, false, TTL)
            .await
            .unwrap(),
        EndRecorded::Finished { .. }
    ));
    let stored = codec::stored(0, &body("done"));
    assert_eq!(
        s.reassert("done", "w2", 200, stored, Reassert::Suspended, TTL)
            .await
            .unwrap(),
        Reasserted::Lost,
        "a run issued before the end took the finished job back"
    );
}
