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

use super::live_pool::LivePool;
use super::*;

/// Two nodes (TTL 1 s: renewals every 333 ms, cleanup passes every
/// 250 ms), 40 jobs between their workers; Redis is frozen for 2.5 TTLs.
/// No cleanup is claimed after it, no worker registers again, every job
/// runs again where it ran (its lease lapsed during the freeze and came
/// back), and the pool admits new work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_judges_no_live_worker_dead_when_it_wakes() {
    let server = RedisServer::start().unwrap();
    let ttl = Duration::from_secs(1);
    let options = NodeOptions::default()
        .worker_ttl(ttl)
        .dispatch_timeout(Duration::from_secs(10));
    let pool = LivePool::start(&server.url(), "redis-freeze", options).await;
    let workers_hash = pool.a.inner.store.maps.workers.keys_info().hash.clone();
    let registered: HashMap<String, String> =
        pool.client.hgetall(workers_hash.as_str()).await.unwrap();

    server.freeze().unwrap();
    tokio::time::sleep(ttl * 5 / 2).await;
    server.thaw().unwrap();

    // Every node's first renewal after the wake is refused (no reply heard
    // for over a TTL) and sent again at once; cleanup passes run meanwhile,
    // and a cleanup takes a moment to remove a worker. Watch for 4 TTLs.
    pool.watch_no_worker_judged_dead(ttl * 4).await;
    // A cleaned-up worker registers again with a new record.
    let after: HashMap<String, String> = pool.client.hgetall(workers_hash.as_str()).await.unwrap();
    assert_eq!(
        after, registered,
        "workers were removed and registered again"
    );
    pool.ends_in_place_and_admitting().await;
}
