//! Schedules: a producer, run by one leader per interval, says which jobs
//! should run; the scheduler starts the missing ones and stops the extra
//! ones it started itself.
//!
//! * **One leader.** Every node that calls [`Node::schedule`] for a name
//!   competes for a [`LeaderLease`] in the pool's hash tag
//!   (`fl:{pool}:lock:schedule:<name>`). Only the leader runs the producer.
//! * **One run per interval, pool-wide.** The leader runs a [`Ticker`]
//!   (`fl:{pool}:ticker:schedule:<name>`): its slots live in Redis, so a new
//!   leader never re-runs the slot its predecessor already ran.
//! * **Its own jobs only.** Each admission of a schedule's dispatch records
//!   the key in the schedule's job set (`fl:{pool}:schedule:<name>`, job key
//!   → fencing token) in the same script, so a new leader knows what the
//!   previous one started. Jobs started by anyone else are never stopped.
//! * **Fenced.** That admission also checks that the lease's holder record
//!   still carries this leader's token; a deposed leader's dispatch is
//!   refused ([`Error::NotLeader`]) and its run ends. Its stops (each
//!   attempt, as it is routed to the job's worker) and dropping a key from
//!   the job set are fenced the same way: a leader paused or cut off past
//!   its lease cannot stop a job its successor wants.
//! * **Never dies.** Producer errors and panics are logged and reported in
//!   [`ScheduleRun::producer_error`]; the next interval runs again.
//!
//! # Examples
//! ```no_run
//! use std::time::Duration;
//! use bytes::Bytes;
//! use flotilla_pool::Node;
//!
//! # async fn demo(node: Node) -> flotilla_pool::Result<()> {
//! let schedule = node
//!     .schedule("tenants", Duration::from_secs(30), || async {
//!         // e.g. read the active tenants from a database
//!         Ok(vec![("tenant-1".to_string(), Bytes::from_static(b"{}"))])
//!     })
//!     .await?;
//! println!("leading: {}", schedule.is_leader());
//! schedule.close().await?; // hands leadership over at once
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::handler::HandlerError;
use crate::keys;
use crate::leader::{LeaderLease, LeaderOptions};
use crate::node::Node;
use crate::options::{DispatchOptions, ScheduleFence, ScheduleOptions};
use crate::ticker::{Ticker, TickerOptions};

/// The jobs a producer wants running: (job key, payload). The payload is
/// used when a job is started; a running job is not restarted when only
/// its payload changes. A key listed twice keeps its last payload.
pub type ScheduledJobs = Vec<(String, Bytes)>;

type Producer =
    Arc<dyn Fn() -> BoxFuture<'static, Result<ScheduledJobs, HandlerError>> + Send + Sync>;

/// What one run of a schedule did (on the leader that ran it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScheduleRun {
    /// The ticker slot of the run (`floor(server_ms / interval)`); slots of
    /// one schedule strictly increase pool-wide.
    pub slot: u64,
    /// The leader's fencing token during the run.
    pub leader_token: u64,
    /// How many jobs the producer asked for (0 when it failed).
    pub desired: usize,
    /// Keys this run started.
    pub started: Vec<String>,
    /// Keys this run stopped (they were the schedule's and no longer wanted).
    pub stopped: Vec<String>,
    /// Dispatches or stops that failed (each is logged); retried next run.
    pub failed: usize,
    /// The producer's error or panic message, if it failed.
    pub producer_error: Option<String>,
    /// The run ended early because this node stopped leading.
    pub interrupted: bool,
}

/// A running schedule on this node: competes for leadership and, while
/// leading, runs the producer once per interval.
///
/// [`close`](Self::close) releases leadership at once (a follower takes
/// over within its poll interval) and waits for the background task.
/// Dropping the handle stops the task too; closing the node ends it.
#[derive(Debug)]
pub struct Schedule {
    name: String,
    leader: watch::Receiver<bool>,
    runs: watch::Receiver<Option<ScheduleRun>>,
    cancel: CancellationToken,
    task: Option<JoinHandle<Result<()>>>,
}

/// The background task's state.
struct Runner {
    node: Node,
    name: String,
    interval: Duration,
    options: ScheduleOptions,
    producer: Producer,
    record_key: String,
    lock_key: String,
    runs: watch::Sender<Option<ScheduleRun>>,
    cancel: CancellationToken,
}

