//! Rebalance: when the set of active workers changes, each worker hands
//! off the jobs that now hash elsewhere — stop locally first, then one
//! script moves ownership and enqueues the start at the new owner. The job
//! is never owned by two workers: handoff is at-most-once. A drained
//! worker (see `drain.rs`) is out of the ring, so every job it runs hashes
//! elsewhere and leaves by this same path; while a local worker is drained,
//! the pass also runs every cleanup interval, to move a job that started
//! there from an entry queued before the drain.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::StreamExt;

use crate::handoffs::HandedOff;
use crate::lease::{Reassert, Restart};
use crate::membership::HANDOFFS_IN_FLIGHT;
use crate::node::NodeInner;
use crate::routing::Ring;
use crate::store::{Handoff, Mover, Reasserted};
use crate::worker::{LocalJob, WorkerInner};

/// Wait after a ring change before moving jobs, so that a burst of joins
/// moves each job once.
const SETTLE: Duration = Duration::from_millis(100);

/// Entries a rebalance lets wait in a new owner's inbox, per worker lane
/// of this node (see [`NodeInner::backlog_limit`]).
const BACKLOG_PER_LANE: usize = 2;

/// The fewest entries a rebalance lets wait in a new owner's inbox.
const MIN_BACKLOG: usize = 8;

/// How often a rebalance looks again at new owners' inboxes that are full.
const BACKLOG_POLL: Duration = Duration::from_millis(20);

