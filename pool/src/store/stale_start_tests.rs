//! A start entry that Redis brought back by going back in time, claimed
//! after the pool's recovery window: the key may still run on a worker
//! that holds a newer token Redis lost, out of reach (paused, cut off)
//! through the whole window, so it has not re-asserted. Claimed under its
//! old token, the entry's run would rank *below* that copy, and fencing
//! downstream would let the stale copy win. Chaos soak seed 1439
//! (`eb4f9ad`, job-0908): the orphan sweep gave the job to a worker that
//! was then paused; a cleaner moved it on (a newer token) and its new owner
//! started it; Redis rolled back to the requeue; the new owner was paused
//! through the recovery window; the first worker resumed, claimed the
//! restored entry with the older token and started the job while the
//! paused copy, with the higher token, still held it.
//! So a claim of an entry issued before the pool's last recovery began
//! issues the entry again, with a token newer than any issued before the
//! recovery.

use bytes::Bytes;

use super::*;

/// The token in the header of each start entry in `worker`'s inbox.
async fn entry_tokens(f: &Fixture, worker: &str) -> Vec<(String, u64)> {
    let entries: Vec<(String, HashMap<String, Bytes>)> = f
        .store
        .client
        .xrange(f.inbox(worker), "-", "+", None)
        .await
        .unwrap();
    entries
        .into_iter()
        .map(|(id, fields)| {
            let header = &fields["p"][..fields["p"].iter().position(|b| *b == b' ').unwrap()];
            let token = std::str::from_utf8(header).unwrap().parse().unwrap();
            (id, token)
        })
        .collect()
}

/// Claims `start` with recovery window `ttl`, waiting out the window.
async fn claim_after_recovery(f: &Fixture, start: &StartToRecord, ttl: Duration) -> Claimed {
    let deadline = std::time::Instant::now() + ttl * 20;
    loop {
        match f.store.claim_start(start, ttl, ttl).await {
            Ok(Claimed::Recovering) | Err(_) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the recovery window did not close"
                );
                tokio::time::sleep(ttl / 10).await;
            }
            Ok(claimed) => return claimed,
        }
    }
}

#[tokio::test]
async fn an_entry_from_before_a_rollback_is_issued_again_with_a_newer_token() {
    let mut f = fixture_mirroring(false).await;
    let ttl = Duration::from_millis(300);
    f.register("w1").await;
    f.register("w2").await;
    f.store
        .note_server(f.store.server_identity(ttl).await.unwrap());
    let older = f.admitted("k", "w1").await;
    let restored = f.entry_ids("w1").await.pop().unwrap();
    let snapshot = f.server.save_snapshot().unwrap();
    // What the rollback loses: w1 claims the job, hands it to w2 (a new
    // token), and w2 claims it. w2 runs it from then on.
    let start = f.start("k", older, "w1", &restored);
    assert_eq!(
        f.store.claim_start(&start, ttl, ttl).await.unwrap(),
        Claimed::Ok
    );
    let Handoff::Ok { token: moved } = f.handoff("k", "w1", "w2", None).await else {
        panic!("not handed to w2");
    };
    let (moved_id, _) = entry_tokens(&f, "w2").await.pop().unwrap();
    let start = f.start("k", moved, "w2", &moved_id);
    assert_eq!(
        f.store.claim_start(&start, ttl, ttl).await.unwrap(),
        Claimed::Ok
    );
    f.server.roll_back(&snapshot).unwrap();
    rollback_tests::current_run_id(&f.store).await;
    let s = &f.store;
    let start = f.start("k", older, "w1", &restored);
    assert_eq!(
        s.claim_start(&start, ttl, ttl).await.unwrap(),
        Claimed::Recovering,
        "the claim saw the restart"
    );
    s.note_server(s.server_identity(ttl).await.unwrap());
    // w2 stays out of reach past the window; w1 claims the entry Redis
    // brought back.
    assert_eq!(
        claim_after_recovery(&f, &start, ttl).await,
        Claimed::Reissued,
        "an entry from before the rollback claimed under its old token"
    );
    let entries = entry_tokens(&f, "w1").await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    let (again_id, again) = entries[0].clone();
    assert_ne!(again_id, restored, "the old entry is gone");
    assert!(
        again > moved,
        "{again} issued after the rollback, {moved} before"
    );
    let (_, record, guard) = s.job_records("k").await.unwrap();
    assert_eq!(record, None);
    let guard = guard.expect("the guard of the new entry");
    assert!(guard.starts_with(&format!("{again} ")), "{guard}");
    // The new entry is claimed as any other, and the paused copy, once it
    // re-asserts, gives way to it.
    let start = f.start("k", again, "w1", &again_id);
    assert_eq!(s.claim_start(&start, ttl, ttl).await.unwrap(), Claimed::Ok);
    let stored = s.payload("k").await.unwrap().expect("admitted");
    assert_eq!(
        s.reassert("k", "w2", moved, stored, Reassert::Running, ttl)
            .await
            .unwrap(),
        Reasserted::Lost
    );
    // An entry issued after the recovery is claimed as it is.
    let fresh = f.admitted("fresh", "w1").await;
    let id = entry_tokens(&f, "w1").await.pop().unwrap().0;
    let start = f.start("fresh", fresh, "w1", &id);
    assert_eq!(s.claim_start(&start, ttl, ttl).await.unwrap(), Claimed::Ok);
}