impl Node {
    /// Starts schedule `name`: every node that calls this competes for the
    /// schedule's leadership; the leader runs `producer` once per
    /// `interval` (one run per interval pool-wide) and reconciles: it
    /// dispatches the listed jobs that are not running, and stops the jobs
    /// this schedule started earlier that are no longer listed. Uses
    /// [`ScheduleOptions::default`].
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a bad name; [`Error::InvalidOptions`] for
    /// an interval under 10 ms or over 30 days; [`Error::Closed`];
    /// [`Error::Redis`] when Redis refuses the first leadership attempt.
    pub async fn schedule<F, Fut>(
        &self,
        name: &str,
        interval: Duration,
        producer: F,
    ) -> Result<Schedule>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ScheduledJobs, HandlerError>> + Send + 'static,
    {
        self.schedule_with(name, interval, ScheduleOptions::default(), producer)
            .await
    }

    /// Like [`schedule`](Self::schedule), with options.
    ///
    /// # Errors
    /// As [`schedule`](Self::schedule), plus [`Error::InvalidOptions`] from
    /// [`ScheduleOptions::validate`].
    pub async fn schedule_with<F, Fut>(
        &self,
        name: &str,
        interval: Duration,
        options: ScheduleOptions,
        producer: F,
    ) -> Result<Schedule>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ScheduledJobs, HandlerError>> + Send + 'static,
    {
        self.inner.check_open()?;
        crate::keys::check_name("schedule name", name)?;
        options.validate()?;
        if interval < Duration::from_millis(10) || interval > Duration::from_secs(30 * 86_400) {
            return Err(Error::InvalidOptions {
                option: "interval",
                reason: "must be between 10 ms and 30 days".to_string(),
            });
        }
        let pool = self.pool().to_string();
        let lease_name = keys::schedule_lease(name);
        let lease = LeaderLease::start(
            &self.inner.store.client,
            &lease_name,
            LeaderOptions::default()
                .ttl(options.leader_ttl)
                .follower_poll(options.follower_poll)
                .hash_tag(pool.clone())
                .owner_id(self.id()),
        )
        .await?;
        let leader = lease.subscribe();
        let (runs_tx, runs_rx) = watch::channel(None);
        let cancel = self.inner.cancel.child_token();
        let producer: Producer = Arc::new(move || producer().boxed());
        let runner = Runner {
            node: self.clone(),
            name: name.to_string(),
            interval,
            options,
            producer,
            record_key: keys::schedule(&pool, name),
            lock_key: keys::lock(Some(&pool), &lease_name),
            runs: runs_tx,
            cancel: cancel.clone(),
        };
        let task = self.inner.tasks.spawn(runner.run(lease));
        tracing::info!(pool, schedule = name, ?interval, "schedule started");
        Ok(Schedule {
            name: name.to_string(),
            leader,
            runs: runs_rx,
            cancel,
            task: Some(task),
        })
    }
}

impl Schedule {
    /// The schedule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether this node leads the schedule right now.
    pub fn is_leader(&self) -> bool {
        *self.leader.borrow()
    }

    /// A receiver of leadership changes: `true` while this node leads.
    pub fn leadership(&self) -> watch::Receiver<bool> {
        self.leader.clone()
    }

    /// A receiver of this node's runs: the latest [`ScheduleRun`] (`None`
    /// until this node has run the schedule once).
    pub fn runs(&self) -> watch::Receiver<Option<ScheduleRun>> {
        self.runs.clone()
    }

    /// Stops competing: ends a run in progress, releases leadership so a
    /// follower takes over within its poll interval, and waits for the
    /// background task. Jobs the schedule started keep running; the next
    /// leader owns them.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the lease could not be released (it then
    /// expires after its TTL).
    pub async fn close(mut self) -> Result<()> {
        self.cancel.cancel();
        match self.task.take() {
            Some(task) => task.await.unwrap_or(Ok(())),
            None => Ok(()),
        }
    }
}

impl Drop for Schedule {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl Runner {
    /// Follows leadership until cancelled, then releases the lease.
    async fn run(self, lease: LeaderLease) -> Result<()> {
        let mut leadership = lease.subscribe();
        loop {
            tokio::select! {
                () = self.cancel.cancelled() => break,
                leading = leadership.wait_for(|leading| *leading) => {
                    if leading.is_err() { break }
                }
            }
            self.lead(&lease, &mut leadership).await;
        }
        lease.close().await
    }

