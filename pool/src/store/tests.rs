//! Every status of every pool script, against a real Redis, through
//! [`PoolStore`] alone: no node, no worker task; the state each status
//! needs is made by the scripts themselves where they can make it.

use std::collections::HashMap;
use std::time::Duration;

use flotilla_streaming::{Stream, StreamOptions};
use flotilla_testkit::RedisServer;
use fred::prelude::{HashesInterface, StreamsInterface};

use super::jobs::Stopped;
use super::lifecycle::{EndArgs, EndRecorded};
use super::workers::{Recovery, Released};
use super::*;
use crate::codec::{self, JobBody};

/// Worker TTL, pending TTL and recovery window of every call.
const TTL: Duration = Duration::from_secs(60);
const INFO: &str = r#"{"node":"n-test","host":"h","pid":1}"#;

struct Fixture {
    server: RedisServer,
    store: PoolStore,
}

async fn fixture() -> Fixture {
    fixture_mirroring(true).await
}

/// A store on a private server, mirroring the jobs maps or not.
async fn fixture_mirroring(mirror_jobs: bool) -> Fixture {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let pool = flotilla_testkit::unique_name("store");
    let store = PoolStore::join(&client, &pool, Duration::from_secs(10), mirror_jobs)
        .await
        .unwrap();
    assert!(!store.create_epoch(TTL).await.unwrap(), "a new pool");
    Fixture { server, store }
}

impl Fixture {
    fn inbox(&self, worker: &str) -> String {
        let options = StreamOptions::default().hash_tag(&*self.store.pool);
        Stream::new(&self.store.client, &keys::worker_inbox(worker), options)
            .unwrap()
            .key()
            .to_string()
    }

    /// Ids of the entries of `worker`'s inbox, oldest first.
    async fn entry_ids(&self, worker: &str) -> Vec<String> {
        let entries: Vec<(String, HashMap<String, Bytes>)> = self
            .store
            .client
            .xrange(self.inbox(worker), "-", "+", None)
            .await
            .unwrap();
        entries.into_iter().map(|(id, _)| id).collect()
    }

    /// The admission stamp of `key`'s stored payload (its dispatch).
    async fn admission_stamp(&self, key: &str) -> u64 {
        let stored = self.store.payload(key).await.unwrap().expect("a payload");
        let head = stored.split(|b| *b == b' ').next().unwrap();
        std::str::from_utf8(head).unwrap().parse().unwrap()
    }

    async fn register(&self, worker: &str) -> Option<u64> {
        self.store.register(worker, INFO).await.unwrap()
    }

    fn limits(&self) -> AdmitLimits {
        AdmitLimits {
            node: "n-test".into(),
            max_queued: 0,
            pending_ttl: TTL,
            worker_ttl: TTL,
        }
    }

    fn admission(&self, key: &str, owner: &str, request: u64) -> Admission {
        Admission {
            key: key.to_string(),
            body: body(key),
            owner: owner.to_string(),
            inbox: self.inbox(owner),
            request,
            window: None,
            schedule: None,
            started: None,
        }
    }

    async fn admit(&self, limits: &AdmitLimits, admission: Admission) -> Admitted {
        self.store.admit(limits, &[admission]).await.unwrap()[0]
    }

    /// Admits `key` at `owner`; its token.
    async fn admitted(&self, key: &str, owner: &str) -> u64 {
        match self
            .admit(&self.limits(), self.admission(key, owner, 1))
            .await
        {
            Admitted::Ok { token } => token,
            other => panic!("{key} not admitted: {other:?}"),
        }
    }

    /// Admits `key` at `worker` and claims its start there: a running
    /// job; its run's token.
    async fn running(&self, key: &str, worker: &str) -> u64 {
        let token = self.admitted(key, worker).await;
        let id = self.entry_ids(worker).await.pop().unwrap();
        assert_eq!(
            self.store
                .claim_start(&self.start(key, token, worker, &id), TTL, TTL)
                .await
                .unwrap(),
            Claimed::Ok
        );
        token
    }

    fn start(&self, key: &str, token: u64, worker: &str, entry_id: &str) -> StartToRecord {
        StartToRecord {
            key: key.to_string(),
            token,
            worker: worker.to_string(),
            inbox: self.inbox(worker),
            entry_id: entry_id.to_string(),
            reply: None,
            // An admission's start: its token is the admission stamp.
            admitted: token,
        }
    }

