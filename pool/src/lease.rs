//! Keep-alive and leases: a worker's keep-alive is its lease on its jobs.
//!
//! The node renews the keep-alive of all its workers every TTL/3 in one
//! script, on Redis server time. Independently, it measures on its own
//! monotonic clock the time since the last successful renewal was *sent*;
//! past `lease_stop_after` it stops its jobs (policy `StopJobs`) before any
//! other node may judge the worker dead (which takes a full TTL of server
//! time after the last renewal was *applied*, later than it was sent).
//! When renewal works again, it resumes the jobs still assigned to it.
//! A worker that Redis no longer knows (cleaned up while partitioned, or
//! Redis lost its data) registers again and re-asserts the jobs it runs.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;

use tokio::time::Instant;

use crate::error::Result;
use crate::handler::Job;
use crate::node::NodeInner;
use crate::options::LeasePolicy;
pub(crate) use crate::store::Reassert;
use crate::store::{Reasserted, Renewal, Resumed};
use crate::worker::{HandlerStart, LocalJob, WorkerInner};

impl NodeInner {
    /// Renews the keep-alives every TTL/3, and at once when a claim found
    /// a worker unregistered ([`NodeInner::renewal_wanted`]); after a
    /// lease loss, the first
    /// renewal that succeeds has the resume task restart the suspended
    /// jobs. The lease itself is watched by [`NodeInner::lease_watchdog`],
    /// a task of its own, so a renewal, a re-registration or a resume stuck
    /// on an unreachable Redis never delays the stop of the jobs.
    pub(crate) async fn renewal_loop(self: Arc<Self>) {
        let period = self.options.worker_ttl / 3;
        let mut next = Instant::now() + period;
        // At most one silent-link check per TTL (see `silent_link.rs`): a
        // check lasts at most two periods, so checks never overlap.
        let mut reconnected: Option<Instant> = None;
        loop {
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return,
                _ = tokio::time::sleep_until(next) => {}
                () = self.renewal_wanted.notified() => {}
            }
            next = Instant::now() + period;
            self.sample_gauges();
            let sent = Instant::now();
            let server = self.commands_server();
            let last_ok = *self.last_renewal.borrow();
            match tokio::time::timeout(period, self.renew()).await {
                Ok(Ok(renewal)) if renewal.unheard => {
                    // Redis ran it but renewed nothing: no reply had
                    // reached this node for over a TTL (a link failing one
                    // way), so its jobs are stopped here and the pool may
                    // move them. This reply was heard, so a renewal counts
                    // again: sent at once, not a period later (after an
                    // outage longer than a TTL every node is refused once).
                    // Also once after a forward step of the server's
                    // clock: the last reply heard then looks a step old.
                    tracing::warn!(
                        node = %self.id,
                        "keep-alive refused: no reply from Redis was heard for over a TTL \
                         (or the server's clock stepped forward); renewing again at once"
                    );
                    next = Instant::now();
                }
                Ok(Ok(Renewal {
                    server_ms,
                    unknown,
                    claimed,
                    ..
                })) => {
                    // Behind Sentinel, a server the Sentinels no longer
                    // name the primary (it stalled through its failover)
                    // renews nothing that counts: see `primary_check`.
                    if !self.renewal_counts(server.as_ref()).await {
                        continue;
                    }
                    if sent.saturating_duration_since(last_ok) >= self.options.lease_stop_after {
                        // The lease lapsed (a pause, a long stall): the
                        // watchdog may not have run yet when this renewal
                        // succeeded, and cleanup may have moved the jobs
                        // meanwhile. Stop them now; the resume below
                        // restarts those still this node's.
                        self.freshness.invalidate("lease gap");
                        self.lose_lease(last_ok).await;
                    }
                    // Before the lease counts again: a worker a cleaner
                    // claimed starts nothing (see `keepalive.lua`).
                    self.note_cleanup_claims(&claimed);
                    self.freshness.server_time(server_ms, sent);
                    // Redis stamped the keep-alive after `sent`: nobody may
                    // take this node's jobs before `sent + worker_ttl`.
                    self.last_renewal.send_replace(sent);
                    // Redis forgot a worker: cleaned up, or the pool's
                    // data lost. A `FLUSHALL` shows in no run id, only in
                    // the pool's generation: checked before the workers
                    // re-assert what they hold, which then finds the
                    // recovery window open (see `check_identity_once`), and
                    // this node makes its stops stand within it.
                    if !unknown.is_empty()
                        && let Err(e) = self.check_identity_once().await
                    {
                        tracing::debug!(node = %self.id, error = %e, "reading the server's identity failed; the identity task retries");
                        self.identity_wanted.notify_one();
                    }
                    // Every worker at once: each is the only holder of
                    // its jobs until it has re-asserted them.
                    let node = &self;
                    futures::future::join_all(unknown.iter().map(|worker| async move {
                        if let Err(e) = node.reregister(worker).await {
                            tracing::warn!(worker, error = %e, "re-registering worker failed");
                        }
                    }))
                    .await;
                    if self.lease_suspended.swap(false, Ordering::SeqCst) {
                        self.resume_everyone.store(true, Ordering::SeqCst);
                    }
                    // Also when no lease was lost: jobs a cleanup claim or
                    // an error held back at the last resume are asked for
                    // again at every renewal.
                    self.resume_wanted.notify_one();
                    self.rewinds_due();
                }
                Ok(Err(e)) => {
                    tracing::warn!(node = %self.id, error = %e, "keep-alive failed");
                    self.after_refused_renewal(&e);
                }
                Err(_) => {
                    tracing::warn!(node = %self.id, "keep-alive timed out");
                    if reconnected.is_none_or(|at| at.elapsed() >= self.options.worker_ttl) {
                        reconnected = Some(Instant::now());
                        // Beside the renewals: on a link only slow for a
                        // moment, the next renewal may still save the lease.
                        let node = self.clone();
                        self.tasks.spawn(async move {
                            tokio::select! {
                                _ = node.cancel.cancelled() => {}
                                () = node.reconnect_silent_link(period) => {}
                            }
                        });
                    }
                }
            }
        }
    }

    /// Resumes suspended jobs when a renewal asks (see
    /// [`NodeInner::resume_wanted`]): every worker's after a lease loss,
    /// else those of workers still holding some.
    pub(crate) async fn resume_loop(self: Arc<Self>) {
        loop {
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return,
                _ = self.resume_wanted.notified() => {}
            }
            if self.resume_everyone.swap(false, Ordering::SeqCst) {
                self.resume_all().await;
            } else {
                self.resume_held().await;
            }
        }
    }

    /// Stops every local job when no renewal succeeded for
    /// `lease_stop_after` since it was sent (policy `StopJobs`): all jobs of
    /// every worker at once, each within `stop_timeout`, so that they have
    /// all stopped before `worker_ttl` — the earliest moment another node
    /// may judge the workers dead.
    pub(crate) async fn lease_watchdog(self: Arc<Self>) {
        let mut renewals = self.last_renewal.subscribe();
        loop {
            let last = *renewals.borrow_and_update();
            let deadline = last + self.options.lease_stop_after;
            if Instant::now() < deadline {
                tokio::select! {
                    biased;
                    _ = self.cancel.cancelled() => return,
                    r = renewals.changed() => if r.is_err() { return },
                    _ = tokio::time::sleep_until(deadline) => {}
                }
                continue; // look again: a renewal may have moved the deadline
            }
            self.lose_lease(last).await;
            // Until a renewal succeeds again (it resumes the jobs).
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return,
                r = renewals.changed() => if r.is_err() { return },
            }
        }
    }

    /// The lease lapsed (no renewal sent since `last` succeeded for
    /// `lease_stop_after`): stops every local job at once, unless that was
    /// done already for this lapse.
    pub(crate) async fn lose_lease(&self, last: Instant) {
        if self.lease_suspended.swap(true, Ordering::SeqCst) {
            return;
        }
        self.freshness.invalidate("lease lapsed");
        if self.options.lease_policy == LeasePolicy::StopJobs && !self.workers.is_empty() {
            tracing::warn!(node = %self.id, since = ?last.elapsed(), "lease lost: stopping local jobs");
            self.metrics.lease_lost.increment(1);
            let stopping = Instant::now();
            let stopped = self.suspend_all().await;
            tracing::info!(node = %self.id, jobs = stopped, took = ?stopping.elapsed(), "local jobs stopped on lease loss");
            self.metrics
                .lease_stop_seconds
                .record(stopping.elapsed().as_secs_f64());
        }
    }

    /// Renews the node's and its workers' keep-alives: Redis server time
    /// (ms) and the local workers Redis does not know, or a refusal. Notes
    /// the reply's server time as the last one heard.
    async fn renew(&self) -> Result<Renewal> {
        let workers: Vec<String> = self.workers.iter().map(|w| w.key().clone()).collect();
        let heard_ms = self.renewal_heard_ms.load(Ordering::SeqCst);
        let renewal = self
            .store
            .keepalive(&self.id, self.options.worker_ttl, heard_ms, workers)
            .await?;
        self.server_clock.record(renewal.server_ms, Instant::now());
        // Stored, not maxed: after a failover to a server whose clock is
        // behind, the next renewal compares with that server's time.
        self.renewal_heard_ms
            .store(renewal.server_ms, Ordering::SeqCst);
        Ok(renewal)
    }

    /// Registers a worker Redis forgot and re-asserts its jobs: those nobody
    /// else took keep running (after data loss), the others stop here.
    /// Not a worker that is closing: its close removes its registration,
    /// and a renewal made meanwhile finds it unknown; registering it again
    /// would leave a worker in every ring that no process reads for, until
    /// a cleanup finds it silent. Nor does the renewal wait for the lock
    /// such a close holds until its jobs are handed over.
    pub(crate) async fn reregister(&self, id: &str) -> Result<()> {
        let Some(worker) = self.workers.get(id).map(|w| w.value().clone()) else {
            return Ok(());
        };
        if worker.cancel.is_cancelled() {
            return Ok(());
        }
        tracing::warn!(worker = id, "worker unknown to redis: registering again");
        self.freshness.invalidate("re-registered");
        let began = Instant::now();
        self.register_worker(id).await?;
        // A close that begins meanwhile takes the lock, then cancels the
        // worker, and removes its registration last.
        let locking = Instant::now();
        let Some(_guard) = worker.lock_for_reassertion().await else {
            return Ok(());
        };
        let lock_wait = locking.elapsed();
        self.reassert_all(&worker).await?;
        // Until here the worker was the only holder of its jobs: the time
        // a crash would have lost them.
        tracing::info!(
            worker = id,
            running = worker.jobs.len(),
            ?lock_wait,
            took = ?began.elapsed(),
            "worker registered again and its jobs re-asserted"
        );
        Ok(())
    }

    /// Re-asserts every job `worker` runs or holds suspended, after Redis
    /// lost its data or went back in time (the caller holds the worker's
    /// `ops` lock exclusively). A running job that another worker holds
    /// with a newer token stops here. A suspended one comes back too if
    /// nobody took it; while the pool recovers it is left to the orphan
    /// sweep instead (see `scripts/reassert.lua`). A Redis error leaves the
    /// rest as it was, for the next attempt.
    pub(crate) async fn reassert_all(&self, worker: &WorkerInner) -> Result<()> {
        self.requested_stops_of_runs_here(worker).await?;
        let running: Vec<(String, LocalJob)> = worker
            .jobs
            .iter()
            .map(|e| (e.key().clone(), e.value().clone()))
            .collect();
        let (outcomes, mut first_error) =
            self.reassert_many(worker, running, Reassert::Running).await;
        // All at once: one after the other, a dozen handler stops held the
        // worker's lock (and the re-assertion a loss of Redis's data right
        // after needs) for their sum (chaos soak seed 1432: 630 ms, and a
        // kill then took 150 jobs Redis had just lost).
        let elsewhere: Vec<String> = outcomes
            .into_iter()
            .filter(|(_, outcome)| *outcome != Reasserted::Ok)
            .filter_map(|(key, _)| {
                tracing::info!(key, worker = %worker.id, "job runs elsewhere now; stopping it here");
                worker.jobs.remove(&key).map(|_| key)
            })
            .collect();
        futures::future::join_all(elsewhere.iter().map(|key| worker.stop_handler(key))).await;
        let suspended: Vec<(String, LocalJob)> = worker
            .suspended
            .lock()
            .await
            .iter()
            .map(|(k, j)| (k.clone(), j.clone()))
            .collect();
        let (outcomes, error) = self
            .reassert_many(worker, suspended, Reassert::Suspended)
            .await;
        for (key, outcome) in outcomes {
            match outcome {
                Reasserted::Ok => {}
                Reasserted::Orphaned => {
                    tracing::info!(key, worker = %worker.id, "suspended job left to the orphan sweep");
                    worker.suspended.lock().await.remove(&key);
                }
                Reasserted::Lost
                | Reasserted::Pending
                | Reasserted::Unclaimed
                | Reasserted::Superseded(_) => {
                    tracing::info!(key, worker = %worker.id, outcome = outcome.as_str(), "suspended job given up: a newer run of it elsewhere");
                    worker.suspended.lock().await.remove(&key);
                }
            }
        }
        first_error = first_error.or(error);
        first_error.map_or(Ok(()), Err)
    }

    /// Stops every local job at once, remembering them to resume later.
    /// Returns how many were stopped.
    async fn suspend_all(&self) -> usize {
        let _transition = self.lease_transition.lock().await;
        let workers: Vec<Arc<WorkerInner>> =
            self.workers.iter().map(|w| w.value().clone()).collect();
        // First no worker may start anything (a start that is inserted
        // after this sees the flag and stops itself), then every job stops.
        // No ops lock here: the worker's loop may be blocked on the very
        // Redis that is unreachable, and the jobs must stop now.
        for worker in &workers {
            worker.lapse_lease();
        }
        // Each job moves to the suspended set before its stop begins, and
        // under that set's lock, so that whoever holds the lock sees it in
        // one set or the other (`WorkerInner::runs_or_holds`): a rollback
        // recovery running meanwhile must not take it for a job that ended
        // here and release it.
        let mut stops = FuturesUnordered::new();
        for worker in &workers {
            let keys: Vec<String> = worker.jobs.iter().map(|e| e.key().clone()).collect();
            for key in keys {
                let mut suspended = worker.suspended.lock().await;
                if let Some((_, job)) = worker.jobs.remove(&key) {
                    suspended.insert(key.clone(), job);
                    drop(suspended);
                    stops.push(async move {
                        if let Err(e) = worker.stop_handler(&key).await {
                            tracing::warn!(key, error = %e, "handler stop failed on lease loss");
                        }
                    });
                }
            }
        }
        let mut stopped = 0;
        while stops.next().await.is_some() {
            stopped += 1;
        }
        stopped
    }

    /// Restarts suspended jobs that are still ours, with new tokens. Stops
    /// early, keeping the rest suspended, when the lease lapses again.
    pub(crate) async fn resume_all(&self) {
        let workers: Vec<Arc<WorkerInner>> =
            self.workers.iter().map(|w| w.value().clone()).collect();
        self.resume_workers(workers).await;
    }

    /// Asks again for the suspended jobs of workers that hold some while
    /// the lease is valid: jobs a cleanup claim held back (kept until the
    /// cleaner moved them or the claim is gone), or whose resume failed.
    async fn resume_held(&self) {
        let workers: Vec<Arc<WorkerInner>> =
            self.workers.iter().map(|w| w.value().clone()).collect();
        let mut held = Vec::new();
        for worker in workers {
            if !worker.suspended.lock().await.is_empty() {
                held.push(worker);
            }
        }
        if !held.is_empty() {
            self.resume_workers(held).await;
        }
    }

    /// Every worker at once: each restart may wait on a slow `start`, and
    /// one worker's need not wait for another's.
    async fn resume_workers(&self, workers: Vec<Arc<WorkerInner>>) {
        futures::future::join_all(workers.iter().map(|worker| self.resume_worker(worker))).await;
    }

    /// Resumes `worker`'s suspended jobs under its `ops` lock.
    async fn resume_worker(&self, worker: &Arc<WorkerInner>) {
        let _guard = worker.ops.write().await;
        let suspended: Vec<(String, LocalJob)> = {
            let _transition = self.lease_transition.lock().await;
            if self.lease_suspended.load(Ordering::SeqCst) {
                return; // lapsed again: the next renewal resumes
            }
            worker.regain_lease();
            worker.suspended.lock().await.drain().collect()
        };
        // Runs that ended and whose end waits for the recovery to be
        // recorded stay held, for that end.
        let (ending, suspended): (Vec<_>, Vec<_>) = suspended
            .into_iter()
            .partition(|(key, job)| worker.lifecycle.ending(key, job.token));
        if !ending.is_empty() {
            worker.suspended.lock().await.extend(ending);
        }
        // Many at a time: each restart waits on Redis and then on the
        // handler's `start`, which may take a while, and the worker's
        // lanes wait for all of them (this holds its `ops` lock).
        let restarts: Vec<(String, LocalJob, Result<Restart>)> =
            futures::stream::iter(suspended.into_iter().filter(|(key, _)| {
                if worker.jobs.contains_key(key) {
                    lock_held(worker).remove(key);
                    return false; // started again from its inbox entry meanwhile
                }
                true
            }))
            .map(|(key, job)| async move {
                let restart = self.resume_one(worker, &key, &job).await;
                (key, job, restart)
            })
            .buffer_unordered(RESUMES_AT_ONCE)
            .collect()
            .await;
        for (key, job, restart) in restarts {
            note_held_back(worker, &key, &restart);
            match restart {
                Ok(Restart::Started | Restart::Left) => {}
                Ok(Restart::Moved) => {
                    tracing::info!(key, "job moved during lease loss; forgetting it");
                }
                Ok(Restart::Claimed | Restart::Recovering | Restart::Unsettled) => {
                    // The cleaner that claimed this worker (it was
                    // silent past its TTL) may be moving the job, or
                    // a run elsewhere may not have re-asserted it yet.
                    // Held here, not forgotten: a cleaner that dies or
                    // stalls until the claim is cleared would leave a
                    // record naming this worker for a job nobody runs.
                    worker.suspended.lock().await.insert(key, job);
                }
                Ok(Restart::Suspended(token)) => {
                    // The lease lapsed again: kept for the next resume
                    // (so are the others, each its own way here).
                    let mut kept = worker.suspended.lock().await;
                    kept.insert(key, LocalJob { token, ..job });
                }
                Ok(Restart::StartFailed(e)) => {
                    // Still recorded as ours but not running: hand it to
                    // another worker for a fresh start.
                    tracing::warn!(key, error = %e, "restart after lease loss failed; requeueing");
                    self.requeue_job(&key, &worker.id, crate::store::Mover::Owner)
                        .await;
                }
                Err(e) => {
                    tracing::warn!(key, error = %e, "resuming job failed; will retry");
                    worker.suspended.lock().await.insert(key, job);
                }
            }
        }
        // Starts refused while the lease was lost are still in the inbox.
        worker.rewind_soon(self);
    }

    /// Restarts suspended job `key` when Redis still names `worker` its
    /// owner. When it does not, the job moved, or Redis went back to a
    /// state from before this worker recorded it (a rollback whose
    /// reconcile has not run here yet): re-asserting it tells the two
    /// apart (a newer token elsewhere wins; while the pool recovers, the
    /// job is left to the orphan sweep), where forgetting it at once
    /// would lose a job nothing else knows.
    async fn resume_one(&self, worker: &WorkerInner, key: &str, job: &LocalJob) -> Result<Restart> {
        let restart = self.restart_owned(worker, key, job.clone()).await?;
        if !matches!(restart, Restart::Moved) {
            return Ok(restart); // a claimed one among them: Redis names us
        }
        match self.reassert(worker, key, job, Reassert::Suspended).await? {
            // Redis named this run a moment ago: when the restart then
            // finds it moved, Redis may have gone back in time between
            // the two calls (soak seed 1439); the next renewal settles it.
            Reasserted::Ok => match self.restart_owned(worker, key, job.clone()).await? {
                Restart::Moved => Ok(Restart::Unsettled),
                restart => Ok(restart),
            },
            Reasserted::Orphaned => {
                tracing::info!(key, worker = %worker.id, "suspended job Redis did not hold left to the orphan sweep");
                Ok(Restart::Left)
            }
            Reasserted::Lost
            | Reasserted::Pending
            | Reasserted::Unclaimed
            | Reasserted::Superseded(_) => Ok(Restart::Moved),
        }
    }

    /// Restarts `key` on `worker`, with a new fencing token, when the jobs
    /// map still says the worker owns it (after lease loss, or when a
    /// handoff could not be done). The caller holds the worker's `ops` lock
    /// exclusively, or shared together with the key's stripe lock.
    pub(crate) async fn restart_owned(
        &self,
        worker: &WorkerInner,
        key: &str,
        job: LocalJob,
    ) -> Result<Restart> {
        if !worker.holds_lease(self) {
            return Ok(Restart::Suspended(job.token));
        }
        let resumed = self
            .store
            .resume(key, &worker.id, self.options.worker_ttl)
            .await?;
        let token = match resumed {
            Resumed::Token(token) => token,
            Resumed::Moved => return Ok(Restart::Moved),
            Resumed::Claimed => return Ok(Restart::Claimed),
            Resumed::Recovering => return Ok(Restart::Recovering),
        };
        // The resume took a round trip: on a slow link, or through a
        // stall, seconds. Past the lease a cleaner may have moved the job
        // and another worker started it; the record stays this worker's
        // (a later resume takes it again, with the next token).
        if !worker.holds_lease(self) {
            return Ok(Restart::Suspended(token));
        }
        let run = Job::new_run(
            key,
            job.payload.clone(),
            std::time::SystemTime::UNIX_EPOCH
                + Duration::from_micros(crate::codec::stamp_us(job.admitted)),
            token,
            worker.lifecycle.outcome(key, token),
        );
        match worker.start_handler(run).await {
            HandlerStart::Cancelled => {
                if let Err(e) = worker.stop_handler(key).await {
                    tracing::warn!(key, error = %e, "handler stop failed on lease loss");
                }
                Ok(Restart::Suspended(token))
            }
            HandlerStart::Started => {
                worker
                    .jobs
                    .insert(key.to_string(), LocalJob { token, ..job });
                self.note_running(&worker.id, key);
                // A lease loss since the check above: its stop may have
                // missed this job; stop it here (whichever side removes it
                // stops it).
                if worker.lease_lost.load(Ordering::SeqCst) {
                    if worker.jobs.remove(key).is_some()
                        && let Err(e) = worker.stop_handler(key).await
                    {
                        tracing::warn!(key, error = %e, "handler stop failed on lease loss");
                    }
                    return Ok(Restart::Suspended(token));
                }
                Ok(Restart::Started)
            }
            HandlerStart::Refused(e) => Ok(Restart::StartFailed(e)),
        }
    }
}

