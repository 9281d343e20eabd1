//! The worker processes of a chaos run, each behind its own fault proxy, and
//! a live view of which keys run where (from their ledgers).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_testkit::FaultProxy;

use crate::clock::mono_ns;
use crate::ledger::{LedgerTail, Record};
use crate::process::{ProcessError, StartingWorker, WorkerProcess, WorkerSpec};
use crate::requests::Requester;
use crate::schedules::ScheduleSpec;

/// What a worker process is going through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Health {
    Up,
    Paused,
    Cut,
}

/// One worker process and its proxy.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) process: WorkerProcess,
    pub(crate) proxy: FaultProxy,
    pub(crate) health: Health,
}

/// Every worker process of the run.
#[derive(Debug)]
pub(crate) struct Fleet {
    pub(crate) members: Vec<Member>,
    binary: PathBuf,
    pool: String,
    ttl: Duration,
    workers_per_process: usize,
    stop_ms: (u64, u64),
    /// Every other process started does not mirror the jobs and pending
    /// maps.
    pub(crate) lean: bool,
    /// No process started mirrors them (takes precedence over `lean`).
    pub(crate) all_lean: bool,
    /// Every process started runs lifecycle keys (`--lifecycle`).
    pub(crate) lifecycle: bool,
    /// Processes started take the node id of one that ended, when there
    /// is one (`--fixed-node-ids`): a pod that restarts under its name.
    pub(crate) fixed_node_ids: bool,
    /// Longest handler `start` of the processes started (ms, 0: none).
    pub(crate) start_max_ms: u64,
    /// Lanes per worker of the processes started
    /// (`NodeOptions::worker_lanes`; 0: the library's default).
    pub(crate) worker_lanes: usize,
    /// Where the request channel of each process started goes, when the
    /// processes take requests (`--requests-from-workers`).
    pub(crate) requesters: Option<Arc<Mutex<Vec<Requester>>>>,
    /// The schedule every process started runs (`--schedule-keys`).
    pub(crate) schedule: Option<ScheduleSpec>,
    /// The node ids of processes that ended, free to be taken again.
    free_node_ids: Vec<String>,
    /// pid → the fixed node id its process runs under.
    node_ids: HashMap<u32, String>,
    dir: PathBuf,
    next: usize,
    /// Every ledger file ever used (also of processes gone).
    pub(crate) ledgers: Vec<PathBuf>,
    tails: Vec<LedgerTail>,
    /// key → pid → workers running it, from the ledgers.
    running: HashMap<String, HashMap<u32, HashSet<String>>>,
    /// key → when its last run ended on its own (monotonic ns) and whether
    /// it finished (else it failed).
    ended: HashMap<String, (u64, bool)>,
    /// key → when a run of it last finished on its own (monotonic ns).
    finished: HashMap<String, u64>,
    /// key → when it last started (monotonic ns).
    started: HashMap<String, u64>,
    /// The URL the processes connect to instead of their proxy (a Sentinel
    /// deployment's; the proxy then stays idle).
    pub(crate) redis_url: Option<String>,
}

impl Fleet {
    pub(crate) fn new(
        binary: PathBuf,
        pool: String,
        ttl: Duration,
        workers_per_process: usize,
        stop_ms: (u64, u64),
        dir: PathBuf,
    ) -> Fleet {
        Fleet {
            members: Vec::new(),
            binary,
            pool,
            ttl,
            workers_per_process,
            stop_ms,
            lean: false,
            all_lean: false,
            lifecycle: false,
            fixed_node_ids: false,
            start_max_ms: 0,
            worker_lanes: 0,
            requesters: None,
            schedule: None,
            free_node_ids: Vec::new(),
            node_ids: HashMap::new(),
            dir,
            next: 0,
            ledgers: Vec::new(),
            tails: Vec::new(),
            running: HashMap::new(),
            ended: HashMap::new(),
            started: HashMap::new(),
            finished: HashMap::new(),
            redis_url: None,
        }
    }

    /// Starts one more worker process behind a new proxy to `redis`.
    pub(crate) async fn add(&mut self, redis: SocketAddr) -> Result<u32, ProcessError> {
        let (starting, proxy) = self.start(redis).await?;
        let process = starting.ready(Duration::from_secs(30)).await?;
        let pid = process.pid();
        if let (Some(requesters), Some(requester)) = (&self.requesters, &process.requester)
            && let Ok(mut all) = requesters.lock()
        {
            all.push(requester.clone());
        }
        self.members.push(Member {
            process,
            proxy,
            health: Health::Up,
        });
        Ok(pid)
    }

