//! A rollback or an empty restart that lands while hand-offs wait at their
//! new owner: the new owner's start entries and the hand-offs' records go
//! with the lost writes, and the jobs, stopped here for the hand-off, would
//! run nowhere. The worker that handed them off gives their payloads back;
//! the orphan sweep then runs them again. A stop answered `Ok` in those
//! lost writes still stands: the node that asked for it makes it stand
//! again.

use super::*;
use flotilla_testkit::{RedisSnapshot, ServerOptions};

/// How Redis loses the writes made after [`Loss::mark`].
#[derive(Debug, Clone, Copy)]
enum Loss {
    /// Restarted from a snapshot taken at the mark.
    Rollback,
    /// The same, the snapshot taken later: once the hand-offs are done.
    RollbackAfterHandoffs,
    /// Restarted with no data at all.
    Empty,
    /// `FLUSHALL` on a server that keeps running (same run id).
    Flush,
}

impl Loss {
    fn server(self) -> RedisServer {
        match self {
            // The AOF is set aside by the roll-back; without one (and
            // without a snapshot) a restart comes back empty.
            Loss::Rollback | Loss::RollbackAfterHandoffs => {
                RedisServer::start_with(ServerOptions::default().aof(true))
            }
            Loss::Empty | Loss::Flush => RedisServer::start(),
        }
        .unwrap()
    }

    fn mark(self, server: &RedisServer) -> Option<RedisSnapshot> {
        match self {
            Loss::Rollback | Loss::RollbackAfterHandoffs => Some(server.save_snapshot().unwrap()),
            Loss::Empty | Loss::Flush => None,
        }
    }

