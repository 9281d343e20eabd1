//! The worker's side of a job's life: reports from [`JobOutcome`]s are
//! recorded in Redis, and failed jobs are restarted after their backoff.
//!
//! Every step runs under the worker's per-key lock and checks that the
//! worker still runs that very run (same token) — so a report or a restart
//! that races a stop, a move or a lease loss does nothing.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use dashmap::DashMap;
use tokio::sync::{Mutex, mpsc};

use super::{Ended, JobOutcome, RestartPolicy, RunEnd};
use crate::codec::{self, JobBody};
use crate::handler::Job;
use crate::lease::Reassert;
use crate::node::NodeInner;
use crate::store::{EndArgs, EndRecorded, Reasserted, Restarted};
use crate::worker::{HandlerStart, LocalJob, WorkerInner};

/// How long to wait before trying a report or restart again after Redis
/// did not answer.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// A worker's lifecycle state.
pub(crate) struct WorkerLifecycle {
    to_worker: mpsc::UnboundedSender<Ended>,
    reports: Mutex<Option<mpsc::UnboundedReceiver<Ended>>>,
    /// Jobs waiting to restart: key → token of the failed run.
    restarting: DashMap<String, u64>,
    /// Runs whose end waits for a recovery to be recorded (`Retry`): key →
    /// token. Not resumed meanwhile: the run ended.
    ending: DashMap<String, u64>,
}

impl WorkerLifecycle {
    pub(crate) fn new() -> Self {
        let (to_worker, reports) = mpsc::unbounded_channel();
        WorkerLifecycle {
            to_worker,
            reports: Mutex::new(Some(reports)),
            restarting: DashMap::new(),
            ending: DashMap::new(),
        }
    }

    /// The outcome handle of run `token` of `key` on this worker.
    pub(crate) fn outcome(&self, key: &str, token: u64) -> JobOutcome {
        JobOutcome::new(self.to_worker.clone(), key, token)
    }

    /// Cancels a pending restart of `key` (it was stopped, moved or
    /// restarted); whether there was one.
    pub(crate) fn forget(&self, key: &str) -> bool {
        self.restarting.remove(key).is_some()
    }

    /// Jobs waiting to restart.
    pub(crate) fn restarting(&self) -> usize {
        self.restarting.len()
    }

    /// Whether run `token` of `key` ended and its end waits to be
    /// recorded (a resume must not start it again).
    pub(crate) fn ending(&self, key: &str, token: u64) -> bool {
        self.ending.get(key).is_some_and(|t| *t == token)
    }

    /// Marks run `token` of `key` as waiting to restart.
    fn mark(&self, key: &str, token: u64) {
        self.restarting.insert(key.to_string(), token);
    }
}

impl WorkerInner {
    /// Handles the reports of this worker's jobs until the worker closes.
    pub(crate) async fn lifecycle_loop(self: Arc<Self>) {
        let Some(mut reports) = self.lifecycle.reports.lock().await.take() else {
            return;
        };
        loop {
            let ended = tokio::select! {
                _ = self.cancel.cancelled() => return,
                e = reports.recv() => match e {
                    Some(e) => e,
                    None => return,
                },
            };
            self.on_ended(ended).await;
        }
    }

    /// The restart policy of a job: the one its dispatch set, else the
    /// node's.
    fn restart_policy(&self, node: &NodeInner, job: &LocalJob) -> RestartPolicy {
        codec::decode::<JobBody>("job body", &job.raw_body)
            .ok()
            .and_then(|body| body.restart)
            .unwrap_or(node.options.restart_policy)
    }

