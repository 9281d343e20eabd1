//! The dispatch load of a chaos run: two client-only nodes dispatch, stop
//! and re-dispatch keys continuously, sometimes racing each other on one
//! key, and record every outcome in the driver's ledger.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use flotilla_pool::Node;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;

use crate::ledger::{LedgerWriter, Record};
use crate::lifecycle::fails_for_good;
use crate::requests::{Op, Outcome, Requester};
use crate::windows::{dispatch_options, windowed};

/// What the dispatchers last learnt about a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyState {
    /// Never dispatched, or its stop was confirmed.
    Stopped,
    /// Admitted (`Ok`) or reported existing (`JobExists`).
    Running,
    /// An error left it open.
    Unknown,
}

/// Counters of the load.
#[derive(Debug, Clone, Default)]
pub(crate) struct LoadStats {
    pub(crate) dispatch_ok: u64,
    pub(crate) dispatch_exists: u64,
    /// Admissions (`Ok`) of dispatches with an idempotency window.
    pub(crate) windowed_ok: u64,
    /// `AlreadyDispatched` answers.
    pub(crate) dispatch_recent: u64,
    pub(crate) dispatch_errors: BTreeMap<String, u64>,
    pub(crate) stop_ok: u64,
    pub(crate) stop_not_found: u64,
    pub(crate) stop_errors: u64,
    pub(crate) races: u64,
    /// Dispatches and stops sent through a worker process's node.
    pub(crate) via_workers: u64,
}

/// The node a dispatch or stop goes through.
#[derive(Debug, Clone)]
enum Via {
    /// One of the driver's dispatching nodes (by place).
    Dispatcher(usize),
    /// A worker process's own node (`--requests-from-workers`).
    Process(Requester),
}

/// How long the driver waits for a worker process's reply: past the
/// process's own dispatch timeout (5 s) and a stop's settling pauses.
const PROCESS_REPLY_WAIT: Duration = Duration::from_secs(15);

/// Key states and counters shared by the load tasks and the driver.
#[derive(Debug, Clone)]
pub(crate) struct Load {
    pub(crate) keys: Arc<Mutex<BTreeMap<String, KeyState>>>,
    busy: Arc<Mutex<HashSet<String>>>,
    /// Keys whose last stop failed (timeout, unavailable): it may still take
    /// effect at any time, so a `JobExists` answered meanwhile does not say
    /// the key will keep running (the stop can land after it). Cleared by
    /// an admission (`Ok`: a new run, which that stop does not name) or a
    /// stop with a definite answer.
    stop_in_doubt: Arc<Mutex<HashSet<String>>>,
    /// Keys with a stop sent and not answered yet: the run may end at any
    /// moment, so a recovery check does not expect it running.
    stopping: Arc<Mutex<HashSet<String>>>,
    /// key → when the dispatch that last found it running (`Ok` or
    /// `JobExists`) was sent (`mono_ns`): a run that finished on its own
    /// since ended what that answer promised.
    running_since: Arc<Mutex<std::collections::HashMap<String, u64>>>,
    pub(crate) stats: Arc<Mutex<LoadStats>>,
    /// The dispatching nodes; one may be replaced by a new run of it
    /// (the `restart-dispatcher` fault).
    nodes: Arc<Vec<RwLock<Node>>>,
    ledger: LedgerWriter,
    /// Dispatch the keys that [`fails_for_good`] with
    /// [`crate::lifecycle::final_failure_policy`] (`--fail-for-good`).
    fail_for_good: bool,
    /// The idempotency window (ms) of the dispatches of [`windowed`] keys;
    /// 0: none (`--window-ms`).
    window_ms: u64,
    /// The worker processes' request channels, when half the operations
    /// go through them (`--requests-from-workers`); the fleet adds each
    /// process it starts, and a process that exited is passed over.
    requesters: Option<Arc<Mutex<Vec<Requester>>>>,
}

impl Load {
    pub(crate) fn new(nodes: Vec<Node>, keys: usize, ledger: LedgerWriter) -> Load {
        let keys = (0..keys)
            .map(|i| (format!("job-{i:04}"), KeyState::Stopped))
            .collect();
        Load {
            keys: Arc::new(Mutex::new(keys)),
            busy: Arc::new(Mutex::new(HashSet::new())),
            stop_in_doubt: Arc::new(Mutex::new(HashSet::new())),
            stopping: Arc::new(Mutex::new(HashSet::new())),
            running_since: Arc::default(),
            stats: Arc::new(Mutex::new(LoadStats::default())),
            nodes: Arc::new(nodes.into_iter().map(RwLock::new).collect()),
            ledger,
            fail_for_good: false,
            window_ms: 0,
            requesters: None,
        }
    }

