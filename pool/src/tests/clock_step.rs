//! A step of Redis's wall clock (an NTP correction, a virtual machine
//! resumed: a Sentinel soak saw the server's clock jump 33.7 s ahead of the
//! hosts' monotonic clock) judges no live worker dead. Liveness is read on
//! server time (`TIME` in scripts), which a step moves at once: every
//! keep-alive looked a step old until its worker's next renewal, up to a
//! third of a TTL later, and a cleanup pass meanwhile moved the jobs of
//! workers that were running them.

use super::live_pool::LivePool;
use super::*;

/// Two nodes (TTL 2 s: renewals every 667 ms, cleanup passes every
/// 500 ms), 40 jobs between their workers; the server's clock jumps 30 s
/// ahead. Every job keeps running where it ran, started once, and the pool
/// still admits new work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_step_of_the_server_clock_moves_no_job_of_a_live_worker() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let server =
        RedisServer::start_with(flotilla_testkit::ServerOptions::default().clock_shift(true))
            .unwrap();
    let options = NodeOptions::default()
        .worker_ttl(Duration::from_secs(2))
        .dispatch_timeout(Duration::from_secs(10));
    let pool = LivePool::start(&server.url(), "clock-step", options).await;
    let starts = pool.starts();

    let before = crate::store::call::server_time_ms(&pool.client)
        .await
        .unwrap();
    server.shift_clock(30_000).unwrap();
    let after = crate::store::call::server_time_ms(&pool.client)
        .await
        .unwrap();
    assert!(
        after >= before + 30_000,
        "the server's clock did not move: {before} → {after}"
    );
    // Every node's next renewal is refused once (no reply heard for "30 s")
    // and sent again at once; the danger is until both keep-alives carry
    // the new time, and any cleanup pass until then; a cleanup it started
    // takes a few seconds to remove a worker. Watch for 4 TTLs, 16 passes
    // per node.
    pool.watch_no_worker_judged_dead(Duration::from_secs(8))
        .await;
    assert_eq!(
        pool.starts(),
        starts,
        "jobs were moved or restarted after the step"
    );
    pool.ends_in_place_and_admitting().await;
}
