//! The recovery window after Redis went back in time ends when the pool
//! re-converged, not after a fixed TTL: while a node's workers have not
//! re-asserted what they run, nothing is admitted (a key running there
//! could start twice), however long that takes; once they have, admissions
//! go on at once.

use super::*;
use flotilla_testkit::ServerOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_window_lasts_until_every_worker_reconciled() {
    window_case(false).await;
}

/// The same with nodes that mirror the jobs map (they compare its
/// revision too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_window_lasts_until_every_worker_reconciled_on_mirroring_nodes() {
    window_case(true).await;
}

/// The rollback may come within the second of the snapshot's SAVE (same
/// LASTSAVE) and lose no keep-alive renewal: the dispatcher, which made no
/// write after the SAVE, then sees the restart only by the server's run id,
/// which its scripts compare on every call (or, mirroring, by the jobs
/// map's revision).
async fn window_case(mirror_jobs: bool) {
    let mut server = RedisServer::start_with(ServerOptions::default().aof(true)).unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("recovery-window");
    let ttl = Duration::from_secs(1);
    let options = NodeOptions::default()
        .mirror_jobs(mirror_jobs)
        .worker_ttl(ttl)
        .dispatch_timeout(Duration::from_millis(500));
    let node = Node::join(&client, &name, options.clone()).await.unwrap();
    // Dispatches from a node with no workers, whose own recovery is quick.
    let dispatcher = Node::join(&client, &name, options).await.unwrap();
    let (worker, handler, snapshot) = running_and_lost(&node, &server).await;

    // The worker's reconcile waits for this (it takes the worker's
    // operations lock for writing): a slow re-assertion.
    let slow = worker.inner.ops.read().await;
    server.roll_back(&snapshot).unwrap();
    let back = std::time::Instant::now();
    // Well past the window's own TTL, the worker has not re-asserted
    // "lost" yet: admitting it again would run it twice.
    // A dispatch that times out may have been admitted (and found no
    // start ack): the pending guard an admission writes tells.
    let pending = pending_hash(&name);
    while back.elapsed() < ttl * 3 {
        let answer = dispatcher.dispatch_job("lost", &b"again"[..]).await;
        let admitted: bool = client.hexists(&pending, "lost").await.unwrap();
        match answer {
            Err(crate::Error::Timeout(_)) if !admitted => {}
            other => panic!(
                "'lost' admitted before its worker re-asserted it: {other:?} (admitted: {admitted})"
            ),
        }
    }
    drop(slow);
    // Re-asserted: the window closes with the last reconcile.
    let released = std::time::Instant::now();
    let again = loop {
        match dispatcher.dispatch_job("new", &b"p"[..]).await {
            Ok(()) => break released.elapsed(),
            Err(crate::Error::Timeout(_)) if released.elapsed() < ttl * 10 => continue,
            Err(e) => panic!(
                "no admission {:?} after the reconcile: {e}",
                released.elapsed()
            ),
        }
    };
    assert!(
        matches!(
            dispatcher.dispatch_job("lost", &b"again"[..]).await,
            Err(crate::Error::JobExists(_))
        ),
        "'lost' runs and is known again"
    );
    assert_eq!(
        handler.starts.load(Ordering::SeqCst),
        3,
        "before, lost and new started once each"
    );
    tracing::info!(?again, "admitting again after the reconcile");
    dispatcher.close().await.unwrap();
    node.close().await.unwrap();
}

/// A node that joins after Redis went back in time knows only the new
/// server: its own view shows no restart. If its dispatch is the first
/// script to reach that server (every older node is cut off, so none has
/// noticed), it must still see the restart and refuse the key the rollback
/// forgot while its worker, out of reach, may still run it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_joined_after_a_rollback_sees_it_first() {
    late_joiner_case(false).await;
}

/// The same after a `FLUSHALL`: the server keeps running, so no run id
/// shows the loss, and the late node finds a pool with no epoch, as a new
/// pool would have. The server ran the pool's scripts before, though, and
/// remembers it: the late node's join opens the recovery window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_joined_after_a_flush_sees_it_first() {
    late_joiner_case(true).await;
}