    /// Runs the producer at every tick while this node leads.
    async fn lead(&self, lease: &LeaderLease, leadership: &mut watch::Receiver<bool>) {
        let pool = self.node.pool();
        tracing::info!(pool, schedule = %self.name, "leading the schedule");
        let ticker = Ticker::start(
            &self.node.inner.store.client,
            &keys::schedule_lease(&self.name),
            self.interval,
            TickerOptions::default().hash_tag(pool),
        )
        .await;
        let mut ticker = match ticker {
            Ok(ticker) => ticker,
            Err(error) => {
                // Only bad options fail here, and they were checked; log and
                // retry after a poll rather than end the task.
                tracing::error!(pool, schedule = %self.name, %error, "cannot start the schedule's ticker");
                tokio::select! {
                    () = self.cancel.cancelled() => {}
                    () = tokio::time::sleep(self.options.follower_poll) => {}
                }
                return;
            }
        };
        loop {
            let tick = tokio::select! {
                () = self.cancel.cancelled() => break,
                _ = leadership.wait_for(|leading| !*leading) => break,
                tick = ticker.next() => match tick {
                    Some(tick) => tick,
                    None => break,
                },
            };
            // Leadership may have been lost and taken again between two
            // ticks: always fence with the current token.
            let Some(token) = lease.fencing_token() else {
                break;
            };
            let run = self.run_once(tick.slot, token);
            let report = tokio::select! {
                report = run => report,
                () = self.cancel.cancelled() => break,
                _ = leadership.wait_for(|leading| !*leading) => {
                    tracing::info!(pool, schedule = %self.name, slot = tick.slot, "lost leadership during a run");
                    ScheduleRun { slot: tick.slot, leader_token: token, interrupted: true, ..ScheduleRun::default() }
                }
            };
            self.publish(report);
        }
        ticker.close().await;
        tracing::info!(pool, schedule = %self.name, "no longer leading the schedule");
    }

    fn publish(&self, report: ScheduleRun) {
        let name = self.name.clone();
        metrics::counter!("flotilla_schedule_runs_total", "schedule" => name.clone()).increment(1);
        metrics::counter!("flotilla_schedule_started_total", "schedule" => name.clone())
            .increment(report.started.len() as u64);
        metrics::counter!("flotilla_schedule_stopped_total", "schedule" => name)
            .increment(report.stopped.len() as u64);
        tracing::debug!(
            schedule = %self.name,
            slot = report.slot,
            desired = report.desired,
            started = report.started.len(),
            stopped = report.stopped.len(),
            failed = report.failed,
            "schedule run"
        );
        self.runs.send_replace(Some(report));
    }

    /// One run: produce, then start the missing jobs and stop the extra
    /// ones this schedule started.
    async fn run_once(&self, slot: u64, token: u64) -> ScheduleRun {
        let mut report = ScheduleRun {
            slot,
            leader_token: token,
            ..ScheduleRun::default()
        };
        let desired: BTreeMap<String, Bytes> = match self.produce().await {
            Ok(jobs) => jobs.into_iter().collect(),
            Err(message) => {
                tracing::warn!(schedule = %self.name, slot, error = %message, "producer failed; retrying next interval");
                report.producer_error = Some(message);
                return report;
            }
        };
        report.desired = desired.len();
        let recorded: Vec<String> = match self
            .node
            .inner
            .store
            .client
            .hkeys(&self.record_key)
            .await
            .map_err(crate::store::call::from_redis)
        {
            Ok(keys) => keys,
            Err(error) => {
                tracing::warn!(schedule = %self.name, slot, %error, "cannot read the schedule's job set");
                report.failed += 1;
                return report;
            }
        };
        self.start_missing(&desired, token, &mut report).await;
        if !report.interrupted {
            self.stop_extra(&desired, recorded, token, &mut report)
                .await;
        }
        report
    }

    /// Runs the producer, turning an error or a panic into a message.
    async fn produce(&self) -> Result<ScheduledJobs, String> {
        match AssertUnwindSafe((self.producer)()).catch_unwind().await {
            Ok(Ok(jobs)) => Ok(jobs),
            Ok(Err(error)) => Err(error.to_string()),
            Err(panic) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                Err(format!("producer panicked: {message}"))
            }
        }
    }

