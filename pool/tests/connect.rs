//! Connecting by URL and never hanging: `Node::connect` heals after a Redis
//! restart; a client that was never connected, an address where nothing
//! listens, and closing while Redis is down all end within their bounds
//! with a typed error that names the address.

mod support;

use std::time::{Duration, Instant};

use flotilla_pool::fred::prelude::{Builder, Config};
use flotilla_pool::{Error, Node, Worker};
use flotilla_testkit::{RedisServer, ServerOptions};
use support::{Ledger, eventually, fast};

fn server(aof: bool) -> RedisServer {
    support::init_tracing();
    RedisServer::start_with(ServerOptions::default().aof(aof))
        .expect("redis-server must be installed (apt-get install redis-server)")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connected_node_dispatches_again_after_a_redis_restart() {
    let mut server = server(true);
    let pool = flotilla_testkit::unique_name("connect-restart");
    let node = Node::connect(&server.url(), &pool, fast()).await.unwrap();
    let ledger = Ledger::default();
    let _worker = Worker::new(&node, ledger.handler("w")).await.unwrap();
    node.dispatch_job("before", "p").await.unwrap();

    server.restart().unwrap();
    let restarted = Instant::now();
    flotilla_testkit::wait_until(
        Duration::from_secs(15),
        "dispatch after restart",
        || async {
            match node.dispatch_job("after", "p").await {
                Ok(()) | Err(Error::JobExists(_)) => true,
                Err(e) => {
                    println!("not yet: {e}");
                    false
                }
            }
        },
    )
    .await
    .unwrap();
    println!(
        "dispatch works again {:?} after the restart",
        restarted.elapsed()
    );
    assert!(ledger.running().contains_key("before"));
    assert!(ledger.running().contains_key("after"));
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    node.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_with_a_client_never_connected_fails_within_redis_timeout() {
    let server = server(false);
    // Built but never `init()`ed, and without a reconnect policy (WARN).
    let client = Builder::from_config(Config::from_url(&server.url()).unwrap())
        .build()
        .unwrap();
    let redis_timeout = Duration::from_millis(500);
    let t0 = Instant::now();
    let result = Node::join(
        &client,
        "never-connected",
        fast().redis_timeout(redis_timeout),
    )
    .await;
    let took = t0.elapsed();
    let e = result.expect_err("the client never connected");
    let text = e.to_string();
    println!("Node::join on a client never initialised: {text} after {took:?}");
    assert!(matches!(e, Error::Unavailable(_)), "{text}");
    assert!(
        text.contains("init()") && text.contains(&server.addr().to_string()),
        "{text}"
    );
    assert!(
        took < redis_timeout + Duration::from_millis(500),
        "took {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_where_nothing_listens_names_the_address_within_redis_timeout() {
    support::init_tracing();
    let port = flotilla_testkit::free_port().unwrap();
    let url = format!("redis://127.0.0.1:{port}");
    let redis_timeout = Duration::from_millis(500);
    let t0 = Instant::now();
    let result = Node::connect(&url, "nothing", fast().redis_timeout(redis_timeout)).await;
    let took = t0.elapsed();
    let e = result.expect_err("nothing listens there");
    let text = e.to_string();
    println!("Node::connect to a closed port: {text} after {took:?}");
    assert!(matches!(e, Error::Unavailable(_)), "{text}");
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(!text.contains("Os {"), "raw I/O error text: {text}");
    assert!(
        took < redis_timeout + Duration::from_millis(500),
        "took {took:?}"
    );

    let bad = Node::connect("redis-sentinel://127.0.0.1:1", "nothing", fast())
        .await
        .unwrap_err();
    assert!(
        matches!(bad, Error::InvalidOptions { option: "url", .. }),
        "{bad}"
    );
}

/// A process started while Redis restarts (or while Sentinel still names a
/// demoted primary) joins once Redis answers within `redis_timeout`,
/// instead of failing at the first refused connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_waits_within_redis_timeout_for_a_server_that_comes_up() {
    support::init_tracing();
    let port = flotilla_testkit::free_port().unwrap();
    let url = format!("redis://127.0.0.1:{port}");
    let pool = flotilla_testkit::unique_name("connect-late");
    let connecting = tokio::spawn({
        let url = url.clone();
        let pool = pool.clone();
        async move {
            let t0 = Instant::now();
            let node =
                Node::connect(&url, &pool, fast().redis_timeout(Duration::from_secs(10))).await;
            (node, t0.elapsed())
        }
    });
    // Nothing listens yet: the first attempts are refused.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !connecting.is_finished(),
        "connect gave up while nothing listened"
    );
    let _server = RedisServer::start_with(ServerOptions::default().port(port))
        .expect("redis-server must be installed (apt-get install redis-server)");
    let (node, took) = tokio::time::timeout(Duration::from_secs(15), connecting)
        .await
        .expect("connect returns within its redis_timeout")
        .unwrap();
    let node = node.expect("joins once the server answers");
    println!("Node::connect joined {took:?} after it started, the server came up at 300 ms");
    let ledger = Ledger::default();
    let _worker = Worker::new(&node, ledger.handler("w")).await.unwrap();
    node.dispatch_job("late", "p").await.unwrap();
    assert!(ledger.running().contains_key("late"));
    node.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_and_remove_worker_while_redis_is_down_return_within_the_bound() {
    let mut server = server(false);
    let pool = flotilla_testkit::unique_name("connect-close");
    let options = fast()
        .redis_timeout(Duration::from_millis(500))
        .worker_shutdown_ttl(Duration::from_secs(2));
    let bound = options.worker_shutdown_ttl + options.redis_timeout;
    let node = Node::connect(&server.url(), &pool, options).await.unwrap();
    let ledger = Ledger::default();
    let first = Worker::new(&node, ledger.slow_stop_handler("w1", 20, 50))
        .await
        .unwrap();
    let _second = Worker::new(&node, ledger.slow_stop_handler("w2", 20, 50))
        .await
        .unwrap();
    // Two left for close: they stop together, within the same bound.
    let _third = Worker::new(&node, ledger.slow_stop_handler("w3", 20, 50))
        .await
        .unwrap();
    for i in 0..20 {
        node.dispatch_job(&format!("job-{i}"), "p").await.unwrap();
    }
    eventually("20 jobs run", Duration::from_secs(10), || {
        ledger.running().len() == 20
    })
    .await;

    server.kill();
    let t0 = Instant::now();
    let removed = node.remove_worker(&first).await;
    let took = t0.elapsed();
    println!("remove_worker while Redis is down: {removed:?} after {took:?}");
    assert!(
        took <= bound + Duration::from_millis(500),
        "remove_worker took {took:?}"
    );
    assert!(
        ledger.running().values().all(|w| w != "w1"),
        "w1's jobs must be stopped: {:?}",
        ledger.running()
    );

    let t0 = Instant::now();
    let closed = node.close().await;
    let took = t0.elapsed();
    println!("close while Redis is down: {closed:?} after {took:?}");
    assert!(
        took <= bound + Duration::from_millis(500),
        "close took {took:?}"
    );
    assert!(closed.is_err(), "the handover cannot have happened");
    assert!(ledger.running().is_empty(), "{:?}", ledger.running());
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
}

/// A server that evicts any key when full (`maxmemory` with an `allkeys-*`
/// policy) would drop job records, payloads and fencing counters without
/// a trace: joining is refused with a typed error that names the setting
/// and the fix. One that evicts only keys with a time to live
/// (`volatile-*`) is joined with a warning, and `noeviction` silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_may_evict_any_key_is_refused_at_join() {
    use flotilla_pool::fred::prelude::ConfigInterface;
    let server = server(false);
    let client = flotilla_testkit::client(&server.url()).await.unwrap();
    let pool = flotilla_testkit::unique_name("eviction");
    client.config_set("maxmemory", "100mb").await.unwrap();
    for policy in ["allkeys-lru", "allkeys-lfu", "allkeys-random"] {
        client.config_set("maxmemory-policy", policy).await.unwrap();
        match Node::join(&client, &pool, fast()).await {
            Err(Error::UnsafeServer {
                setting,
                value,
                reason,
            }) => {
                assert_eq!(setting, "maxmemory-policy");
                assert_eq!(value, policy);
                assert!(reason.contains("noeviction"), "{reason}");
            }
            other => panic!("{policy}: joined or failed otherwise: {other:?}"),
        }
    }
    for policy in ["volatile-lru", "noeviction"] {
        client.config_set("maxmemory-policy", policy).await.unwrap();
        let node = Node::join(&client, &pool, fast()).await.unwrap();
        node.close().await.unwrap();
    }
    // Without maxmemory nothing is evicted, whatever the policy.
    client.config_set("maxmemory", "0").await.unwrap();
    client
        .config_set("maxmemory-policy", "allkeys-lru")
        .await
        .unwrap();
    let node = Node::join(&client, &pool, fast()).await.unwrap();
    node.close().await.unwrap();
}