    /// Starts a worker process behind a new proxy to `redis`, without
    /// waiting for it to be ready or making it a member: its ledger joins
    /// the run's, its lines join the live view only if it becomes one.
    pub(crate) async fn start(
        &mut self,
        redis: SocketAddr,
    ) -> Result<(StartingWorker, FaultProxy), ProcessError> {
        let proxy = FaultProxy::start(redis)
            .await
            .map_err(|e| ProcessError::NotReady(format!("proxy: {e}")))?;
        self.next += 1;
        let ledger = self.dir.join(format!("worker-{}.jsonl", self.next));
        self.ledgers.push(ledger.clone());
        self.tails.push(LedgerTail::new(ledger.clone()));
        let spec = WorkerSpec {
            binary: self.binary.clone(),
            redis_url: self.redis_url.clone().unwrap_or_else(|| proxy.url()),
            pool: self.pool.clone(),
            ttl: self.ttl,
            workers: self.workers_per_process,
            ledger,
            stop_ms: self.stop_ms,
            mirror_jobs: !(self.all_lean || (self.lean && self.next.is_multiple_of(2))),
            lifecycle: self.lifecycle,
            start_max_ms: self.start_max_ms,
            worker_lanes: self.worker_lanes,
            requests: self.requesters.is_some(),
            schedule: self.schedule,
            node_id: self.fixed_node_ids.then(|| {
                self.free_node_ids
                    .pop()
                    .unwrap_or_else(|| format!("n-proc-{}", self.next))
            }),
        };
        let starting = match WorkerProcess::start(&spec) {
            Ok(starting) => starting,
            Err(e) => {
                self.free_node_ids.extend(spec.node_id);
                return Err(e);
            }
        };
        if let Some(id) = spec.node_id {
            self.node_ids.insert(starting.pid(), id);
        }
        Ok((starting, proxy))
    }

    /// Frees the fixed node id of process `pid`, which has ended, for the
    /// next process started.
    pub(crate) fn ended(&mut self, pid: u32) {
        if let Some(id) = self.node_ids.remove(&pid) {
            self.free_node_ids.push(id);
        }
    }

    /// Removes a member from the fleet (after it was killed or exited).
    pub(crate) fn forget(&mut self, pid: u32) -> Option<Member> {
        let i = self.members.iter().position(|m| m.process.pid() == pid)?;
        self.ended(pid);
        for pids in self.running.values_mut() {
            pids.remove(&pid);
        }
        Some(self.members.remove(i))
    }

    /// Members that are up (not paused, not cut off).
    pub(crate) fn up(&self) -> Vec<u32> {
        self.members
            .iter()
            .filter(|m| m.health == Health::Up)
            .map(|m| m.process.pid())
            .collect()
    }

    /// The member started last that is up.
    pub(crate) fn newest_up(&self) -> Option<u32> {
        self.members
            .iter()
            .rev()
            .find(|m| m.health == Health::Up)
            .map(|m| m.process.pid())
    }

    /// The keys running on `pid` (per the ledgers).
    pub(crate) fn keys_on(&self, pid: u32) -> Vec<String> {
        let mut keys: Vec<String> = self
            .running
            .iter()
            .filter(|(_, pids)| pids.get(&pid).is_some_and(|w| !w.is_empty()))
            .map(|(key, _)| key.clone())
            .collect();
        keys.sort();
        keys
    }

    /// The member that is up and runs the most jobs (per the ledgers).
    pub(crate) fn busiest_up(&self) -> Option<u32> {
        self.up().into_iter().max_by_key(|pid| {
            self.running
                .values()
                .filter(|pids| pids.contains_key(pid))
                .count()
        })
    }

    pub(crate) fn member(&mut self, pid: u32) -> Option<&mut Member> {
        self.members.iter_mut().find(|m| m.process.pid() == pid)
    }