    async fn on_ended(self: &Arc<Self>, ended: Ended) {
        let Some(node) = self.node() else { return };
        // A re-assertion waiting for `ops` goes first: reported again.
        let Some((_ops, _key)) = self.lock_key_or_give_way(&ended.key).await else {
            self.clone().report_later(ended);
            return;
        };
        let running = self
            .jobs
            .get(&ended.key)
            .filter(|j| j.token == ended.token)
            .map(|j| j.clone());
        // A run the lease watchdog stopped after it had ended on its own
        // (the report was on its way): its end still counts, or the resume
        // would start a finished job again.
        let (job, handler_stopped) = match running {
            Some(job) => (job, false),
            None => {
                let suspended = self.suspended.lock().await;
                match suspended.get(&ended.key).filter(|j| j.token == ended.token) {
                    Some(job) => (job.clone(), true),
                    None => {
                        tracing::debug!(key = %ended.key, token = ended.token, "outcome of a run no longer here; ignored");
                        return;
                    }
                }
            }
        };
        let policy = self.restart_policy(&node, &job);
        let delays_ms = policy.delays_ms();
        let end = match &ended.end {
            RunEnd::Finished => EndArgs::Finished,
            RunEnd::Failed(error) => EndArgs::Failed {
                error,
                reset: ended.ran >= policy.reset_after,
                delays_ms: &delays_ms,
            },
        };
        // Read before the call: a run held suspended, or still running
        // after the lease lapsed, may have been moved meanwhile.
        let past_lease = handler_stopped || !self.holds_lease(&node);
        // Behind Sentinel, the server asked: an end recorded on a primary
        // the Sentinels no longer name is made to stand where they name.
        let asked = node.commands_server();
        let recorded = node
            .store
            .record_job_end(
                &ended.key,
                &self.id,
                ended.token,
                end,
                past_lease,
                node.options.worker_ttl,
            )
            .await;
        let key = ended.key.as_str();
        // Kept while no answer came (an error: asked again later).
        if !matches!(recorded, Ok(EndRecorded::Retry) | Err(_)) {
            self.lifecycle
                .ending
                .remove_if(key, |_, token| *token == ended.token);
        }
        match recorded {
            Err(e) => {
                // The job stays recorded here; report again later (the
                // token check makes a repeat harmless).
                tracing::warn!(key, error = %e, "recording a job's end failed; retrying");
                self.clone().report_later(ended);
            }
            Ok(EndRecorded::Retry) => {
                // Past the lease while the pool recovers: the record naming
                // this run may hide a move. Asked again once the window is
                // over, when every running copy has re-asserted; the run is
                // not resumed meanwhile.
                tracing::info!(
                    key,
                    token = ended.token,
                    "end of a run past its lease held back while the pool recovers; asking again"
                );
                self.lifecycle.ending.insert(key.to_string(), ended.token);
                self.clone().report_later(ended);
            }
            Ok(EndRecorded::Finished { ended_at }) => {
                self.end_locally(key, ended.token, ended_at, Some(job.admitted))
                    .await;
                node.report_final_end(key, ended.token, job.admitted, asked, FinalEnd::Finished)
                    .await;
            }
            Ok(EndRecorded::Moved) if matches!(ended.end, RunEnd::Failed(_)) => {
                // Moved, or lost by Redis before this worker re-asserted
                // it: the restart tells the two apart (`restart_here`).
                if !handler_stopped && let Err(e) = self.stop_handler(key).await {
                    tracing::debug!(key, error = %e, "handler stop of an ended run failed");
                }
                self.lifecycle.mark(key, ended.token);
                tracing::info!(
                    key,
                    "failed run Redis does not name; restarting it if it is still this worker's"
                );
                node.metrics.job_failures.increment(1);
                self.clone()
                    .restart_after(key.to_string(), ended.token, policy.first_delay);
            }
            Ok(EndRecorded::Moved) => {
                self.end_locally(key, ended.token, ended.token, None).await;
                tracing::info!(key, "run ended; Redis names another run of the key");
            }
            Ok(EndRecorded::Failed { failures, ended_at }) => {
                self.end_locally(key, ended.token, ended_at, Some(job.admitted))
                    .await;
                node.metrics.job_failures.increment(1);
                let error = match &ended.end {
                    RunEnd::Failed(error) => error.clone(),
                    RunEnd::Finished => String::new(),
                };
                let end = FinalEnd::Failed { failures, error };
                node.report_final_end(key, ended.token, job.admitted, asked, end)
                    .await;
            }
            Ok(EndRecorded::Restarting { failures, delay }) => {
                // The handler's state of the ended run goes (unless the
                // watchdog's stop took it); the job stays this worker's
                // (stops, moves and lease losses apply).
                if !handler_stopped && let Err(e) = self.stop_handler(key).await {
                    tracing::debug!(key, error = %e, "handler stop of an ended run failed");
                }
                self.lifecycle.mark(key, ended.token);
                tracing::warn!(key, failures, delay_ms = delay.as_millis() as u64, error = ?ended.end, "job failed; restarting after a backoff");
                node.metrics.job_failures.increment(1);
                self.clone()
                    .restart_after(key.to_string(), ended.token, delay);
            }
        }
    }

