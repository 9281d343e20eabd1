//! The options of a chaos run, builder-style, with their defaults.

use std::path::PathBuf;
use std::time::Duration;

use crate::ledger::FaultKind;

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
    /// With [`lifecycle`](Self::lifecycle): half the flaky keys
    /// ([`fails_for_good`](crate::lifecycle::fails_for_good)) are
    /// dispatched with a restart policy that allows one restart, so their
    /// second failure in a row is final: the job leaves the pool, and the
    /// checker requires that end to hold as a finish does. Default: off.
    pub fail_for_good: bool,
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
    /// With [`sentinel`](Self::sentinel): the primary's replicas, and
    /// `min-replicas-to-write` on every server (0: off; with a lag of 1 s).
    /// Default: 1 replica, off.
    pub sentinel_replicas: (usize, u32),
    /// Half the dispatches and stops go through the worker processes' own
    /// nodes (see [`crate::requests`]) instead of the two dispatching
    /// nodes: the node asking holds jobs and meets the faults (cut, paused,
    /// killed, deaf) while its calls are in flight. Default: off.
    pub requests_from_workers: bool,
    /// A third of the keys ([`windowed`](crate::windows::windowed)) are
    /// dispatched with an idempotency window this long (ms), and the
    /// checker requires that no windowed admission of a key follows another
    /// within it where Redis kept its data and clock. Default: 0 (none).
    pub window_ms: u64,
    /// Every worker process runs a schedule over this many keys
    /// (`sched-0` …, see [`crate::schedules`]): its leader, one of the
    /// processes the faults hit, starts the wanted keys and stops the
    /// quarter it no longer wants, a quarter that changes every 3 TTLs
    /// until the fault phase ends; the checker holds those starts and
    /// stops to the invariants. Default: 0 (no schedule).
    pub schedule_keys: usize,
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
                .filter(|k| !k.needs_sentinels())
                .collect(),
            sentinel: false,
            worker_binary: None,
            ledger_dir: None,
            stop_ms: (0, 40),
            lean_nodes: false,
            all_lean: false,
            overlap: false,
            lifecycle: false,
            fail_for_good: false,
            fixed_node_ids: false,
            start_max_ms: 0,
            worker_lanes: 0,
            sentinel_replicas: (1, 0),
            requests_from_workers: false,
            window_ms: 0,
            schedule_keys: 0,
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

    /// Sets [`fail_for_good`](Self::fail_for_good).
    pub fn fail_for_good(mut self, on: bool) -> Self {
        self.fail_for_good = on;
        self
    }
    /// Sets [`fixed_node_ids`](Self::fixed_node_ids).
    pub fn fixed_node_ids(mut self, on: bool) -> Self {
        self.fixed_node_ids = on;
        self
    }
    /// Sets [`sentinel_replicas`](Self::sentinel_replicas).
    pub fn sentinel_replicas(mut self, replicas: usize, min_to_write: u32) -> Self {
        self.sentinel_replicas = (replicas, min_to_write);
        self
    }

    /// Sets [`window_ms`](Self::window_ms).
    pub fn window_ms(mut self, window_ms: u64) -> Self {
        self.window_ms = window_ms;
        self
    }

    /// Sets [`schedule_keys`](Self::schedule_keys).
    pub fn schedule_keys(mut self, keys: usize) -> Self {
        self.schedule_keys = keys;
        self
    }

    /// Sets [`requests_from_workers`](Self::requests_from_workers).
    pub fn requests_from_workers(mut self, on: bool) -> Self {
        self.requests_from_workers = on;
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
    /// Sets how many load tasks dispatch and stop at once, and the pause
    /// each takes between two operations.
    pub fn load(mut self, tasks: usize, pace: Duration) -> Self {
        self.load_tasks = tasks.max(1);
        self.load_pace = pace;
        self
    }
    /// Keeps ledgers in `dir`.
    pub fn ledger_dir(mut self, dir: PathBuf) -> Self {
        self.ledger_dir = Some(dir);
        self
    }
}
