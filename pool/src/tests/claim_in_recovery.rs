//! A start entry that Redis brought back by going back in time is not
//! claimed while the pool recovers. Its key may run on another worker
//! with a start Redis lost, which that worker has not re-asserted yet:
//! claimed then, the key would run twice (chaos soak seed 1432: a
//! hand-off's start entry came back with a rollback and was claimed by its
//! new owner, cut off until then, while the worker it had gone back to ran
//! the key; `I1 overlap` for 75 ms, until that worker re-asserted it).

use super::*;
use flotilla_testkit::ServerOptions;
use fred::prelude::HashesInterface;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_back_with_a_rollback_waits_for_the_runs_to_re_assert() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let mut server = RedisServer::start_with(ServerOptions::default().aof(true)).unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("claim-in-recovery");
    let options = NodeOptions::default()
        .worker_ttl(Duration::from_secs(1))
        .dispatch_timeout(Duration::from_secs(20));
    let handler = Overlap::default();
    let (a, b, wa, wb) = two_nodes_sharing(&client, &name, options, &handler).await;
    let key = key_placed_on(&b, &wb).await;
    let pending = super::recovery_window::pending_hash(&name);

    // The start of `key` waits in wb's inbox (its lanes wait for this),
    // pending guard and all, when Redis saves the state it goes back to.
    let lanes_held = wb.inner.ops.write().await;
    let dispatch = tokio::spawn({
        let (b, key) = (b.clone(), key.clone());
        async move { b.dispatch_job(&key, &b"p"[..]).await }
    });
    wait_until(Duration::from_secs(5), "the admission's guard", || {
        let (client, pending, key) = (client.clone(), pending.clone(), key.clone());
        async move { client.hexists::<bool, _, _>(pending, key).await.unwrap() }
    })
    .await
    .unwrap();
    let snapshot = server.save_snapshot().unwrap();

    // Then the key runs on wa with a newer token (here: the guard and the
    // payload go, and `a`, whose ring names only wa, admits it again).
    let _: i64 = client.hdel(&pending, &key).await.unwrap();
    let _: i64 = client
        .hdel(crate::keys::payloads(&name), &key)
        .await
        .unwrap();
    a.inner.ring.store(Arc::new(crate::routing::Ring::new(vec![
        wa.id().to_string(),
    ])));
    a.dispatch_job(&key, &b"p"[..]).await.unwrap();
    let newer = wa.job_token(&key).expect("the key runs on wa");

    // Redis goes back to the snapshot: wb's entry and guard are back, wa's
    // run is forgotten, and wa re-asserts it only once this is dropped.
    let reassertion_held = wa.inner.ops.read().await;
    server.roll_back(&snapshot).unwrap();
    // wb's node had a reason for doubt since the entry was appended (in
    // the soak, the cut that kept it away): the entry is claimed before it
    // starts, not started first (see `freshness.rs`).
    b.inner.freshness.invalidate("cut off");
    drop(lanes_held);
    // wb reads its entry while the pool recovers: refused, read again
    // later (or, without the check, claimed and started).
    wait_until(
        Duration::from_secs(10),
        "wb tried to claim the entry",
        || {
            let tried = wb.inner.rewind_state().0 >= 1 || handler.starts.load(Ordering::SeqCst) > 1;
            async move { tried }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        handler.most.load(Ordering::SeqCst),
        1,
        "the key ran on wb while wa ran it"
    );
    drop(reassertion_held);

    // wa re-asserts its run; wb's entry, read again, is dropped. (The
    // ring places the key on wb: a rebalance may then hand wa's run over
    // to it, with a newer token still.)
    let inbox = b.inner.inbox(wb.id()).unwrap();
    wait_until(
        Duration::from_secs(10),
        "wb's entry dropped, the key running on one worker",
        || {
            let inbox = inbox.clone();
            let runs = wa.job_keys().len() + wb.job_keys().len();
            async move { runs == 1 && inbox.is_empty().await.unwrap_or(false) }
        },
    )
    .await
    .unwrap();
    assert_eq!(handler.most.load(Ordering::SeqCst), 1, "ran once at a time");
    if let Some(token) = wb.job_token(&key) {
        assert!(
            token > newer,
            "wb runs the start Redis brought back ({token}), older than wa's run ({newer})"
        );
    }
    dispatch.abort();
    a.close().await.unwrap();
    b.close().await.unwrap();
}
