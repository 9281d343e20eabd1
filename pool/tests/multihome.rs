//! Multi-home workers against two real Redis servers: one handler serving
//! both, a killed home and a black-holed home that never slow the healthy
//! one, breaker open / half-open / close, capacity split and re-split, and
//! configuration errors.

mod support;

use std::time::{Duration, Instant};

use flotilla_pool::multihome::{
    BreakerState, ConfigError, HomeConfig, MultiHomeConfig, MultiHomeOptions, MultiHomeWorker,
    read_published,
};
use flotilla_pool::{Error, Node};
use flotilla_testkit::{FaultProxy, RedisServer};
use support::{Ledger, eventually, fast};

/// Held by every test that runs Redis servers: two of them compare
/// latencies before and during an outage, and another test's outage (or
/// start-up) on this 2-core budget would be their noise. Serial, the file
/// takes about 25 s.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const RESET: Duration = Duration::from_millis(1000);
const POLL_TIMEOUT: Duration = Duration::from_millis(500);

fn options() -> MultiHomeOptions {
    MultiHomeOptions::default()
        .failure_threshold(3)
        .reset_after(RESET)
        .poll_timeout(POLL_TIMEOUT)
        .probe_interval(Duration::from_millis(100))
        .node(fast())
}

fn start_server() -> RedisServer {
    RedisServer::start().expect("redis-server must be installed (apt-get install redis-server)")
}

/// A dispatching node of one home, mirroring its jobs map (the tests list
/// each home's jobs).
async fn dispatcher(url: &str, pool: &str) -> Node {
    let client = flotilla_testkit::client(url).await.unwrap();
    Node::join(&client, pool, fast().client_only(true).mirror_jobs(true))
        .await
        .unwrap()
}

fn two_homes(url_a: &str, url_b: &str, pool: &str) -> MultiHomeConfig {
    MultiHomeConfig::new(vec![
        HomeConfig::new(url_a, pool),
        HomeConfig::new(url_b, pool),
    ])
    .unwrap()
}

/// Dispatches `n` jobs one after the other on `node`, returning each
/// dispatch → Ok latency.
async fn timed_dispatches(node: &Node, prefix: &str, n: usize) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        node.dispatch_job(&format!("{prefix}-{i}"), &b"x"[..])
            .await
            .unwrap_or_else(|e| panic!("dispatch {prefix}-{i}: {e}"));
        out.push(t.elapsed());
    }
    out
}

fn p99(samples: &[Duration]) -> Duration {
    let mut s = samples.to_vec();
    s.sort();
    s[((s.len() * 99).div_ceil(100)).saturating_sub(1)]
}

/// Time from `since` until home `name` of `worker` reaches `state`.
fn time_to_state(
    worker: &MultiHomeWorker,
    name: &str,
    state: BreakerState,
    since: Instant,
) -> tokio::task::JoinHandle<Duration> {
    let mut rx = worker.breaker_state(name).unwrap();
    tokio::spawn(async move {
        let _ = rx.wait_for(|s| *s == state).await;
        since.elapsed()
    })
}

