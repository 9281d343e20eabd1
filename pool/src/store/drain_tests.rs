//! `drain_worker.lua` and what a drain mark changes for the scripts that
//! pick a worker (admission, hand-off, orphan requeue).

use super::*;

#[tokio::test]
async fn drain_script_answers_each_status_and_a_drained_worker_is_never_a_target() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    f.register("w2").await;
    assert_eq!(s.set_drained("w1", true).await.unwrap(), DrainMark::Changed);
    assert_eq!(
        s.set_drained("w1", true).await.unwrap(),
        DrainMark::Unchanged
    );
    assert_eq!(
        s.set_drained("w-gone", true).await.unwrap(),
        DrainMark::Unknown
    );
    let record: String = s
        .client
        .hget(s.maps.workers.keys_info().hash.clone(), "w1")
        .await
        .unwrap();
    let entry = records::WorkerEntry::parse(&record).unwrap();
    assert!(entry.drained_at_ms.is_some() && entry.node.as_deref() == Some("n-test"));
    // Registering again keeps the mark.
    f.register("w1").await;
    let record: String = s
        .client
        .hget(s.maps.workers.keys_info().hash.clone(), "w1")
        .await
        .unwrap();
    assert!(
        records::WorkerEntry::parse(&record)
            .unwrap()
            .drained_at_ms
            .is_some()
    );

    // Whatever a node's replica says, nothing is given to w1.
    assert_eq!(
        f.admit(&f.limits(), f.admission("d1", "w1", 1)).await,
        Admitted::NoWorker
    );
    f.admitted("d2", "w2").await;
    let t = records::pending_guard(&s.job_records("d2").await.unwrap().2.unwrap())
        .unwrap()
        .0;
    let id = f.entry_ids("w2").await.pop().unwrap();
    assert_eq!(
        s.claim_start(&f.start("d2", t, "w2", &id), TTL, TTL)
            .await
            .unwrap(),
        Claimed::Ok
    );
    assert_eq!(f.handoff("d2", "w2", "w1", None).await, Handoff::NoTarget);
    s.to_owner("d2", "w2", &f.inbox("w2"), "notify", body("d2"), TTL)
        .await
        .unwrap();
    let queued = f.entry_ids("w2").await.pop().unwrap();
    assert_eq!(f.move_entry(&queued, "w2", "w1").await, Moved::NoTarget);

    // Undrained: a target again.
    assert_eq!(
        s.set_drained("w1", false).await.unwrap(),
        DrainMark::Changed
    );
    assert_eq!(
        s.set_drained("w1", false).await.unwrap(),
        DrainMark::Unchanged
    );
    assert_eq!(f.move_entry(&queued, "w2", "w1").await, Moved::Ok);
    assert!(matches!(
        f.admit(&f.limits(), f.admission("d1", "w1", 1)).await,
        Admitted::Ok { .. }
    ));

    s.client
        .hset::<(), _, _>(
            s.maps.workers.keys_info().hash.clone(),
            ("w-bad", "not json"),
        )
        .await
        .unwrap();
    assert_eq!(
        s.set_drained("w-bad", true).await.unwrap(),
        DrainMark::Malformed
    );
}
