//! The chaos driver: a private Redis (AOF on), worker processes behind
//! per-process fault proxies, two client-only dispatcher nodes in this
//! process, a fault schedule, a recovery window, then the checker.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use flotilla_integration_tests::driver::{ChaosOptions, run};
//! let summary = run(ChaosOptions::default().duration(std::time::Duration::from_secs(60))).await?;
//! println!("{}", summary.table());
//! assert!(summary.violations.is_empty());
//! # Ok(()) }
//! ```

mod dispatcher_faults;
mod drain_faults;
mod fault_steps;
mod faults;
mod fleet;
mod load;
mod options;
mod recovery_faults;
mod refusal_faults;
mod summary;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_pool::fred::prelude::ClientLike;
use flotilla_pool::{Node, NodeOptions};
use flotilla_testkit::{FaultProxy, RedisServer, SentinelOptions, Sentinels, ServerOptions};
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::checker::{CheckOptions, TimeBase, check};
use crate::clock::{ServerClock, mono_ns};
use crate::ledger::{FaultKind, LedgerWriter, Line, Record, read_ledger};
use crate::schedules::{ScheduleSpec, wall_ms};
use fleet::Fleet;
use load::{KeyState, Load};
pub use options::ChaosOptions;
pub use summary::ChaosSummary;

/// Errors that stop a chaos run before it can be checked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChaosError {
    /// Redis or a proxy could not be started.
    #[error(transparent)]
    Testkit(#[from] flotilla_testkit::Error),
    /// A worker process could not be started or signalled.
    #[error(transparent)]
    Process(#[from] crate::process::ProcessError),
    /// The pool refused something the driver needs.
    #[error(transparent)]
    Pool(#[from] flotilla_pool::Error),
    /// Ledger I/O.
    #[error("ledger: {0}")]
    Io(#[from] std::io::Error),
    /// No worker binary was found.
    #[error(
        "flotilla-test-worker binary not found; build it (cargo build -p flotilla-integration-tests) or pass its path"
    )]
    NoWorkerBinary,
    /// The ledger directory holds ledgers of an earlier run. Ledgers are
    /// appended to, so the checker would judge both runs' records together
    /// (a run the earlier one left open overlaps every later one).
    #[error(
        "the ledger directory {0} already holds ledgers (*.jsonl) of an earlier run: \
         remove them or pass another --ledger-dir"
    )]
    LedgerDirInUse(PathBuf),
    /// The handlers' longest stop exceeds the workers' stop budget
    /// ([`NodeOptions::stop_timeout`](flotilla_pool::NodeOptions), a sixth
    /// of the TTL by default). The pool counts a stop that overran its
    /// budget as done (`Handler::stop`: such work is kept apart only by the
    /// fencing token), so the run would report overlaps the contract allows.
    #[error(
        "handler stops of up to {longest:?} exceed the workers' stop budget of {budget:?} \
         (NodeOptions::stop_timeout for a TTL of {ttl:?}): the pool counts an overrun stop as \
         done and the checker would report the overlaps that follow; pass --stop-max-ms {} or less",
        budget.as_millis()
    )]
    StopsOverBudget {
        /// The longest handler stop asked for.
        longest: Duration,
        /// The workers' stop budget.
        budget: Duration,
        /// The workers' TTL.
        ttl: Duration,
    },
    /// A ledger holds lines of more than one process: another run (one
    /// still going, e.g. after its directory was removed and made again)
    /// wrote into this run's directory, and the checker would judge the
    /// two runs' jobs as one pool's. The run's result is withheld.
    #[error(
        "the ledger {path} holds lines of {} processes (pids {pids:?}); each process writes \
         its own, so another run wrote into this directory (a chaos run still going?)",
        pids.len()
    )]
    MixedLedger {
        /// The ledger.
        path: PathBuf,
        /// The processes that wrote it.
        pids: Vec<u32>,
    },
}