fn state_of(worker: &MultiHomeWorker, home: &str) -> BreakerState {
    worker.home(home).unwrap().state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_of_both_homes_run_on_one_worker_and_stay_apart() {
    let _serial = SERIAL.lock().await;
    support::init_tracing();
    let (a, b) = (start_server(), start_server());
    let pool = flotilla_testkit::unique_name("mh-both");
    let ledger = Ledger::default();
    let worker = MultiHomeWorker::start(
        two_homes(&a.url(), &b.url(), &pool),
        options(),
        ledger.handler("mh"),
    )
    .await
    .unwrap();
    assert_eq!(worker.background_tasks(), 2, "one supervisor per home");
    let (da, db) = (
        dispatcher(&a.url(), &pool).await,
        dispatcher(&b.url(), &pool).await,
    );
    // The same key in both homes is two jobs, both on this one worker.
    da.dispatch_job("order-1", &b"a"[..]).await.unwrap();
    db.dispatch_job("order-1", &b"b"[..]).await.unwrap();
    db.dispatch_job("order-2", &b"b"[..]).await.unwrap();
    let running = ledger.running_keys();
    for key in ["home1/order-1", "home2/order-1", "home2/order-2"] {
        assert!(running.contains(key), "{key} not running: {running:?}");
    }
    assert_eq!(worker.home("home1").unwrap().running, 1);
    assert_eq!(worker.home("home2").unwrap().running, 2);
    // Stopping in one home leaves the other home's job alone.
    da.stop_job("order-1").await.unwrap();
    let running = ledger.running_keys();
    assert!(!running.contains("home1/order-1") && running.contains("home2/order-1"));
    assert_eq!(worker.home("home1").unwrap().running, 0);
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    // Each home's pool only knows its own jobs (replicas catch up).
    eventually("home1 pool empty", Duration::from_secs(5), || {
        da.job_keys().is_empty()
    })
    .await;
    eventually(
        "home2 pool has its two jobs",
        Duration::from_secs(5),
        || {
            let mut keys = db.job_keys();
            keys.sort();
            keys == ["order-1", "order-2"]
        },
    )
    .await;
    // An inspector of either home reads the breaker states.
    let probe = flotilla_testkit::client(&b.url()).await.unwrap();
    flotilla_testkit::wait_until(Duration::from_secs(5), "published state", || {
        let (probe, pool) = (probe.clone(), pool.clone());
        async move {
            let states = read_published(&probe, &pool).await.unwrap();
            states.len() == 1
                && states[0].home == "home2"
                && states[0].homes.iter().all(|h| h.state == "closed")
                && states[0].homes[1].running == 2
        }
    })
    .await
    .unwrap();
    worker.close().await.unwrap();
    // Closing removes the published state.
    assert!(read_published(&probe, &pool).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_home_takes_the_plain_path_and_refuses_beyond_capacity() {
    let _serial = SERIAL.lock().await;
    support::init_tracing();
    let server = start_server();
    let pool = flotilla_testkit::unique_name("mh-single");
    let ledger = Ledger::default();
    let config = MultiHomeConfig::from_lists(&server.url(), Some(&pool), "unused").unwrap();
    let worker = MultiHomeWorker::start(
        config,
        options().max_concurrent_jobs(Some(2)),
        ledger.handler("mh"),
    )
    .await
    .unwrap();
    assert_eq!(worker.background_tasks(), 0, "no supervisor for one home");
    assert_eq!(worker.home("home1").unwrap().allotted, Some(2));
    let d = dispatcher(&server.url(), &pool).await;
    d.dispatch_job("j1", &b""[..]).await.unwrap();
    d.dispatch_job("j2", &b""[..]).await.unwrap();
    let refused = d.dispatch_job("j3", &b""[..]).await;
    assert!(
        matches!(&refused, Err(Error::WorkerAtCapacity { key, .. }) if key == "j3"),
        "{refused:?}"
    );
    // The refusal left nothing behind: once a slot frees, the key starts.
    d.stop_job("j1").await.unwrap();
    d.dispatch_job("j3", &b""[..]).await.unwrap();
    assert_eq!(ledger.total_starts(), 3);
    worker.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_home_never_slows_the_other_and_resumes_after_restart() {
    let _serial = SERIAL.lock().await;
    support::init_tracing();
    let (mut a, b) = (start_server(), start_server());
    let pool = flotilla_testkit::unique_name("mh-kill");
    let ledger = Ledger::default();
    let worker = MultiHomeWorker::start(
        two_homes(&a.url(), &b.url(), &pool),
        options(),
        ledger.handler("mh"),
    )
    .await
    .unwrap();
    // Home 1's dispatcher gives up after 1 s, so that a dispatch caught in
    // the pool's own recovery window does not hide when home 1 is back.
    let da = {
        let client = flotilla_testkit::client(&a.url()).await.unwrap();
        let options = fast()
            .client_only(true)
            .dispatch_timeout(Duration::from_secs(1));
        Node::join(&client, &pool, options).await.unwrap()
    };
    let db = dispatcher(&b.url(), &pool).await;
    da.dispatch_job("a-before", &b""[..]).await.unwrap();
    timed_dispatches(&db, "warm", 20).await;
    let before = timed_dispatches(&db, "before", 150).await;

    let killed_at = Instant::now();
    let opened = time_to_state(&worker, "home1", BreakerState::Open, killed_at);
    a.kill();
    let during = timed_dispatches(&db, "during", 150).await;
    eventually("home1 open", Duration::from_secs(5), || {
        state_of(&worker, "home1") == BreakerState::Open
    })
    .await;
    let opened_after = opened.await.unwrap();
    let status = worker.home("home1").unwrap();
    assert!(status.consecutive_failures >= 3, "{status:?}");
    // Still dispatching on B while A is open.
    let open_phase = timed_dispatches(&db, "open", 50).await;
    let (p_before, p_during) = (
        p99(&before),
        p99(&during
            .iter()
            .chain(&open_phase)
            .copied()
            .collect::<Vec<_>>()),
    );
    println!(
        "home2 dispatch->Ok p99: before {:.2} ms, during home1 outage {:.2} ms; home1 breaker open {:.0} ms after the kill",
        p_before.as_secs_f64() * 1e3,
        p_during.as_secs_f64() * 1e3,
        opened_after.as_secs_f64() * 1e3
    );
    let bound = (p_before * 3).max(Duration::from_millis(50));
    assert!(p_during < bound, "p99 during {p_during:?} >= {bound:?}");

    // After the reset period a probe half-opens the breaker and, failing,
    // opens it again: the open count grows.
    eventually("home1 probed after reset and re-opened", RESET * 5, || {
        worker.home("home1").unwrap().opens >= 2
    })
    .await;
    assert!(
        killed_at.elapsed() >= RESET,
        "re-probed before the reset period"
    );
    // Skipped while open: beyond the three that opened it, one failure per
    // half-open probe, none in between.
    let status = worker.home("home1").unwrap();
    assert_eq!(
        u64::from(status.consecutive_failures),
        3 + (status.opens - 1),
        "{status:?}"
    );

    let restarted_at = Instant::now();
    let closed_after = time_to_state(&worker, "home1", BreakerState::Closed, restarted_at);
    a.start_again().unwrap();
    let mut attempt = 0;
    loop {
        attempt += 1;
        match da
            .dispatch_job(&format!("a-after-{attempt}"), &b""[..])
            .await
        {
            Ok(()) => break,
            Err(e) if restarted_at.elapsed() < Duration::from_secs(20) => {
                tracing::debug!(error = %e, "home1 not back yet");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("home1 did not resume: {e}"),
        }
    }
    let resumed_after = restarted_at.elapsed();
    eventually("home1 closed", Duration::from_secs(5), || {
        state_of(&worker, "home1") == BreakerState::Closed
    })
    .await;
    let closed_after = closed_after.await.unwrap();
    println!(
        "home1 after redis-server restart: breaker closed in {:.0} ms, first dispatch Ok in {:.0} ms ({attempt} attempts)",
        closed_after.as_secs_f64() * 1e3,
        resumed_after.as_secs_f64() * 1e3
    );
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    worker.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_holed_home_is_bounded_by_the_poll_timeout() {
    let _serial = SERIAL.lock().await;
    support::init_tracing();
    let (a, b) = (start_server(), start_server());
    let proxy = FaultProxy::start(a.addr()).await.unwrap();
    let pool = flotilla_testkit::unique_name("mh-hole");
    let ledger = Ledger::default();
    let worker = MultiHomeWorker::start(
        two_homes(&proxy.url(), &b.url(), &pool),
        options(),
        ledger.handler("mh"),
    )
    .await
    .unwrap();
    let (da, db) = (
        dispatcher(&a.url(), &pool).await,
        dispatcher(&b.url(), &pool).await,
    );
    da.dispatch_job("a-before", &b""[..]).await.unwrap();
    timed_dispatches(&db, "warm", 20).await;
    let before = timed_dispatches(&db, "before", 100).await;

    let holed_at = Instant::now();
    let opened = time_to_state(&worker, "home1", BreakerState::Open, holed_at);
    proxy.black_hole();
    let during = timed_dispatches(&db, "during", 100).await;
    eventually("home1 open", Duration::from_secs(10), || {
        state_of(&worker, "home1") == BreakerState::Open
    })
    .await;
    let opened_after = opened.await.unwrap();
    let more = timed_dispatches(&db, "open", 50).await;
    let all_during: Vec<Duration> = during.iter().chain(&more).copied().collect();
    println!(
        "black hole: home2 dispatch->Ok p99 before {:.2} ms, during {:.2} ms, max during {:.2} ms; home1 open {:.0} ms after the black hole",
        p99(&before).as_secs_f64() * 1e3,
        p99(&all_during).as_secs_f64() * 1e3,
        all_during.iter().max().unwrap().as_secs_f64() * 1e3,
        opened_after.as_secs_f64() * 1e3
    );
    // Three probes, each cut at the poll timeout, plus their intervals.
    let stall_bound = (POLL_TIMEOUT + Duration::from_millis(100)) * 3 + Duration::from_secs(2);
    assert!(opened_after < stall_bound, "opened after {opened_after:?}");
    let bound = (p99(&before) * 3).max(Duration::from_millis(50));
    assert!(
        p99(&all_during) < bound,
        "p99 during {:?}",
        p99(&all_during)
    );

    proxy.heal();
    eventually(
        "home1 closed after heal",
        RESET * 3 + Duration::from_secs(5),
        || state_of(&worker, "home1") == BreakerState::Closed,
    )
    .await;
    // Home 1's node (its blocking inbox read, its map subscribers) works
    // again: a dispatch there starts on this worker.
    let healed_at = Instant::now();
    let mut n = 0;
    loop {
        n += 1;
        match da.dispatch_job(&format!("a-healed-{n}"), &b""[..]).await {
            Ok(()) => break,
            Err(e) if healed_at.elapsed() < Duration::from_secs(20) => {
                tracing::debug!(error = %e, "home1 not serving yet");
            }
            Err(e) => panic!("home1 did not serve again after the heal: {e}"),
        }
    }
    assert!(
        ledger
            .running_keys()
            .contains(&format!("home1/a-healed-{n}"))
    );
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    worker.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_is_split_and_resplit_as_homes_open_and_close() {
    let _serial = SERIAL.lock().await;
    support::init_tracing();
    let (mut a, b) = (start_server(), start_server());
    let pool = flotilla_testkit::unique_name("mh-cap");
    let ledger = Ledger::default();
    let worker = MultiHomeWorker::start(
        two_homes(&a.url(), &b.url(), &pool),
        options().max_concurrent_jobs(Some(5)),
        ledger.handler("mh"),
    )
    .await
    .unwrap();
    let allotted = |w: &MultiHomeWorker| {
        let h = w.homes();
        (h[0].allotted, h[1].allotted)
    };
    assert_eq!(allotted(&worker), (Some(3), Some(2)));
    let (da, db) = (
        dispatcher(&a.url(), &pool).await,
        dispatcher(&b.url(), &pool).await,
    );
    for i in 0..3 {
        da.dispatch_job(&format!("a{i}"), &b""[..]).await.unwrap();
    }
    let refused = da.dispatch_job("a3", &b""[..]).await;
    assert!(
        matches!(refused, Err(Error::WorkerAtCapacity { .. })),
        "{refused:?}"
    );
    for i in 0..2 {
        db.dispatch_job(&format!("b{i}"), &b""[..]).await.unwrap();
    }
    let refused = db.dispatch_job("b2", &b""[..]).await;
    assert!(
        matches!(refused, Err(Error::WorkerAtCapacity { .. })),
        "{refused:?}"
    );

    // Home 1 opens: home 2 gets the whole capacity.
    a.kill();
    eventually(
        "home1 open, all capacity on home2",
        Duration::from_secs(5),
        || allotted(&worker) == (Some(0), Some(5)),
    )
    .await;
    for i in 2..5 {
        db.dispatch_job(&format!("b{i}"), &b""[..]).await.unwrap();
    }
    let refused = db.dispatch_job("b5", &b""[..]).await;
    assert!(
        matches!(refused, Err(Error::WorkerAtCapacity { .. })),
        "{refused:?}"
    );

    // Home 1 closes again: re-split 3 + 2 (home 2 keeps its 5 running
    // jobs but starts nothing new until it is under its share).
    a.start_again().unwrap();
    eventually(
        "home1 closed, capacity re-split",
        RESET * 3 + Duration::from_secs(5),
        || {
            state_of(&worker, "home1") == BreakerState::Closed
                && allotted(&worker) == (Some(3), Some(2))
        },
    )
    .await;
    assert_eq!(worker.home("home2").unwrap().running, 5);
    let refused = db.dispatch_job("b6", &b""[..]).await;
    assert!(
        matches!(refused, Err(Error::WorkerAtCapacity { .. })),
        "{refused:?}"
    );
    assert!(ledger.violations().is_empty(), "{:?}", ledger.violations());
    worker.close().await.unwrap();
}

#[test]
fn handles_are_send_and_sync() {
    fn check<T: Send + Sync + 'static>() {}
    check::<MultiHomeWorker>();
    check::<MultiHomeConfig>();
    check::<Error>();
}

#[test]
fn configuration_errors_name_the_position() {
    let e = MultiHomeConfig::from_lists("redis://a:1,redis://b:2,redis://c:3", Some("p,q"), "x")
        .unwrap_err();
    assert!(
        matches!(e, ConfigError::LengthMismatch { urls: 3, pools: 2 }),
        "{e}"
    );
    let e = MultiHomeConfig::from_lists("redis://a:1, redis://b:x", None, "x").unwrap_err();
    assert!(matches!(e, ConfigError::BadUrl { position: 2, .. }), "{e}");
    assert!(e.to_string().starts_with("Redis URL 2 "), "{e}");
    // The pool crate's error carries it, matchable.
    let e: Error = MultiHomeConfig::from_lists("", None, "x")
        .unwrap_err()
        .into();
    assert!(
        matches!(e, Error::HomeConfig(ConfigError::NoHomes(_))),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_home_down_at_start_joins_later() {
    let _serial = SERIAL.lock().await;
    support::init_tracing();
    let (mut a, b) = (start_server(), start_server());
    let url_a = a.url();
    a.kill();
    let pool = flotilla_testkit::unique_name("mh-late");
    let ledger = Ledger::default();
    let started = Instant::now();
    let worker = MultiHomeWorker::start(
        two_homes(&url_a, &b.url(), &pool),
        options().max_concurrent_jobs(Some(4)),
        ledger.handler("mh"),
    )
    .await
    .unwrap();
    assert!(
        started.elapsed() < POLL_TIMEOUT * 4,
        "start waited {:?}",
        started.elapsed()
    );
    assert!(!worker.home("home1").unwrap().joined);
    assert_eq!(worker.home("home2").unwrap().allotted, Some(4));
    a.start_again().unwrap();
    eventually(
        "home1 joined and given its share",
        RESET * 3 + Duration::from_secs(5),
        || {
            let h = worker.homes();
            h[0].joined && h[0].allotted == Some(2) && h[1].allotted == Some(2)
        },
    )
    .await;
    let da = dispatcher(&url_a, &pool).await;
    da.dispatch_job("late", &b""[..]).await.unwrap();
    assert!(ledger.running_keys().contains("home1/late"));
    worker.close().await.unwrap();
}
