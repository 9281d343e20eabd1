//! A start that reaches Redis after Redis lost its admission (a rollback or
//! an empty restart between the two: the client resends the start record
//! on its reconnect). The run is kept — nothing is admitted while the pool
//! recovers, so it is the only one — but its dispatcher is not told `ok`
//! unless Redis still holds the job's payload: until the run's worker
//! re-asserts it, that worker's memory is the job's only copy, and a
//! dispatch answered `Ok` then was lost with the worker's process (chaos
//! soak seed 1440: `job-2805`, a rollback 1 ms after its start, `Ok` 118 ms
//! later, the worker killed 150 ms after that; the record, without a
//! payload, then stayed with the dead worker and answered every later
//! dispatch of the key with `JobExists`).

use super::*;

/// The reply stream of node "n-test", and its lines so far.
struct Replies(String);

impl Replies {
    fn of(f: &Fixture) -> Self {
        let options = StreamOptions::default().hash_tag(&*f.store.pool);
        let stream = Stream::new(&f.store.client, &keys::node_replies("n-test"), options).unwrap();
        Self(stream.key().to_string())
    }

    async fn lines(&self, f: &Fixture) -> Vec<String> {
        let entries: Vec<(String, HashMap<String, String>)> = f
            .store
            .client
            .xrange(&self.0, "-", "+", None)
            .await
            .unwrap();
        entries
            .into_iter()
            .flat_map(|(_, fields)| fields["p"].lines().map(str::to_string).collect::<Vec<_>>())
            .collect()
    }
}

/// Redis loses `key`'s admission (its guard, and its payload unless
/// `keep_payload`) and the pool's epoch: the next script opens the
/// recovery window.
async fn lose_admission(f: &Fixture, key: &str, keep_payload: bool) {
    let s = &f.store;
    s.maps.pending_map().delete(key).await.unwrap();
    if !keep_payload {
        let _: i64 = s.client.hdel(keys::payloads(&s.pool), key).await.unwrap();
    }
    f.lose_epoch().await;
}

#[tokio::test]
async fn a_start_recorded_over_a_lost_admission_is_not_answered_ok_without_its_payload() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    let replies = Replies::of(f);
    let lost = f.admitted("lost", "w1").await;
    let kept = f.admitted("kept", "w1").await;
    let ids = f.entry_ids("w1").await;
    lose_admission(f, "lost", false).await;
    lose_admission(f, "kept", true).await;
    let answered = |start: StartToRecord, request| StartToRecord {
        reply: Some((replies.0.clone(), request)),
        ..start
    };
    let batch = [
        answered(f.start("lost", lost, "w1", &ids[0]), 31),
        answered(f.start("kept", kept, "w1", &ids[1]), 32),
    ];
    assert_eq!(
        s.record_starts(&batch, TTL).await.unwrap(),
        [StartKept::Ok, StartKept::Ok],
        "both runs are kept: nothing else is admitted while the pool recovers"
    );
    let (_, record, _) = s.job_records("lost").await.unwrap();
    assert_eq!(record, Some(format!("w1 {lost}")));
    assert_eq!(
        replies.lines(f).await,
        ["31 recovering", "32 ok"],
        "a run whose payload Redis lost is not promised to its dispatcher"
    );
}

#[tokio::test]
async fn a_claimed_start_whose_claim_went_with_redis_s_data_is_not_answered_ok() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    let replies = Replies::of(f);
    let token = f.admitted("k", "w1").await;
    let id = f.entry_ids("w1").await.pop().unwrap();
    let start = StartToRecord {
        reply: Some((replies.0.clone(), 41)),
        ..f.start("k", token, "w1", &id)
    };
    assert_eq!(s.claim_start(&start, TTL, TTL).await.unwrap(), Claimed::Ok);
    // Redis loses the claim (the record) and the payload.
    s.maps.jobs_map().delete("k").await.unwrap();
    lose_admission(f, "k", false).await;
    assert_eq!(
        s.started(&start, Answer::Ok, TTL).await.unwrap(),
        StartKept::Recovering
    );
    assert_eq!(replies.lines(f).await, ["41 recovering"]);
}