    /// Reads new ledger lines into the live view (lines of processes no
    /// longer in the fleet are ignored: they run nothing).
    pub(crate) fn refresh(&mut self) {
        let alive: HashSet<u32> = self.members.iter().map(|m| m.process.pid()).collect();
        for tail in &mut self.tails {
            let Ok(lines) = tail.read_new() else { continue };
            for l in lines {
                // A run that ended on its own tells about the key whatever
                // became of its process since (removed before this read).
                // A final failure recorded (`--fail-for-good`) ends the job
                // as a finish does.
                let ended = match &l.record {
                    Record::Ended { key, outcome, .. } => Some((key, outcome == "finished")),
                    Record::Finished { key, .. } => Some((key, true)),
                    _ => None,
                };
                if let Some((key, finished)) = ended {
                    if finished {
                        let at = self.finished.entry(key.clone()).or_default();
                        *at = (*at).max(l.mono_ns);
                    }
                    let newer = self.ended.get(key).is_none_or(|(at, _)| *at < l.mono_ns);
                    if newer {
                        self.ended.insert(key.clone(), (l.mono_ns, finished));
                    }
                }
                if !alive.contains(&l.pid) {
                    continue;
                }
                match l.record {
                    Record::Start { key, worker, .. } => {
                        self.started.insert(key.clone(), l.mono_ns);
                        self.running
                            .entry(key)
                            .or_default()
                            .entry(l.pid)
                            .or_default()
                            .insert(worker);
                    }
                    Record::Ended { key, worker, .. } | Record::Stop { key, worker } => {
                        forget_run(&mut self.running, &key, l.pid, &worker)
                    }
                    _ => {}
                }
            }
        }
    }

    /// Whether `key` is not expected to run now although the load last
    /// admitted it: its last run finished on its own, or failed within
    /// [`restart_within`](crate::lifecycle::restart_within) (the pool
    /// restarts it after a backoff).
    pub(crate) fn ended_on_its_own(&self, key: &str) -> bool {
        let started = self.started.get(key).copied().unwrap_or(0);
        self.ended.get(key).is_some_and(|(at, finished)| {
            *at > started
                && (*finished
                    || mono_ns().saturating_sub(*at)
                        < crate::lifecycle::restart_within(Duration::from_millis(self.start_max_ms))
                            .as_nanos() as u64)
        })
    }

    /// Whether a run of `key` finished on its own after `since` (ns): the
    /// job left the pool, unless the pool ran it again because the finish
    /// was not recorded in time (a cut), in which case that new run may
    /// be lost with the faults that follow as a finished job may (the
    /// checker expects nothing of such a key either).
    pub(crate) fn finished_since(&self, key: &str, since: u64) -> bool {
        self.finished.get(key).is_some_and(|at| *at > since)
    }

    /// Whether `key` runs on a member that is up.
    pub(crate) fn runs_on_up_member(&self, key: &str, up: &HashSet<u32>) -> bool {
        self.running
            .get(key)
            .is_some_and(|pids| pids.keys().any(|p| up.contains(p)))
    }

    /// Whether `key` runs anywhere (per the ledgers of live processes).
    pub(crate) fn runs_anywhere(&self, key: &str) -> bool {
        self.running.get(key).is_some_and(|p| !p.is_empty())
    }

    /// Where `key` runs (per the ledgers of live processes): each process
    /// and its workers running it, with whether the process is up.
    pub(crate) fn holders(&self, key: &str) -> Vec<(u32, bool, Vec<String>)> {
        let up: HashSet<u32> = self.up().into_iter().collect();
        let mut holders: Vec<(u32, bool, Vec<String>)> = self
            .running
            .get(key)
            .into_iter()
            .flatten()
            .map(|(pid, workers)| (*pid, up.contains(pid), workers.iter().cloned().collect()))
            .collect();
        holders.sort();
        holders
    }

    /// Kills every process (reaping them) and drops the proxies.
    pub(crate) async fn kill_all(&mut self) {
        for mut m in self.members.drain(..) {
            let _ = m.process.signal(nix::sys::signal::Signal::SIGCONT);
            let _ = m.process.sigkill().await;
        }
    }
}

/// Forgets the run of `key` on `worker` of process `pid` in the live view.
fn forget_run(
    running: &mut HashMap<String, HashMap<u32, HashSet<String>>>,
    key: &str,
    pid: u32,
    worker: &str,
) {
    if let Some(pids) = running.get_mut(key)
        && let Some(workers) = pids.get_mut(&pid)
    {
        workers.remove(worker);
        if workers.is_empty() {
            pids.remove(&pid);
        }
    }
}
