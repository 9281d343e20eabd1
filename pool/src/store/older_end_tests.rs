//! A run of an *older* dispatch that a cleanup moves after Redis went back
//! in time takes a token from the clock, above the run of a *newer*
//! dispatch whose admission the rollback took and whose worker holds it
//! (suspended on its lease loss). When the older dispatch's run then ends
//! (its stop made to stand, its own finish), Redis shows a newer token and
//! no payload: that must not pass for the end of the held dispatch, whose
//! worker holds its only copy (chaos soak seed 1645, chaos CI seed 7:
//! `job-0009` given up, then admitted again with no stop between).

use fred::prelude::HashesInterface;

use super::lifecycle::EndArgs;
use super::*;

const KEY: &str = "k";

/// Dispatch A of `KEY` runs on "w1"; Redis lost dispatch B, newer, which
/// "w1" holds suspended under token `b` (B's admission stamp). A is moved
/// to "w3" with a token from the clock, above `b`, and starts there.
/// Returns (A's admission stamp, B's stamp, B's stored payload, the moved
/// run's token).
async fn older_moved_over_newer_held(f: &Fixture) -> (u64, u64, Bytes, u64) {
    let (a, b, held, moved) = older_handed_over_newer_held(f).await;
    let start = older_start(f, moved, a).await;
    assert_eq!(
        f.store.claim_start(&start, TTL, TTL).await.unwrap(),
        Claimed::Ok
    );
    (a, b, held, moved)
}

/// [`older_moved_over_newer_held`] up to A's hand-off: its start entry on
/// "w3" is not claimed yet (a pending guard).
async fn older_handed_over_newer_held(f: &Fixture) -> (u64, u64, Bytes, u64) {
    f.register("w1").await;
    f.register("w3").await;
    let a = f.running(KEY, "w1").await;
    let b = a + 500;
    let held = codec::stored(b, &body(KEY));
    tokio::time::sleep(Duration::from_millis(5)).await;
    let moved = match f.handoff(KEY, "w1", "w3", None).await {
        Handoff::Ok { token } => token,
        other => panic!("not moved: {other:?}"),
    };
    assert!(moved > b, "a token from the clock: {moved} over {b}");
    (a, b, held, moved)
}

/// The start of A's moved run (token `moved`) in "w3"'s inbox.
async fn older_start(f: &Fixture, moved: u64, a: u64) -> StartToRecord {
    let id = f.entry_ids("w3").await.pop().unwrap();
    let mut start = f.start(KEY, moved, "w3", &id);
    start.admitted = a;
    start
}

/// "w3" stops the moved run of A, for dispatch `dispatch` (`None`: a stop
/// of the whole key).
async fn stop_on_w3(f: &Fixture, moved: u64, dispatch: Option<u64>) {
    let inbox = f.inbox("w3");
    let stopped = f
        .store
        .stopped(StopDone {
            key: KEY,
            worker: "w3",
            inbox: &inbox,
            entry_id: "0-1",
            reply: None,
            held: Some(moved),
            worker_ttl: TTL,
            target: Some(moved),
            kept: None,
            held_past_lease: false,
            dispatch,
        })
        .await
        .unwrap();
    assert_eq!(stopped, Stopped::Ok);
}

/// `KEY`'s dispatch-over mark: every dispatch admitted at or before it
/// is over.
async fn dispatch_over_mark(f: &Fixture) -> u64 {
    let field = format!("{}{KEY}", keys::ENDED_FIELD_PREFIX);
    f.store
        .client
        .hget(keys::fencing(&f.store.pool), field)
        .await
        .unwrap()
}