/// How many suspended jobs of a worker a resume restarts at a time.
const RESUMES_AT_ONCE: usize = 64;

/// Outcome of [`NodeInner::restart_owned`].
pub(crate) enum Restart {
    /// Running again here with a new token.
    Started,
    /// The job belongs to another worker now; nothing to do here.
    Moved,
    /// Redis did not hold the job while the pool recovers from a data
    /// loss: its payload is back and the orphan sweep requeues it.
    Left,
    /// The handler refused; the job is still recorded as ours.
    StartFailed(String),
    /// The lease is lost: not running; resume it once the lease is back.
    /// Holds the token Redis records for the job now: a resume answered
    /// after the lease lapsed issued a new one, which the held copy takes
    /// (its stop, hand-off or re-assertion names the run Redis knows).
    Suspended(u64),
    /// Still recorded as this worker's, but a cleanup claim on the worker
    /// holds it back: not running; kept suspended and asked again at each
    /// renewal until the cleaner moved it or the claim is gone.
    Claimed,
    /// Recorded as this worker's, but the pool recovers from a data loss
    /// or a rollback, and the record may be older than a run elsewhere
    /// that has not re-asserted yet: not running; kept suspended and asked
    /// again at each renewal until the window is over.
    Recovering,
    /// Re-asserted, then found no longer recorded as this worker's: moved
    /// in between, or Redis went back in time between the two calls. Not
    /// running; kept suspended and asked again at the next renewal (a
    /// move then shows as a newer run, and the job is forgotten).
    Unsettled,
}

