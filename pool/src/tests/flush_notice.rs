//! Every node notices, within its TTL, that Redis lost the pool's data on
//! a server that kept running (`FLUSHALL`: no new run id). It must: a
//! node that answered for a stop makes it stand again during the recovery
//! window, which the first node to notice opens for one TTL. Soak seed 1404
//! (TTL 600 ms): a paused holder came back right after a `FLUSHALL` and gave
//! back the jobs it held as orphans; the nodes that had stopped them since
//! noticed the flush only at their identity check, every 2 s, after the
//! orphan sweep had started them again.

use super::*;

/// Short enough that a fixed 2 s between identity checks misses it.
const TTL: Duration = Duration::from_millis(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_notices_a_flush_within_its_ttl() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("flush-notice");
    let lean = NodeOptions::default().mirror_jobs(false).worker_ttl(TTL);
    let worker_node = Node::join(&client, &name, lean.clone()).await.unwrap();
    let _worker = Worker::new(&worker_node, Counting::default())
        .await
        .unwrap();
    let client_only = Node::join(&client, &name, lean.client_only(true))
        .await
        .unwrap();
    let mut noticed = Vec::new();
    for node in [&worker_node, &client_only] {
        let mut restarts = node.inner.server_restarts.subscribe();
        restarts.borrow_and_update();
        noticed.push(restarts);
    }
    flushall(&client).await;
    let flushed = std::time::Instant::now();
    for (what, restarts) in ["the worker's node", "the client-only node"]
        .into_iter()
        .zip(&mut noticed)
    {
        let left = TTL.saturating_sub(flushed.elapsed());
        tokio::time::timeout(left, restarts.changed())
            .await
            .unwrap_or_else(|_| panic!("{what} did not notice the flush within a TTL ({TTL:?})"))
            .unwrap();
    }
    client_only.close().await.unwrap();
    worker_node.close().await.unwrap();
}

/// A worker cut off while Redis lost the pool's data, back after the
/// recovery window another node opened has ended (seed 1404: Redis refused
/// writes meanwhile, and the nodes that had stopped the job since could not
/// make their stops stand in time). Redis has forgotten the worker; it must
/// not take its suspended job back as its running one before those nodes
/// can. It opens the window itself before it re-asserts, so the job comes
/// back as an orphan, which the sweep requeues only past the window.
/// Here the worker's reconnect also checks the server's identity, which
/// opens the window as well; in the soak that check failed while Redis
/// refused writes, and the renewal that re-registered the worker came
/// first. The renewal now checks the identity itself before re-asserting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_forgotten_with_the_pools_data_reasserts_inside_a_window() {
    let server = RedisServer::start().unwrap();
    let proxy = flotilla_testkit::FaultProxy::start(server.addr())
        .await
        .unwrap();
    let cut_client = flotilla_testkit::client(&proxy.url()).await.unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("forgotten-worker");
    let ttl = Duration::from_secs(1);
    let options = NodeOptions::default().mirror_jobs(false).worker_ttl(ttl);
    let holder = Node::join(&cut_client, &name, options.clone())
        .await
        .unwrap();
    let handler = Counting::default();
    let worker = Worker::new(&holder, handler.clone()).await.unwrap();
    let other = Node::join(&client, &name, options.client_only(true))
        .await
        .unwrap();
    holder.dispatch_job("k", &b"p"[..]).await.unwrap();
    assert!(worker.job_token("k").is_some(), "the job runs");

    proxy.set_mode(flotilla_testkit::ProxyMode::BlackHole);
    wait_until(
        Duration::from_secs(5),
        "the holder stopped its job on lease loss",
        || {
            let worker = worker.inner.clone();
            async move { worker.suspended.lock().await.contains_key("k") }
        },
    )
    .await
    .unwrap();
    let mut noticed = other.inner.server_restarts.subscribe();
    noticed.borrow_and_update();
    flushall(&client).await;
    tokio::time::timeout(ttl, noticed.changed())
        .await
        .expect("the other node noticed the flush")
        .unwrap();
    wait_until(
        Duration::from_secs(10),
        "the window it opened ended",
        || window_over(&client, &name),
    )
    .await
    .unwrap();

    let starts = handler.starts.load(Ordering::SeqCst);
    proxy.set_mode(flotilla_testkit::ProxyMode::Forward);
    let marks = crate::keys::orphan_marks(&name);
    wait_until(
        Duration::from_secs(10),
        "the holder gave its job back, as an orphan or as its running one",
        || {
            let (client, marks) = (client.clone(), marks.clone());
            let restarted = handler.starts.load(Ordering::SeqCst) > starts;
            async move {
                let marked: bool = client.hexists(marks, "k").await.unwrap();
                marked || restarted
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        handler.starts.load(Ordering::SeqCst),
        starts,
        "restarted before the nodes that stopped it since could make the stop stand"
    );
    other.close().await.unwrap();
    holder.close().await.unwrap();
}

/// Whether the recovery window of pool `name` is over: past its end on
/// server time, and no node's recovery mark holds it open.
async fn window_over(client: &fred::prelude::Client, name: &str) -> bool {
    let (epoch, marks): (Option<String>, Option<String>) = client
        .hmget(crate::keys::fencing(name), vec!["\nepoch", "\nrecovering"])
        .await
        .unwrap();
    let now_ms = crate::inspect::server_time_ms(client).await.unwrap();
    let ends = |text: &str| -> Vec<u64> {
        text.split_whitespace()
            .skip(1)
            .step_by(2)
            .filter_map(|t| t.parse().ok())
            .collect()
    };
    let until = epoch.as_deref().map(ends).unwrap_or_default();
    let marked = marks.as_deref().map(ends).unwrap_or_default();
    epoch.is_some() && until.iter().chain(&marked).all(|t| *t <= now_ms)
}