impl NodeInner {
    pub(crate) async fn rebalance_loop(self: Arc<Self>) {
        let mut version = self.ring_version.subscribe();
        let mut drained_pass = tokio::time::interval(self.options.cleanup_interval);
        drained_pass.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Jobs left here by the last pass for want of a new owner that
        // reads its inbox: tried again every cleanup interval (a live
        // owner renews within one; a dead one is cleaned up, which changes
        // the ring).
        let mut jobs_wait = false;
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                r = version.changed() => if r.is_err() { return },
                _ = drained_pass.tick() => {
                    let due = self.rebalance_due.swap(false, Ordering::SeqCst);
                    if jobs_wait || due || self.hosts_busy_drained_worker() {
                        jobs_wait = self.rebalance().await;
                    }
                    continue;
                }
            }
            // Let the ring settle.
            loop {
                tokio::select! {
                    _ = self.cancel.cancelled() => return,
                    r = tokio::time::timeout(SETTLE, version.changed()) => match r {
                        Ok(Ok(())) => continue,
                        Ok(Err(_)) => return,
                        Err(_) => break,
                    },
                }
            }
            jobs_wait = self.rebalance().await;
        }
    }

    /// Hands off every local job whose ring owner is another worker, a few
    /// at a time per new owner: a job is stopped for an owner only while
    /// fewer than [`Self::backlog_limit`] entries wait in its inbox. A
    /// returning worker is owed a share of every other's jobs at once, and
    /// it starts them at its own pace (its lanes, its handler's start
    /// time): stopped all at once, the last of hundreds waited seconds in
    /// its inbox, running nowhere (chaos soak seed 1618: 4 lanes, starts of
    /// up to 60 ms, ~660 jobs back after a deaf link, keys down for up to
    /// 7 s). Paced, a job keeps running here until its new owner is about
    /// to start it. One pass serves all local workers, so that a slow owner
    /// holds back only the jobs owed to it. Returns whether some stay here
    /// for now: their owner does not read its inbox, or its inbox did not
    /// drain for a cleanup interval (the pass at the next tick goes on).
    pub(crate) async fn rebalance(&self) -> bool {
        let limit = self.backlog_limit();
        let mut waiting_since: Option<Instant> = None;
        // Jobs this pass tried: one whose hand-off failed runs here again
        // and waits for the next pass, not stopped again at once.
        let mut tried: HashSet<(String, String)> = HashSet::new();
        let mut noted = false;
        loop {
            if self.cancel.is_cancelled() {
                return false;
            }
            let ring = self.ring.load_full();
            let moving = self.jobs_to_move(&ring, &tried);
            if moving.is_empty() {
                return false;
            }
            let keys: Vec<&str> = moving.iter().map(|(_, key)| key.as_str()).collect();
            let mut room = self.targets_room(&ring, &keys, limit).await;
            let (mut now, mut full, mut not_current) = (Vec::new(), 0, 0);
            for (worker, key) in moving {
                match ring.owner(&key).and_then(|o| room.get_mut(o)) {
                    None => not_current += 1,
                    Some(0) => full += 1,
                    Some(left) => {
                        *left -= 1;
                        now.push((worker, key));
                    }
                }
            }
            if not_current > 0 && !noted {
                noted = true;
                tracing::info!(
                    jobs = not_current,
                    "jobs stay here until their new owner reads its inbox"
                );
            }
            if now.is_empty() {
                if full == 0 {
                    return not_current > 0;
                }
                // Every owner's inbox is full: look again shortly, for at
                // most a cleanup interval without progress.
                let since = *waiting_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= self.options.cleanup_interval {
                    tracing::info!(
                        jobs = full,
                        "jobs stay here while their new owners' inboxes are full"
                    );
                    return true;
                }
                tokio::select! {
                    _ = self.cancel.cancelled() => return false,
                    () = tokio::time::sleep(BACKLOG_POLL) => {}
                }
                continue;
            }
            waiting_since = None;
            if tried.is_empty() {
                tracing::info!(jobs = now.len() + full, "rebalancing");
            } else {
                tracing::debug!(jobs = now.len(), left = full, "rebalancing more");
            }
            tried.extend(now.iter().map(|(w, key)| (w.id.clone(), key.clone())));
            // Many hand-offs at once (each stops its job before moving it,
            // under the key's lock): a worker with hundreds of jobs to move
            // is done in a few stop times, not one stop time per job.
            futures::stream::iter(now)
                .for_each_concurrent(HANDOFFS_IN_FLIGHT, |(worker, key)| async move {
                    if !worker.cancel.is_cancelled() {
                        self.hand_off_local(&worker, &key).await;
                    }
                })
                .await;
        }
    }

    /// The local jobs whose ring owner is another worker, with their
    /// workers: of every worker in the ring or drained (one leaving or
    /// being cleaned up is not ours to move), less those `tried`.
    fn jobs_to_move(
        &self,
        ring: &Ring,
        tried: &HashSet<(String, String)>,
    ) -> Vec<(Arc<WorkerInner>, String)> {
        let drained = self.drained.load();
        let mut moving = Vec::new();
        for worker in self.workers.iter() {
            let worker = worker.value();
            if worker.cancel.is_cancelled()
                || (!ring.contains(&worker.id) && !drained.contains(&worker.id))
            {
                continue;
            }
            for job in worker.jobs.iter() {
                let key = job.key();
                if ring.owner(key).is_some_and(|o| o != worker.id)
                    && !tried.contains(&(worker.id.clone(), key.clone()))
                {
                    moving.push((worker.clone(), key.clone()));
                }
            }
        }
        moving
    }

    /// How many entries a rebalance lets wait in a new owner's inbox: two
    /// per lane of this node's workers (a pool's nodes usually share their
    /// options), within [`MIN_BACKLOG`] and [`HANDOFFS_IN_FLIGHT`].
    fn backlog_limit(&self) -> u64 {
        let limit = self.options.worker_lanes.saturating_mul(BACKLOG_PER_LANE);
        limit.clamp(MIN_BACKLOG, HANDOFFS_IN_FLIGHT) as u64
    }

    /// The ring owners of `keys` a job may be handed to now, each with the
    /// number of jobs it may be handed in this round (`limit` less the
    /// entries in its inbox). A target reads its inbox and has renewed
    /// since the pool last found its data lost (`targets_current.lua`). A
    /// registration a rollback brought back, of a worker whose process has
    /// left, is in the ring until a cleanup removes it; a job stopped for
    /// it would be refused and started here again. On an error, every
    /// owner, with room for `limit`: `handoff.lua` checks again.
    async fn targets_room(&self, ring: &Ring, keys: &[&str], limit: u64) -> HashMap<String, u64> {
        let owners: Vec<String> = keys
            .iter()
            .filter_map(|key| ring.owner(key))
            .collect::<BTreeSet<&str>>()
            .into_iter()
            .map(str::to_string)
            .collect();
        let mut asked = Vec::with_capacity(owners.len());
        for owner in &owners {
            match self.inbox(owner) {
                Ok(inbox) => asked.push((owner.clone(), inbox.key().to_string())),
                Err(e) => tracing::debug!(owner, error = %e, "no inbox for a ring owner"),
            }
        }
        match self
            .store
            .targets_current(&asked, self.options.worker_ttl)
            .await
        {
            Ok(queued) => asked
                .into_iter()
                .zip(queued)
                .filter_map(|((owner, _), queued)| queued.map(|n| (owner, limit.saturating_sub(n))))
                .collect(),
            Err(e) => {
                tracing::debug!(error = %e, "could not ask which workers read their inbox");
                owners.into_iter().map(|o| (o, limit)).collect()
            }
        }
    }

    /// Notes that `worker` began running `key`. The pass a ring change
    /// brings looks at the jobs that run, not at a start under way: one
    /// that finishes after the change, on a worker the ring no longer
    /// names, is moved by a pass at the next tick (no later change of the
    /// ring may come).
    pub(crate) fn note_running(&self, worker: &str, key: &str) {
        if self.ring.load().owner(key).is_some_and(|o| o != worker) {
            self.rebalance_due.store(true, Ordering::SeqCst);
        }
    }

    /// Whether a local worker is drained and still runs jobs.
    fn hosts_busy_drained_worker(&self) -> bool {
        let drained = self.drained.load();
        !drained.is_empty()
            && self
                .workers
                .iter()
                .any(|w| drained.contains(w.key()) && !w.jobs.is_empty())
    }

    pub(crate) async fn hand_off_local(&self, worker: &Arc<WorkerInner>, key: &str) {
        // A re-assertion after Redis lost its data goes first: until it is
        // done this process holds the only copy of the worker's jobs, and
        // it waits for every hand-off holding the `ops` lock. Hand-offs
        // queued behind each other for their keys' locks, each through a
        // handler stop, held it for 650 ms (chaos soak seed 1422: the
        // process was killed before it re-asserted, and 29 jobs were
        // lost); the renewal that waits for the re-assertion can let the
        // lease lapse meanwhile. A hand-off not begun gives way, its job
        // keeps running and is re-asserted, and a pass at the next tick
        // moves it.
        let Some((_ops, _key)) = worker.lock_key_or_give_way(key).await else {
            self.rebalance_due.store(true, Ordering::SeqCst);
            return;
        };
        // The ring may have changed since the caller looked: after Redis
        // lost its data it is empty until the workers register again. Stop
        // only a job that still belongs elsewhere.
        if self.ring.load().owner(key).is_none_or(|o| o == worker.id) {
            return;
        }
        // Past its lease a worker may have been cleaned up and the job
        // moved, run and stopped elsewhere, on writes a rollback this node
        // has not noticed yet lost: the record naming the worker cannot
        // vouch for the job then. The lease watchdog stops it, the
        // renewals settle it, and a later pass moves it. Under a lease
        // that held nobody can have moved it.
        if !worker.holds_lease(self) {
            return;
        }
        let Some((_, job)) = worker.jobs.remove(key) else {
            return;
        };
        if let Err(e) = worker.stop_handler(key).await {
            tracing::warn!(key, error = %e, "handler stop failed during handoff; moving anyway");
        }
        if !worker.holds_lease(self) {
            // The lease lapsed during the stop: held like a job the
            // watchdog stopped, for the renewals to settle.
            self.hold_unsettled(worker, key, job).await;
            return;
        }
        for _ in 0..3 {
            let ring = self.ring.load_full();
            let Some(target) = ring.owner(key).map(str::to_string) else {
                break;
            };
            if target == worker.id {
                break;
            }
            match self.handoff(key, &worker.id, &target, Mover::Owner).await {
                Ok(Handoff::Ok { token }) => {
                    worker.handed_off.record(HandedOff::of(key, token, &job));
                    return;
                }
                // Nobody may own it any more (Redis lost its data before
                // this node re-asserted), or it moved: settled below.
                Ok(Handoff::NotOwner) => break,
                Ok(_) => self.refresh_ring(),
                Err(e) => {
                    tracing::warn!(key, error = %e, "handoff failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        self.run_here_again(worker, key, job).await;
    }

    /// Runs a job that could not be moved on this worker again, with a new
    /// token: first takes ownership back if Redis lost it with its data
    /// (the ring may even be empty until the workers register again), so a
    /// stopped job is never dropped for want of a record; a job that another
    /// worker owns or is starting moved, and is forgotten here. The job is
    /// stopped, so it is re-asserted as a suspended one: while the pool
    /// recovers it is left to the orphan sweep, never taken from a run
    /// elsewhere that has not re-asserted yet (after an empty restart Redis
    /// knows nothing of it).
    pub(crate) async fn run_here_again(&self, worker: &Arc<WorkerInner>, key: &str, job: LocalJob) {
        // A restart that then finds no record of this worker's does not
        // show a move: Redis may have lost the job, which only this worker
        // knows, before it answered the re-assertion or since (it went
        // back in time between the two calls).
        match self.reassert(worker, key, &job, Reassert::Suspended).await {
            Ok(Reasserted::Ok) => {}
            Ok(Reasserted::Orphaned) => {
                tracing::info!(
                    key,
                    worker = %worker.id,
                    "job not handed off while the pool recovers; left to the orphan sweep"
                );
                return;
            }
            Ok(status) => {
                tracing::info!(
                    key,
                    status = status.as_str(),
                    "job moved while being handed off; not running it here"
                );
                return;
            }
            Err(e) => {
                // The restart below checks ownership itself.
                tracing::warn!(key, error = %e, "re-asserting a job that could not be moved failed");
            }
        }
        match self.restart_owned(worker, key, job.clone()).await {
            Ok(Restart::Started | Restart::Left) => {}
            Ok(Restart::Moved) => self.hold_unsettled(worker, key, job).await,
            Ok(Restart::Suspended(token)) => {
                // The lease is lost: held suspended, resumed (or forgotten
                // once moved) by the renewals.
                let held = LocalJob { token, ..job };
                worker.suspended.lock().await.insert(key.to_string(), held);
            }
            Ok(Restart::Claimed | Restart::Recovering | Restart::Unsettled) => {
                // A cleaner claimed the worker, or the pool recovers:
                // held the same way, resumed by the renewals.
                worker.suspended.lock().await.insert(key.to_string(), job);
            }
            Ok(Restart::StartFailed(e)) => {
                tracing::warn!(key, error = %e, "restart after failed handoff refused; requeueing");
                self.requeue_job(key, &worker.id, Mover::Owner).await;
            }
            Err(e) => {
                // Not running, and recorded here or nowhere: hand it on
                // (retried with backoff). A hand-off moves only what Redis
                // names this worker's, so when it moved nothing the job is
                // held until the renewals settle it.
                tracing::warn!(key, error = %e, "restart after failed handoff failed; requeueing");
                match self.requeue_job(key, &worker.id, Mover::Owner).await {
                    Some(Handoff::Ok { token }) => {
                        worker.handed_off.record(HandedOff::of(key, token, &job));
                    }
                    _ => self.hold_unsettled(worker, key, job).await,
                }
            }
        }
    }

    /// Holds a stopped job that Redis, as far as this worker could learn,
    /// does not name its own: moved, or lost with Redis's data before this
    /// worker re-asserted it. The renewals' resume tells the two apart (it
    /// restarts the job if Redis names this worker, else re-asserts it, as
    /// after a lease loss), where forgetting it would lose a job that only
    /// this worker knows.
    pub(crate) async fn hold_unsettled(&self, worker: &WorkerInner, key: &str, job: LocalJob) {
        tracing::info!(
            key,
            worker = %worker.id,
            "a job neither moved nor restarted is held until a renewal settles it"
        );
        worker.suspended.lock().await.insert(key.to_string(), job);
        self.resume_wanted.notify_one();
    }
}
