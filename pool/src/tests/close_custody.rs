//! A close whose jobs Redis alone holds once the process has exited: the
//! orphans a close leaves while the pool recovers from a loss, and the
//! hand-offs whose new owners have not read their start entries yet. A
//! second loss then would take them with no process left to give them
//! back (the integration README's Finding 19: a `flush`, a `pause-remove`
//! of the holder, its close, then an empty restart). The closing worker
//! leaves what it remembers with a worker that stays, which gives them
//! back after such a loss.

use super::*;

/// Keys `node`'s ring places on `worker`, `n` of them.
async fn keys_placed_on(node: &Node, worker: &Worker, n: usize) -> Vec<String> {
    key_placed_on(node, worker).await; // the ring holds every worker
    let keys: Vec<String> = (0..400)
        .map(|i| format!("c{i}"))
        .filter(|k| node.placement(k).as_deref() == Some(worker.id()))
        .take(n)
        .collect();
    assert_eq!(keys.len(), n, "not enough keys placed on {}", worker.id());
    keys
}

/// Dispatches `keys` from `node` and holds them stopped and suspended on
/// `worker`, as a lease loss (a pause) leaves them.
async fn held_suspended(node: &Node, worker: &Worker, keys: &[String]) {
    for k in keys {
        node.dispatch_job(k, &b"p"[..]).await.unwrap();
    }
    for k in keys {
        let (_, job) = worker.inner.jobs.remove(k).unwrap();
        worker.inner.stop_handler(k).await.unwrap();
        worker.inner.suspended.lock().await.insert(k.clone(), job);
    }
}

/// Waits until every one of `keys` runs on `worker`; names those that run
/// nowhere when it does not happen.
async fn all_run_on(worker: &Worker, keys: &[String], what: &str) {
    if let Err(e) = wait_until(Duration::from_secs(30), what, || async {
        let running = worker.job_keys();
        keys.iter().all(|k| running.contains(k))
    })
    .await
    {
        let running = worker.job_keys();
        let missing: Vec<&String> = keys.iter().filter(|k| !running.contains(k)).collect();
        panic!("{e}: {missing:?} run nowhere");
    }
}

/// Two nodes whose workers' leases are short (TTL 2 s: the recovery
/// window after a loss lasts about that long, orphans wait 4 s more).
async fn short_nodes(
    server: &RedisServer,
    name: &str,
) -> (fred::prelude::Client, Node, Node, Worker, Worker) {
    let options = NodeOptions::default()
        .mirror_jobs(true)
        .worker_ttl(Duration::from_secs(2))
        .dispatch_timeout(Duration::from_secs(5));
    two_nodes_with_options(server, name, options, Counting::default()).await
}

/// Jobs a lease loss left suspended on a worker; Redis loses its data, and
/// the worker's node closes while the pool recovers: the close leaves the
/// jobs to the orphan sweep, and the process is gone. A second loss before
/// the sweep requeued them must not lose them: they run again on the
/// worker that stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_a_close_left_during_a_recovery_survive_a_second_loss() {
    orphans_of_a_close_after_a_loss_survive_a_second_loss(CloseAt::Registered).await;
}

/// The same, the node closing right after the loss, before the worker that
/// stays has registered again: nobody is there to keep the jobs yet, so
/// the close waits for a worker to come back rather than leave the jobs
/// with Redis alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_a_close_left_right_after_a_loss_survive_a_second_loss() {
    orphans_of_a_close_after_a_loss_survive_a_second_loss(CloseAt::Once).await;
}

/// When the holder's node closes after the first loss.
#[derive(Debug, Clone, Copy)]
enum CloseAt {
    /// Once both workers registered again.
    Registered,
    /// At once.
    Once,
}