/// An entry that waited in its worker's backlog past its guard's
/// deadline: the stale-pending sweep removed the guard, making the job an
/// orphan for the orphan sweep to requeue with a newer token. Until that
/// requeue the entry is still the key's newest start, so its claim takes
/// the job; refused, each requeue to a worker with a long backlog could
/// lapse the same way (chaos soak seed 1449: three requeues of job-3755 in
/// 33 s, each claimed after its guard was gone and answered `superseded`;
/// the job ran nowhere until an empty restart took its only copy).
#[tokio::test]
async fn an_entry_whose_guard_lapsed_is_claimed_while_it_is_the_newest_start() {
    let f = fixture().await;
    let s = &f.store;
    f.register("w1").await;
    let token = f.admitted("k", "w1").await;
    let id = f.entry_ids("w1").await.pop().unwrap();
    // The stale-pending sweep: the guard goes, the payload stays.
    s.maps.pending_map().delete("k").await.unwrap();
    let start = f.start("k", token, "w1", &id);
    assert_eq!(s.claim_start(&start, TTL, TTL).await.unwrap(), Claimed::Ok);
    let (_, record, guard) = s.job_records("k").await.unwrap();
    assert_eq!(
        (record, guard),
        (Some(format!("w1 {token}")), None),
        "claimed under its token"
    );
}

/// The other cases of the test above: once a newer token was issued for
/// the key (the orphan sweep's requeue, a move, an end's tombstone), or
/// its payload is gone, an entry without a guard is superseded as before.
#[tokio::test]
async fn an_entry_whose_guard_lapsed_is_superseded_by_a_newer_token_or_a_gone_payload() {
    let f = fixture().await;
    let s = &f.store;
    f.register("w1").await;
    for (key, newer_token) in [("requeued", true), ("ended", false)] {
        let token = f.admitted(key, "w1").await;
        let id = f.entry_ids("w1").await.pop().unwrap();
        s.maps.pending_map().delete(key).await.unwrap();
        if newer_token {
            let _: i64 = s
                .client
                .hset(keys::fencing(&s.pool), (key, (token + 1).to_string()))
                .await
                .unwrap();
        } else {
            let _: i64 = s.client.hdel(keys::payloads(&s.pool), key).await.unwrap();
        }
        let start = f.start(key, token, "w1", &id);
        assert_eq!(
            s.claim_start(&start, TTL, TTL).await.unwrap(),
            Claimed::Superseded,
            "{key}"
        );
        assert_eq!(
            s.job_records(key).await.unwrap().1,
            None,
            "{key}: no record"
        );
    }
}