    /// Forgets run `token` that ended: local state and the handler's. The
    /// end is remembered up to `ended_at`, the tombstone Redis issued for
    /// it (or the run's token): made to stand after a loss, it also ends a
    /// move of the run issued before it that a rollback took back, which
    /// a cleaner remembers and would otherwise give back (chaos soak seed
    /// 1564: a finished job ran again). `admitted`: the dispatch's
    /// admission stamp when Redis recorded the end (the dispatch is over,
    /// as after a stop `stop_job` asked for: a newer run of it undoes the
    /// end, see `StopTombstones::record_dispatch`); `None` when Redis named
    /// another run (this one's end says nothing of the dispatch).
    async fn end_locally(&self, key: &str, token: u64, ended_at: u64, admitted: Option<u64>) {
        self.lifecycle.forget(key);
        let remember = |stopped: &crate::tombstones::StopTombstones| match admitted {
            Some(admitted) => stopped.record_dispatch(key, ended_at, admitted),
            None => stopped.record(key, ended_at),
        };
        if self.jobs.remove_if(key, |_, j| j.token == token).is_some() {
            remember(&self.stopped);
            if let Err(e) = self.stop_handler(key).await {
                tracing::debug!(key, error = %e, "handler stop of an ended run failed");
            }
        }
        // A lease loss while the end was being recorded moved the run to
        // the suspended set (its handler stopped there): left in it, the
        // resume would find no record, take that for Redis having lost it,
        // re-assert the job and start it again.
        let mut suspended = self.suspended.lock().await;
        if suspended.get(key).is_some_and(|j| j.token == token) {
            suspended.remove(key);
            drop(suspended);
            remember(&self.stopped);
        }
    }

    /// The next run's token from Redis (`job_restart.lua`), or `None` when
    /// the job is no longer this worker's. Redis naming no run, or another,
    /// does not say that yet: it may have lost the record (an empty
    /// restart) or gone back to before this run (a rollback) before the
    /// worker noticed and re-asserted its jobs, and dropping the job then
    /// loses it. So the job is re-asserted first, as a suspended one is on
    /// a resume: a newer run elsewhere (or a newer admission) wins, and
    /// while the pool recovers the job is left to the orphan sweep.
    async fn restart_here(
        &self,
        node: &NodeInner,
        key: &str,
        job: &LocalJob,
    ) -> crate::error::Result<Option<u64>> {
        let ttl = node.options.worker_ttl;
        match node
            .store
            .restart_job(key, &self.id, job.token, ttl)
            .await?
        {
            Restarted::Token(token) => return Ok(Some(token)),
            Restarted::Recovering => {
                // The record may be one a rollback brought back, of a run
                // moved and stopped since: held for a renewal to settle
                // once the pool has recovered (soak seed 1439, job-1107).
                node.hold_unsettled(self, key, job.clone()).await;
                return Ok(None);
            }
            Restarted::Elsewhere => {}
        }
        match node.reassert(self, key, job, Reassert::Suspended).await? {
            Reasserted::Ok => {
                let restarted = node
                    .store
                    .restart_job(key, &self.id, job.token, ttl)
                    .await?;
                let Restarted::Token(token) = restarted else {
                    // Redis named this run a moment ago: the job moved
                    // since, or Redis went back in time between the two
                    // calls (soak seed 1439). Held for a renewal to settle.
                    node.hold_unsettled(self, key, job.clone()).await;
                    return Ok(None);
                };
                Ok(Some(token))
            }
            Reasserted::Orphaned => {
                tracing::info!(key, worker = %self.id, "failed job Redis did not hold left to the orphan sweep");
                Ok(None)
            }
            Reasserted::Lost
            | Reasserted::Pending
            | Reasserted::Unclaimed
            | Reasserted::Superseded(_) => {
                tracing::info!(key, "restart dropped: Redis names another run of the key");
                Ok(None)
            }
        }
    }

    fn report_later(self: Arc<Self>, ended: Ended) {
        let Some(node) = self.node() else { return };
        node.tasks.spawn(async move {
            tokio::select! {
                _ = self.cancel.cancelled() => {}
                _ = tokio::time::sleep(RETRY_AFTER) => {
                    let _ = self.lifecycle.to_worker.send(ended);
                }
            }
        });
    }

    fn restart_after(self: Arc<Self>, key: String, token: u64, delay: Duration) {
        let Some(node) = self.node() else { return };
        node.tasks.spawn(async move {
            tokio::select! {
                _ = self.cancel.cancelled() => {}
                _ = tokio::time::sleep(delay) => self.restart(key, token).await,
            }
        });
    }