async fn orphans_of_a_close_after_a_loss_survive_a_second_loss(close_at: CloseAt) {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("close-custody");
    let (client, a, b, wa, wb) = short_nodes(&server, &name).await;
    let keys = keys_placed_on(&a, &wa, 6).await;
    held_suspended(&a, &wa, &keys).await;
    flushall(&client).await;
    if let CloseAt::Registered = close_at {
        // Both workers registered again: the pool is recovering.
        wait_until(
            Duration::from_secs(10),
            "both workers registered again",
            || async {
                let registered: std::collections::HashMap<String, String> = client
                    .hgetall(b.inner.store.maps.workers.keys_info().hash.clone())
                    .await
                    .unwrap_or_default();
                registered.contains_key(wa.id()) && registered.contains_key(wb.id())
            },
        )
        .await
        .unwrap();
    }
    a.close().await.unwrap();
    drop((wa, a));
    flushall(&client).await;
    all_run_on(&wb, &keys, "the jobs run again on the worker that stays").await;
    b.close().await.unwrap();
}

/// What a close left is kept on two nodes: the worker that keeps it dies
/// with its process (no close, nothing left with anyone) before a second
/// loss, and the other keeper gives the jobs back (chaos soak seed 1564: a
/// process cut off and closed while the pool recovered from a `flush`
/// left its suspended jobs to the orphan sweep and its memory with one
/// worker; Redis restarted empty and that worker's process was killed
/// 374 ms later, before its recovery gave them back: 14 jobs ran nowhere
/// until dispatched again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_a_close_left_survive_a_second_loss_and_the_death_of_their_keeper() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("close-custody-keeper");
    let options = NodeOptions::default()
        .mirror_jobs(true)
        .worker_ttl(Duration::from_secs(2))
        .dispatch_timeout(Duration::from_secs(5));
    let a = Node::join(&client, &name, options.clone()).await.unwrap();
    let b = Node::join(&client, &name, options.clone()).await.unwrap();
    let c = Node::join(&client, &name, options).await.unwrap();
    let wa = Worker::new(&a, Counting::default()).await.unwrap();
    let wb = Worker::new(&b, Counting::default()).await.unwrap();
    let wc = Worker::new(&c, Counting::default()).await.unwrap();
    wait_until(Duration::from_secs(5), "three workers seen", || async {
        [&a, &b, &c].iter().all(|n| n.pool_workers().len() == 3)
    })
    .await
    .unwrap();
    // Keys on `wa` that the ring gives `wb` once `wa` goes: `wb` is their
    // first keeper.
    let ring = a.inner.ring.load_full();
    let keys: Vec<String> = (0..2000)
        .map(|i| format!("k{i}"))
        .filter(|k| {
            a.placement(k).as_deref() == Some(wa.id())
                && ring.owner_excluding(k, wa.id()) == Some(wb.id())
        })
        .take(6)
        .collect();
    assert_eq!(keys.len(), 6, "not enough keys placed on wa, then wb");
    held_suspended(&a, &wa, &keys).await;
    flushall(&client).await;
    let workers = b.inner.store.maps.workers.keys_info().hash.clone();
    wait_until(
        Duration::from_secs(10),
        "every worker registered again",
        || async {
            let registered: std::collections::HashMap<String, String> =
                client.hgetall(&workers).await.unwrap_or_default();
            [&wa, &wb, &wc]
                .iter()
                .all(|w| registered.contains_key(w.id()))
        },
    )
    .await
    .unwrap();
    a.close().await.unwrap();
    drop((wa, a));
    // `wb`'s process dies: what it kept goes with it.
    wb.inner.cancel.cancel();
    b.inner.stop_tasks().await;
    drop((wb, b));
    flushall(&client).await;
    all_run_on(&wc, &keys, "the jobs run again on the worker left").await;
    c.close().await.unwrap();
}

/// A worker's node closes right after a loss with no other worker in its
/// ring (the others not registered again yet; here, one joins only while
/// the close runs): the close waits for a worker while the pool recovers,
/// rather than give up what it remembers, and a second loss then finds the
/// jobs kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_after_a_loss_waits_for_a_worker_to_keep_its_orphans() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("close-custody-alone");
    let options = NodeOptions::default()
        .mirror_jobs(true)
        .worker_ttl(Duration::from_secs(2))
        .dispatch_timeout(Duration::from_secs(5));
    let a = Node::join(&client, &name, options.clone()).await.unwrap();
    let wa = Worker::new(&a, Counting::default()).await.unwrap();
    let keys: Vec<String> = (0..6).map(|i| format!("c{i}")).collect();
    held_suspended(&a, &wa, &keys).await;
    flushall(&client).await;
    let closing = tokio::spawn(async move {
        a.close().await.unwrap();
        drop(wa);
    });
    // The close is under way, nobody else in the pool; a worker joins
    // while the pool recovers, as one registering again would.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = Node::join(&client, &name, options).await.unwrap();
    let wb = Worker::new(&b, Counting::default()).await.unwrap();
    closing.await.unwrap();
    flushall(&client).await;
    all_run_on(&wb, &keys, "the jobs run again on the worker that joined").await;
    b.close().await.unwrap();
}

