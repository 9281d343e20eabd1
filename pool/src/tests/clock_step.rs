//! A step of Redis's wall clock (an NTP correction, a virtual machine
//! resumed: a Sentinel soak saw the server's clock jump 33.7 s ahead of the
//! hosts' monotonic clock) judges no live worker dead. Liveness is read on
//! server time (`TIME` in scripts), which a step moves at once: every
//! keep-alive looked a step old until its worker's next renewal, up to a
//! third of a TTL later, and a cleanup pass meanwhile moved the jobs of
//! workers that were running them.

use std::collections::HashMap;

use super::*;

/// Keys some handler runs now.
fn running_keys(handler: &Overlap) -> usize {
    handler.running.iter().filter(|n| *n.value() > 0).count()
}

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
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let options = NodeOptions::default()
        .worker_ttl(Duration::from_secs(2))
        .dispatch_timeout(Duration::from_secs(10));
    let name = flotilla_testkit::unique_name("clock-step");
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
    let on_a = keys.iter().filter(|k| wa.job_token(k).is_some()).count();
    assert!(on_a > 0 && on_a < keys.len(), "{on_a} of 40 jobs on a");
    let starts = handler.starts.load(Ordering::SeqCst);
    // Past the first TTL after joining, when a node judges nobody dead.
    wait_until(
        Duration::from_secs(5),
        "both nodes judge liveness",
        || async { !a.inner.recently_connected().await && !b.inner.recently_connected().await },
    )
    .await
    .unwrap();

    let before = crate::store::call::server_time_ms(&client).await.unwrap();
    server.shift_clock(30_000).unwrap();
    let after = crate::store::call::server_time_ms(&client).await.unwrap();
    assert!(
        after >= before + 30_000,
        "the server's clock did not move: {before} → {after}"
    );
    // Every node's next renewal is refused once (no reply heard for "30 s")
    // and sent again at once; the danger is until both keep-alives carry
    // the new time, and any cleanup pass until then; a cleanup it started
    // takes a few seconds to remove a worker. Watch for 4 TTLs, 16 passes
    // per node.
    let cleanup_hash = a.inner.store.maps.cleanup.keys_info().hash.clone();
    let watch = std::time::Instant::now();
    while watch.elapsed() < Duration::from_secs(8) {
        let most = handler.most.load(Ordering::SeqCst);
        assert!(most <= 1, "a key ran {most} times at once");
        // A claim on a worker is a judgement that it is dead.
        let claims: HashMap<String, String> = client.hgetall(cleanup_hash.as_str()).await.unwrap();
        assert!(claims.is_empty(), "live workers judged dead: {claims:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        handler.starts.load(Ordering::SeqCst),
        starts,
        "jobs were moved or restarted after the step"
    );
    assert_eq!(running_keys(&handler), keys.len());
    let still_on_a = keys.iter().filter(|k| wa.job_token(k).is_some()).count();
    let still_on_b = keys.iter().filter(|k| wb.job_token(k).is_some()).count();
    assert_eq!((still_on_a, still_on_b), (on_a, keys.len() - on_a));

    // The pool admits and starts new work on both nodes.
    a.dispatch_job("after-a", &b"p"[..]).await.unwrap();
    b.dispatch_job("after-b", &b"p"[..]).await.unwrap();
    wait_until(Duration::from_secs(5), "the new jobs run", || async {
        running_keys(&handler) == keys.len() + 2
    })
    .await
    .unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}
