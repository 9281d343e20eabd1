//! A drained worker gets nothing even from a node whose view is stale: the
//! admission script refuses it and the dispatcher retries elsewhere.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_view_never_dispatches_to_a_drained_worker() {
    let server = RedisServer::start().unwrap();
    let (_client, a, b, _wa, wb, handler_a) =
        two_nodes(&server, &flotilla_testkit::unique_name("drain-stale")).await;
    assert!(b.drain_worker(wb.id()).await.unwrap());
    wait_until(Duration::from_secs(5), "a sees the drain", || async {
        a.pool_workers()
            .iter()
            .any(|w| w.id == wb.id() && w.drained)
    })
    .await
    .unwrap();
    // `a` routes as if it had missed the drain: every key goes to wb.
    a.inner
        .ring
        .store(Arc::new(crate::routing::Ring::new([wb.id().to_string()])));
    a.dispatch_job("k-stale", &b"p"[..]).await.unwrap();
    // Started by wa's handler (before the dispatch was answered).
    assert_eq!(handler_a.starts.load(Ordering::SeqCst), 1);
    assert!(wb.job_keys().is_empty());
    a.close().await.unwrap();
    b.close().await.unwrap();
}