    /// An orphan: a payload with neither owner nor pending dispatch.
    async fn orphan(&self, key: &str, worker: &str) {
        self.admitted(key, worker).await;
        self.store.maps.pending_map().delete(key).await.unwrap();
    }

    /// `handoff.lua` of `key` from `from` (`"-"`: an orphan) to `to`, by a
    /// cleanup on node `cleaner` or (`None`) not.
    async fn handoff(&self, key: &str, from: &str, to: &str, cleaner: Option<&str>) -> Handoff {
        let inbox = self.inbox(to);
        let to = Receiver {
            worker: to,
            inbox: &inbox,
            floor_ms: None,
        };
        let ttl = TTL;
        self.store
            .handoff(key, from, to, ttl, ttl, Mover::owner_or(cleaner))
            .await
            .unwrap()
            .0
    }

    /// Moves entry `id` of `from`'s inbox to `to`'s.
    async fn move_entry(&self, id: &str, from: &str, to: &str) -> Moved {
        self.move_entry_judged(id, from, to, None).await
    }

    /// [`move_entry`](Self::move_entry) by a caller whose own clock bounds
    /// server time at `floor_ms`.
    async fn move_entry_judged(
        &self,
        id: &str,
        from: &str,
        to: &str,
        floor_ms: Option<u64>,
    ) -> Moved {
        let (from_inbox, to_inbox) = (self.inbox(from), self.inbox(to));
        let entry = EntryMove {
            from,
            from_inbox: &from_inbox,
            to,
            to_inbox: &to_inbox,
            id,
            name: "notify",
            payload: body("j1"),
            requeue: Requeue::default(),
            worker_ttl: TTL,
            pending_ttl: TTL,
            floor_ms,
        };
        self.store.move_entry(entry).await.unwrap()
    }

    /// Redis goes back to a state older than the node has seen: the node's
    /// replica has seen the keep-alive map's revision, which is then set
    /// one lower (a rollback no node has noticed yet).
    async fn go_back_before_seen(&self) {
        let s = &self.store;
        let revision_key = s.maps.keepalive_revision_key();
        let seen: u64 = s.client.get(&revision_key).await.unwrap();
        s.maps
            .keepalive
            .wait_for(Duration::from_secs(10), |m| m.revision_high_water() >= seen)
            .await
            .expect("the replica saw the revision");
        let _: () = s
            .client
            .set(&revision_key, seen - 1, None, None, false)
            .await
            .unwrap();
    }

    /// Redis loses the pool's epoch: the next script opens the recovery
    /// window.
    async fn lose_epoch(&self) {
        let _: i64 = self
            .store
            .client
            .hdel(keys::fencing(&self.store.pool), keys::EPOCH_FIELD)
            .await
            .unwrap();
    }
}

fn body(key: &str) -> Bytes {
    codec::encode(&JobBody {
        key: key.to_string(),
        payload: b"p".to_vec(),
        restart: None,
    })
}

