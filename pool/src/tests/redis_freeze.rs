//! A Redis that stalls for over a TTL (a frozen host, a paused virtual
//! machine) judges no live worker dead when it comes back. No worker can
//! renew while Redis serves nobody, so every keep-alive is over a TTL old
//! on server time at the wake; judged by `TIME` alone, the first cleanup
//! pass after it claimed every worker of the pool at once and moved all
//! their jobs (chaos soak seed 1652: ten workers cleaned up on waking from
//! a 1.75 s freeze, and ten jobs moved off them were lost to a loss that
//! came after). A worker's silence now counts only while Redis served
//! (`note_pulse`, `serving_since` in `scripts/base.lua`).

use std::collections::HashMap;

use super::*;

/// Keys some handler runs now.
fn running_keys(handler: &Overlap) -> usize {
    handler.running.iter().filter(|n| *n.value() > 0).count()
}

/// Two nodes (TTL 1 s: renewals every 333 ms, cleanup passes every
/// 250 ms), 40 jobs between their workers; Redis is frozen for 2.5 TTLs.
/// No cleanup is claimed after it, every job runs again where it ran
/// (its lease lapsed during the freeze and came back), and the pool
/// admits new work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_judges_no_live_worker_dead_when_it_wakes() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let ttl = Duration::from_secs(1);
    let options = NodeOptions::default()
        .worker_ttl(ttl)
        .dispatch_timeout(Duration::from_secs(10));
    let name = flotilla_testkit::unique_name("redis-freeze");
    let handler = Overlap::default();
    let (a, b, wa, wb) = two_nodes_sharing(&client, &name, options, &handler).await;
    let keys: Vec<String> = (0..40).map(|i| format!("k{i:02}")).collect();
    for key in &keys {
        a.dispatch_job(key, &b"p"[..]).await.unwrap();
    }
    wait_until(Duration::from_secs(10), "every job runs", || async {
        running_keys(&handler) == keys.len()
    })
    .await
    .unwrap();
    let on_a: Vec<&String> = keys.iter().filter(|k| wa.job_token(k).is_some()).collect();
    assert!(
        !on_a.is_empty() && on_a.len() < keys.len(),
        "{} of 40 jobs on a",
        on_a.len()
    );
    // Past the first TTL after joining, when a node judges nobody dead.
    wait_until(
        Duration::from_secs(5),
        "both nodes judge liveness",
        || async { !a.inner.recently_connected().await && !b.inner.recently_connected().await },
    )
    .await
    .unwrap();
    let workers_hash = a.inner.store.maps.workers.keys_info().hash.clone();
    let registered: HashMap<String, String> = client.hgetall(workers_hash.as_str()).await.unwrap();

    server.freeze().unwrap();
    tokio::time::sleep(ttl * 5 / 2).await;
    server.thaw().unwrap();

    // Every node's first renewal after the wake is refused (no reply heard
    // for over a TTL) and sent again at once; cleanup passes run meanwhile,
    // and a cleanup takes a moment to remove a worker. Watch for 4 TTLs.
    let cleanup_hash = a.inner.store.maps.cleanup.keys_info().hash.clone();
    let watch = std::time::Instant::now();
    while watch.elapsed() < ttl * 4 {
        let most = handler.most.load(Ordering::SeqCst);
        assert!(most <= 1, "a key ran {most} times at once");
        // A claim on a worker is a judgement that it is dead.
        let claims: HashMap<String, String> = client.hgetall(cleanup_hash.as_str()).await.unwrap();
        assert!(claims.is_empty(), "live workers judged dead: {claims:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A cleaned-up worker registers again with a new record.
    let after: HashMap<String, String> = client.hgetall(workers_hash.as_str()).await.unwrap();
    assert_eq!(
        after, registered,
        "workers were removed and registered again"
    );
    wait_until(Duration::from_secs(10), "every job runs again", || async {
        running_keys(&handler) == keys.len()
    })
    .await
    .unwrap();
    let still_on_a: Vec<&String> = keys.iter().filter(|k| wa.job_token(k).is_some()).collect();
    let on_b = keys.iter().filter(|k| wb.job_token(k).is_some()).count();
    assert_eq!(still_on_a, on_a, "jobs moved between the workers");
    assert_eq!(on_b, keys.len() - on_a.len());

    a.dispatch_job("after-a", &b"p"[..]).await.unwrap();
    b.dispatch_job("after-b", &b"p"[..]).await.unwrap();
    wait_until(Duration::from_secs(5), "the new jobs run", || async {
        running_keys(&handler) == keys.len() + 2
    })
    .await
    .unwrap();
    assert!(handler.most.load(Ordering::SeqCst) <= 1);
    a.close().await.unwrap();
    b.close().await.unwrap();
}