/// "w1" re-asserts its held copy of B.
async fn held_reasserts(f: &Fixture, b: u64, held: &Bytes) -> Reasserted {
    f.store
        .reassert(KEY, "w1", b, held.clone(), Reassert::Suspended, TTL)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_held_newer_dispatch_outlives_the_end_of_an_older_ones_moved_run() {
    let f = &fixture().await;
    let s = &f.store;
    let (a, b, held, moved) = older_moved_over_newer_held(f).await;
    // A's stop made to stand again reaches its moved run: a stop of that
    // one dispatch, whose tombstone is from the clock.
    stop_on_w3(f, moved, Some(a)).await;
    let counter: u64 = s.client.hget(keys::fencing(&s.pool), KEY).await.unwrap();
    assert!(counter > b, "a tombstone from the clock: {counter}");
    assert_eq!(dispatch_over_mark(f).await, a, "A's end, and no other");
    assert_eq!(
        held_reasserts(f, b, &held).await,
        Reasserted::Ok,
        "B was never stopped"
    );
    assert_eq!(s.payload(KEY).await.unwrap(), Some(held), "B's payload");
    let (_, record, _) = s.job_records(KEY).await.unwrap();
    assert_eq!(record.as_deref(), Some(format!("w1 {b}").as_str()));
}

#[tokio::test]
async fn a_held_newer_dispatch_outlives_an_older_ones_finish() {
    let f = &fixture().await;
    let s = &f.store;
    let (_, b, held, moved) = older_moved_over_newer_held(f).await;
    let ended = s
        .record_job_end(KEY, "w3", moved, EndArgs::Finished, false, TTL)
        .await
        .unwrap();
    assert!(matches!(ended, EndRecorded::Finished { .. }), "{ended:?}");
    assert_eq!(held_reasserts(f, b, &held).await, Reasserted::Ok);
}

/// A stop of the whole key (`stop_job`) after the newer admission ends
/// every dispatch, and so does the newer dispatch's own end made to stand
/// again (its token is above its admission): the held copy is given up.
#[tokio::test]
async fn a_stop_of_the_key_or_the_newer_dispatchs_own_end_still_ends_it() {
    let f = &fixture().await;
    let (_, b, held, moved) = older_moved_over_newer_held(f).await;
    stop_on_w3(f, moved, None).await;
    assert_eq!(held_reasserts(f, b, &held).await, Reasserted::Lost);

    let f = &fixture().await;
    let (a, b, held, moved) = older_moved_over_newer_held(f).await;
    stop_on_w3(f, moved, Some(a)).await;
    f.store
        .stop_stands_batch(&[(KEY, b + 10)], StopKind::Dispatch)
        .await
        .unwrap();
    assert_eq!(held_reasserts(f, b, &held).await, Reasserted::Lost);
}

/// The other order: the held copy re-asserts while the older dispatch's
/// moved run still goes on (given up, remembered as passed on, and waiting
/// in Redis for that run's end), and that run ends after. The remembered
/// copy is then not settled as ended, and its give-back finds it back.
#[tokio::test]
async fn a_held_newer_dispatch_given_way_to_an_older_ones_run_is_given_back() {
    let f = &fixture().await;
    let s = &f.store;
    let (a, b, held, moved) = older_moved_over_newer_held(f).await;
    assert_eq!(
        held_reasserts(f, b, &held).await,
        Reasserted::Superseded(a),
        "a record of a newer token, of an older dispatch"
    );
    stop_on_w3(f, moved, Some(a)).await;
    let asked = [(KEY.to_string(), b + 1, b)];
    let answer = s.handoffs_ended(&asked).await.unwrap();
    assert!(answer.ended.is_empty(), "{:?}", answer.ended);
    assert!(answer.passed.is_empty(), "{:?}", answer.passed);
    assert_eq!(answer.waiting, [(0, b)], "its payload, waiting to start");
    assert_eq!(
        s.handoff_stands(KEY, b + 1, held.clone()).await.unwrap(),
        HandoffStands::Current,
        "the older run's tombstone is above it; its payload stays"
    );
    assert_eq!(s.payload(KEY).await.unwrap(), Some(held));

    // A stop of the key instead: ended, and not given back.
    let f = &fixture().await;
    let s = &f.store;
    let (_, b, held, moved) = older_moved_over_newer_held(f).await;
    stop_on_w3(f, moved, None).await;
    let answer = s
        .handoffs_ended(&[(KEY.to_string(), b + 1, b)])
        .await
        .unwrap();
    assert_eq!(answer.ended.len(), 1, "{answer:?}");
    assert!(answer.passed.is_empty());
    assert_eq!(
        s.handoff_stands(KEY, b + 1, held).await.unwrap(),
        HandoffStands::Current
    );
}

/// Made to stand again after another rollback, the stop of the older
/// dispatch's moved run ends that dispatch alone: the newer dispatch's
/// record and payload, back under its own older token, stay. As a stop of
/// the key (no dispatch named) it ends every dispatch admitted before it,
/// the newer one too (stopped again through its worker: `Undone`).
#[tokio::test]
async fn the_older_dispatchs_stop_made_to_stand_leaves_the_newer_one() {
    let f = &fixture().await;
    let s = &f.store;
    let (a, b, held, moved) = older_moved_over_newer_held(f).await;
    stop_on_w3(f, moved, Some(a)).await;
    assert_eq!(
        s.reassert(KEY, "w1", b, held.clone(), Reassert::Running, TTL)
            .await
            .unwrap(),
        Reasserted::Ok
    );
    let statuses = s
        .stops_stand_yielding(&[(KEY, moved, a)], StopKind::Dispatch, false)
        .await
        .unwrap();
    assert_eq!(statuses, [StopStands::Newer]);
    let (_, record, _) = s.job_records(KEY).await.unwrap();
    assert_eq!(record.as_deref(), Some(format!("w1 {b}").as_str()));
    assert_eq!(s.payload(KEY).await.unwrap(), Some(held));

    let statuses = s
        .stops_stand_yielding(&[(KEY, moved, 0)], StopKind::Dispatch, false)
        .await
        .unwrap();
    // Its record is gone; the payload, above the counter's tombstone's
    // reach, stays for the node to stop the dispatch through its worker.
    assert_eq!(statuses, [StopStands::Undone(b)], "a stop of the key");
    assert_eq!(
        dispatch_over_mark(f).await,
        moved,
        "every dispatch admitted before the stop is over"
    );
}

/// Admits `KEY` again at "w1": what a dispatch of it is answered.
async fn dispatched_again(f: &Fixture) -> Admitted {
    f.admit(&f.limits(), f.admission(KEY, "w1", 77)).await
}

/// The held copy re-asserts while the older dispatch's moved run still
/// goes on (chaos_short_scheduled_jobs seed 45, `sched-19`: a finished
/// dispatch's run brought back by a rollback and moved by a cleanup): that
/// dispatch is marked over, and the held one waits in Redis for the run's
/// end and takes its place as it ends, whether stopped as one dispatch or
/// finished. The key is never unknown in between, so a dispatch of it is
/// not admitted again; a stop of the whole key ends the held one too.
#[tokio::test]
async fn a_held_newer_dispatch_takes_the_place_of_an_older_ones_run_as_it_ends() {
    for end in ["stop of one dispatch", "finish", "stop of the key"] {
        let f = &fixture().await;
        let s = &f.store;
        let (a, b, held, moved) = older_moved_over_newer_held(f).await;
        assert_eq!(
            held_reasserts(f, b, &held).await,
            Reasserted::Superseded(a),
            "{end}"
        );
        assert_eq!(dispatch_over_mark(f).await, a, "{end}: A is over");
        assert_eq!(dispatched_again(f).await, Admitted::Exists, "{end}");
        match end {
            "stop of one dispatch" => stop_on_w3(f, moved, Some(a)).await,
            "finish" => {
                let ended = s
                    .record_job_end(KEY, "w3", moved, EndArgs::Finished, false, TTL)
                    .await
                    .unwrap();
                assert!(matches!(ended, EndRecorded::Finished { .. }), "{ended:?}");
            }
            _ => stop_on_w3(f, moved, None).await,
        }
        if end == "stop of the key" {
            assert_eq!(s.payload(KEY).await.unwrap(), None, "{end}");
            continue;
        }
        assert_eq!(s.payload(KEY).await.unwrap(), Some(held.clone()), "{end}");
        assert_eq!(dispatched_again(f).await, Admitted::Pending, "{end}");
        let (_, record, guard) = s.job_records(KEY).await.unwrap();
        assert_eq!(
            (record, guard),
            (None, None),
            "{end}: an orphan for the sweep"
        );
    }
}

/// The same over the older dispatch's start not claimed yet (its pending
/// guard): the claim ends that dispatch instead of running it, and the
/// held one takes its place.
#[tokio::test]
async fn a_held_newer_dispatch_takes_the_place_of_an_older_ones_start() {
    let f = &fixture().await;
    let s = &f.store;
    let (a, b, held, moved) = older_handed_over_newer_held(f).await;
    assert_eq!(held_reasserts(f, b, &held).await, Reasserted::Superseded(a));
    assert_eq!(dispatched_again(f).await, Admitted::Pending);
    let start = older_start(f, moved, a).await;
    assert_eq!(
        s.claim_start(&start, TTL, TTL).await.unwrap(),
        Claimed::Superseded
    );
    assert_eq!(s.payload(KEY).await.unwrap(), Some(held));
    assert_eq!(dispatched_again(f).await, Admitted::Pending);
}

/// A stop of the held dispatch alone (one undone and asked again) while
/// it waits for the older run's end: it ends there, and does not take that
/// run's place when the run ends.
#[tokio::test]
async fn a_stop_of_the_waiting_dispatch_ends_it_where_it_waits() {
    let f = &fixture().await;
    let s = &f.store;
    let (a, b, held, moved) = older_moved_over_newer_held(f).await;
    assert_eq!(held_reasserts(f, b, &held).await, Reasserted::Superseded(a));
    let inbox = f.inbox("w3");
    let request = OwnerRequest {
        owner: "w3",
        owner_inbox: &inbox,
        event: "stop",
        dispatch: Some(b),
        server_floor_ms: None,
        leader: None,
    };
    let routed = s
        .to_owner_of(KEY, request, Bytes::new(), TTL)
        .await
        .unwrap();
    assert_eq!(routed, Routed::NotFound(None));
    assert_eq!(dispatch_over_mark(f).await, b, "the held dispatch is over");
    stop_on_w3(f, moved, Some(a)).await;
    assert_eq!(s.payload(KEY).await.unwrap(), None, "not put in place");
}

/// Redis goes back again, to before the held copy's re-assertion: the
/// older dispatch's run is recorded again and nothing waits for its end.
/// The copy remembered as passed on, given back, waits again (given back
/// only where nothing of the key was left, it found the older run's record
/// and stayed out of Redis until a settle round after that run's end).
#[tokio::test]
async fn a_given_back_newer_dispatch_waits_again_for_the_older_ones_run() {
    let f = &fixture().await;
    let s = &f.store;
    let (a, b, held, moved) = older_moved_over_newer_held(f).await;
    assert_eq!(held_reasserts(f, b, &held).await, Reasserted::Superseded(a));
    let waiting = format!("{}{KEY}", keys::WAITING_FIELD_PREFIX);
    let fencing = keys::fencing(&s.pool);
    let _: i64 = s.client.hdel(&fencing, &waiting).await.unwrap();
    assert_eq!(
        s.handoff_stands(KEY, b + 1, held.clone()).await.unwrap(),
        HandoffStands::Superseded(a)
    );
    stop_on_w3(f, moved, Some(a)).await;
    assert_eq!(s.payload(KEY).await.unwrap(), Some(held));
    assert_eq!(dispatched_again(f).await, Admitted::Pending);
}
