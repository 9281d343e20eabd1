//! The dead-worker cleanup's scripts while the pool recovers from a data
//! loss or a rollback (`claim_cleanup.lua`, `handoff.lua`, `move_entry.lua`):
//! nothing of a dead worker moves until every node has made its stops stand.

use super::*;

#[tokio::test]
async fn no_cleanup_moves_anything_while_the_pool_recovers() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    f.register("w2").await;
    f.register("w3").await;
    // w1 runs one job and has a start queued; w3 has one queued too.
    let stored = codec::stored(0, &body("r"));
    s.reassert("r", "w1", 7, stored, Reassert::Running, TTL)
        .await
        .unwrap();
    f.admitted("q", "w1").await;
    let queued = f.entry_ids("w1").await[0].clone();
    // w3 is silent for ages; w1 too, and its cleanup is claimed already.
    s.maps.keepalive.set("w3", "1000").await.unwrap();
    s.maps.keepalive.set("w1", "1000").await.unwrap();
    let claim = s.claim_cleanup("w1", "n-test", TTL).await.unwrap();
    assert_eq!(claim.status, ClaimStatus::Claimed);

    // Redis went back in time: the older state may show the dead workers
    // owning runs stopped since, whose stops are not made to stand yet.
    s.begin_recovery(TTL).await.unwrap();
    let claim = s.claim_cleanup("w3", "n-test", TTL).await.unwrap();
    assert_eq!(claim.status, ClaimStatus::Recovering);
    assert!(claim.silent_ms > TTL.as_millis() as u64, "{claim:?}");
    assert_eq!(s.maps.cleanup.get("w3"), None, "no claim taken");
    // The cleanup claimed before it neither hands on w1's job...
    let handed = s
        .handoff("r", "w1", "w2", &f.inbox("w2"), TTL, TTL)
        .await
        .unwrap();
    assert_eq!(handed, Handoff::Recovering);
    let (_, record, _) = s.job_records("r").await.unwrap();
    assert_eq!(record.as_deref(), Some("w1 7"));
    // ...nor moves its queued start on (with a new token).
    let (from_inbox, to_inbox) = (f.inbox("w1"), f.inbox("w2"));
    let entry = |requeued_key| EntryMove {
        from_inbox: &from_inbox,
        to: "w2",
        to_inbox: &to_inbox,
        id: &queued,
        name: "start",
        payload: body("q"),
        requeued_key,
        worker_ttl: TTL,
    };
    assert_eq!(
        s.move_entry(entry(Some("q"))).await.unwrap(),
        Moved::Recovering
    );
    assert_eq!(
        f.entry_ids("w1").await,
        std::slice::from_ref(&queued),
        "the entry stays"
    );
    // A live worker's hand-off (a rebalance), and a forward, go on.
    let stored = codec::stored(0, &body("r2"));
    s.reassert("r2", "w2", 9, stored, Reassert::Running, TTL)
        .await
        .unwrap();
    let live = s
        .handoff("r2", "w2", "w3", &f.inbox("w3"), TTL, TTL)
        .await
        .unwrap();
    assert!(matches!(live, Handoff::Ok { .. }), "{live:?}");
    assert_eq!(s.move_entry(entry(None)).await.unwrap(), Moved::Ok);
}