/// The error for a ledger that more than one process wrote, if `lines` is
/// one.
pub fn mixed_ledger(path: &std::path::Path, lines: &[Line]) -> Option<ChaosError> {
    let pids = crate::ledger::writers(lines);
    (pids.len() > 1).then(|| ChaosError::MixedLedger {
        path: path.to_path_buf(),
        pids,
    })
}

/// Whether `dir` holds a ledger (`*.jsonl`).
fn holds_ledgers(dir: &std::path::Path) -> std::io::Result<bool> {
    for entry in std::fs::read_dir(dir)? {
        if entry?.path().extension().is_some_and(|e| e == "jsonl") {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Shared state of a run.
pub(crate) struct Run {
    options: ChaosOptions,
    server: Arc<Mutex<RedisServer>>,
    /// The Sentinel deployment when [`ChaosOptions::sentinel`] is on (then
    /// `server` is an idle stand-in that no process uses).
    sentinels: Option<Arc<Mutex<Sentinels>>>,
    fleet: Fleet,
    load: Load,
    ledger: LedgerWriter,
    rng: StdRng,
    faults: BTreeMap<FaultKind, u64>,
    recovery: BTreeMap<FaultKind, Duration>,
    /// The keys that came back last in each kind's worst recovery.
    last_to_recover: BTreeMap<FaultKind, Vec<String>>,
    /// While a fault's recovery is observed: the keys not running at the
    /// last poll, each with the first poll since which it has not been.
    still_missing: BTreeMap<String, Instant>,
    /// Recoveries that did not end in time, each with the keys it missed
    /// and when it found them missing (`mono_ns`).
    unrecovered: Vec<Unrecovered>,
    /// Cuts injected so far (they rotate through the proxy's modes).
    cuts: usize,
    /// The port of a primary killed by a failover, to start again as a
    /// replica once the pool recovered.
    failed_primary: Option<u16>,
    /// The dispatching nodes' proxies (none against Sentinel).
    dispatcher_proxies: Vec<FaultProxy>,
    /// Proxies of dispatchers that crashed (`restart-dispatcher`), refusing
    /// every connection until the run ends.
    old_proxies: Vec<FaultProxy>,
    /// Closes of crashed dispatchers, left to run in the background.
    closing: Vec<tokio::task::JoinHandle<Result<(), flotilla_pool::Error>>>,
    /// How a short-lived client (the `stop-leave` fault) reaches the pool:
    /// Redis's URL, the pool's name and the dispatchers' options.
    transient: (String, String, NodeOptions),
}

/// Runs the chaos suite and checks the ledgers.
///
/// # Errors
/// [`ChaosError`] when the harness itself cannot run; invariant
/// violations are in the summary, not errors.
pub async fn run(options: ChaosOptions) -> Result<ChaosSummary, ChaosError> {
    let binary = options
        .worker_binary
        .clone()
        .or_else(crate::process::sibling_worker_binary)
        .ok_or(ChaosError::NoWorkerBinary)?;
    // The worker processes take the stop budget that their TTL gives
    // (flotilla-test-worker sets no stop_timeout of its own).
    let budget = flotilla_pool::NodeOptions::default()
        .worker_ttl(options.ttl)
        .stop_timeout;
    let longest = Duration::from_millis(options.stop_ms.1);
    if longest > budget {
        return Err(ChaosError::StopsOverBudget {
            longest,
            budget,
            ttl: options.ttl,
        });
    }
    let temp = tempfile::Builder::new()
        .prefix("flotilla-chaos-")
        .tempdir()?;
    let dir = options
        .ledger_dir
        .clone()
        .unwrap_or_else(|| temp.path().to_path_buf());
    std::fs::create_dir_all(&dir)?;
    if holds_ledgers(&dir)? {
        return Err(ChaosError::LedgerDirInUse(dir));
    }
    // A wall clock the `clock-step` fault can step.
    let clock_shift = options.faults.contains(&FaultKind::ClockStep);
    let server =
        RedisServer::start_with(ServerOptions::default().aof(true).clock_shift(clock_shift))?;
    let sentinels = if options.sentinel {
        let (replicas, min_to_write) = options.sentinel_replicas;
        let sentinel_options = SentinelOptions {
            replicas,
            min_replicas: (min_to_write > 0).then_some((min_to_write, 1)),
            ..SentinelOptions::default()
        };
        Some(tokio::task::block_in_place(|| {
            Sentinels::start_with(sentinel_options)
        })?)
    } else {
        None
    };
    let url = sentinels
        .as_ref()
        .map_or_else(|| server.url(), Sentinels::url);
    let addr = server.addr();
    let pool = flotilla_testkit::unique_name("chaos");
    let clock_client = match &sentinels {
        Some(_) => flotilla_pool::client_builder(&url, &NodeOptions::default())?
            .build()
            .map_err(flotilla_pool::Error::Redis)?,
        None => flotilla_testkit::client(&url).await?,
    };
    if sentinels.is_some() {
        clock_client
            .init()
            .await
            .map_err(flotilla_pool::Error::Redis)?;
    }
    let clock = ServerClock::new();
    let _ = clock.sample(&clock_client, true).await;
    let cancel = CancellationToken::new();
    tokio::spawn(
        clock
            .clone()
            .run(clock_client, Duration::from_millis(500), cancel.clone()),
    );
    let ledger = LedgerWriter::open(&dir.join("driver.jsonl"), clock)?;
    let node_options = NodeOptions::default()
        .client_only(true)
        .worker_ttl(options.ttl)
        .ack_grace(options.ttl)
        .dispatch_timeout(Duration::from_secs(3));
    let mut nodes = Vec::new();
    let mut dispatcher_proxies = Vec::new();
    for i in 0..2 {
        let node_options = node_options
            .clone()
            .mirror_jobs(!(options.all_lean || (options.lean_nodes && i == 1)));
        if sentinels.is_some() {
            nodes.push(Node::connect(&url, &pool, node_options).await?);
            continue;
        }
        // Each dispatcher behind a proxy of its own, for the
        // `cut-dispatcher` fault.
        let proxy = FaultProxy::start(addr)
            .await
            .map_err(|e| flotilla_testkit::Error::Startup(format!("proxy: {e}")))?;
        let client = node_client(&proxy.url(), &node_options).await?;
        nodes.push(Node::join(&client, &pool, node_options).await?);
        dispatcher_proxies.push(proxy);
    }
    let mut fleet = Fleet::new(
        binary,
        pool.clone(),
        options.ttl,
        options.workers_per_process,
        options.stop_ms,
        dir.clone(),
    );
    fleet.lean = options.lean_nodes;
    fleet.all_lean = options.all_lean;
    fleet.lifecycle = options.lifecycle;
    fleet.fixed_node_ids = options.fixed_node_ids;
    fleet.start_max_ms = options.start_max_ms;
    fleet.worker_lanes = options.worker_lanes;
    fleet.schedule = (options.schedule_keys > 0).then(|| {
        ScheduleSpec::for_ttl(
            options.schedule_keys,
            options.ttl,
            wall_ms() + options.duration.as_millis() as u64,
        )
    });
    let requesters = options
        .requests_from_workers
        .then(|| Arc::new(Mutex::new(Vec::new())));
    fleet.requesters = requesters.clone();
    if sentinels.is_some() {
        fleet.redis_url = Some(url.clone());
    }
    for _ in 0..options.worker_processes {
        fleet.add(addr).await?;
    }
    let mut load = Load::new(nodes.clone(), options.keys, ledger.clone())
        .fail_for_good(options.fail_for_good)
        .window_ms(options.window_ms);
    if let Some(requesters) = requesters {
        load = load.via_workers(requesters);
    }
    let mut run = Run {
        rng: StdRng::seed_from_u64(options.seed),
        options: options.clone(),
        server: Arc::new(Mutex::new(server)),
        sentinels: sentinels.map(|s| Arc::new(Mutex::new(s))),
        fleet,
        load: load.clone(),
        ledger,
        faults: BTreeMap::new(),
        recovery: BTreeMap::new(),
        last_to_recover: BTreeMap::new(),
        still_missing: BTreeMap::new(),
        unrecovered: Vec::new(),
        cuts: 0,
        failed_primary: None,
        dispatcher_proxies,
        old_proxies: Vec::new(),
        closing: Vec::new(),
        transient: (url.clone(), pool.clone(), node_options.clone()),
    };
    let started = Instant::now();
    let load_cancel = CancellationToken::new();
    let mut load_tasks = Vec::new();
    for i in 0..options.load_tasks {
        load_tasks.push(tokio::spawn(load.clone().run(
            options.seed.wrapping_mul(1000).wrapping_add(i as u64),
            options.load_pace,
            load_cancel.clone(),
        )));
    }
    let outcome = run.inject_until(started + options.duration).await;
    load_cancel.cancel();
    for t in load_tasks {
        let _ = t.await;
    }
    if let Err(e) = outcome {
        run.fleet.kill_all().await;
        cancel.cancel();
        return Err(e);
    }
    // Recovery window: no faults, no load; keys left unknown are settled
    // first, then the pool gets the window to converge.
    load.settle_unknown().await;
    let window_start = Instant::now();
    let mut final_recovery = None;
    // Until it converges: when the keys that kept it changed, and which
    // (a key lost with a killed holder and Redis's data never runs again,
    // which the check below finds; the pool has converged without it).
    let mut missing_since: Vec<(Duration, Vec<String>)> = Vec::new();
    while window_start.elapsed() < options.recovery_window {
        if final_recovery.is_none() {
            match run.missing_when_stops_hold() {
                Some(missing) if missing.is_empty() => {
                    final_recovery = Some(window_start.elapsed());
                }
                Some(missing) if missing_since.last().is_none_or(|(_, m)| *m != missing) => {
                    missing_since.push((window_start.elapsed(), missing));
                }
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if final_recovery.is_none() {
        run.report_unconverged();
    }
    let end_ns = mono_ns();
    let driver_ledger = dir.join("driver.jsonl");
    let mut ledgers = vec![read_ledger(&driver_ledger)?];
    let mut mixed = mixed_ledger(&driver_ledger, &ledgers[0]);
    for path in &run.fleet.ledgers {
        let lines = read_ledger(path)?;
        mixed = mixed.or_else(|| mixed_ledger(path, &lines));
        ledgers.push(lines);
    }
    let report = check(
        &ledgers,
        &CheckOptions {
            time_base: TimeBase::Monotonic,
            end_ns: Some(end_ns),
            restart_within: crate::lifecycle::restart_within(Duration::from_millis(
                options.start_max_ms,
            )),
            final_failures: options.fail_for_good,
            ..CheckOptions::for_ttl(options.ttl)
        },
    );
    if final_recovery.is_none() {
        final_recovery = missing_since
            .iter()
            .find(|(_, missing)| missing.iter().all(|k| report.not_expected_to_run(k)))
            .map(|(at, missing)| {
                tracing::info!(keys = missing.len(), "the keys that kept the pool from converging were all lost with a killed holder and Redis's data");
                *at
            });
    }
    run.fleet.kill_all().await;
    for closing in run.closing.drain(..) {
        closing.abort();
    }
    // The dispatchers as they are now (a restart replaced some).
    for i in 0..load.node_count() {
        let _ = load.node(i).close().await;
    }
    cancel.cancel();
    if let Some(error) = mixed {
        return Err(error);
    }
    let stats = load.stats.lock().map(|s| s.clone()).unwrap_or_default();
    let summary = ChaosSummary {
        duration: started.elapsed(),
        seed: options.seed,
        faults: run.faults,
        worst_recovery_by_kind: run.recovery,
        last_to_recover_by_kind: run.last_to_recover,
        unrecovered: still_unrecovered(run.unrecovered, |at_ns| {
            check(
                &ledgers,
                &CheckOptions {
                    time_base: TimeBase::Monotonic,
                    end_ns: Some(at_ns),
                    restart_within: crate::lifecycle::restart_within(Duration::from_millis(
                        options.start_max_ms,
                    )),
                    final_failures: options.fail_for_good,
                    ..CheckOptions::for_ttl(options.ttl)
                },
            )
            .not_expected_to_run_keys()
        }),
        final_convergence: final_recovery,
        dispatch_ok: stats.dispatch_ok,
        dispatch_exists: stats.dispatch_exists,
        windowed_ok: stats.windowed_ok,
        dispatch_recent: stats.dispatch_recent,
        scheduled: scheduled_counts(&ledgers[1..]),
        dispatch_errors: stats.dispatch_errors,
        stop_ok: stats.stop_ok,
        stop_not_found: stats.stop_not_found,
        stop_errors: stats.stop_errors,
        races: stats.races,
        via_workers: stats.via_workers,
        running_at_end: load.keys_in(KeyState::Running).len(),
        violations: report.violations.iter().map(ToString::to_string).collect(),
        report,
        ledger_dir: options.ledger_dir.clone(),
    };
    drop(temp);
    Ok(summary)
}

/// The admissions and stops the schedule's leaders recorded in the worker
/// processes' ledgers (only the schedule writes those there).
fn scheduled_counts(worker_ledgers: &[Vec<Line>]) -> (u64, u64) {
    let mut counts = (0, 0);
    for line in worker_ledgers.iter().flatten() {
        match line.record {
            Record::Admit { .. } => counts.0 += 1,
            Record::StopDone { .. } => counts.1 += 1,
            _ => {}
        }
    }
    counts
}

/// A recovery that did not end in time.
struct Unrecovered {
    message: String,
    /// The keys believed running that ran on no member that was up.
    missing: Vec<String>,
    /// When they were found missing (`mono_ns`).
    at_ns: u64,
}

/// The recoveries that did not end in time, but for those whose missing
/// keys the checker found lost to two faults at once (their process
/// killed, then Redis's data lost before anything restarted them): nothing
/// could restart those. Each is judged at its own instant (`lost_at`: the
/// keys lost to two faults then), since the load may stop such a key
/// before the run ends.
fn still_unrecovered(
    unrecovered: Vec<Unrecovered>,
    lost_at: impl Fn(u64) -> Vec<String>,
) -> Vec<String> {
    unrecovered
        .into_iter()
        .filter_map(|u| {
            if u.missing.is_empty() {
                return Some(u.message);
            }
            let lost = lost_at(u.at_ns);
            // Name the keys that matter: those not lost to two faults.
            let others: Vec<&str> = u
                .missing
                .iter()
                .filter(|k| !lost.contains(k))
                .map(String::as_str)
                .collect();
            if others.is_empty() {
                return None;
            }
            if others.len() == u.missing.len() {
                return Some(u.message);
            }
            let shown: Vec<&str> = others.iter().take(10).copied().collect();
            Some(format!(
                "{}; {} of them not lost to two faults: {}",
                u.message,
                others.len(),
                shown.join(", ")
            ))
        })
        .collect()
}

/// A client for one of the driver's nodes (a dispatcher, the short-lived
/// client of `stop-leave`): the test client's settings with the reconnect
/// policy the pool recommends for `options`' TTL (the test client's pauses
/// grow to 100 ms, past a tenth of a 600 ms TTL, and the pool warns).
pub(crate) async fn node_client(
    url: &str,
    options: &NodeOptions,
) -> Result<flotilla_pool::fred::prelude::Client, flotilla_testkit::Error> {
    let mut builder = flotilla_testkit::builder(url)?;
    builder.set_policy(flotilla_pool::reconnect_policy(options));
    let client = builder.build()?;
    client.init().await?;
    Ok(client)
}

impl Run {
    /// Whether every key the dispatchers believe running runs on a member
    /// that is up, and no key believed stopped runs anywhere.
    /// The keys believed running that run on no member that is up, once
    /// no key believed stopped runs anywhere (`None` while one does): the
    /// pool has converged when this is empty.
    fn missing_when_stops_hold(&mut self) -> Option<Vec<String>> {
        // The ledgers read first: judged on the view of an earlier read,
        // a key stopped since would keep the stops from holding, and the
        // view, refreshed only past that point, would never change.
        let missing = self.not_running();
        let stops_hold = self
            .load
            .keys_in(KeyState::Stopped)
            .iter()
            .all(|k| !self.fleet.runs_anywhere(k));
        stops_hold.then_some(missing)
    }

    /// Logs what keeps the pool from converging at the end of the
    /// recovery window: keys believed running that run on no member that
    /// is up, and keys believed stopped that run somewhere (a few each).
    fn report_unconverged(&mut self) {
        let missing = self.not_running();
        let stopped_running: Vec<String> = self
            .load
            .keys_in(KeyState::Stopped)
            .into_iter()
            .filter(|k| self.fleet.runs_anywhere(k))
            .collect();
        tracing::warn!(
            missing = missing.len(),
            stopped_but_running = stopped_running.len(),
            "final convergence not reached"
        );
        for key in missing.iter().take(10) {
            tracing::warn!(key, holders = ?self.fleet.holders(key), "believed running, runs on no member that is up");
        }
        for key in stopped_running.iter().take(10) {
            tracing::warn!(key, holders = ?self.fleet.holders(key), "believed stopped, runs (process, up, workers)");
        }
    }

    /// The keys believed running that run on no member that is up.
    fn not_running(&mut self) -> Vec<String> {
        self.fleet.refresh();
        let up: HashSet<u32> = self.fleet.up().into_iter().collect();
        let mut missing: Vec<String> = self
            .load
            .keys_expected_running()
            .into_iter()
            .filter(|k| {
                !self.fleet.runs_on_up_member(k, &up)
                    && !self.fleet.ended_on_its_own(k)
                    && !self.fleet.finished_since(k, self.load.running_since(k))
            })
            .collect();
        missing.sort();
        missing
    }
}

#[cfg(test)]
mod tests {
    use super::{Unrecovered, still_unrecovered};

    fn entry(message: &str, missing: &[&str], at_ns: u64) -> Unrecovered {
        Unrecovered {
            message: message.to_string(),
            missing: missing.iter().map(|k| k.to_string()).collect(),
            at_ns,
        }
    }

    /// Each entry is judged against the keys lost to two faults at its own
    /// instant: all lost, it goes; some not, it stays and names them.
    #[test]
    fn unrecovered_keys_are_judged_at_their_own_instant() {
        let lost_at = |at_ns: u64| -> Vec<String> {
            match at_ns {
                // A key the load stopped later is lost only at this instant.
                10 => vec!["a".into(), "b".into()],
                _ => vec!["a".into()],
            }
        };
        let kept = still_unrecovered(
            vec![
                entry("all lost then", &["a", "b"], 10),
                entry("one not lost", &["a", "b"], 20),
                entry("none lost", &["c"], 10),
                entry("no keys", &[], 20),
            ],
            lost_at,
        );
        assert_eq!(
            kept,
            vec![
                "one not lost; 1 of them not lost to two faults: b".to_string(),
                "none lost".to_string(),
                "no keys".to_string(),
            ]
        );
    }
}