/// A node cut off while its worker runs "lost"; Redis then goes back to
/// before its admission (`flush`: loses all its data); a node joins and
/// dispatches "lost" again and again.
async fn late_joiner_case(flush: bool) {
    let mut server = RedisServer::start_with(ServerOptions::default().aof(true)).unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let proxy = flotilla_testkit::FaultProxy::start(server.addr())
        .await
        .unwrap();
    let cut_off_client = flotilla_testkit::client(&proxy.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("recovery-late-joiner");
    let ttl = Duration::from_secs(2);
    let options = NodeOptions::default()
        .worker_ttl(ttl)
        .dispatch_timeout(Duration::from_millis(300));
    let node = Node::join(&cut_off_client, &name, options.clone())
        .await
        .unwrap();
    let (_worker, handler, snapshot) = running_and_lost(&node, &server).await;

    // The worker's node hears nothing from now on; its worker keeps
    // running "lost" until its own lease runs out, up to `ttl` from now.
    proxy.black_hole();
    let cut_at = std::time::Instant::now();
    // No renewal of the cut-off worker is stamped after this (server
    // time): from a TTL later, its jobs may be taken, and an admission is
    // allowed.
    let lease_over_ms =
        crate::store::call::server_time_ms(&client).await.unwrap() + ttl.as_millis() as u64;
    if flush {
        super::flushall(&client).await;
    } else {
        server.roll_back(&snapshot).unwrap();
    }
    wait_until(Duration::from_secs(5), "the server answers again", || {
        let client = client.clone();
        async move { client.ping::<String>(None).await.is_ok() }
    })
    .await
    .unwrap();
    let late = Node::join(&client, &name, options).await.unwrap();
    // A worker the key can go to (a flush forgot the cut-off one).
    let late_handler = Counting::default();
    let late_worker = Worker::new(&late, late_handler.clone()).await.unwrap();
    let pending = pending_hash(&name);
    let mut refused = 0;
    while cut_at.elapsed() < ttl {
        let answer = late.dispatch_job("lost", &b"again"[..]).await;
        let guard: Option<String> = client.hget(&pending, "lost").await.unwrap();
        // The token is the server time of the admission (µs), in the guard
        // until the job starts, then in its run: an attempt sent within
        // the TTL may be admitted past it (a timeout leaves the outcome
        // open), which the client's clock cannot judge.
        let admitted_ms = guard
            .as_deref()
            .and_then(|g| g.split(' ').next()?.parse::<u64>().ok())
            .or_else(|| late_worker.job_token("lost"))
            .map(|token_us| token_us / 1000);
        match (answer, admitted_ms) {
            // Refused while recovering (a timeout).
            (Err(_), None) => refused += 1,
            // Admitted once the cut-off worker's lease was over (the job
            // then waits for a worker, or runs on the late one).
            (_, Some(at)) if at >= lease_over_ms => break,
            (other, at) => panic!(
                "'lost' answered {other:?} (admitted at {at:?} ms, lease over at {lease_over_ms} ms) {:?} after the cut, while its worker may still run it",
                cut_at.elapsed()
            ),
        }
    }
    assert!(
        refused > 0,
        "the late node tried at least once in the lease"
    );
    assert_eq!(
        handler.starts.load(Ordering::SeqCst),
        2,
        "nothing else started on the cut-off worker"
    );
    late.close().await.unwrap();
    proxy.heal();
    node.close().await.unwrap();
}

/// The pending map's hash of pool `name`: an admission writes the key's
/// guard there.
pub(super) fn pending_hash(name: &str) -> String {
    flotilla_rmap::MapKeys::new(crate::keys::PENDING_MAP, Some(name))
        .unwrap()
        .hash
}

/// A worker on `node` running "before", admitted before a snapshot of
/// `server`, and "lost", admitted after it: a rollback to the snapshot
/// forgets "lost" while the worker runs it.
async fn running_and_lost(
    node: &Node,
    server: &RedisServer,
) -> (Worker, Counting, flotilla_testkit::RedisSnapshot) {
    let handler = Counting::default();
    let worker = Worker::new(node, handler.clone()).await.unwrap();
    node.dispatch_job("before", &b"p"[..]).await.unwrap();
    let snapshot = server.save_snapshot().unwrap();
    node.dispatch_job("lost", &b"p"[..]).await.unwrap();
    wait_until(Duration::from_secs(5), "both jobs run", || async {
        handler.starts.load(Ordering::SeqCst) == 2
    })
    .await
    .unwrap();
    (worker, handler, snapshot)
}