    async fn start_missing(
        &self,
        desired: &BTreeMap<String, Bytes>,
        token: u64,
        report: &mut ScheduleRun,
    ) {
        let store = &self.node.inner.store;
        let options = DispatchOptions {
            schedule: Some(ScheduleFence {
                name: self.name.clone(),
                record_key: self.record_key.clone(),
                lock_key: self.lock_key.clone(),
                token,
            }),
            ..DispatchOptions::default()
        };
        // Read from Redis: this node may not mirror the jobs map, and a
        // key found running is one admission saved (the admission itself
        // answers `JobExists` for a key that started meanwhile).
        let wanted: Vec<String> = desired.keys().cloned().collect();
        let running = match store.running_or_pending(&wanted).await {
            Ok(running) => running,
            Err(error) => {
                tracing::warn!(schedule = %self.name, %error, "reading which scheduled keys run failed; retrying next interval");
                report.failed += desired.len();
                return;
            }
        };
        let missing: Vec<(String, Bytes)> = desired
            .iter()
            .filter(|(key, _)| !running.contains(*key))
            .map(|(key, payload)| (key.clone(), payload.clone()))
            .collect();
        let options = Arc::new(options);
        let mut results = futures::stream::iter(missing)
            .map(|(key, payload)| {
                let (node, options) = (self.node.clone(), Arc::clone(&options));
                async move {
                    let result = node.dispatch_job_with(&key, payload, &options).await;
                    (key, result)
                }
            })
            .buffer_unordered(self.options.max_concurrent);
        while let Some((key, result)) = results.next().await {
            match result {
                Ok(()) => report.started.push(key),
                // Running already (started by anyone): nothing to do.
                Err(Error::JobExists(_)) => {}
                Err(Error::NotLeader(_)) => report.interrupted = true,
                Err(error) => {
                    tracing::warn!(schedule = %self.name, key = %key, %error, "scheduled dispatch failed; retrying next interval");
                    report.failed += 1;
                }
            }
        }
    }

    async fn stop_extra(
        &self,
        desired: &BTreeMap<String, Bytes>,
        recorded: Vec<String>,
        token: u64,
        report: &mut ScheduleRun,
    ) {
        let extra: Vec<String> = recorded
            .into_iter()
            .filter(|key| !desired.contains_key(key))
            .collect();
        // A key still pending may not be startable-yet-stoppable: leave it
        // for the next run rather than forget a job about to start.
        let pending = match self.node.inner.store.pending_among(&extra).await {
            Ok(pending) => pending,
            Err(error) => {
                tracing::warn!(schedule = %self.name, %error, "reading which keys wait to start failed; retrying next interval");
                report.failed += extra.len();
                return;
            }
        };
        let extra: Vec<String> = extra
            .into_iter()
            .filter(|key| !pending.contains(key))
            .collect();
        let mut results = futures::stream::iter(extra)
            .map(|key| {
                let fence = Fence {
                    node: self.node.clone(),
                    leader: ScheduleFence {
                        name: self.name.clone(),
                        record_key: self.record_key.clone(),
                        lock_key: self.lock_key.clone(),
                        token,
                    },
                };
                async move {
                    let result = fence.stop_and_forget(&key).await;
                    (key, result)
                }
            })
            .buffer_unordered(self.options.max_concurrent);
        while let Some((key, result)) = results.next().await {
            match result {
                Ok(true) => report.stopped.push(key),
                Ok(false) => {}
                Err(Error::NotLeader(_)) => report.interrupted = true,
                Err(error) => {
                    tracing::warn!(schedule = %self.name, key = %key, %error, "stopping a scheduled job failed; retrying next interval");
                    report.failed += 1;
                }
            }
        }
    }
}

/// What stopping one of the schedule's jobs needs (owned, so that stops
/// can run concurrently).
struct Fence {
    node: Node,
    leader: ScheduleFence,
}

impl Fence {
    /// Stops `key` (if it runs) and then drops it from the schedule's job
    /// set. Stopping first means a crash in between leaves a stopped job
    /// recorded (forgotten by the next run), never a running job unrecorded.
    /// Returns whether the job was running. Each attempt to stop it is
    /// refused ([`Error::NotLeader`]) once this leader is deposed.
    async fn stop_and_forget(&self, key: &str) -> Result<bool> {
        self.node.inner.check_open()?;
        crate::keys::check_name("job key", key)?;
        let stopped = match self
            .node
            .inner
            .stop_key(key, None, Some(&self.leader))
            .await
        {
            Ok(()) => true,
            Err(Error::JobNotFound(_)) => false,
            Err(error) => return Err(error),
        };
        self.forget(key).await?;
        Ok(stopped)
    }

    /// Drops `key` from the schedule's job set while this node still leads.
    async fn forget(&self, key: &str) -> Result<()> {
        let forgot = self
            .node
            .inner
            .store
            .forget_scheduled(
                &self.leader.record_key,
                &self.leader.lock_key,
                self.leader.token,
                key,
                self.node.inner.options.dispatch_timeout,
            )
            .await?;
        if forgot == crate::store::Forgot::NotLeader {
            return Err(Error::NotLeader(self.leader.name.clone()));
        }
        Ok(())
    }
}