#[tokio::test]
async fn admit_unmark_and_schedule_forget_answer_each_status() {
    let f = &fixture().await;
    let s = &f.store;
    assert!(
        f.register("w1").await.is_some(),
        "registered on server time"
    );
    let limits = f.limits();
    let first = f.admission("a1", "w1", 1);
    let Admitted::Ok { token } = f.admit(&limits, first.clone()).await else {
        panic!("a1 not admitted");
    };
    assert_eq!(
        f.admit(&limits, first).await,
        Admitted::Ok { token },
        "retry"
    );
    let again = f.admission("a1", "w1", 2);
    assert_eq!(
        f.admit(&limits, again.clone()).await,
        Admitted::Pending,
        "another dispatch's admission, not started yet"
    );
    let id = f.entry_ids("w1").await.pop().unwrap();
    assert_eq!(
        s.claim_start(&f.start("a1", token, "w1", &id), TTL, TTL)
            .await
            .unwrap(),
        Claimed::Ok
    );
    assert_eq!(
        f.admit(&limits, again).await,
        Admitted::Exists,
        "once it started"
    );
    let gone = f.admission("a2", "w-gone", 3);
    assert_eq!(f.admit(&limits, gone).await, Admitted::NoWorker);
    let full = AdmitLimits {
        max_queued: 1,
        ..f.limits()
    };
    assert_eq!(
        f.admit(&full, f.admission("a3", "w1", 4)).await,
        Admitted::Full(1)
    );
    // A refusal takes back the payload the admission stored first: left
    // behind, it would be an orphan that the sweep runs.
    for refused in ["a2", "a3"] {
        assert_eq!(s.payload(refused).await.unwrap(), None, "{refused}");
    }

    let windowed = |request| Admission {
        window: Some((keys::dispatched(&s.pool, "r1"), 60_000)),
        ..f.admission("r1", "w1", request)
    };
    let Admitted::Ok { token: r1 } = f.admit(&limits, windowed(5)).await else {
        panic!("r1 not admitted");
    };
    // As if it had ended: guard and payload gone (a payload alone would be
    // an orphan, still owed a run).
    s.maps.pending_map().delete("r1").await.unwrap();
    let _: i64 = s.client.hdel(s.maps.payloads_key(), "r1").await.unwrap();
    let recent = f.admit(&limits, windowed(6)).await;
    assert!(
        matches!(recent, Admitted::Recent(left) if left > Duration::ZERO && left <= TTL),
        "{recent:?}"
    );
    let marker = keys::dispatched(&s.pool, "r1");
    assert!(
        !s.unmark(&marker, r1 + 1, TTL).await.unwrap(),
        "not its own"
    );
    assert!(s.unmark(&marker, r1, TTL).await.unwrap());
    assert!(!s.unmark(&marker, r1, TTL).await.unwrap(), "gone already");

    let record = keys::schedule(&s.pool, "s");
    let lock = keys::lock(Some(&s.pool), &keys::schedule_lease("s"));
    let _: i64 = s.client.hset(&lock, ("token", "7")).await.unwrap();
    let scheduled = |key, request, leader| Admission {
        schedule: Some((leader, record.clone(), lock.clone())),
        started: None,
        ..f.admission(key, "w1", request)
    };
    assert_eq!(
        f.admit(&limits, scheduled("s1", 7, 8)).await,
        Admitted::NotLeader
    );
    let led = f.admit(&limits, scheduled("s1", 8, 7)).await;
    assert!(matches!(led, Admitted::Ok { .. }), "{led:?}");
    let forget = |leader| s.forget_scheduled(&record, &lock, leader, "s1", TTL);
    assert_eq!(forget(8).await.unwrap(), Forgot::NotLeader);
    assert_eq!(forget(7).await.unwrap(), Forgot::Dropped);
    assert_eq!(forget(7).await.unwrap(), Forgot::Absent);

    f.lose_epoch().await;
    let lost = f.admission("a4", "w1", 9);
    assert_eq!(f.admit(&limits, lost).await, Admitted::Recovering);
}

/// An admission that stores a new payload does not read the guard first
/// (every guard is written with its payload); a guard found without one
/// anyway is kept, and the key is not admitted.
#[tokio::test]
async fn an_admission_keeps_a_guard_it_finds_without_a_payload() {
    let f = &fixture().await;
    let s = &f.store;
    assert!(f.register("w1").await.is_some());
    let limits = f.limits();
    let token = f.admitted("g1", "w1").await;
    let _: i64 = s.client.hdel(s.maps.payloads_key(), "g1").await.unwrap();
    let pending = s.maps.pending_map().keys_info().hash.clone();
    let fencing = keys::fencing(&s.pool);
    let read = |hash: String| async move {
        let value: Option<String> = s.client.hget(hash, "g1").await.unwrap();
        value
    };
    let (guard, counter) = (read(pending.clone()).await, read(fencing.clone()).await);
    assert!(guard.is_some() && counter.is_some());
    let entries = f.entry_ids("w1").await;

    assert_eq!(
        f.admit(&limits, f.admission("g1", "w1", 2)).await,
        Admitted::Pending
    );
    assert_eq!(read(pending.clone()).await, guard, "the guard is kept");
    assert_eq!(read(fencing.clone()).await, counter, "no token issued");
    assert_eq!(f.entry_ids("w1").await, entries, "no start entry");
    assert_eq!(
        s.payload("g1").await.unwrap(),
        None,
        "the payload stored meanwhile is taken back"
    );
    assert_eq!(
        f.admit(&limits, f.admission("g1", "w1", 1)).await,
        Admitted::Ok { token },
        "a retry of the admission that wrote the guard"
    );
}

