//! I7: while Redis is down, calls fail fast with a typed error; once it is
//! back, the pool heals by itself.

mod support;

use std::time::{Duration, Instant};

use flotilla_pool::{Error, Node, Worker};
use flotilla_testkit::{RedisServer, ServerOptions};
use support::{Ledger, eventually, fast};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_fail_fast_while_redis_is_down_and_work_again_after() {
    support::init_tracing();
    let mut server = RedisServer::start_with(ServerOptions::default().aof(true)).unwrap();
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let pool = flotilla_testkit::unique_name("outage");
    let options = fast().redis_timeout(Duration::from_millis(500));
    let node = Node::join(&client, &pool, options).await.unwrap();
    let ledger = Ledger::default();
    let _worker = Worker::new(&node, ledger.handler("w")).await.unwrap();
    node.dispatch_job("before", &b"p"[..]).await.unwrap();

    server.kill();
    for (what, call) in [
        (
            "dispatch_job",
            Box::pin(node.dispatch_job("during", &b"p"[..]))
                as std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), Error>> + Send>>,
        ),
        ("stop_job", Box::pin(node.stop_job("before"))),
        (
            "notify_worker",
            Box::pin(node.notify_worker("before", &b"n"[..])),
        ),
        (
            "dispatch_message",
            Box::pin(node.dispatch_message("before", &b"m"[..])),
        ),
        (
            "job_payload",
            Box::pin(async { node.job_payload("before").await.map(|_| ()) }),
        ),
    ] {
        let t0 = Instant::now();
        let result = call.await;
        let took = t0.elapsed();
        assert!(
            matches!(result, Err(Error::Unavailable(_))),
            "{what} while Redis is down: {result:?}"
        );
        assert!(took < Duration::from_secs(2), "{what} took {took:?}");
        println!("{what} failed in {took:?}: {}", result.unwrap_err());
    }

    server.restart().unwrap();
    // Healed: the job that ran before still runs once, and new work goes through.
    eventually("dispatch works again", Duration::from_secs(15), || {
        ledger.running().contains_key("before")
    })
    .await;
    flotilla_testkit::wait_until(
        Duration::from_secs(15),
        "dispatch after restart",
        || async {
            match node.dispatch_job("after", &b"p"[..]).await {
                Ok(()) => true,
                Err(Error::JobExists(_)) => true,
                Err(e) => {
                    println!("not yet: {e}");
                    false
                }
            }
        },
    )
    .await
    .unwrap();
    assert!(ledger.running().contains_key("after"));
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    node.close().await.unwrap();
}