/// Once the pool has recovered, a record without a payload is a run whose
/// worker never re-asserted it: not a job that runs. A dispatch waits on
/// it (`pending`) rather than answer `JobExists`, and a cleanup of its
/// dead worker releases it (nobody holds the job's body to hand on), so a
/// later dispatch is admitted.
#[tokio::test]
async fn a_record_left_without_its_payload_is_neither_exists_nor_kept_by_a_cleanup() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    f.register("w2").await;
    let token = f.admitted("k", "w1").await;
    s.maps.pending_map().delete("k").await.unwrap();
    s.maps
        .jobs_map()
        .set("k", &format!("w1 {token}"))
        .await
        .unwrap();
    let _: i64 = s.client.hdel(keys::payloads(&s.pool), "k").await.unwrap();
    assert_eq!(
        f.admit(&f.limits(), f.admission("k", "w2", 2)).await,
        Admitted::Pending
    );
    // w1's owner moves it (a close): the record stays, as w1 holds the body.
    assert_eq!(f.handoff("k", "w1", "w2", None).await, Handoff::NoPayload);
    assert!(s.job_records("k").await.unwrap().1.is_some());
    // A cleaner of a dead w1: nobody holds the body; the record goes.
    s.maps.cleanup.set("w1", "n-test 1000").await.unwrap();
    assert_eq!(
        f.handoff("k", "w1", "w2", Some("n-test")).await,
        Handoff::NoPayload
    );
    assert_eq!(s.job_records("k").await.unwrap().1, None, "released");
    assert!(matches!(
        f.admit(&f.limits(), f.admission("k", "w2", 3)).await,
        Admitted::Ok { .. }
    ));
}

/// A start that reaches Redis after a rollback lost its admission, when a
/// stop of a newer run of the key was made to stand again since
/// (`stop_stands.lua` raises the key's counter past the stopped token).
/// The recovery branch above kept the run and wrote its record; the
/// worker, whose lease had lapsed meanwhile, then resumed the job over the
/// stop. Chaos soak seed 1439 (`0be2f16`, job-0337): a fresh start 42 ms
/// before its process was cut off, the run handed back elsewhere and
/// stopped on request there, Redis rolled back to the cut's start; the
/// stop stood again at 55.770, the client resent the start record after
/// the cut healed, and the job resumed at 56.988. A newer token issued
/// since the start supersedes it, as in a re-assertion.
#[tokio::test]
async fn a_start_resent_after_a_newer_stop_stood_again_is_superseded() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    let replies = Replies::of(f);
    let token = f.admitted("k", "w1").await;
    let id = f.entry_ids("w1").await.pop().unwrap();
    lose_admission(f, "k", true).await;
    // The stop of a newer run of the key (on another worker), made to
    // stand again by its node's recovery.
    assert_eq!(
        s.stop_stands("k", token + 1_000).await.unwrap(),
        StopStands::Removed
    );
    let start = StartToRecord {
        reply: Some((replies.0.clone(), 51)),
        ..f.start("k", token, "w1", &id)
    };
    assert_eq!(
        s.record_starts(&[start], TTL).await.unwrap(),
        [StartKept::Superseded],
        "a start older than a stop that stands"
    );
    let (_, record, guard) = s.job_records("k").await.unwrap();
    assert_eq!((record, guard), (None, None), "nothing of the run recorded");
    assert_eq!(replies.lines(f).await, ["51 superseded"]);
}

/// Admits `admission` once the pool's recovery window has ended; the
/// answer.
async fn admitted_after_recovery(
    f: &Fixture,
    limits: &AdmitLimits,
    admission: Admission,
) -> Admitted {
    let answer = std::sync::Mutex::new(Admitted::Recovering);
    flotilla_testkit::wait_until(Duration::from_secs(10), "the window ends", || async {
        let admitted = f.admit(limits, admission.clone()).await;
        *answer.lock().unwrap() = admitted;
        admitted != Admitted::Recovering
    })
    .await
    .unwrap();
    answer.into_inner().unwrap()
}

/// `key` admitted at w1 (registered here), its admission and payload lost,
/// then its start recorded over the loss with a window of `ttl` and
/// answered `recovering` to request `request`; the run's token.
async fn started_through_a_loss(f: &Fixture, key: &str, request: u64, ttl: Duration) -> u64 {
    f.register("w1").await;
    let replies = Replies::of(f);
    let token = f.admitted(key, "w1").await;
    let id = f.entry_ids("w1").await.pop().unwrap();
    lose_admission(f, key, false).await;
    let start = StartToRecord {
        reply: Some((replies.0.clone(), request)),
        ..f.start(key, token, "w1", &id)
    };
    assert_eq!(
        f.store.record_starts(&[start], ttl).await.unwrap(),
        [StartKept::Ok]
    );
    assert_eq!(replies.lines(f).await, [format!("{request} recovering")]);
    token
}

