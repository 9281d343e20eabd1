//! Redis refusing writes for a while (out of memory, or turned into a
//! read-only replica) while it keeps its data: every function call fails
//! with an error reply, then works again. No job may be lost to the
//! errors, whatever Redis knew of it when they began.

use super::*;
use fred::interfaces::ConfigInterface;

/// Sets `maxmemory` (0: no limit). With policy `noeviction`, a limit below
/// what Redis uses refuses every function call and write command (`OOM`).
async fn maxmemory(client: &fred::prelude::Client, bytes: u64) {
    client
        .config_set("maxmemory", bytes.to_string())
        .await
        .unwrap();
}

/// A job stopped to be moved while Redis refuses writes, of which Redis
/// knows nothing (it went back to before the job's admission, and the
/// worker has not re-asserted yet): the move, the re-assertion and the
/// restart all fail, and once writes come back the job runs again, here
/// or at the key's ring owner. Handing it on is not enough: a hand-off
/// from a worker Redis does not name moves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_stopped_to_move_while_writes_are_refused_runs_again() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("refused");
    let handler_a = HookOnStop::default();
    let (client, a, b, wa, wb) = two_nodes_with(&server, &name, handler_a.clone()).await;
    // A key the ring gives to `b`, running on `a` (a ring change `a` has
    // not acted on yet), that Redis has no record of.
    let key = key_placed_on(&a, &wb).await;
    wa.inner.jobs.insert(key.clone(), local_job(&key, 7));
    // Writes are refused from the stop on, for 1.5 s.
    let hook: StopHook = Box::new(move || {
        let client = client.clone();
        Box::pin(async move {
            maxmemory(&client, 1).await;
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                maxmemory(&client, 0).await;
            });
        })
    });
    handler_a.hook.set(hook).ok().unwrap();
    a.inner.hand_off_local(&wa.inner, &key).await;
    wait_until(Duration::from_secs(15), "the job runs again", || async {
        wa.job_token(&key).is_some_and(|t| t > 7) || wb.job_token(&key).is_some_and(|t| t > 7)
    })
    .await
    .unwrap();
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Makes the server a replica of a server that is not there (`port` 0:
/// a primary again): it keeps its data and refuses writes (`READONLY`).
async fn replica_of_nobody(client: &fred::prelude::Client, replica: bool) {
    let args: Vec<String> = if replica {
        vec!["127.0.0.1".into(), "1".into()]
    } else {
        vec!["NO".into(), "ONE".into()]
    };
    let _: fred::types::Value = client
        .custom(
            fred::types::CustomCommand::new_static("REPLICAOF", None, false),
            args,
        )
        .await
        .unwrap();
}

/// A dispatch Redis refuses to write, out of memory (`OOM`) or as a
/// read-only replica (`READONLY`), fails with [`crate::Error::WritesRefused`],
/// which a caller can tell from a bug and retry; once Redis takes writes
/// again the same dispatch starts its job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_redis_refuses_to_write_fails_with_writes_refused() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("refused-dispatch");
    let (node, _worker, handler) = pool(&server, &name).await;
    let client = flotilla_testkit::client(&server.url()).await.unwrap();

    maxmemory(&client, 1).await;
    let refused = node.dispatch_job("oom", &b"p"[..]).await;
    maxmemory(&client, 0).await;
    assert!(
        matches!(refused, Err(crate::Error::WritesRefused(_))),
        "out of memory: {refused:?}"
    );
    node.dispatch_job("oom", &b"p"[..]).await.unwrap();

    replica_of_nobody(&client, true).await;
    let refused = node.dispatch_job("read-only", &b"p"[..]).await;
    replica_of_nobody(&client, false).await;
    assert!(
        matches!(refused, Err(crate::Error::WritesRefused(_))),
        "read-only replica: {refused:?}"
    );
    node.dispatch_job("read-only", &b"p"[..]).await.unwrap();
    assert_eq!(handler.starts.load(Ordering::SeqCst), 2);
    node.close().await.unwrap();
}
