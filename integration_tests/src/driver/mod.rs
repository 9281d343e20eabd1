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
mod fault_steps;
mod faults;
mod fleet;
mod load;
mod recovery_faults;
mod refusal_faults;
mod summary;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_pool::fred::prelude::ClientLike;
use flotilla_pool::{Node, NodeOptions};
use flotilla_testkit::{FaultProxy, RedisServer, Sentinels, ServerOptions};
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::checker::{CheckOptions, TimeBase, check};
use crate::clock::{ServerClock, mono_ns};
use crate::ledger::{FaultKind, LedgerWriter, Line, read_ledger};
use fleet::Fleet;
use load::{KeyState, Load};
pub use summary::ChaosSummary;

/// Options of a chaos run. Defaults in `impl Default`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ChaosOptions {
    /// How long faults are injected. Default: 60 s.
    pub duration: Duration,
    /// Worker processes at the start (the count moves by ±1 with
    /// add/remove faults). Default: 4.
    pub worker_processes: usize,
    /// Workers in each process. Default: 2.
    pub workers_per_process: usize,
    /// Seed of the fault schedule and the load. Default: 1.
    pub seed: u64,
    /// Worker TTL of every node. Default: 2 s.
    pub ttl: Duration,
    /// Distinct job keys the load uses. Default: 280 (about three quarters
    /// run at a time: over 50 jobs per worker process of 4).
    pub keys: usize,
    /// Concurrent load tasks. Default: 4.
    pub load_tasks: usize,
    /// Pause between two operations of one load task. Default: 40 ms.
    pub load_pace: Duration,
    /// Quiet time between a fault's recovery and the next fault.
    /// Default: 1 s.
    pub fault_gap: Duration,
    /// How long a fault may take to recover before it is counted as not
    /// recovered. Default: 5 × TTL.
    pub recovery_limit: Duration,
    /// Recovery window after the last fault, before the final check.
    /// Default: 4 × TTL.
    pub recovery_window: Duration,
    /// Fault kinds to inject, each round in a seeded order.
    /// Default: all of [`FaultKind::ALL`] but `failover` (which needs
    /// [`sentinel`](Self::sentinel)).
    pub faults: Vec<FaultKind>,
    /// Run against a Sentinel deployment (primary, replica, three
    /// Sentinels) instead of one server: every process connects through
    /// the Sentinel URL, and only `kill`, `pause`, `add`, `remove` and
    /// `failover` faults apply. Default: `false`.
    pub sentinel: bool,
    /// The `flotilla-test-worker` binary. Default: next to this
    /// executable.
    pub worker_binary: Option<PathBuf>,
    /// Where ledgers go; `None` uses a temp dir removed at the end.
    /// Default: `None`.
    pub ledger_dir: Option<PathBuf>,
    /// How long each handler `stop` of the worker processes takes, a random
    /// duration in this range (ms), like closing a connection.
    /// Default: 0–40 ms.
    pub stop_ms: (u64, u64),
    /// Half the nodes do not mirror the pool's jobs and pending maps
    /// (`NodeOptions::mirror_jobs(false)`): every other worker process and
    /// one of the two dispatching nodes. Default: off (every node mirrors).
    pub lean_nodes: bool,
    /// No node mirrors the pool's jobs and pending maps (the library's
    /// default): every worker process and both dispatching nodes. Takes
    /// precedence over [`lean_nodes`](Self::lean_nodes). Default: off.
    pub all_lean: bool,
    /// Faults overlap recoveries: after each fault the schedule waits a
    /// random 0–2 TTLs (less if the pool recovers sooner) and injects the
    /// next one, with no quiet gap, so faults land while workers are still
    /// re-asserting, handing off or cleaning up after the last one. A fault
    /// not recovered before the next is not counted as unrecovered; the
    /// final check after the run still requires every key to run.
    /// Default: off.
    pub overlap: bool,
    /// Some keys' runs end on their own (see [`crate::lifecycle`]): 1 key
    /// in 8 fails every 0.3–4 s and is restarted by the pool after a
    /// backoff, 1 in 8 finishes 1–8 s after each start and leaves the pool
    /// (one run in four of either ends within 50 ms of its start)
    /// until dispatched again. The checker then also requires a recorded
    /// finish to hold (no run of the key after it until a new dispatch).
    /// Default: off.
    pub lifecycle: bool,
    /// Each worker process started takes the node id of one that ended,
    /// when there is one (a pod restarted under its name). Default:
    /// `false` (every process a fresh id).
    pub fixed_node_ids: bool,
    /// Longest time a handler's `start` takes after its start line (ms;
    /// each a random time up to it): jobs that do slow work before `start`
    /// returns. Default: 0 (at once).
    pub start_max_ms: u64,
    /// Lanes per worker in the worker processes
    /// (`NodeOptions::worker_lanes`: how many keys a worker handles at
    /// once). Default: 0 (the library's default).
    pub worker_lanes: usize,
}

impl Default for ChaosOptions {
    fn default() -> Self {
        let ttl = Duration::from_secs(2);
        ChaosOptions {
            duration: Duration::from_secs(60),
            worker_processes: 4,
            workers_per_process: 2,
            seed: 1,
            ttl,
            keys: 280,
            load_tasks: 4,
            load_pace: Duration::from_millis(40),
            fault_gap: Duration::from_secs(1),
            recovery_limit: ttl * 5,
            recovery_window: ttl * 4,
            faults: FaultKind::ALL
                .into_iter()
                .filter(|k| *k != FaultKind::Failover)
                .collect(),
            sentinel: false,
            worker_binary: None,
            ledger_dir: None,
            stop_ms: (0, 40),
            lean_nodes: false,
            all_lean: false,
            overlap: false,
            lifecycle: false,
            fixed_node_ids: false,
            start_max_ms: 0,
            worker_lanes: 0,
        }
    }
}

