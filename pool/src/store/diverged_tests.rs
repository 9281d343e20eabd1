//! Re-assertions by a node that wrote to a primary that stalled through
//! its failover (`diverged_for`: its suspended jobs re-assert yielding,
//! their tokens not comparable with the promoted side's).

use super::*;

/// The promoted side's part: a dispatch of `key` admitted a second ago,
/// moved to worker `w2` (registered here) and running there. Returns the
/// stored payload, the server time (ms) and the moved run's token.
async fn a_moved_run(f: &Fixture, key: &str) -> (Bytes, u64, u64) {
    let s = &f.store;
    f.register("w2").await;
    let now_ms = s.server_time_ms().await.unwrap();
    let dispatch = codec::stored(now_ms - 1_000, &body(key));
    let moved = (now_ms - 500) * 1_000;
    assert_eq!(
        s.reassert(key, "w2", moved, dispatch.clone(), Reassert::Running, TTL)
            .await
            .unwrap(),
        Reasserted::Ok
    );
    (dispatch, now_ms, moved)
}

/// A run of a dispatch that ended on the promoted side (moved there, then
/// failed for good) is not brought back by a yielding copy of it, however
/// large its token: the woken primary ran the copy's restart and gave it
/// a token above the promoted side's tombstone (chaos soak seed 1472: the
/// re-assertion restored the payload, the orphan sweep requeued it, and
/// the job ran again). An admission the promoted side never saw is still
/// restored: no token there is from after it.
#[tokio::test]
async fn a_yielding_copy_of_a_run_that_ended_on_the_promoted_side_stays_ended() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    // The promoted side: the moved run fails for good; the end leaves a
    // tombstone token.
    let (dispatch, now_ms, moved) = a_moved_run(f, "ended").await;
    let failed = EndArgs::Failed {
        error: "boom",
        reset: false,
        delays_ms: &[],
    };
    assert!(matches!(
        s.record_job_end("ended", "w2", moved, failed, false, TTL)
            .await
            .unwrap(),
        EndRecorded::Failed { failures: 1, .. }
    ));
    s.diverged_for(Duration::from_secs(60));
    let woken_token = (now_ms + 60_000) * 1_000;
    assert_eq!(
        s.reassert(
            "ended",
            "w1",
            woken_token,
            dispatch,
            Reassert::Suspended,
            TTL
        )
        .await
        .unwrap(),
        Reasserted::Lost
    );
    let (_, record, guard) = s.job_records("ended").await.unwrap();
    assert!(record.is_none() && guard.is_none(), "{record:?} {guard:?}");
    assert!(
        s.payload("ended").await.unwrap().is_none(),
        "no orphan made"
    );

    // A later dispatch of the key that the promoted side lost (admitted on
    // the stalled primary after the tombstone) is given back.
    let later = codec::stored(now_ms + 30_000, &body("ended"));
    assert_ne!(
        s.reassert("ended", "w1", woken_token, later, Reassert::Suspended, TTL)
            .await
            .unwrap(),
        Reasserted::Lost
    );
    assert!(
        s.payload("ended").await.unwrap().is_some(),
        "payload restored"
    );
}

/// A hand-off a node made on the woken primary, of a job that finished on
/// the promoted side, is not given back there after the node's reconnect
/// (chaos soak seed 1481: the cleaner on the woken primary moved the job
/// with a token from that primary's clock, above the promoted side's
/// tombstone; given back, the orphan sweep ran the finished job again).
/// Without the yielding state a give-back is judged as after a rollback
/// (`give_back_tests.rs`).
#[tokio::test]
async fn a_hand_off_from_the_woken_side_of_a_job_that_ended_is_not_given_back() {
    let f = &fixture().await;
    let s = &f.store;
    let (dispatch, now_ms, moved) = a_moved_run(f, "done").await;
    assert!(matches!(
        s.record_job_end("done", "w2", moved, EndArgs::Finished, false, TTL)
            .await
            .unwrap(),
        EndRecorded::Finished { .. }
    ));
    let woken_token = (now_ms + 60_000) * 1_000;
    s.diverged_for(Duration::from_secs(60));
    assert_eq!(
        s.handoff_stands("done", woken_token, dispatch.clone())
            .await
            .unwrap(),
        HandoffStands::Ended
    );
    assert!(s.payload("done").await.unwrap().is_none(), "no orphan made");

    // A later dispatch of the key, which the promoted side never saw, is
    // given back.
    let later = codec::stored(now_ms + 30_000, &body("done"));
    assert_eq!(
        s.handoff_stands("done", woken_token, later).await.unwrap(),
        HandoffStands::Restored
    );
}

/// A stop a worker carried out on the woken primary, under a token from
/// that primary's clock, leaves the record of the run the promoted side
/// moved the job to meanwhile: that run's token is smaller, yet it is not
/// older (chaos soak seed 1562: the stop took the record, its worker ran
/// on, and a `stop_job` asked on the promoted side found nothing to stop).
/// Made to stand as after a rollback, the same stop removes it.
#[tokio::test]
async fn a_stop_from_the_woken_side_leaves_the_run_the_promoted_side_moved_the_job_to() {
    let f = &fixture().await;
    let s = &f.store;
    let (_, now_ms, moved) = a_moved_run(f, "moved").await;
    let woken_token = (now_ms + 60_000) * 1_000;
    let running = format!("w2 {moved}");
    for kind in [StopKind::Run, StopKind::Dispatch] {
        assert_eq!(
            s.stops_stand_yielding(&[("moved", woken_token, 0)], kind, true)
                .await
                .unwrap(),
            vec![StopStands::Newer],
            "{kind:?}"
        );
        let (_, record, _) = s.job_records("moved").await.unwrap();
        assert_eq!(record.as_deref(), Some(running.as_str()), "{kind:?}");
        assert!(s.payload("moved").await.unwrap().is_some(), "{kind:?}");
    }
    assert_eq!(
        s.stops_stand_yielding(&[("moved", woken_token, 0)], StopKind::Run, false)
            .await
            .unwrap(),
        vec![StopStands::Removed]
    );
    let (_, record, _) = s.job_records("moved").await.unwrap();
    assert!(record.is_none(), "{record:?}");
}
