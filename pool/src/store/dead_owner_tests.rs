//! `to_owner.lua`'s stop of a run on a worker Redis judges dead: carried
//! out in Redis, as a cleanup would judge the worker; not while the pool
//! recovers. A stop of one dispatch also ends a start of it no worker
//! claimed yet, and leaves newer runs their place.

use super::*;

/// Makes `worker`'s keep-alive older than a TTL by the server's clock.
async fn silence(f: &Fixture, worker: &str) -> u64 {
    let s = &f.store;
    let now = s.server_time_ms().await.unwrap();
    let last = now - TTL.as_millis() as u64 - 1_000;
    let hash = s.maps.keepalive.keys_info().hash.clone();
    let _: i64 = s.client.hset(&hash, (worker, last)).await.unwrap();
    last
}

/// A stop of `key` at `owner`, for one dispatch or any, judged with the
/// caller's server time floor `floor_ms`.
async fn stop(
    f: &Fixture,
    key: &str,
    owner: &str,
    dispatch: Option<u64>,
    floor_ms: Option<u64>,
) -> Routed {
    let request = OwnerRequest {
        owner,
        owner_inbox: &f.inbox(owner),
        event: "stop",
        dispatch,
        server_floor_ms: floor_ms,
        leader: None,
    };
    f.store
        .to_owner_of(key, request, body(key), TTL)
        .await
        .unwrap()
}

/// Whether Redis holds a record, guard or payload of `key`.
async fn held(f: &Fixture, key: &str) -> bool {
    let (_, record, guard) = f.store.job_records(key).await.unwrap();
    let payload: Option<Bytes> = f
        .store
        .client
        .hget(f.store.maps.payloads_key(), key)
        .await
        .unwrap();
    record.is_some() || guard.is_some() || payload.is_some()
}

#[tokio::test]
async fn a_stop_of_a_run_on_a_dead_worker_is_carried_out_in_redis() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("dead").await;
    f.register("live").await;
    let run = f.running("j-dead", "dead").await;
    f.running("j-note", "dead").await;
    f.running("j-live", "live").await;
    let last = silence(f, "dead").await;

    // A caller whose clock says the server's cannot be that far on yet (a
    // step of the server's clock) does not judge the worker dead.
    let floor = last + TTL.as_millis() as u64 - 500;
    assert_eq!(
        stop(f, "j-dead", "dead", None, Some(floor)).await,
        Routed::Queued
    );
    let Routed::Stopped(tombstone) = stop(f, "j-dead", "dead", None, None).await else {
        panic!("the stop of a run on a dead worker was not carried out");
    };
    assert!(tombstone > run, "tombstone {tombstone} above run {run}");
    assert!(
        !held(f, "j-dead").await,
        "the stopped run is still in Redis"
    );
    // The dead worker's copy cannot come back over the stop.
    let stored = codec::stored(0, &body("j-dead"));
    assert_eq!(
        s.reassert("j-dead", "dead", run, stored, Reassert::Running, TTL)
            .await
            .unwrap(),
        Reasserted::Lost
    );
    // A live worker's run is reached through its inbox, as before; a
    // notify of a dead worker's run too (nothing is carried out for it).
    assert_eq!(stop(f, "j-live", "live", None, None).await, Routed::Queued);
    assert!(held(f, "j-live").await);
    assert_eq!(
        s.to_owner(
            "j-note",
            "dead",
            &f.inbox("dead"),
            "notify",
            body("j-note"),
            TTL
        )
        .await
        .unwrap(),
        Routed::Queued
    );
    assert!(held(f, "j-note").await);
}

#[tokio::test]
async fn while_the_pool_recovers_a_dead_looking_run_is_not_taken() {
    let f = &fixture().await;
    f.register("quiet").await;
    f.register("holder").await;
    f.running("j-any", "quiet").await;
    let stopped_run = f.running("j-one", "quiet").await;
    let dispatch = f.admission_stamp("j-one").await;
    silence(f, "quiet").await;
    f.lose_epoch().await;

    // A keep-alive brought back from an older state looks stale while its
    // worker lives, and the record may be older than a run that has not
    // re-asserted yet: neither a stop `stop_job` asked for nor a stop of
    // one dispatch (answered before, undone) takes the run, and neither
    // is queued at a worker that may never read it; both ask again.
    let before = f.entry_ids("quiet").await.len();
    assert_eq!(stop(f, "j-any", "quiet", None, None).await, Routed::Pending);
    assert_eq!(
        stop(f, "j-one", "quiet", Some(dispatch), None).await,
        Routed::Pending
    );
    assert!(held(f, "j-any").await && held(f, "j-one").await);
    assert_eq!(
        f.entry_ids("quiet").await.len(),
        before,
        "a stop was queued"
    );
    // A newer dispatch's run, held by a worker that has not re-asserted it
    // yet, keeps its place (chaos soak seed 1591 on `b0c8145`: a stop of
    // the older dispatch ended while the pool recovered, with a tombstone
    // from the clock, refused 14 such runs).
    let newer = stopped_run + 1_000;
    let stored = codec::stored(newer, &body("j-one"));
    assert_eq!(
        f.store
            .reassert("j-one", "holder", newer, stored, Reassert::Running, TTL)
            .await
            .unwrap(),
        Reasserted::Ok,
        "the newer dispatch's run was refused"
    );
}

#[tokio::test]
async fn a_stop_of_one_dispatch_on_a_dead_worker_leaves_newer_runs_their_place() {
    let f = &fixture().await;
    f.register("dead").await;
    f.register("holder").await;
    let stopped_run = f.running("j", "dead").await;
    let dispatch = f.admission_stamp("j").await;
    silence(f, "dead").await;
    let Routed::Stopped(tombstone) = stop(f, "j", "dead", Some(dispatch), None).await else {
        panic!("the stop of one dispatch on a dead worker was not carried out");
    };
    assert_eq!(tombstone, stopped_run + 1, "a tombstone just above the run");
    assert!(!held(f, "j").await);
    // The stopped run cannot come back; a newer dispatch's run, not
    // re-asserted yet when the stop was carried out, can.
    let again = |token: u64| async move {
        let stored = codec::stored(token, &body("j"));
        f.store
            .reassert("j", "holder", token, stored, Reassert::Running, TTL)
            .await
            .unwrap()
    };
    assert_eq!(again(stopped_run).await, Reasserted::Lost);
    assert_eq!(again(stopped_run + 1_000).await, Reasserted::Ok);
}

#[tokio::test]
async fn a_stop_of_one_dispatch_takes_its_start_before_any_worker_claims_it() {
    let f = &fixture().await;
    f.register("w").await;
    let token = f.admitted("j", "w").await;
    let dispatch = f.admission_stamp("j").await;
    // A stop `stop_job` asked for waits for the start; a stop of the
    // dispatch (answered before, undone) ends it here.
    assert_eq!(stop(f, "j", "w", None, None).await, Routed::Pending);
    let Routed::Stopped(tombstone) = stop(f, "j", "w", Some(dispatch), None).await else {
        panic!("the unclaimed start of a stopped dispatch was not ended");
    };
    assert!(tombstone > token);
    assert!(
        !held(f, "j").await,
        "the stopped dispatch is still in Redis"
    );
    // The worker's claim of the start is refused.
    let id = f.entry_ids("w").await.pop().unwrap();
    let claimed = f
        .store
        .claim_start(&f.start("j", token, "w", &id), TTL, TTL)
        .await
        .unwrap();
    assert_ne!(
        claimed,
        Claimed::Ok,
        "the start of a stopped dispatch was claimed"
    );
}