/// The same when the worker the close waits for is dead: it died without a
/// close just before the loss (nobody cleaned it up), so Redis knows it
/// neither before nor after. The close waits for it while the pool
/// recovers, finds it gone once the window has closed, and leaves what it
/// remembers with the worker that joined meanwhile, within its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_after_a_loss_leaves_a_dead_worker_for_one_that_joined() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("close-custody-dead-receiver");
    let (client, a, b, wa, wb) = short_nodes(&server, &name).await;
    let keys = keys_placed_on(&a, &wa, 6).await;
    held_suspended(&a, &wa, &keys).await;
    wb.inner.cancel.cancel();
    b.inner.stop_tasks().await;
    flushall(&client).await;
    let started = std::time::Instant::now();
    let closing = tokio::spawn(async move {
        a.close().await.unwrap();
        drop(wa);
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let options = NodeOptions::default()
        .mirror_jobs(true)
        .worker_ttl(Duration::from_secs(2))
        .dispatch_timeout(Duration::from_secs(5));
    let c = Node::join(&client, &name, options).await.unwrap();
    let wc = Worker::new(&c, Counting::default()).await.unwrap();
    closing.await.unwrap();
    // Its deadline is worker_shutdown_ttl + redis_timeout (35 s); the
    // window lasts about a TTL (2 s) past the loss.
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "closing took {:?}",
        started.elapsed()
    );
    flushall(&client).await;
    all_run_on(&wc, &keys, "the jobs run again on the worker that joined").await;
    c.close().await.unwrap();
    drop((wb, b));
}

/// A rollback to before a stop once every process that saw it is gone:
/// the node that asked for it closed, then the worker that carried it out
/// (scaled down). Redis goes back to a state that shows the stopped run
/// going on under that worker, whose cleanup would start it again. The
/// closing worker left its recent stops with the worker that stays, which
/// makes them stand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_to_before_a_stop_keeps_it_when_everyone_who_saw_it_is_gone() {
    a_stop_stands_after_everyone_who_saw_it_left(Exit::Close).await;
}

/// The same, the worker's process dead without a close (`SIGKILL`): the
/// node that asked for the stop left its requested stops with the workers
/// that stay when it closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_to_before_a_stop_keeps_it_when_its_worker_died_and_its_requester_left() {
    a_stop_stands_after_everyone_who_saw_it_left(Exit::Crash).await;
}

/// How the worker that carried out a stop goes.
#[derive(Debug, Clone, Copy)]
enum Exit {
    Close,
    /// Its node's tasks and the worker's end at once, with no close: no
    /// keep-alive, no hand-over, nothing left with anyone.
    Crash,
}

/// A server that can go back to a snapshot, a client, and a pool's name
/// and options (TTL 2 s) with three nodes joined.
async fn rollback_pool(
    name: &str,
) -> (
    RedisServer,
    fred::prelude::Client,
    String,
    NodeOptions,
    [Node; 3],
) {
    let server =
        RedisServer::start_with(flotilla_testkit::ServerOptions::default().aof(true)).unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name(name);
    let options = NodeOptions::default()
        .worker_ttl(Duration::from_secs(2))
        .dispatch_timeout(Duration::from_secs(5));
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(Node::join(&client, &name, options.clone()).await.unwrap());
    }
    let Ok(nodes) = <[Node; 3]>::try_from(nodes) else {
        unreachable!("three nodes joined")
    };
    (server, client, name, options, nodes)
}

