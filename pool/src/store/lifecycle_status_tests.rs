//! The lifecycle scripts (a job's end recorded, a failed run restarted, a
//! failed job forgotten) answer each of their statuses.

use super::*;

#[tokio::test]
async fn lifecycle_scripts_answer_each_status() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    let failed = |delays: &'static [u64]| EndArgs::Failed {
        error: "boom\nat line 2",
        reset: false,
        delays_ms: delays,
    };

    let t = f.running("done", "w1").await;
    assert_eq!(
        s.record_job_end("done", "w2", t, EndArgs::Finished, false, TTL)
            .await
            .unwrap(),
        EndRecorded::Moved,
        "another worker's report"
    );
    assert!(matches!(
        s.record_job_end("done", "w1", t, EndArgs::Finished, false, TTL)
            .await
            .unwrap(),
        // The tombstone: above the run's token.
        EndRecorded::Finished { ended_at } if ended_at > t
    ));
    // Read from Redis: the replica follows asynchronously.
    assert_eq!(s.job_records("done").await.unwrap().1, None);

    let t1 = f.running("flaky", "w1").await;
    assert_eq!(
        s.record_job_end("flaky", "w1", t1, failed(&[100, 200]), false, TTL)
            .await
            .unwrap(),
        EndRecorded::Restarting {
            failures: 1,
            delay: Duration::from_millis(100)
        }
    );
    assert_eq!(
        s.restart_job("flaky", "w1", t1 - 1, TTL).await.unwrap(),
        Restarted::Elsewhere,
        "stale run"
    );
    let Restarted::Token(t2) = s.restart_job("flaky", "w1", t1, TTL).await.unwrap() else {
        panic!("not restarted");
    };
    assert!(t2 > t1);
    // The same restart again, as a client resends a call whose reply a
    // dropped connection lost (Redis restarting): the run it started, not
    // "another run" (chaos soak seed 1402, run 2: the worker dropped the
    // job, its rollback recovery then released the record as a run not
    // running here, and the key ran nowhere).
    assert_eq!(
        s.restart_job("flaky", "w1", t1, TTL).await.unwrap(),
        Restarted::Token(t2),
        "a restart retried after its reply was lost"
    );
    assert_eq!(
        s.restart_job("flaky", "w2", t1, TTL).await.unwrap(),
        Restarted::Elsewhere,
        "another worker's"
    );
    assert_eq!(
        s.record_job_end("flaky", "w1", t2, failed(&[100, 200]), false, TTL)
            .await
            .unwrap(),
        EndRecorded::Restarting {
            failures: 2,
            delay: Duration::from_millis(200)
        }
    );
    let Restarted::Token(t3) = s.restart_job("flaky", "w1", t2, TTL).await.unwrap() else {
        panic!("not restarted");
    };
    assert!(matches!(
        s.record_job_end("flaky", "w1", t3, failed(&[100, 200]), false, TTL)
            .await
            .unwrap(),
        EndRecorded::Failed { failures: 3, ended_at } if ended_at > t3
    ));
    let (record, owner, _) = s.job_records("flaky").await.unwrap();
    assert!(owner.is_none());
    assert!(record.unwrap().starts_with("failed 3 "), "one line kept");
    assert!(s.forget_failed_job("flaky").await.unwrap());
    assert!(!s.forget_failed_job("flaky").await.unwrap());
    // Written again where a failure for good was made to stand (the
    // promoted primary lost the record): only for a key that neither runs
    // nor waits for a start.
    assert!(s.mark_failed_job("flaky", 3, t3, "boom").await.unwrap());
    let (record, _, _) = s.job_records("flaky").await.unwrap();
    assert!(record.unwrap().starts_with(&format!("failed 3 {t3} ")));
    let t4 = f.running("flaky", "w1").await;
    assert!(!s.mark_failed_job("flaky", 3, t3, "boom").await.unwrap());
    let (_, owner, _) = s.job_records("flaky").await.unwrap();
    assert!(owner.unwrap().ends_with(&t4.to_string()), "a new dispatch");
}