    fn lose(self, server: &mut RedisServer, mark: Option<RedisSnapshot>) {
        match (self, mark) {
            (_, Some(snapshot)) => server.roll_back(&snapshot).unwrap(),
            (Loss::Flush, None) => server.flush_all().unwrap(),
            (_, None) => server.restart().unwrap(),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_during_hand_offs_loses_no_job() {
    hand_offs_in_the_lost_writes_lose_no_job(Loss::Rollback).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_restart_during_hand_offs_loses_no_job() {
    hand_offs_in_the_lost_writes_lose_no_job(Loss::Empty).await;
}

async fn hand_offs_in_the_lost_writes_lose_no_job(loss: Loss) {
    let mut server = loss.server();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("handoff-rollback");
    let options = NodeOptions::default()
        .worker_ttl(Duration::from_secs(2))
        .dispatch_timeout(Duration::from_secs(5));
    let node = Node::join(&client, &name, options).await.unwrap();
    let worker = Worker::new(&node, Counting::default()).await.unwrap();
    let keys: Vec<String> = (0..24).map(|i| format!("h{i}")).collect();
    for k in &keys {
        node.dispatch_job(k, &b"p"[..]).await.unwrap();
    }
    let mark = loss.mark(&server);

    // A worker registered in Redis that no process hosts: the jobs the
    // ring gives it are handed off into its inbox and never start.
    node.inner
        .store
        .register("w-ghost", r#"{"node":"nowhere"}"#)
        .await
        .unwrap();
    let recent = || worker.inner.handed_off.remembered();
    wait_until(
        Duration::from_secs(5),
        "jobs handed to the ghost",
        || async { recent().len() >= 3 },
    )
    .await
    .unwrap();
    let handed: Vec<String> = recent().into_iter().map(|h| h.key).collect();
    assert!(handed.iter().all(|k| !worker.job_keys().contains(k)));

    loss.lose(&mut server, mark);
    // Redis shows the state before the hand-offs (the jobs under this
    // worker, which does not run them), or nothing. They must run again,
    // here (the ghost is unknown to Redis now).
    if let Err(e) = wait_until(
        Duration::from_secs(30),
        "handed-off jobs run again",
        || async {
            let running = worker.job_keys();
            handed.iter().all(|k| running.contains(k))
        },
    )
    .await
    {
        let running = worker.job_keys();
        let missing: Vec<&String> = handed.iter().filter(|k| !running.contains(k)).collect();
        panic!("{e}: {missing:?} run nowhere");
    }
    node.close().await.unwrap();
}

/// Starts per key and the keys running now, on one worker.
#[derive(Clone, Default)]
struct Ledger {
    starts: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    running: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

impl Ledger {
    fn running(&self) -> std::collections::HashSet<String> {
        self.running.lock().unwrap().clone()
    }
    fn starts(&self, key: &str) -> usize {
        self.starts.lock().unwrap().get(key).copied().unwrap_or(0)
    }
}

#[async_trait]
impl Handler for Ledger {
    async fn start(&self, job: Job) -> Result<(), HandlerError> {
        *self
            .starts
            .lock()
            .unwrap()
            .entry(job.key.clone())
            .or_default() += 1;
        self.running.lock().unwrap().insert(job.key);
        Ok(())
    }
    async fn stop(&self, key: &str) -> Result<(), HandlerError> {
        self.running.lock().unwrap().remove(key);
        Ok(())
    }
}

/// A job handed off, started by its new owner, stopped there on request,
/// and the new owner gone, all in the writes a rollback loses: Redis shows
/// the job under the worker that handed it off, which gives the hand-off
/// back. The stop was answered `Ok`, so the job must not run again: the
/// node that asked for the stop makes it stand (the worker that carried it
/// out is gone). The jobs handed to a worker no process hosts come back,
/// which shows the give-back ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_keeps_a_stop_made_at_a_new_owner_that_is_gone() {
    a_stop_at_a_new_owner_that_is_gone_stands(Loss::Rollback, Requester::Stays).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_restart_keeps_a_stop_made_at_a_new_owner_that_is_gone() {
    a_stop_at_a_new_owner_that_is_gone_stands(Loss::Empty, Requester::Stays).await;
}

/// The same with the node that asked for the stop gone before the loss
/// too (a command-line client that stopped a job and exited; in a chaos
/// soak, a dispatcher cut off until after the orphan sweep): nothing that
/// remembers the stop is there to make it stand. The worker that handed
/// the job off must have learnt, while Redis still knew, that the run it
/// led to ended, and not give the job back (soak seed 491 after the
/// generation fix: 4 stops undone by a `FLUSHALL` that way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_keeps_a_stop_whose_requester_and_worker_are_gone() {
    a_stop_at_a_new_owner_that_is_gone_stands(Loss::Rollback, Requester::Leaves).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_restart_keeps_a_stop_whose_requester_and_worker_are_gone() {
    a_stop_at_a_new_owner_that_is_gone_stands(Loss::Empty, Requester::Leaves).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_keeps_a_stop_whose_requester_and_worker_are_gone() {
    a_stop_at_a_new_owner_that_is_gone_stands(Loss::Flush, Requester::Leaves).await;
}

/// A rollback to after the hand-offs, before the stop: Redis shows the
/// stopped job running at its new owner again, which is gone, so the
/// cleanup of that worker would start it once more. The worker that
/// handed it off saw it end while Redis knew, and makes that end stand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_to_before_the_stop_keeps_it_when_its_requester_and_worker_are_gone() {
    a_stop_at_a_new_owner_that_is_gone_stands(Loss::RollbackAfterHandoffs, Requester::Leaves).await;
}

/// Whether the node that asked for a stop is still there when Redis loses
/// the writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Requester {
    Stays,
    Leaves,
}

async fn a_stop_at_a_new_owner_that_is_gone_stands(loss: Loss, requester: Requester) {
    let mut server = loss.server();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("handoff-stop-rollback");
    let options = NodeOptions::default()
        .worker_ttl(Duration::from_secs(2))
        .dispatch_timeout(Duration::from_secs(5));
    let node_a = Node::join(&client, &name, options.clone()).await.unwrap();
    let ledger_a = Ledger::default();
    let worker_a = Worker::new(&node_a, ledger_a.clone()).await.unwrap();
    let dispatcher = Node::join(&client, &name, options.clone()).await.unwrap();
    let keys: Vec<String> = (0..30).map(|i| format!("s{i}")).collect();
    for k in &keys {
        dispatcher.dispatch_job(k, &b"p"[..]).await.unwrap();
    }
    wait_until(Duration::from_secs(5), "every job runs on a", || async {
        ledger_a.running().len() == keys.len()
    })
    .await
    .unwrap();
    let early = !matches!(loss, Loss::RollbackAfterHandoffs);
    let mut mark = if early { loss.mark(&server) } else { None };

    // A worker no process hosts, and a worker on a second node; a hands
    // each the jobs the ring now gives it.
    node_a
        .inner
        .store
        .register("w-ghost", r#"{"node":"nowhere"}"#)
        .await
        .unwrap();
    let node_b = Node::join(&client, &name, options).await.unwrap();
    let ledger_b = Ledger::default();
    let worker_b = Worker::new(&node_b, ledger_b.clone()).await.unwrap();
    let placed = |worker: &str| -> Vec<String> {
        keys.iter()
            .filter(|k| node_a.placement(k).as_deref() == Some(worker))
            .cloned()
            .collect()
    };
    wait_until(
        Duration::from_secs(10),
        "jobs handed to b and to the ghost",
        || {
            let on_b = placed(worker_b.id());
            let on_ghost = placed("w-ghost");
            let running_a = ledger_a.running();
            let running_b = ledger_b.running();
            let done = !on_b.is_empty()
                && !on_ghost.is_empty()
                && on_b.iter().all(|k| running_b.contains(k))
                && on_ghost.iter().all(|k| !running_a.contains(k));
            async move { done }
        },
    )
    .await
    .unwrap();
    if !early {
        mark = loss.mark(&server);
    }
    let ghost_keys = placed("w-ghost");
    let stopped = placed(worker_b.id())[0].clone();
    dispatcher.stop_job(&stopped).await.unwrap();
    assert!(!ledger_b.running().contains(&stopped));
    // b goes; whatever it still ran it hands on first.
    node_b.close().await.unwrap();
    let starts_before = ledger_a.starts(&stopped);
    let asker = match requester {
        Requester::Stays => &dispatcher,
        Requester::Leaves => {
            dispatcher.close().await.unwrap();
            // Nothing but Redis remembers the stop now; a asks it
            // every second which jobs it passed on ended.
            wait_until(
                Duration::from_secs(10),
                "a learns that the run it handed off ended",
                || {
                    let settled = !worker_a
                        .inner
                        .handed_off
                        .remembered()
                        .iter()
                        .any(|h| h.key == stopped);
                    async move { settled }
                },
            )
            .await
            .unwrap();
            &node_a
        }
    };

    loss.lose(&mut server, mark);
    // Redis shows every job under a again, or nothing. Every one but the
    // stopped one must run there again (the ghost's come back as orphans).
    let expected: Vec<&String> = keys.iter().filter(|k| **k != stopped).collect();
    if let Err(e) = wait_until(
        Duration::from_secs(30),
        "every job but the stopped one runs on a",
        || {
            let running = ledger_a.running();
            let done = expected.iter().all(|k| running.contains(*k));
            async move { done }
        },
    )
    .await
    {
        let running = ledger_a.running();
        let missing: Vec<&&String> = expected.iter().filter(|k| !running.contains(**k)).collect();
        panic!("{e}: {missing:?} run nowhere (ghost's: {ghost_keys:?})");
    }
    // The ghost's jobs came back through the orphan sweep, after the
    // give-back; the stopped job went through the same give-back.
    assert!(
        !ledger_a.running().contains(&stopped),
        "{stopped}, stopped on request at b, runs again on a"
    );
    assert_eq!(
        ledger_a.starts(&stopped),
        starts_before,
        "{stopped} started again"
    );
    assert!(
        matches!(
            asker.stop_job(&stopped).await,
            Err(crate::Error::JobNotFound(_))
        ),
        "{stopped} is known to Redis again"
    );
    drop(worker_a);
    if requester == Requester::Stays {
        dispatcher.close().await.unwrap();
    }
    node_a.close().await.unwrap();
}

/// Jobs a worker held suspended through a data loss are left to the orphan
/// sweep while the pool recovers (`reassert.lua`): from then on Redis holds
/// the only copy, until the sweep requeues them one grace later. A second
/// loss before that (an empty restart, a rollback) must not take them: the
/// worker gives their payloads back as it does for its hand-offs, and the
/// jobs run again (chaos soak seed 140, `--overlap`: a worker paused
/// through a rollback woke, left its jobs to the sweep, and an empty
/// restart 4 s later took them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_a_reassert_left_survive_a_second_rollback() {
    orphans_a_reassert_left_survive_a_second_loss(Loss::Rollback).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_a_reassert_left_survive_a_second_empty_restart() {
    orphans_a_reassert_left_survive_a_second_loss(Loss::Empty).await;
}

/// A one-worker pool (TTL 2 s) whose 8 jobs, keyed `<prefix>0`..`7`,
/// the worker holds suspended: its lease lapsed (a pause, a cut), so it
/// stopped them and holds them out of Redis's sight. Then the first loss:
/// Redis loses every record. Returns the client, node, worker, its ledger,
/// the keys and the held jobs.
async fn jobs_held_through_a_loss(
    server: &RedisServer,
    prefix: &str,
    options: NodeOptions,
) -> (
    fred::prelude::Client,
    Node,
    Worker,
    Ledger,
    Vec<String>,
    Vec<(String, crate::worker::LocalJob)>,
) {
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name(prefix);
    let options = options
        .worker_ttl(Duration::from_secs(2))
        .dispatch_timeout(Duration::from_secs(5));
    let node = Node::join(&client, &name, options).await.unwrap();
    let ledger = Ledger::default();
    let worker = Worker::new(&node, ledger.clone()).await.unwrap();
    let keys: Vec<String> = (0..8).map(|i| format!("{prefix}{i}")).collect();
    for k in &keys {
        node.dispatch_job(k, &b"p"[..]).await.unwrap();
    }
    let mut held = Vec::new();
    for k in &keys {
        let (_, job) = worker.inner.jobs.remove(k).unwrap();
        worker.inner.stop_handler(k).await.unwrap();
        held.push((k.clone(), job));
    }
    super::flushall(&client).await;
    (client, node, worker, ledger, keys, held)
}

/// Waits until every job of `keys` runs again on the ledger's worker, and
/// each was started twice (before the losses, and once after).
async fn each_runs_again(ledger: &Ledger, keys: &[String]) {
    if let Err(e) = wait_until(Duration::from_secs(30), "the jobs run again", || async {
        let running = ledger.running();
        keys.iter().all(|k| running.contains(k))
    })
    .await
    {
        let running = ledger.running();
        let missing: Vec<&String> = keys.iter().filter(|k| !running.contains(*k)).collect();
        panic!("{e}: {missing:?} run nowhere");
    }
    for k in keys {
        assert_eq!(ledger.starts(k), 2, "{k}: started once, then once again");
    }
}

async fn orphans_a_reassert_left_survive_a_second_loss(loss: Loss) {
    let mut server = loss.server();
    // The worker's lease lapses and the first loss comes; the worker comes
    // back within the recovery window and re-asserts them: left to the
    // orphan sweep.
    let (_client, node, worker, ledger, keys, held) =
        jobs_held_through_a_loss(&server, "o", NodeOptions::default()).await;
    let mark = loss.mark(&server);
    for (k, job) in &held {
        let outcome = node
            .inner
            .reassert(&worker.inner, k, job, crate::lease::Reassert::Suspended)
            .await
            .unwrap();
        assert_eq!(outcome, crate::store::Reasserted::Orphaned, "{k}");
    }
    // The second loss, before the sweep requeued them (one grace: 4 s).
    loss.lose(&mut server, mark);
    each_runs_again(&ledger, &keys).await;
    node.close().await.unwrap();
}

/// A worker holding jobs suspended (its lease lapsed: a cut, a pause)
/// while Redis lost their records finds, when it re-asserts them, newer
/// admissions of their keys that have not started yet: a dispatch retried
/// while the worker was out of reach and nothing in Redis knew the keys.
/// The worker gives way to them. If Redis then loses those admissions too
/// (a second restart or rollback before they started), the jobs must not
/// run nowhere: the worker remembers what it gave way to and gives the
/// payloads back, as for a hand-off (chaos soak seed 241, `--overlap`: a
/// rollback while the holder was cut, a dispatch of the key 73 ms after
/// the cut healed, then an empty restart; the key ran nowhere for 17 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_given_way_to_admissions_a_rollback_lost_run_again() {
    jobs_given_way_then_lost_run_again(Loss::Rollback, GivenWay::Admission).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_given_way_to_admissions_an_empty_restart_lost_run_again() {
    jobs_given_way_then_lost_run_again(Loss::Empty, GivenWay::Admission).await;
}

/// What a worker re-asserting its suspended jobs gives way to.
#[derive(Clone, Copy)]
enum GivenWay {
    /// A newer admission not started yet: its token, its pending guard.
    Admission,
    /// An orphan another worker gave back: a newer token, the payload.
    Orphan,
}

/// The worker's lease lapses and a first loss takes its jobs' records;
/// Redis then shows something newer of each key (`given_way`), to which
/// the worker's re-assertion gives way; a second loss takes that too
/// before anything started, and each job must run again.
async fn jobs_given_way_then_lost_run_again(loss: Loss, given_way: GivenWay) {
    let mut server = loss.server();
    // Mirroring: the test writes the pending map by its key.
    let (prefix, options) = match given_way {
        GivenWay::Admission => ("g", NodeOptions::default().mirror_jobs(true)),
        GivenWay::Orphan => ("v", NodeOptions::default()),
    };
    let (client, node, worker, ledger, keys, held) =
        jobs_held_through_a_loss(&server, prefix, options).await;
    let mark = loss.mark(&server);
    let store = &node.inner.store;
    let fencing = crate::keys::fencing(&store.pool);
    let now_ms = store.server_time_ms().await.unwrap();
    for (k, job) in &held {
        let newer = job.token + 1_000;
        let _: () = client
            .hset(fencing.as_str(), (k.as_str(), newer.to_string()))
            .await
            .unwrap();
        let (hash, value) = match given_way {
            // The start entry waits at an owner.
            GivenWay::Admission => (
                store.maps.pending_map().keys_info().hash.clone(),
                format!("{newer} {} n-elsewhere/1", now_ms + 60_000).into_bytes(),
            ),
            GivenWay::Orphan => (
                crate::keys::payloads(&store.pool),
                crate::codec::stored(job.admitted, &job.raw_body).to_vec(),
            ),
        };
        let _: () = client
            .hset(hash.as_str(), (k.as_str(), value))
            .await
            .unwrap();
    }
    let expected = match given_way {
        GivenWay::Admission => crate::store::Reasserted::Pending,
        GivenWay::Orphan => crate::store::Reasserted::Unclaimed,
    };
    for (k, job) in &held {
        let outcome = node
            .inner
            .reassert(&worker.inner, k, job, crate::lease::Reassert::Suspended)
            .await
            .unwrap();
        assert_eq!(outcome, expected, "{k}");
        worker.inner.suspended.lock().await.remove(k);
    }
    // The second loss takes what the worker gave way to before it started.
    loss.lose(&mut server, mark);
    each_runs_again(&ledger, &keys).await;
    node.close().await.unwrap();
}

/// A worker holding jobs suspended while Redis lost their records finds,
/// when it re-asserts them, that another worker passed each on since and
/// gave it back to Redis after the loss: a newer token issued, the payload
/// an orphan, no record and no guard (a cleanup moved the jobs while the
/// worker was cut off, the loss took the move, and the new owner gave
/// them back when it found its start gone). Only that other worker
/// remembers them then; when its process dies and Redis loses the orphans
/// too, the jobs must not run nowhere: the re-asserting worker remembers
/// what it gave way to and gives the payloads back (chaos soak seed 1436:
/// a cut worker's job moved, an empty restart, the new owner's "orphan
/// again", a second empty restart, that owner killed 290 ms later; the key
/// ran nowhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_given_way_to_orphans_a_rollback_lost_run_again() {
    jobs_given_way_then_lost_run_again(Loss::Rollback, GivenWay::Orphan).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_given_way_to_orphans_an_empty_restart_lost_run_again() {
    jobs_given_way_then_lost_run_again(Loss::Empty, GivenWay::Orphan).await;
}