async fn a_stop_stands_after_everyone_who_saw_it_left(exit: Exit) {
    let (mut server, client, _, _, [requester, b, c]) = rollback_pool("close-custody-stop").await;
    let wb = Worker::new(&b, Counting::default()).await.unwrap();
    let stays = Counting::default();
    let wc = Worker::new(&c, stays.clone()).await.unwrap();
    wait_until(Duration::from_secs(5), "both workers seen", || async {
        requester.pool_workers().len() == 2 && c.pool_workers().len() == 2
    })
    .await
    .unwrap();
    let key = key_placed_on(&requester, &wb).await;
    requester.dispatch_job(&key, &b"p"[..]).await.unwrap();
    wait_until(Duration::from_secs(5), "the job runs on b", || async {
        wb.job_token(&key).is_some()
    })
    .await
    .unwrap();
    let snapshot = server.save_snapshot().unwrap();
    requester.stop_job(&key).await.unwrap();
    match exit {
        Exit::Close => {
            requester.close().await.unwrap();
            b.close().await.unwrap();
        }
        Exit::Crash => {
            wb.inner.cancel.cancel();
            b.inner.stop_tasks().await;
            requester.close().await.unwrap();
        }
    }
    drop((wb, b, requester));
    assert_eq!(stays.starts.load(Ordering::SeqCst), 0);

    server.roll_back(&snapshot).unwrap();
    // Redis shows the job running on b's worker, which is gone: its
    // cleanup comes one TTL after the window, and requeues what the
    // records still give it.
    let workers = c.inner.store.maps.workers.keys_info().hash.clone();
    let inbox = crate::keys::worker_inbox(wc.id());
    wait_until(
        Duration::from_secs(30),
        "b's worker cleaned up and c's inbox read",
        || async {
            let registered: std::collections::HashMap<String, String> =
                client.hgetall(&workers).await.unwrap_or_default();
            let queued: u64 = fred::prelude::StreamsInterface::xlen(&client, &inbox)
                .await
                .unwrap_or(1);
            registered.len() == 1 && registered.contains_key(wc.id()) && queued == 0
        },
    )
    .await
    .unwrap();
    assert_eq!(
        stays.starts.load(Ordering::SeqCst),
        0,
        "{key}, stopped on request at b, runs again on c"
    );
    assert!(wc.job_token(&key).is_none());
    c.close().await.unwrap();
}

/// Nodes that close together (a pool scaled to zero) leave nothing with
/// each other and wait for nobody: each finds the other's worker leaving
/// and gives up what it remembered at once, long before the close's
/// deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_closing_together_do_not_wait_for_each_other() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("close-custody-all");
    let (_client, a, b, wa, wb) = short_nodes(&server, &name).await;
    let on_a = keys_placed_on(&a, &wa, 5).await;
    let on_b = keys_placed_on(&a, &wb, 5).await;
    for k in on_a.iter().chain(&on_b) {
        a.dispatch_job(k, &b"p"[..]).await.unwrap();
    }
    // A stop on each worker: both remember something to leave.
    a.stop_job(&on_a[0]).await.unwrap();
    a.stop_job(&on_b[0]).await.unwrap();
    let started = std::time::Instant::now();
    let (closed_a, closed_b) = tokio::join!(a.close(), b.close());
    closed_a.unwrap();
    closed_b.unwrap();
    // The deadline is worker_shutdown_ttl + redis_timeout (35 s).
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "closing both took {:?}",
        started.elapsed()
    );
    drop((wa, wb));
}

/// A node that asked for stops closes after the only worker died without
/// a close (nobody cleaned it up: no other worker node is left): the dead
/// worker is found silent and nothing waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_does_not_wait_for_a_dead_worker() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("close-custody-dead");
    let options = NodeOptions::default()
        .worker_ttl(Duration::from_secs(2))
        .dispatch_timeout(Duration::from_secs(5));
    let requester = Node::join(&client, &name, options.clone().client_only(true))
        .await
        .unwrap();
    let b = Node::join(&client, &name, options).await.unwrap();
    let wb = Worker::new(&b, Counting::default()).await.unwrap();
    let key = key_placed_on(&requester, &wb).await;
    requester.dispatch_job(&key, &b"p"[..]).await.unwrap();
    requester.stop_job(&key).await.unwrap();
    wb.inner.cancel.cancel();
    b.inner.stop_tasks().await;
    let started = std::time::Instant::now();
    requester.close().await.unwrap();
    // The deadline is worker_shutdown_ttl + redis_timeout (35 s); the dead
    // worker is silent within its 2 s TTL.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "closing took {:?}",
        started.elapsed()
    );
    drop((wb, b));
}

