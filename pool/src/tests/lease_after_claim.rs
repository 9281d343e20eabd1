//! A start entry that may be stale is claimed in Redis before its handler
//! runs; the claim is a round trip, and a stall or a pause during it (past
//! the lease) lets a cleaner move the job and another worker start it
//! first. The handler must not start then: the lease is checked again once
//! the claim is answered (found by a chaos soak: a process `SIGSTOP`ped
//! between a claim's answer and its start ran the key beside the worker
//! that took it over meanwhile).

use std::sync::Mutex;

use super::*;

/// Records, for each start, whether its node held the lease then.
#[derive(Clone)]
struct LeaseWitness {
    node: Node,
    starts: Arc<Mutex<Vec<(String, bool)>>>,
}

#[async_trait]
impl Handler for LeaseWitness {
    async fn start(&self, job: Job) -> Result<(), HandlerError> {
        let held = self.node.inner.lease_valid();
        self.starts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((job.key.clone(), held));
        Ok(())
    }
    async fn stop(&self, _key: &str) -> Result<(), HandlerError> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_answered_after_the_lease_lapsed_does_not_start_the_job() {
    let server = RedisServer::start().unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let name = flotilla_testkit::unique_name("lease-after-claim");
    // Renewals every second, the lease lapses 2 s after the last one.
    let options = NodeOptions::default()
        .worker_ttl(Duration::from_secs(3))
        .dispatch_timeout(Duration::from_secs(15));
    let node = Node::join(&client, &name, options).await.unwrap();
    let witness = LeaseWitness {
        node: node.clone(),
        starts: Arc::default(),
    };
    let worker = Worker::new(&node, witness.clone()).await.unwrap();

    // The entry waits in the inbox (starts refused), then may be stale:
    // it takes the claim path when read again.
    let dispatch = dispatch_without_lease(&node, &worker, "k").await;
    node.inner.freshness.invalidate("test");

    // Redis holds every script (the claim, the renewals) for 3 s; reads go
    // on, so the worker reads the entry and sends its claim with a lease
    // that still holds, and gets the answer after it lapsed.
    let _: () = client
        .custom(
            fred::types::CustomCommand::new_static("CLIENT", None, false),
            vec!["PAUSE", "3000", "WRITE"],
        )
        .await
        .unwrap();
    worker.inner.lease_lost.store(false, Ordering::Release);
    worker.inner.rewind_soon(&node.inner);

    dispatch.await.unwrap().unwrap();
    let starts = witness
        .starts
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    assert_eq!(starts.len(), 1, "one start: {starts:?}");
    assert!(
        starts.iter().all(|(_, held)| *held),
        "a handler started without a lease: {starts:?}"
    );
    node.close().await.unwrap();
}
