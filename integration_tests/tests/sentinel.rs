//! Sentinel failover under a running pool: worker processes and a
//! dispatcher connect with `Node::connect` through the Sentinel URL; the
//! primary is killed (`SIGKILL`) and Sentinel promotes the replica. From the
//! handlers' ledgers: I1–I3 hold, no admitted job is lost, no stop is
//! undone, fencing tokens increase across the failover, and dispatch works
//! again within `DISPATCH_BACK_WITHIN` (12 s) of the kill.

mod sentinel_harness;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use flotilla_integration_tests::clock::mono_ns;
use flotilla_integration_tests::ledger::{FaultKind, Line, Record, read_ledger};
use flotilla_pool::{Node, NodeOptions};
use flotilla_testkit::{Sentinels, unique_name, wait_until};
use nix::sys::signal::Signal;
use sentinel_harness::{HaHarness, TTL};

/// What the failover cost, from the handlers' ledgers: per key the fencing
/// tokens of its starts in time order, and for the keys that started again
/// after `after_ns`, how long each was stopped (its stop before → its start
/// after, ms; 0 when it was not stopped first).
struct FailoverCost {
    tokens: HashMap<String, Vec<u64>>,
    gaps_ms: Vec<f64>,
}

impl FailoverCost {
    fn measure(ledgers: &[Vec<Line>], after_ns: u64) -> FailoverCost {
        let mut events: Vec<(u64, String, Option<u64>)> = Vec::new();
        for l in ledgers.iter().flatten() {
            match &l.record {
                Record::Start { key, token, .. } => {
                    events.push((l.mono_ns, key.clone(), Some(*token)))
                }
                Record::Stop { key, .. } => events.push((l.mono_ns, key.clone(), None)),
                _ => {}
            }
        }
        events.sort();
        let mut tokens: HashMap<String, Vec<u64>> = HashMap::new();
        let mut last_stop: HashMap<String, u64> = HashMap::new();
        let mut gaps_ms = Vec::new();
        let mut counted = HashSet::new();
        for (t, key, token) in events {
            match token {
                Some(token) => {
                    if t > after_ns && tokens.contains_key(&key) && counted.insert(key.clone()) {
                        let gap = last_stop.get(&key).map_or(0, |s| t.saturating_sub(*s));
                        gaps_ms.push(gap as f64 / 1e6);
                    }
                    tokens.entry(key).or_default().push(token);
                }
                None => {
                    last_stop.insert(key, t);
                }
            }
        }
        gaps_ms.sort_by(f64::total_cmp);
        FailoverCost { tokens, gaps_ms }
    }

    fn print(&self, running: usize) {
        let n = self.gaps_ms.len();
        let median = if n == 0 { 0.0 } else { self.gaps_ms[n / 2] };
        let max = self.gaps_ms.last().copied().unwrap_or(0.0);
        println!(
            "{n} of {running} running jobs started again after the failover (new token); \
             stopped for median {median:.0} ms, max {max:.0} ms"
        );
    }
}

