//! Behind Sentinel, a node's reader keeps its own connection: after a
//! primary stalled through its failover, the node's commands may go to the
//! promoted server while the reader still reads the stalled one, which
//! wakes and runs the scripts its clients sent into the stall (a cleanup's
//! move, a requeue). The start entries those append reach the worker with
//! stream ids after the node's last doubt; taken for fresh, they started
//! before any claim, beside the key's run on the promoted side (chaos soak
//! seed 1625: seven `I1` overlaps, `job-0965` among them). An entry read
//! from another server than the commands go to is claimed first, on the
//! commands' server, which knows nothing of it.

use flotilla_streaming::{Stream, StreamOptions};
use flotilla_testkit::Sentinels;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_entry_read_from_a_woken_primary_is_claimed_not_started() {
    let ha = Sentinels::start().unwrap();
    let client = flotilla_testkit::client(&ha.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("woken-entries");
    // A long TTL: no renewal judges the server before the test does.
    let options = NodeOptions::default().worker_ttl(Duration::from_secs(30));
    let node = Node::join(&client, &name, options).await.unwrap();
    let handler = Counting::default();
    let starts = handler.starts.clone();
    let worker = Worker::new(&node, handler).await.unwrap();
    let old = ha.primary_port().unwrap();
    let pid = ha.server_pid(old).unwrap();

    // The primary stalls through its failover and wakes; the commands move
    // to the promoted server, the reader stays on the woken one.
    signal("STOP", pid);
    let promoted =
        tokio::task::block_in_place(|| ha.wait_for_failover(old, Duration::from_secs(20)));
    signal("CONT", pid);
    let promoted = promoted.unwrap();
    node.inner.store.client.force_reconnection().await.unwrap();
    wait_until(
        Duration::from_secs(10),
        "the node's commands go to the promoted server",
        || {
            let port = node
                .inner
                .store
                .client
                .active_connections()
                .first()
                .map(|s| s.port);
            async move { port == Some(promoted) }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        node.inner.reader.server().map(|s| s.port),
        Some(old),
        "the reader still reads the woken primary"
    );

    // On the woken primary, a script its clients sent into the stall
    // appends a start of a key the promoted server never admitted.
    let woken = flotilla_testkit::client(&format!("redis://127.0.0.1:{old}"))
        .await
        .unwrap();
    let inbox = Stream::new(
        &woken,
        &crate::keys::worker_inbox(worker.id()),
        StreamOptions::default().hash_tag(&node.inner.pool),
    )
    .unwrap();
    let token = node.inner.store.server_time_ms().await.unwrap() * 1000;
    // As an admission writes it: no hop, so fresh by its stream id.
    let mut entry = format!("{token} {token} 0 0 -\n").into_bytes();
    entry.extend_from_slice(&crate::codec::encode(&crate::codec::JobBody {
        key: "ghost".to_string(),
        payload: b"p".to_vec(),
        restart: None,
    }));
    inbox.add(crate::codec::EV_START, entry).await.unwrap();

    // The worker reads it and claims it on the promoted server (no guard
    // there: refused) rather than start it; the reader follows the
    // commands once it saw where the entry came from. The lease may have
    // lapsed through the stall: the entry waits for the next renewal on
    // the promoted server (a third of the TTL).
    wait_until(
        Duration::from_secs(40),
        "the entry started, or the reader reconnected to the promoted server",
        || {
            let port = node.inner.reader.server().map(|s| s.port);
            let started = starts.load(Ordering::SeqCst) > 0;
            async move { started || port == Some(promoted) }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        starts.load(Ordering::SeqCst),
        0,
        "an entry of the woken primary started before any claim"
    );
    assert!(worker.job_token("ghost").is_none());
    node.close().await.unwrap();
}
