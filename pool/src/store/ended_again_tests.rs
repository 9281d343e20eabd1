//! `job_ended.lua` called again for the same run, as a client resends a
//! call whose reply a dropped connection lost (chaos soak seed 1579,
//! job-3354: a run failed for good during a `flap` of its process's link;
//! the call was resent, the second answered `moved`, the worker tried to
//! restart a job that had failed for good and never reported its end): the
//! second answers as the first did.

use super::*;

fn failed(delays: &'static [u64]) -> EndArgs<'static> {
    EndArgs::Failed {
        error: "boom",
        reset: false,
        delays_ms: delays,
    }
}

#[tokio::test]
async fn an_end_recorded_again_answers_as_the_first_time() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;

    // Failed for good (no restart left): the second call must not answer
    // `moved`, which has the worker restart the job.
    let t = f.running("gone", "w1").await;
    let first = s
        .record_job_end("gone", "w1", t, failed(&[]), false, TTL)
        .await
        .unwrap();
    assert!(
        matches!(first, EndRecorded::Failed { failures: 1, ended_at } if ended_at > t),
        "{first:?}"
    );
    assert_eq!(
        s.record_job_end("gone", "w1", t, failed(&[]), false, TTL)
            .await
            .unwrap(),
        first,
        "a failure for good recorded again"
    );

    // Finished: the same.
    let t = f.running("done", "w1").await;
    let first = s
        .record_job_end("done", "w1", t, EndArgs::Finished, false, TTL)
        .await
        .unwrap();
    assert!(matches!(first, EndRecorded::Finished { ended_at } if ended_at > t));
    assert_eq!(
        s.record_job_end("done", "w1", t, EndArgs::Finished, false, TTL)
            .await
            .unwrap(),
        first,
        "a finish recorded again"
    );

    // A failure with restarts left, counted once: counted twice, the job
    // failed for good one restart early.
    let t = f.running("flaky", "w1").await;
    let restarting = EndRecorded::Restarting {
        failures: 1,
        delay: Duration::from_millis(100),
    };
    for attempt in ["first", "again"] {
        assert_eq!(
            s.record_job_end("flaky", "w1", t, failed(&[100]), false, TTL)
                .await
                .unwrap(),
            restarting,
            "{attempt}"
        );
    }
    let Restarted::Token(t2) = s.restart_job("flaky", "w1", t, TTL).await.unwrap() else {
        panic!("not restarted");
    };
    // The restarted run failing is the second failure: past the one
    // restart, for good.
    assert!(matches!(
        s.record_job_end("flaky", "w1", t2, failed(&[100]), false, TTL)
            .await
            .unwrap(),
        EndRecorded::Failed { failures: 2, .. }
    ));
}

/// What still answers `moved`: another worker's report, an older run of a
/// key dispatched again since, and a run whose job was stopped and then
/// dispatched again (its payload back).
#[tokio::test]
async fn an_end_of_a_run_redis_no_longer_names_is_moved() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    let t = f.running("k", "w1").await;
    assert_eq!(
        s.record_job_end("k", "w2", t, EndArgs::Finished, false, TTL)
            .await
            .unwrap(),
        EndRecorded::Moved,
        "another worker's report"
    );
    assert!(matches!(
        s.record_job_end("k", "w1", t, EndArgs::Finished, false, TTL)
            .await
            .unwrap(),
        EndRecorded::Finished { .. }
    ));
    // Dispatched again: the old run's end is no longer this job's.
    let _t2 = f.running("k", "w1").await;
    assert_eq!(
        s.record_job_end("k", "w1", t, EndArgs::Finished, false, TTL)
            .await
            .unwrap(),
        EndRecorded::Moved,
        "an older run of a key that runs again"
    );
    // A failure for good of a run whose failure record is not its own.
    assert_eq!(
        s.record_job_end("k", "w1", t, failed(&[]), false, TTL)
            .await
            .unwrap(),
        EndRecorded::Moved,
        "a failure of an older run"
    );
}