impl NodeInner {
    /// Sets the gauges from this node's local state (called on every lease
    /// renewal).
    pub(crate) fn sample_gauges(&self) {
        let (mut running, mut restarting, mut suspended) = (0usize, 0usize, 0usize);
        for w in self.workers.iter() {
            let waiting = w.lifecycle.restarting();
            restarting += waiting;
            running += w.jobs.len().saturating_sub(waiting);
            if let Ok(s) = w.suspended.try_lock() {
                suspended += s.len();
            }
        }
        self.metrics.workers.set(self.workers.len() as f64);
        self.metrics.jobs_running.set(running as f64);
        self.metrics.jobs_restarting.set(restarting as f64);
        self.metrics.jobs_suspended.set(suspended as f64);
    }
}

/// Logs a resume's outcome for a job a cleanup claim or a recovery holds
/// back: at INFO when it is first held back, at DEBUG at each renewal that
/// finds it still held, at INFO once when it leaves that state.
fn note_held_back(worker: &WorkerInner, key: &str, restart: &Result<Restart>) {
    let mut held_back = lock_held(worker);
    let held_by = match restart {
        Ok(Restart::Claimed) => {
            Some("a cleanup claim on the worker (until it moves the job or goes)")
        }
        Ok(Restart::Recovering) => {
            Some("the pool recovering (until every running copy has re-asserted)")
        }
        Ok(Restart::Unsettled) => Some(
            "Redis changing between its re-assertion and its restart (until a renewal settles it)",
        ),
        _ => None,
    };
    if let Some(held_by) = held_by {
        if held_back.insert(key.to_string()) {
            tracing::info!(key, worker = %worker.id, held_by, "job stays suspended, held back");
        } else {
            tracing::debug!(key, worker = %worker.id, held_by, "job still held back");
        }
        return;
    }
    let outcome = match restart {
        Ok(Restart::Claimed | Restart::Recovering | Restart::Unsettled) => return,
        _ if !held_back.remove(key) => return,
        Ok(Restart::Started) => "resumed here",
        Ok(Restart::Moved) => "moved",
        Ok(Restart::Left) => "left to the orphan sweep",
        Ok(Restart::Suspended(_)) => "suspended again (lease lapsed)",
        Ok(Restart::StartFailed(_)) => "start failed",
        Err(_) => "resume failed",
    };
    tracing::info!(key, worker = %worker.id, outcome, "job no longer held back");
}

fn lock_held(worker: &WorkerInner) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
    // A panic while holding this lock can only come from the set itself;
    // the set is a log aid, so a poisoned one is still used.
    worker
        .held_back
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