    /// Sends half the operations through the worker processes whose
    /// channels `requesters` holds.
    pub(crate) fn via_workers(mut self, requesters: Arc<Mutex<Vec<Requester>>>) -> Load {
        self.requesters = Some(requesters);
        self
    }

    /// A worker process to send an operation through, or `None` (none
    /// takes requests, or the roll picked a dispatcher).
    fn process(&self, rng: &mut StdRng) -> Option<Requester> {
        let requesters = self.requesters.as_ref()?;
        if !rng.random_bool(0.5) {
            return None;
        }
        let mut live = requesters.lock().ok()?;
        live.retain(|r| !r.is_closed());
        if live.is_empty() {
            return None;
        }
        Some(live[rng.random_range(0..live.len())].clone())
    }

    /// Dispatches the [`windowed`] keys with an idempotency window of
    /// `window_ms` (0: none).
    pub(crate) fn window_ms(mut self, window_ms: u64) -> Load {
        self.window_ms = window_ms;
        self
    }

    /// Sets whether the keys that [`fails_for_good`] are dispatched with
    /// [`crate::lifecycle::final_failure_policy`].
    pub(crate) fn fail_for_good(mut self, on: bool) -> Load {
        self.fail_for_good = on;
        self
    }

    /// Dispatching node `n` as it is now.
    pub(crate) fn node(&self, n: usize) -> Node {
        match self.nodes[n].read() {
            Ok(node) => node.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// How many dispatching nodes the load uses.
    pub(crate) fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Puts `node` in the place of dispatching node `n`; returns the one
    /// it replaces.
    pub(crate) fn replace_node(&self, n: usize, node: Node) -> Node {
        let mut slot = match self.nodes[n].write() {
            Ok(slot) => slot,
            Err(poisoned) => poisoned.into_inner(),
        };
        std::mem::replace(&mut *slot, node)
    }

    pub(crate) fn state(&self, key: &str) -> KeyState {
        self.keys
            .lock()
            .map(|k| k.get(key).copied().unwrap_or(KeyState::Stopped))
            .unwrap_or(KeyState::Unknown)
    }

    /// Marks (or clears) a stop of `key` whose outcome is not known.
    fn stop_doubt(&self, key: &str, doubt: bool) {
        if let Ok(mut d) = self.stop_in_doubt.lock() {
            if doubt {
                d.insert(key.to_string());
            } else {
                d.remove(key);
            }
        }
    }

    fn in_doubt(&self, key: &str) -> bool {
        self.stop_in_doubt.lock().is_ok_and(|d| d.contains(key))
    }

    fn set(&self, key: &str, state: KeyState) {
        if let Ok(mut k) = self.keys.lock() {
            k.insert(key.to_string(), state);
        }
    }

    pub(crate) fn keys_in(&self, state: KeyState) -> Vec<String> {
        self.keys
            .lock()
            .map(|k| {
                k.iter()
                    .filter(|(_, s)| **s == state)
                    .map(|(k, _)| k.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The keys believed running whose stop is not in flight: those a
    /// recovery check expects to run somewhere.
    /// When the dispatch that last found `key` running was sent
    /// (`mono_ns`; 0: never).
    pub(crate) fn running_since(&self, key: &str) -> u64 {
        self.running_since
            .lock()
            .ok()
            .and_then(|s| s.get(key).copied())
            .unwrap_or(0)
    }

    pub(crate) fn keys_expected_running(&self) -> Vec<String> {
        let stopping = self.stopping.lock().map(|s| s.clone()).unwrap_or_default();
        self.keys_in(KeyState::Running)
            .into_iter()
            .filter(|k| !stopping.contains(k))
            .collect()
    }

    /// Runs one load task until `cancel`: picks a free key, acts on it.
    pub(crate) async fn run(self, seed: u64, pace: Duration, cancel: CancellationToken) {
        let mut rng = StdRng::seed_from_u64(seed);
        let all: Vec<String> = self
            .keys
            .lock()
            .map(|k| k.keys().cloned().collect())
            .unwrap_or_default();
        while !cancel.is_cancelled() {
            let key = &all[rng.random_range(0..all.len())];
            let claimed = self
                .busy
                .lock()
                .map(|mut b| b.insert(key.clone()))
                .unwrap_or(false);
            if claimed {
                let roll: f64 = rng.random();
                let via = match self.process(&mut rng) {
                    Some(process) => Via::Process(process),
                    None => Via::Dispatcher(rng.random_range(0..self.nodes.len())),
                };
                match self.state(key) {
                    KeyState::Stopped | KeyState::Unknown if roll < 0.15 => {
                        self.race(key, &mut rng).await
                    }
                    KeyState::Stopped | KeyState::Unknown => self.dispatch_via(&via, key).await,
                    KeyState::Running if roll < 0.35 => {
                        self.stop_via(&via, key).await;
                    }
                    KeyState::Running if roll < 0.45 => self.dispatch_via(&via, key).await,
                    KeyState::Running => {}
                }
                if let Ok(mut b) = self.busy.lock() {
                    b.remove(key);
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(pace) => {}
            }
        }
    }

    /// Dispatches `key` from every dispatching node at once, and from a
    /// worker process too when operations go through them (I3).
    async fn race(&self, key: &str, rng: &mut StdRng) {
        self.count(|s| s.races += 1);
        let mut vias: Vec<Via> = (0..self.nodes.len()).map(Via::Dispatcher).collect();
        vias.extend(self.process(rng).map(Via::Process));
        futures::future::join_all(vias.iter().map(|via| self.dispatch_via(via, key))).await;
    }

    /// Dispatches `key` from dispatching node `n` and records the outcome.
    pub(crate) async fn dispatch(&self, n: usize, key: &str) {
        self.dispatch_via(&Via::Dispatcher(n), key).await;
    }

    /// Dispatches `key` through `via` and records the outcome.
    async fn dispatch_via(&self, via: &Via, key: &str) {
        let sent_at = crate::clock::mono_ns();
        self.ledger.record(Record::DispatchSent {
            key: key.to_string(),
        });
        let fail_for_good = self.fail_for_good && fails_for_good(key);
        let window_ms = if windowed(key) { self.window_ms } else { 0 };
        let outcome = match via {
            Via::Dispatcher(n) => {
                let node = self.node(*n);
                let options = dispatch_options(fail_for_good, window_ms);
                let result = node.dispatch_job_with(key, &b"chaos"[..], &options).await;
                Outcome::of(&result, node.id())
            }
            Via::Process(process) => {
                self.count(|s| s.via_workers += 1);
                let op = Op::Dispatch {
                    key: key.to_string(),
                    fail_for_good,
                    window_ms,
                };
                process.call(&op, PROCESS_REPLY_WAIT).await
            }
        };
        if matches!(outcome, Outcome::Ok(_) | Outcome::Exists)
            && let Ok(mut since) = self.running_since.lock()
        {
            since.insert(key.to_string(), sent_at);
        }
        match outcome {
            Outcome::Ok(node) => {
                self.ledger.record(Record::Admit {
                    key: key.to_string(),
                    node,
                    window_ms: (window_ms > 0).then_some(window_ms),
                });
                self.stop_doubt(key, false);
                self.set(key, KeyState::Running);
                self.count(|s| {
                    s.dispatch_ok += 1;
                    s.windowed_ok += u64::from(window_ms > 0);
                });
            }
            Outcome::Recent => {
                // Admitted less than a window ago, and neither running nor
                // waiting to start now: what the load believed of the key
                // stands (a key believed running that is refused so was
                // lost, which the final I2 check sees).
                self.ledger.record(Record::Recent {
                    key: key.to_string(),
                });
                self.count(|s| s.dispatch_recent += 1);
            }
            Outcome::Exists => {
                self.ledger.record(Record::Exists {
                    key: key.to_string(),
                });
                // The run that exists may be the one a failed stop still
                // ends.
                let state = if self.in_doubt(key) {
                    KeyState::Unknown
                } else {
                    KeyState::Running
                };
                self.set(key, state);
                self.count(|s| s.dispatch_exists += 1);
            }
            Outcome::NotFound | Outcome::Failed(_) => {
                // The job may or may not start.
                self.ledger.record(Record::DispatchUnknown {
                    key: key.to_string(),
                });
                if self.state(key) != KeyState::Running {
                    self.set(key, KeyState::Unknown);
                }
                let kind = match outcome {
                    Outcome::Failed(kind) => kind,
                    _ => "other: not found".into(),
                };
                self.count(|s| *s.dispatch_errors.entry(kind).or_default() += 1);
            }
        }
    }

    /// Stops those of `keys` that are believed running and no load task
    /// works on, through `node` (not one of the load's: a command-line
    /// client's), and records each outcome; the keys it stopped `Ok`.
    pub(crate) async fn stop_through(&self, node: &Node, keys: &[String]) -> Vec<String> {
        let mut stopped = Vec::new();
        for key in keys {
            let claimed = self
                .busy
                .lock()
                .map(|mut b| b.insert(key.clone()))
                .unwrap_or(false);
            if !claimed {
                continue;
            }
            if self.state(key) == KeyState::Running
                && matches!(self.stop_with(node, key).await, Outcome::Ok(_))
            {
                stopped.push(key.clone());
            }
            if let Ok(mut b) = self.busy.lock() {
                b.remove(key);
            }
        }
        stopped
    }

    /// Stops `key` through `node` (not one of the load's), records the
    /// outcome and returns it.
    async fn stop_with(&self, node: &Node, key: &str) -> Outcome {
        self.stop_by(key, None, async {
            Outcome::of(&node.stop_job(key).await, node.id())
        })
        .await
    }

    /// Stops `key` through `via`, records the outcome and returns it.
    async fn stop_via(&self, via: &Via, key: &str) -> Outcome {
        let pid = match via {
            Via::Dispatcher(_) => None,
            Via::Process(process) => Some(process.pid()),
        };
        self.stop_by(key, pid, async {
            match via {
                Via::Dispatcher(n) => {
                    let node = self.node(*n);
                    Outcome::of(&node.stop_job(key).await, node.id())
                }
                Via::Process(process) => {
                    self.count(|s| s.via_workers += 1);
                    let op = Op::Stop {
                        key: key.to_string(),
                    };
                    process.call(&op, PROCESS_REPLY_WAIT).await
                }
            }
        })
        .await
    }

    /// Records a stop of `key`, made by `call` through the node of worker
    /// process `via` (`None`: a dispatching node), and its outcome.
    async fn stop_by(
        &self,
        key: &str,
        via: Option<u32>,
        call: impl Future<Output = Outcome>,
    ) -> Outcome {
        if let Ok(mut s) = self.stopping.lock() {
            s.insert(key.to_string());
        }
        self.ledger.record(Record::StopSent {
            key: key.to_string(),
        });
        let outcome = call.await;
        let word = match &outcome {
            Outcome::Ok(_) => {
                self.count(|s| s.stop_ok += 1);
                self.stop_doubt(key, false);
                self.set(key, KeyState::Stopped);
                "ok"
            }
            Outcome::NotFound => {
                self.count(|s| s.stop_not_found += 1);
                self.stop_doubt(key, false);
                self.set(key, KeyState::Stopped);
                "not_found"
            }
            Outcome::Exists | Outcome::Recent | Outcome::Failed(_) => {
                self.count(|s| s.stop_errors += 1);
                self.stop_doubt(key, true);
                self.set(key, KeyState::Unknown);
                "unknown"
            }
        };
        self.ledger.record(Record::StopDone {
            key: key.to_string(),
            outcome: word.into(),
            via,
        });
        // After the state above: a check in between sees the key stopped.
        if let Ok(mut s) = self.stopping.lock() {
            s.remove(key);
        }
        outcome
    }

    fn count(&self, f: impl FnOnce(&mut LoadStats)) {
        if let Ok(mut s) = self.stats.lock() {
            f(&mut s);
        }
    }

    /// Settles keys left `Unknown`: dispatching again tells whether the
    /// pool has them (`Ok` or `JobExists` → running); a key whose last stop
    /// failed is stopped again instead (a definite answer → stopped), as a
    /// `JobExists` could not tell whether that stop lands later.
    pub(crate) async fn settle_unknown(&self) {
        for key in self.keys_in(KeyState::Unknown) {
            if self.in_doubt(&key) {
                self.stop_via(&Via::Dispatcher(0), &key).await;
            } else {
                self.dispatch(0, &key).await;
            }
        }
    }
}