impl ChaosOptions {
    /// Sets the fault-injection duration.
    pub fn duration(mut self, d: Duration) -> Self {
        self.duration = d;
        self
    }
    /// Sets the starting number of worker processes.
    pub fn worker_processes(mut self, n: usize) -> Self {
        self.worker_processes = n;
        self
    }
    /// Sets the number of workers in each worker process (at least 1).
    pub fn workers_per_process(mut self, n: usize) -> Self {
        self.workers_per_process = n.max(1);
        self
    }
    /// Sets the worker TTL of every node, and with it the recovery limit
    /// (5 × TTL) and the final recovery window (4 × TTL). The fault
    /// schedule's holds and the checker's windows scale with it too.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self.recovery_limit = ttl * 5;
        self.recovery_window = ttl * 4;
        self
    }
    /// Sets the seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
    /// Sets the fault kinds to inject.
    pub fn faults(mut self, kinds: Vec<FaultKind>) -> Self {
        self.faults = kinds;
        self
    }
    /// Runs against a Sentinel deployment (see [`sentinel`](Self::sentinel)).
    pub fn sentinel(mut self, on: bool) -> Self {
        self.sentinel = on;
        self
    }
    /// Sets the worker binary.
    pub fn worker_binary(mut self, path: PathBuf) -> Self {
        self.worker_binary = Some(path);
        self
    }
    /// Sets the range of handler stop durations (ms).
    pub fn stop_ms(mut self, min: u64, max: u64) -> Self {
        self.stop_ms = (min, max.max(min));
        self
    }
    /// Sets [`lean_nodes`](Self::lean_nodes).
    pub fn lean_nodes(mut self, on: bool) -> Self {
        self.lean_nodes = on;
        self
    }
    /// Sets [`overlap`](Self::overlap).
    pub fn overlap(mut self, on: bool) -> Self {
        self.overlap = on;
        self
    }
    /// Sets [`lifecycle`](Self::lifecycle).
    pub fn lifecycle(mut self, on: bool) -> Self {
        self.lifecycle = on;
        self
    }
    /// Sets [`fixed_node_ids`](Self::fixed_node_ids).
    pub fn fixed_node_ids(mut self, on: bool) -> Self {
        self.fixed_node_ids = on;
        self
    }
    /// Sets [`worker_lanes`](Self::worker_lanes).
    pub fn worker_lanes(mut self, lanes: usize) -> Self {
        self.worker_lanes = lanes;
        self
    }
    /// Sets [`start_max_ms`](Self::start_max_ms).
    pub fn start_max_ms(mut self, ms: u64) -> Self {
        self.start_max_ms = ms;
        self
    }
    /// Sets [`all_lean`](Self::all_lean).
    pub fn all_lean(mut self, on: bool) -> Self {
        self.all_lean = on;
        self
    }
    /// Sets the number of distinct job keys.
    pub fn keys(mut self, keys: usize) -> Self {
        self.keys = keys;
        self
    }
    /// Keeps ledgers in `dir`.
    pub fn ledger_dir(mut self, dir: PathBuf) -> Self {
        self.ledger_dir = Some(dir);
        self
    }
}

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
    /// While a fault's recovery is observed: the keys still not running
    /// at the last poll.
    still_missing: Vec<String>,
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
    let server = RedisServer::start_with(ServerOptions::default().aof(true))?;
    let sentinels = if options.sentinel {
        Some(tokio::task::block_in_place(Sentinels::start)?)
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
        let client = flotilla_testkit::client(&proxy.url()).await?;
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
    if sentinels.is_some() {
        fleet.redis_url = Some(url.clone());
    }
    for _ in 0..options.worker_processes {
        fleet.add(addr).await?;
    }
    let load = Load::new(nodes.clone(), options.keys, ledger.clone());
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
        still_missing: Vec::new(),
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
    while window_start.elapsed() < options.recovery_window {
        if final_recovery.is_none() && run.converged() {
            final_recovery = Some(window_start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
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
            ..CheckOptions::for_ttl(options.ttl)
        },
    );
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
                    ..CheckOptions::for_ttl(options.ttl)
                },
            )
            .lost_with_killed_holder
        }),
        final_convergence: final_recovery,
        dispatch_ok: stats.dispatch_ok,
        dispatch_exists: stats.dispatch_exists,
        dispatch_errors: stats.dispatch_errors,
        stop_ok: stats.stop_ok,
        stop_not_found: stats.stop_not_found,
        stop_errors: stats.stop_errors,
        races: stats.races,
        running_at_end: load.keys_in(KeyState::Running).len(),
        violations: report.violations.iter().map(ToString::to_string).collect(),
        report,
        ledger_dir: options.ledger_dir.clone(),
    };
    drop(temp);
    Ok(summary)
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

impl Run {
    /// Whether every key the dispatchers believe running runs on a member
    /// that is up, and no key believed stopped runs anywhere.
    fn converged(&mut self) -> bool {
        self.recovered()
            && self
                .load
                .keys_in(KeyState::Stopped)
                .iter()
                .all(|k| !self.fleet.runs_anywhere(k))
    }

    /// Whether every key the dispatchers believe running runs on a member
    /// that is up.
    fn recovered(&mut self) -> bool {
        self.not_running().is_empty()
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