#[tokio::test]
async fn start_scripts_answer_each_status() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    let keys = ["k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8"];
    let mut tokens = Vec::new();
    for key in keys {
        tokens.push(f.admitted(key, "w1").await);
    }
    let ids = f.entry_ids("w1").await;
    let start = |i: usize| f.start(keys[i], tokens[i], "w1", &ids[i]);

    let claim =
        |start: StartToRecord| async move { s.claim_start(&start, TTL, TTL).await.unwrap() };
    let stranger = StartToRecord {
        worker: "w-gone".into(),
        ..start(0)
    };
    assert_eq!(claim(stranger).await, Claimed::Unregistered);
    let moved_away = StartToRecord {
        entry_id: "1-1".into(),
        ..start(0)
    };
    assert_eq!(claim(moved_away).await, Claimed::Gone);
    assert_eq!(claim(start(0)).await, Claimed::Ok);
    assert_eq!(claim(start(0)).await, Claimed::Ok, "retry");
    let older = StartToRecord {
        token: tokens[1] - 1,
        ..start(1)
    };
    assert_eq!(claim(older).await, Claimed::Superseded);

    let started = |i| async move { s.started(&start(i), Answer::Ok, TTL).await.unwrap() };
    assert_eq!(started(0).await, StartKept::Ok);
    assert_eq!(started(2).await, StartKept::Lost, "never claimed");

    s.start_failed(&start(3), "refused").await.unwrap();
    assert_eq!(s.payload("k4").await.unwrap(), None, "the job is over");
    assert_eq!(s.job_records("k4").await.unwrap().2, None, "guard dropped");

    let batch = [
        start(6),
        StartToRecord {
            token: tokens[7] - 1,
            ..start(7)
        },
        StartToRecord {
            worker: "w-gone".into(),
            ..start(6)
        },
    ];
    assert_eq!(
        s.record_starts(&batch, TTL).await.unwrap(),
        [
            StartKept::Ok,
            StartKept::Superseded,
            StartKept::Unregistered
        ]
    );

    // A record older than the start, found while the pool recovers: Redis
    // went back in time and lost the hand-off that led here.
    assert_eq!(claim(start(4)).await, Claimed::Ok);
    let waiting = f.admitted("k9", "w1").await;
    let waiting_id = f.entry_ids("w1").await.pop().unwrap();
    f.lose_epoch().await;
    let newer = StartToRecord {
        token: tokens[4] + 1,
        ..start(4)
    };
    assert_eq!(
        s.record_starts(&[newer], TTL).await.unwrap(),
        [StartKept::Recovering]
    );
    assert_eq!(started(5).await, StartKept::Recovering);

    // The same for a guard older than the start: the state Redis went back
    // to held an older admission of the key, not started then.
    let waiting_start = f.start("k9", waiting, "w1", &waiting_id);
    let over_guard = StartToRecord {
        token: waiting + 1,
        ..waiting_start.clone()
    };
    assert_eq!(
        s.record_starts(&[over_guard], TTL).await.unwrap(),
        [StartKept::Recovering]
    );
    // And that older admission's entry is not claimed while the pool
    // recovers: its key may run elsewhere with a start Redis lost.
    assert_eq!(claim(waiting_start).await, Claimed::Recovering);
}

