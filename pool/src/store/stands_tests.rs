//! A stop `stop_job` asked for, made to stand again after Redis went back
//! in time (`stop_stands.lua` with [`StopKind::Dispatch`]), names a newer
//! run of the dispatch it stopped instead of leaving it; a run's stop
//! ([`StopKind::Run`]) leaves it, and both leave a later dispatch.

use super::*;
use fred::prelude::HashesInterface;

#[tokio::test]
async fn a_requested_stop_names_a_newer_run_of_its_dispatch() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    f.register("w2").await;

    // The stopped run's dispatch, moved on (a cleanup on the state Redis
    // went back to) to w2 with a newer token.
    let stopped = f.admitted("moved", "w1").await;
    let dispatch = f.admission_stamp("moved").await;
    s.maps.pending_map().delete("moved").await.unwrap();
    let moved = format!("w2 {}", stopped + 1_000);
    s.maps.jobs_map().set("moved", &moved).await.unwrap();
    assert_eq!(
        s.stop_stands_batch(&[("moved", stopped)], StopKind::Run)
            .await
            .unwrap(),
        vec![StopStands::Newer],
        "a run's stop leaves it (it may be that run's hand-off)"
    );
    assert_eq!(
        s.stop_stands_batch(&[("moved", stopped)], StopKind::Dispatch)
            .await
            .unwrap(),
        vec![StopStands::Undone(dispatch)]
    );
    let (_, record, _) = s.job_records("moved").await.unwrap();
    assert_eq!(
        record.as_deref(),
        Some(moved.as_str()),
        "left to its worker's stop"
    );

    // The same dispatch requeued and not started yet (a guard).
    let stopped = f.admitted("queued", "w1").await;
    let dispatch = f.admission_stamp("queued").await;
    s.maps.pending_map().delete("queued").await.unwrap();
    let guard = format!("{} 9999999999999 n-test/1", stopped + 1_000);
    s.maps.pending_map().set("queued", &guard).await.unwrap();
    assert_eq!(
        s.stop_stands_batch(&[("queued", stopped)], StopKind::Dispatch)
            .await
            .unwrap(),
        vec![StopStands::Undone(dispatch)]
    );

    // An orphan of the stopped dispatch whose newer run (the counter
    // above the stop) Redis lost: owed a run by the sweep.
    let stopped = f.admitted("orphan", "w1").await;
    let dispatch = f.admission_stamp("orphan").await;
    s.maps.pending_map().delete("orphan").await.unwrap();
    let _: i64 = s
        .client
        .hset(
            keys::fencing(&s.pool),
            ("orphan", (stopped + 1_000).to_string()),
        )
        .await
        .unwrap();
    assert_eq!(
        s.stop_stands_batch(&[("orphan", stopped)], StopKind::Dispatch)
            .await
            .unwrap(),
        vec![StopStands::Undone(dispatch)]
    );
    assert!(
        s.payload("orphan").await.unwrap().is_some(),
        "left to the stop"
    );

    // A dispatch admitted after the stop is not the stopped one, even
    // within the millisecond of the stopped run's token (a stamp of the
    // admission's time in ms could not tell them apart): the stamp is the
    // admission's own token.
    let newer = f.admitted("again", "w1").await;
    assert_eq!(
        f.admission_stamp("again").await,
        newer,
        "the stamp is the admission's token"
    );
    let stopped = newer - 1;
    assert_eq!(
        s.stop_stands_batch(&[("again", stopped)], StopKind::Dispatch)
            .await
            .unwrap(),
        vec![StopStands::Newer]
    );
    assert!(
        s.job_records("again").await.unwrap().2.is_some(),
        "guard kept"
    );
}