    /// Starts the next run of a failed job, if it still waits here.
    pub(crate) async fn restart(self: Arc<Self>, key: String, token: u64) {
        let Some(node) = self.node() else { return };
        // A re-assertion waiting for `ops` goes first: tried again.
        let Some((_ops, _key)) = self.lock_key_or_give_way(&key).await else {
            self.clone().restart_after(key, token, RETRY_AFTER);
            return;
        };
        if self.lifecycle.restarting.get(&key).map(|t| *t) != Some(token) {
            return; // stopped (or restarted) meanwhile
        }
        let Some(job) = self
            .jobs
            .get(&key)
            .filter(|j| j.token == token)
            .map(|j| j.clone())
        else {
            // Moved, stopped or suspended on a lease loss meanwhile.
            self.lifecycle.forget(&key);
            return;
        };
        if !self.may_start(&node) {
            // No start without a lease (nor under a cleanup claim); the
            // watchdog suspends the job and the resume restarts it, else
            // try again shortly.
            self.clone().restart_after(key, token, RETRY_AFTER);
            return;
        }
        let new_token = match self.restart_here(&node, &key, &job).await {
            Ok(Some(t)) => t,
            Ok(None) => {
                self.lifecycle.forget(&key);
                self.jobs.remove_if(&key, |_, j| j.token == token);
                return;
            }
            Err(e) => {
                tracing::warn!(key, error = %e, "restarting a job failed; retrying");
                self.clone().restart_after(key, token, RETRY_AFTER);
                return;
            }
        };
        self.lifecycle.forget(&key);
        let next = LocalJob {
            token: new_token,
            ..job.clone()
        };
        // The restart took a round trip: past the lease meanwhile (a slow
        // link, a stall), a cleaner may have moved the job and another
        // worker started it. Held suspended instead, as a lease loss
        // leaves a job: the renewals resume it.
        if !self.holds_lease(&node) {
            let mut held = self.suspended.lock().await;
            self.jobs.remove(&key);
            held.insert(key, next);
            return;
        }
        self.jobs.insert(key.clone(), next);
        node.note_running(&self.id, &key);
        let run = Job::new_run(
            &key,
            job.payload.clone(),
            SystemTime::UNIX_EPOCH + Duration::from_micros(crate::codec::stamp_us(job.admitted)),
            new_token,
            self.lifecycle.outcome(&key, new_token),
        );
        node.metrics.job_restarts.increment(1);
        match self.start_handler(run).await {
            HandlerStart::Cancelled => {
                // A lapse moved the run to the suspended set and stopped
                // it, unless it looked before the run was here; a
                // re-assertion's interrupt left it here: stopped and held
                // now.
                if let Some((k, job)) = self.jobs.remove(&key) {
                    let _ = self.stop_handler(&k).await;
                    self.suspended.lock().await.insert(k, job);
                }
            }
            HandlerStart::Started => {
                tracing::info!(key, token = new_token, "job restarted");
                // A lease loss while the handler started: the watchdog may
                // have missed this run; stop it here (it resumes later).
                if self.lease_lost.load(Ordering::SeqCst)
                    && let Some((k, job)) = self.jobs.remove(&key)
                {
                    let _ = self.stop_handler(&k).await;
                    self.suspended.lock().await.insert(k, job);
                }
            }
            HandlerStart::Refused(message) => {
                // A refused restart is one more failure of the job.
                let _ = self.lifecycle.to_worker.send(Ended {
                    key: key.clone(),
                    token: new_token,
                    ran: Duration::ZERO,
                    end: RunEnd::Failed(message),
                });
            }
        }
    }
}

/// An end that took a job out of the pool: reported (logged and counted)
/// once it stands.
#[derive(Debug, Clone)]
pub(crate) enum FinalEnd {
    /// The run finished.
    Finished,
    /// The run failed once too often: not restarted.
    Failed {
        /// Consecutive failures, this one included.
        failures: u32,
        /// The last run's error.
        error: String,
    },
}

impl FinalEnd {
    /// Logs and counts the end of run `token` of `key`, which stands.
    pub(crate) fn report(&self, node: &NodeInner, key: &str, token: u64) {
        match self {
            FinalEnd::Finished => {
                tracing::info!(key, token, "job finished");
                node.metrics.jobs_finished.increment(1);
            }
            FinalEnd::Failed { failures, error } => {
                tracing::error!(key, token, failures, error = %error, "job failed too often; not restarted");
                node.metrics.jobs_failed.increment(1);
            }
        }
    }
}