/// A stop left with a worker that stays by the node that asked for it and
/// the worker that carried it out (both closed), of a job that worker got
/// by a hand-off from the one that stays (CI seed 7, `stop-leave`: the
/// stopped job ran again). Redis goes back to before the job's dispatch,
/// after the end of an older dispatch of the key. The worker that stays
/// makes the stops stand, then gives back its hand-off, which it had not
/// learnt ended (held here: its settle round had not come): the stops
/// must record what they ended as their stoppers would have, or the
/// counter they raise reads as the end of the older dispatch only, and the
/// hand-off is given back and run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_left_with_the_giver_of_its_hand_off_ends_that_hand_off() {
    let (mut server, client, name, options, [requester, a, b]) =
        rollback_pool("close-custody-handoff-stop").await;
    let stays = Counting::default();
    let wa = Worker::new(&a, stays.clone()).await.unwrap();
    let wb = Worker::new(&b, Counting::default()).await.unwrap();
    wait_until(Duration::from_secs(5), "both workers seen", || async {
        requester.pool_workers().len() == 2 && a.pool_workers().len() == 2
    })
    .await
    .unwrap();
    let key = key_placed_on(&requester, &wb).await;
    // An older dispatch, over before the state Redis goes back to.
    requester.dispatch_job(&key, &b"old"[..]).await.unwrap();
    requester.stop_job(&key).await.unwrap();
    let snapshot = server.save_snapshot().unwrap();

    // The dispatch runs on a, then is handed off to b.
    requester.drain_worker(wb.id()).await.unwrap();
    wait_until(Duration::from_secs(5), "b drained", || async {
        requester.placement(&key).as_deref() == Some(wa.id())
    })
    .await
    .unwrap();
    requester.dispatch_job(&key, &b"new"[..]).await.unwrap();
    wait_until(Duration::from_secs(5), "the job runs on a", || async {
        wa.job_token(&key).is_some()
    })
    .await
    .unwrap();
    wa.inner.handed_off.hold_settling(true);
    requester.undrain_worker(wb.id()).await.unwrap();
    wait_until(
        Duration::from_secs(10),
        "the job handed off to b",
        || async { wb.job_token(&key).is_some() },
    )
    .await
    .unwrap();
    assert_eq!(stays.starts.load(Ordering::SeqCst), 1);
    assert!(
        wa.inner
            .handed_off
            .remembered()
            .iter()
            .any(|h| h.key == key),
        "a remembers its hand-off"
    );

    // A short-lived client stops it and leaves; b is scaled down.
    let visitor = Node::join(&client, &name, options).await.unwrap();
    visitor.stop_job(&key).await.unwrap();
    visitor.close().await.unwrap();
    b.close().await.unwrap();
    drop((wb, b, visitor));

    server.roll_back(&snapshot).unwrap();
    // Redis shows b's worker (gone) and nothing of the stopped dispatch:
    // b's cleanup comes one TTL after the recovery window, by when a has
    // made the stops stand and given back what it had to.
    let workers = a.inner.store.maps.workers.keys_info().hash.clone();
    let payloads = a.inner.store.maps.payloads_key().to_string();
    let jobs = a.inner.store.maps.jobs_keys.hash.clone();
    let outcome = wait_until(
        Duration::from_secs(30),
        "b's worker cleaned up, nothing of the stopped dispatch in Redis",
        || async {
            let registered: std::collections::HashMap<String, String> =
                client.hgetall(&workers).await.unwrap_or_default();
            let payload: Option<fred::types::Value> = client.hget(&payloads, &key).await.ok();
            let record: Option<fred::types::Value> = client.hget(&jobs, &key).await.ok();
            registered.len() == 1
                && registered.contains_key(wa.id())
                && payload.is_some_and(|p| p.is_null())
                && record.is_some_and(|r| r.is_null())
        },
    )
    .await;
    assert_eq!(
        stays.starts.load(Ordering::SeqCst),
        1,
        "{key}, stopped on request at b, runs again on a"
    );
    outcome.unwrap();
    assert!(wa.job_token(&key).is_none());
    requester.close().await.unwrap();
    a.close().await.unwrap();
}