/// A dispatch told `recovering` (its admission lost, its run kept) admits
/// again once the pool has recovered, for the case its run's worker died
/// before re-asserting it. When that run has ended meanwhile (finished,
/// failed for good, stopped), the end left a token above it and the
/// admission of the same dispatch answers `ended`: the job started, and
/// starting it again would undo its end. Chaos soak seed 1446 (`b081e71`,
/// job-1522): a rollback 40 ms after the start, the start recorded over it
/// and answered `recovering`, the run's finish recorded 180 ms later; the
/// dispatch admitted the key again after the recovery and the finished job
/// ran again.
#[tokio::test]
async fn a_dispatch_told_recovering_is_not_admitted_again_once_its_run_ended() {
    let f = &fixture().await;
    let s = &f.store;
    let ttl = Duration::from_millis(300);
    let token = started_through_a_loss(f, "k", 61, ttl).await;
    // The run finishes while the pool recovers.
    assert!(matches!(
        s.record_job_end("k", "w1", token, EndArgs::Finished, false, ttl)
            .await
            .unwrap(),
        EndRecorded::Finished { .. }
    ));
    let limits = AdmitLimits {
        worker_ttl: ttl,
        ..f.limits()
    };
    let again = Admission {
        started: Some(token),
        ..f.admission("k", "w1", 62)
    };
    assert_eq!(
        admitted_after_recovery(f, &limits, again).await,
        Admitted::Ended,
        "the dispatch's own run ended: not started again"
    );
    let (_, record, guard) = s.job_records("k").await.unwrap();
    let payload: Option<String> = s.client.hget(keys::payloads(&s.pool), "k").await.unwrap();
    assert_eq!(
        (payload, record, guard),
        (None, None, None),
        "nothing admitted"
    );
    // Another dispatch, which started no run, is admitted.
    assert!(matches!(
        f.admit(&limits, f.admission("k", "w1", 63)).await,
        Admitted::Ok { .. }
    ));
}

/// The other case of the test above: the run's worker died before it
/// re-asserted the run, and a cleanup released the record it left without
/// a payload. No token came after the run, so the dispatch that started
/// it is admitted again: the job would be lost otherwise.
#[tokio::test]
async fn a_dispatch_told_recovering_is_admitted_again_when_its_run_was_lost() {
    let f = &fixture().await;
    let s = &f.store;
    let ttl = Duration::from_millis(300);
    let token = started_through_a_loss(f, "k", 71, ttl).await;
    // w1 dies before it re-asserts the run; w2 registers again after the
    // loss. Once the pool has recovered, a cleaner of w1 releases the
    // record (nobody holds the body).
    f.register("w2").await;
    s.maps.cleanup.set("w1", "n-test 1000").await.unwrap();
    flotilla_testkit::wait_until(
        Duration::from_secs(10),
        "the cleanup's hand-off",
        || async { f.handoff("k", "w1", "w2", Some("n-test")).await != Handoff::Recovering },
    )
    .await
    .unwrap();
    assert_eq!(s.job_records("k").await.unwrap().1, None, "released");
    let limits = AdmitLimits {
        worker_ttl: ttl,
        ..f.limits()
    };
    let again = Admission {
        started: Some(token),
        ..f.admission("k", "w2", 72)
    };
    assert!(
        matches!(
            admitted_after_recovery(f, &limits, again).await,
            Admitted::Ok { .. }
        ),
        "the lost run's dispatch admits the job again"
    );
}

/// A run's end leaves a token above the run's own even when Redis's
/// counter and clock are both below it (the clock stepped back since the
/// run's token was issued, and a rollback took the counter back): a
/// dispatch waiting on the run, and a copy of it cut off meanwhile, must
/// find the end above the run.
#[tokio::test]
async fn a_run_s_end_leaves_a_token_above_the_run_s_own() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    let token = f.admitted("k", "w1").await;
    let ahead = token + 3_600_000_000;
    s.maps.pending_map().delete("k").await.unwrap();
    s.maps
        .jobs_map()
        .set("k", &format!("w1 {ahead}"))
        .await
        .unwrap();
    assert!(matches!(
        s.record_job_end("k", "w1", ahead, EndArgs::Finished, false, TTL)
            .await
            .unwrap(),
        EndRecorded::Finished { .. }
    ));
    let tombstone: u64 = s.client.hget(keys::fencing(&s.pool), "k").await.unwrap();
    assert!(tombstone > ahead, "{tombstone} is not above {ahead}");
}