/// A record Redis went back to, of a job its worker passed on since,
/// goes without the job's payload even where the key's counter does not
/// show the hand-off (made on a primary that stalled through its
/// failover): the payload may be the job's only copy.
#[tokio::test]
async fn a_record_of_a_job_passed_on_since_goes_without_its_payload() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    for (key, handed_on, expected) in [
        ("passed", true, Released::Kept),
        ("stopped", false, Released::Released),
    ] {
        let token = f.admitted(key, "w1").await;
        s.maps.pending_map().delete(key).await.unwrap();
        let record = format!("w1 {token}");
        s.maps.jobs_map().set(key, &record).await.unwrap();
        assert_eq!(
            s.release_stale(key, &record, handed_on).await.unwrap(),
            expected,
            "{key}"
        );
        assert!(
            s.job_records(key).await.unwrap().1.is_none(),
            "{key}: record gone"
        );
        assert_eq!(
            s.payload(key).await.unwrap().is_some(),
            handed_on,
            "{key}: payload"
        );
    }
}

/// A start recorded while the pool recovers, on a state Redis went back
/// to that holds an older dispatch's payload and no record or guard of the
/// key, leaves that payload out from under its record: taken for this
/// run's, it made the stop of the older dispatch, made to stand again,
/// stop this run, and the key was admitted again over it (chaos soak seed
/// 1564, `job-4365`).
#[tokio::test]
async fn a_start_recorded_in_a_recovery_keeps_no_older_dispatch_under_its_record() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    // The older dispatch, as the state Redis went back to holds it: its
    // payload alone (an orphan; the stop of its run came after).
    let older = f.admitted("k", "w1").await;
    s.maps.pending_map().delete("k").await.unwrap();
    let stopped = older + 1_000;
    // A dispatch admitted after that stop and started: its admission went
    // with the rollback, its start is recorded after it.
    let newer = older + 2_000;
    f.lose_epoch().await;
    let start = f.start("k", newer, "w1", "1-1");
    assert_eq!(
        s.record_starts(&[start], TTL).await.unwrap(),
        [StartKept::Ok]
    );
    let (_, record, _) = s.job_records("k").await.unwrap();
    assert_eq!(record, Some(format!("w1 {newer}")));
    assert_eq!(
        s.payload("k").await.unwrap(),
        None,
        "the older dispatch's payload is not this run's"
    );
    assert_eq!(
        s.stop_stands_batch(&[("k", stopped)], StopKind::Dispatch)
            .await
            .unwrap(),
        vec![StopStands::Newer],
        "the older dispatch's stop leaves the newer run"
    );
    // The run's re-assertion brings its own payload back.
    let stored = codec::stored(newer, &body("k"));
    assert_eq!(
        s.reassert("k", "w1", newer, stored.clone(), Reassert::Running, TTL)
            .await
            .unwrap(),
        Reasserted::Ok
    );
    assert_eq!(s.payload("k").await.unwrap().as_deref(), Some(&stored[..]));
}

/// A run's end made to stand over a record Redis went back to, of a run
/// passed on since (a cleaner ends what its cleanup did not find under a
/// dead worker, see `cleaned.rs`), takes the older record and the payload,
/// and the run it was passed to, under a newer token, brings both back as
/// it re-asserts: the two commute.
#[tokio::test]
async fn the_end_of_a_run_passed_on_leaves_the_run_it_was_passed_to() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    f.register("w2").await;
    let token = f.admitted("k", "w1").await;
    let admitted = f.admission_stamp("k").await;
    s.maps.pending_map().delete("k").await.unwrap();
    s.maps
        .jobs_map()
        .set("k", &format!("w1 {token}"))
        .await
        .unwrap();
    assert_eq!(
        s.stop_stands_batch(&[("k", token)], StopKind::Run)
            .await
            .unwrap(),
        vec![StopStands::Removed]
    );
    assert_eq!(s.job_records("k").await.unwrap().1, None, "record gone");
    let passed = token + 1_000;
    let stored = codec::stored(admitted, &body("k"));
    assert_eq!(
        s.reassert("k", "w2", passed, stored.clone(), Reassert::Running, TTL)
            .await
            .unwrap(),
        Reasserted::Ok,
        "the passed-on run re-asserts over the end"
    );
    assert_eq!(
        s.job_records("k").await.unwrap().1,
        Some(format!("w2 {passed}"))
    );
    assert_eq!(s.payload("k").await.unwrap().as_deref(), Some(&stored[..]));
}