fn assert_tokens_increase(tokens: &HashMap<String, Vec<u64>>) {
    for (key, seq) in tokens {
        assert!(
            seq.windows(2).all(|w| w[0] < w[1]),
            "fencing tokens of {key} do not increase: {seq:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_keeps_every_job_and_every_stop() {
    let mut h = HaHarness::start("sentinel-failover", 3).await;
    let keys: Vec<String> = (0..24).map(|i| format!("job-{i}")).collect();
    for k in &keys {
        h.dispatch(k).await.unwrap();
    }
    for k in &keys[..6] {
        h.stop(k).await;
    }
    let running: Vec<String> = keys[6..].to_vec();
    let kill_ns = mono_ns();
    let killed = h.fail_over().await;
    let back = h.dispatch_until_ok("after-failover", killed).await;
    println!("first successful dispatch {back:?} after the primary's kill");
    let mut running_after = running.clone();
    running_after.push("after-failover".into());
    h.settle(&running_after).await;
    // Observation window: every node's cleanup sweep has run after the
    // failover, so a wrong judgement would show.
    tokio::time::sleep(TTL * 2).await;

    let report = h.check_now();
    assert!(report.ok(), "violations: {:#?}", report.violations);
    let cost = FailoverCost::measure(&h.ledgers(), kill_ns);
    assert_tokens_increase(&cost.tokens);
    for k in &keys[..6] {
        assert_eq!(
            cost.tokens[k].len(),
            1,
            "stopped {k} ran again: {:?}",
            cost.tokens[k]
        );
    }
    cost.print(running.len());
    h.kill_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_while_a_worker_process_is_frozen() {
    let mut h = HaHarness::start("sentinel-frozen", 3).await;
    let keys: Vec<String> = (0..18).map(|i| format!("job-{i}")).collect();
    for k in &keys {
        h.dispatch(k).await.unwrap();
    }
    let victim = (0..h.processes.len())
        .max_by_key(|i| h.running_on(*i).len())
        .unwrap();
    let victim_pid = h.processes[victim].pid();
    h.processes[victim].signal(Signal::SIGSTOP).unwrap();
    h.driver.record(Record::Fault {
        kind: FaultKind::Pause,
        target: Some(victim_pid),
        end: false,
    });
    let kill_ns = mono_ns();
    let killed = h.fail_over().await;
    let back = h.dispatch_until_ok("after-failover", killed).await;
    println!("first successful dispatch {back:?} after the primary's kill (one process frozen)");
    // The frozen process's jobs run elsewhere before it resumes.
    let node = h.node.clone();
    let victim_workers: HashSet<String> = h.processes[victim].workers.iter().cloned().collect();
    wait_until(
        Duration::from_secs(20),
        "frozen process's jobs moved",
        || {
            let moved = keys.iter().all(|k| {
                node.job_owner(k)
                    .is_some_and(|(w, _)| !victim_workers.contains(&w))
            });
            async move { moved }
        },
    )
    .await
    .unwrap();
    h.driver.record(Record::Fault {
        kind: FaultKind::Pause,
        target: Some(victim_pid),
        end: true,
    });
    h.processes[victim].signal(Signal::SIGCONT).unwrap();
    // Its lease lapsed while it was frozen: it stops its jobs on its own and
    // says so in its ledger (the checker exempts those stops from I4; a
    // process that joined through Sentinel once wrote nothing, because its
    // node registered its counters before the ledger's recorder existed).
    let victim_ledger = h.processes[victim].ledger.clone();
    wait_until(
        Duration::from_secs(10),
        "the frozen process records its lease loss",
        || {
            let lines = read_ledger(&victim_ledger).unwrap_or_default();
            let lost = lines.iter().any(|l| l.record == Record::LeaseLost);
            async move { lost }
        },
    )
    .await
    .unwrap();
    let mut running_after = keys.clone();
    running_after.push("after-failover".into());
    h.settle(&running_after).await;
    tokio::time::sleep(TTL * 2).await;

    let report = h.check_now();
    assert!(report.ok(), "violations: {:#?}", report.violations);
    let cost = FailoverCost::measure(&h.ledgers(), kill_ns);
    assert_tokens_increase(&cost.tokens);
    cost.print(keys.len());
    h.kill_all().await;
}

/// A Sentinel deployment plus a stale Sentinel (it names the replica as
/// the primary), and a Sentinel URL that lists the stale one first, as fred
/// parses it (checked here).
fn with_a_stale_sentinel_first() -> (Sentinels, String) {
    let mut ha = tokio::task::block_in_place(Sentinels::start)
        .expect("redis-sentinel must be installed (apt-get install redis-sentinel redis-server)");
    let stale = tokio::task::block_in_place(|| ha.start_stale_sentinel()).unwrap();
    let good = ha.sentinel_ports();
    // fred lists the `node=` Sentinels first and the URL's host last.
    let mut url = format!(
        "redis-sentinel://127.0.0.1:{}?sentinelServiceName={}&node=127.0.0.1:{stale}",
        good[0],
        flotilla_testkit::SERVICE_NAME
    );
    for port in &good[1..] {
        url.push_str(&format!("&node=127.0.0.1:{port}"));
    }
    let config = flotilla_pool::fred::prelude::Config::from_url(&url).unwrap();
    let first = match &config.server {
        flotilla_pool::fred::types::config::ServerConfig::Sentinel { hosts, .. } => hosts[0].port,
        other => panic!("not a Sentinel URL: {other:?}"),
    };
    assert_eq!(first, stale, "the stale Sentinel must be asked first");
    (ha, url)
}

/// A Sentinel that missed a failover still names the old primary, now a
/// replica. fred asks the Sentinels in order and gives up an attempt when
/// the server named is not a primary; listed first, such a Sentinel used to
/// fail every attempt until `redis_timeout` ("Invalid role"). `Node::connect`
/// now asks the next Sentinel after such an answer, joins, and dispatches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_asks_the_next_sentinel_when_the_first_names_a_replica() {
    let (ha, url) = with_a_stale_sentinel_first();
    let primary = ha.primary_port().expect("a primary");

    let pool = unique_name("sentinel-stale");
    let redis_timeout = Duration::from_secs(5);
    let t0 = Instant::now();
    let node = Node::connect(
        &url,
        &pool,
        NodeOptions::default()
            .worker_ttl(TTL)
            .redis_timeout(redis_timeout),
    )
    .await
    .expect("joins through the next Sentinel");
    let took = t0.elapsed();
    println!("Node::connect joined in {took:?} with a stale Sentinel listed first");
    assert!(took < redis_timeout, "took {took:?}");
    use flotilla_pool::fred::interfaces::ConfigInterface;
    let port: i64 = node
        .client()
        .config_get::<std::collections::HashMap<String, i64>, _>("port")
        .await
        .unwrap()["port"];
    assert_eq!(port, i64::from(primary), "connected to the primary");

    use std::sync::atomic::{AtomicUsize, Ordering};
    let started = std::sync::Arc::new(AtomicUsize::new(0));
    let stopped = std::sync::Arc::new(AtomicUsize::new(0));
    let (seen, ended) = (started.clone(), stopped.clone());
    let handler = flotilla_pool::TaskHandler::new(
        move |_job, cancel: tokio_util::sync::CancellationToken| {
            seen.fetch_add(1, Ordering::SeqCst);
            let ended = ended.clone();
            async move {
                cancel.cancelled().await;
                ended.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        },
    );
    let _worker = flotilla_pool::Worker::new(&node, handler).await.unwrap();
    node.dispatch_job("through-the-next-sentinel", "p")
        .await
        .unwrap();
    assert_eq!(started.load(Ordering::SeqCst), 1);
    // After each renewal the node asks every Sentinel which server is the
    // primary: the stale one names the replica, the other three the
    // primary. Most name the node's server, so every renewal counts and
    // the job runs on (a lease lost here would stop it).
    tokio::time::sleep(TTL * 4).await;
    assert_eq!(
        stopped.load(Ordering::SeqCst),
        0,
        "the job stopped: a renewal did not count"
    );
    assert_eq!(started.load(Ordering::SeqCst), 1);
    node.close().await.unwrap();
}

/// The same stale Sentinel listed first in a multi-home worker's only home:
/// the home's join asks the next Sentinel after it and joins the primary
/// (before, the home called `init()` once and the join failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_home_home_joins_past_a_stale_sentinel_listed_first() {
    use flotilla_pool::multihome::{
        HomeConfig, MultiHomeConfig, MultiHomeOptions, MultiHomeWorker,
    };
    let (_ha, url) = with_a_stale_sentinel_first();
    let pool = unique_name("sentinel-stale-mh");
    let handler = flotilla_pool::TaskHandler::new(
        |_job, cancel: tokio_util::sync::CancellationToken| async move {
            cancel.cancelled().await;
            Ok(())
        },
    );
    let poll_timeout = Duration::from_secs(3);
    let t0 = Instant::now();
    let worker = MultiHomeWorker::start(
        MultiHomeConfig::new(vec![HomeConfig::new(&url, &pool)]).unwrap(),
        MultiHomeOptions::default()
            .poll_timeout(poll_timeout)
            .node(NodeOptions::default().worker_ttl(TTL)),
        handler,
    )
    .await
    .expect("the home joins through the next Sentinel");
    println!(
        "MultiHomeWorker::start joined in {:?} with a stale Sentinel listed first",
        t0.elapsed()
    );
    assert!(
        worker.homes().iter().all(|h| h.joined),
        "{:?}",
        worker.homes()
    );
    worker.close().await.unwrap();
}

/// One Sentinel of three frozen (`SIGSTOP`): its connection stays open and
/// its answers never come. A stop's answer is checked with the Sentinels
/// (`primary_check`), and the two that answer settle it: the stop does not
/// wait out the question's timeout (here 5 s, a sixth of a 30 s TTL) on
/// the frozen one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stops_do_not_wait_for_a_frozen_sentinel() {
    let mut h = HaHarness::start("sentinel-frozen-one", 1).await;
    let options = NodeOptions::default()
        .client_only(true)
        .worker_ttl(Duration::from_secs(30))
        .redis_timeout(Duration::from_secs(5))
        .dispatch_timeout(Duration::from_secs(20));
    let stopper = Node::connect(&h.ha.url(), &h.pool, options).await.unwrap();
    let keys: Vec<String> = (0..4).map(|i| format!("job-{i}")).collect();
    for k in &keys {
        h.dispatch(k).await.unwrap();
    }
    // A first stop opens the stopper's connections to the Sentinels.
    stopper.stop_job(&keys[0]).await.unwrap();
    let port = h.ha.sentinel_ports()[0];
    let pid = nix::unistd::Pid::from_raw(h.ha.sentinel_pid(port).unwrap() as i32);
    nix::sys::signal::kill(pid, Signal::SIGSTOP).unwrap();
    let mut slowest = Duration::ZERO;
    for k in &keys[1..] {
        let asked = Instant::now();
        let stopped = stopper.stop_job(k).await;
        slowest = slowest.max(asked.elapsed());
        stopped.unwrap();
    }
    nix::sys::signal::kill(pid, Signal::SIGCONT).unwrap();
    println!("slowest stop with a frozen Sentinel: {slowest:?}");
    assert!(
        slowest < Duration::from_millis(2500),
        "a stop waited {slowest:?} for a frozen Sentinel"
    );
    stopper.close().await.unwrap();
    h.kill_all().await;
}
