//! A node that comes back under the id it had before (`NodeOptions::node_id`,
//! e.g. a pod name) shares its reply stream with its earlier run: answers
//! meant for that run's requests can still arrive after it is gone. They
//! must not answer the new run's requests.

use std::collections::HashSet;
use std::sync::Mutex;

use super::*;

/// Stops slowly, by key: "quick" in 1 s, anything else in 3 s; records
/// the stops begun and the stops that returned.
#[derive(Clone, Default)]
struct SlowStops {
    begun: Arc<Mutex<HashSet<String>>>,
    done: Arc<Mutex<HashSet<String>>>,
}

impl SlowStops {
    fn begun(&self, key: &str) -> bool {
        self.begun.lock().unwrap().contains(key)
    }
    fn done(&self, key: &str) -> bool {
        self.done.lock().unwrap().contains(key)
    }
}

#[async_trait]
impl Handler for SlowStops {
    async fn start(&self, _job: Job) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn stop(&self, key: &str) -> Result<(), HandlerError> {
        self.begun.lock().unwrap().insert(key.to_string());
        let takes = if key == "quick" { 1 } else { 3 };
        tokio::time::sleep(Duration::from_secs(takes)).await;
        self.done.lock().unwrap().insert(key.to_string());
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_back_under_its_id_takes_no_answer_meant_for_its_last_run() {
    let server = RedisServer::start().unwrap();
    let name = flotilla_testkit::unique_name("same-id");
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    // Stops are bounded by a sixth of the TTL: 5 s holds the slow one.
    let options = NodeOptions::default()
        .worker_ttl(Duration::from_secs(30))
        .dispatch_timeout(Duration::from_secs(8));
    let host = Node::join(&client, &name, options.clone()).await.unwrap();
    let handler = SlowStops::default();
    let _worker = Worker::new(&host, handler.clone()).await.unwrap();
    host.dispatch_job("quick", &b"p"[..]).await.unwrap();
    host.dispatch_job("slow", &b"p"[..]).await.unwrap();

    // The first run of node "n-fixed" asks for a stop and goes away while
    // the handler stops the job: the answer comes a second later.
    let fixed = options.client_only(true).node_id("n-fixed");
    let first = Node::join(&client, &name, fixed.clone()).await.unwrap();
    let stop = {
        let first = first.clone();
        tokio::spawn(async move { first.stop_job("quick").await })
    };
    wait_until(Duration::from_secs(5), "the first stop begins", || {
        let begun = handler.begun("quick");
        async move { begun }
    })
    .await
    .unwrap();
    stop.abort();
    first.close().await.unwrap();

    // The node is back under the same id and stops another job; the
    // answer for the first run's stop must not end this one's wait.
    let second = Node::join(&client, &name, fixed).await.unwrap();
    second.stop_job("slow").await.unwrap();
    assert!(
        handler.done("quick"),
        "the earlier stop is answered first (it is the quicker)"
    );
    assert!(
        handler.done("slow"),
        "stop_job returned before the handler's stop of the job returned"
    );
    second.close().await.unwrap();
    host.close().await.unwrap();
}