#[tokio::test]
async fn worker_scripts_answer_each_status() {
    let f = &fixture().await;
    let s = &f.store;
    f.register("w1").await;
    f.register("w2").await;
    let renewal = s
        .keepalive("n-test", TTL, 0, ["w1".to_string(), "w-gone".to_string()])
        .await
        .unwrap();
    assert!(renewal.server_ms > 0);
    assert_eq!(renewal.unknown, ["w-gone"]);

    let stored = |key| codec::stored(0, &body(key));
    let reassert = |key: &'static str, worker: &'static str, token, state| async move {
        s.reassert(key, worker, token, stored(key), state, TTL)
            .await
            .unwrap()
    };
    assert_eq!(
        reassert("r1", "w1", 100, Reassert::Running).await,
        Reasserted::Ok
    );
    assert_eq!(
        reassert("r1", "w2", 50, Reassert::Running).await,
        Reasserted::Lost
    );
    assert_eq!(
        reassert("r1", "w1", 100, Reassert::Suspended).await,
        Reasserted::Ok
    );
    assert!(matches!(s.resume("r1", "w1", TTL).await.unwrap(), Resumed::Token(t) if t > 100));
    assert_eq!(s.resume("r1", "w2", TTL).await.unwrap(), Resumed::Moved); // not w2's
    let record = s.job_records("r1").await.unwrap().1.unwrap();
    assert_eq!(
        s.release_stale("r1", "w1 100", false).await.unwrap(),
        Released::Changed
    );
    assert_eq!(
        s.release_stale("r1", &record, false).await.unwrap(),
        Released::Released
    );
    // A record older than the key's fencing counter goes alone: the payload
    // may be a newer run's only copy (left to the orphan sweep).
    assert_eq!(
        reassert("r3", "w1", 100, Reassert::Running).await,
        Reasserted::Ok
    );
    let older = s.job_records("r3").await.unwrap().1.unwrap();
    let _: i64 = s
        .client
        .hset(keys::fencing(&s.pool), ("r3", "200"))
        .await
        .unwrap();
    assert_eq!(
        s.release_stale("r3", &older, false).await.unwrap(),
        Released::Kept
    );
    assert!(s.job_records("r3").await.unwrap().1.is_none());
    let payload: bool = s
        .client
        .hexists(keys::payloads(&s.pool), "r3")
        .await
        .unwrap();
    assert!(payload, "the payload stays");

    let claim = |worker: &'static str| async move {
        s.claim_cleanup(worker, "n-test", TTL, u64::MAX)
            .await
            .unwrap()
            .status
    };
    assert_eq!(claim("w-gone").await, ClaimStatus::Gone);
    assert_eq!(claim("w1").await, ClaimStatus::Alive);
    s.maps.keepalive.set("w1", "1000").await.unwrap(); // silent for ages
    assert_eq!(claim("w1").await, ClaimStatus::Claimed);
    assert_eq!(claim("w1").await, ClaimStatus::ClaimedByOther);
    s.maps.cleanup.set("w1", "n-dead 1000").await.unwrap();
    assert_eq!(claim("w1").await, ClaimStatus::TakenOver);

    f.admitted("x1", "w2").await;
    let inbox = f.inbox("w2");
    assert_eq!(
        s.remove_worker("w2", &inbox, None).await.unwrap(),
        Removed::InboxNotEmpty
    );
    let ids = f.entry_ids("w2").await;
    let _: i64 = s.client.xdel(&inbox, ids).await.unwrap();
    assert_eq!(
        s.remove_worker("w2", &inbox, None).await.unwrap(),
        Removed::Ok
    );

    assert_eq!(s.begin_recovery(TTL).await.unwrap(), Recovery::Opened);
    assert_eq!(s.begin_recovery(TTL).await.unwrap(), Recovery::Open);
    assert_eq!(
        reassert("r2", "w1", 5, Reassert::Suspended).await,
        Reasserted::Orphaned
    );
}

#[path = "routing_tests.rs"]
mod routing_tests;

#[path = "dead_owner_tests.rs"]
mod dead_owner_tests;

#[path = "sweep_tests.rs"]
mod sweep_tests;

#[path = "batch_tests.rs"]
mod batch_tests;

#[path = "renewal_tests.rs"]
mod renewal_tests;

#[path = "rollback_tests.rs"]
mod rollback_tests;

#[path = "identity_tests.rs"]
mod identity_tests;

#[path = "give_back_tests.rs"]
mod give_back_tests;

#[path = "older_end_tests.rs"]
mod older_end_tests;

#[path = "drain_tests.rs"]
mod drain_tests;

#[path = "cleanup_tests.rs"]
mod cleanup_tests;

#[path = "custody_tests.rs"]
mod custody_tests;

#[path = "target_tests.rs"]
mod target_tests;

#[path = "past_lease_tests.rs"]
mod past_lease_tests;

#[path = "lost_admission_tests.rs"]
mod lost_admission_tests;

#[path = "stale_start_tests.rs"]
mod stale_start_tests;

#[path = "diverged_tests.rs"]
mod diverged_tests;

#[path = "stands_tests.rs"]
mod stands_tests;

#[path = "ended_again_tests.rs"]
mod ended_again_tests;

#[path = "over_tests.rs"]
mod over_tests;

#[path = "lifecycle_status_tests.rs"]
mod lifecycle_status_tests;
