//! Cleanup of dead workers (orphaned jobs and stale pending dispatches
//! are swept by the pool's sweeper, see `sweeper.rs`).
//!
//! Any node may find a worker dead (`liveness.rs`): its keep-alive (server
//! time) older than the TTL. The node claims the cleanup with
//! `set_if_not_exists` on the cleanup map (a claim older than a TTL may be
//! taken over), requeues the worker's jobs and the unprocessed events of
//! its inbox to their new owners — retrying with exponential backoff, never
//! dropping — and then removes the worker. Every step is a conditional
//! script, so concurrent cleaners requeue each job once (I3). The dead
//! worker's jobs are listed from Redis (`owned_page.lua`, an `HSCAN` of
//! the jobs hash filtered by owner), never from a node's replica, which
//! can be stale after a restart.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use bytes::Bytes;
use fred::prelude::*;
use futures::StreamExt;

use crate::cleaned::CleanupFinds;
use crate::codec::{self, EV_KEEP, EV_START, KeptJobs, KeyedRequest, StartEntry};
use crate::error::{Error, Result};
use crate::membership::HANDOFFS_IN_FLIGHT;
use crate::node::NodeInner;
use crate::routing::Refusals;
use crate::store::call::from_redis;
use crate::store::{
    ClaimStatus, DeadWorkerClaim, Dropped, Handoff, Moved, Mover, Released, Removed, Requeue,
    SCAN_START,
};

/// Most inbox entries read per page when moving a dead worker's inbox.
const INBOX_PAGE: u64 = 200;

/// Jobs-hash entries read per page when listing a worker's jobs (a
/// cleanup lists them all at once: it must be done within the failover
/// bound, so pages are larger than the sweeper's).
pub(crate) const OWNED_PAGE: usize = 1000;

impl NodeInner {
    /// Takes the cleanup claim on `worker` if Redis says it is dead (its
    /// keep-alive older than a TTL on server time; a claim older than a TTL,
    /// whose cleaner died, is taken over) and, when the claim is ours,
    /// requeues its jobs and inbox and removes it. Returns the claim's
    /// status and how long the worker was silent: `ClaimedByOther` when
    /// the claim was lost on the way (the worker came back, or another node
    /// took it over), `Recovering` when the cleanup stopped for a recovery
    /// (see [`Claim::Paused`]).
    pub(crate) async fn clean_if_dead(&self, worker: &str) -> Result<DeadWorkerClaim> {
        let floor_ms = self.server_time_floor().await?;
        let mut claim = self
            .store
            .claim_cleanup(worker, &self.id, self.options.worker_ttl, floor_ms)
            .await?;
        let silent_ms = claim.silent_ms;
        match claim.status {
            ClaimStatus::Claimed | ClaimStatus::TakenOver => {
                if claim.status == ClaimStatus::TakenOver {
                    tracing::info!(worker, "took over a stale cleanup claim");
                }
                tracing::warn!(worker, silent_ms, "worker dead: cleaning up");
                self.metrics.dead_workers.increment(1);
                self.history.count(crate::history::PoolEvent::DeadWorker);
                self.refresh_ring();
                let silent = Duration::from_millis(silent_ms);
                match self.clean_dead_worker(worker, silent).await? {
                    Claim::Held => {}
                    Claim::Lost => claim.status = ClaimStatus::ClaimedByOther,
                    Claim::Paused => claim.status = ClaimStatus::Recovering,
                }
            }
            ClaimStatus::Alive => {
                tracing::debug!(
                    worker,
                    silent_ms,
                    "replica was stale: worker alive in Redis"
                );
            }
            ClaimStatus::Recovering => {
                tracing::debug!(
                    worker,
                    silent_ms,
                    "worker dead, but the pool recovers: cleanup after the recovery window"
                );
            }
            ClaimStatus::ClaimedByOther | ClaimStatus::Gone => {}
        }
        Ok(claim)
    }

    /// Requeues a dead worker's jobs and inbox, then removes it; `Held`
    /// once it is removed, or why the cleanup stopped before. The worker
    /// counts as silent for a TTL (see [`clean_dead_worker`](Self::clean_dead_worker)).
    #[cfg(test)]
    pub(crate) async fn clean_worker(&self, worker: &str) -> Result<Claim> {
        self.clean_dead_worker(worker, self.options.worker_ttl)
            .await
    }

    /// [`clean_worker`](Self::clean_worker) of a worker silent for
    /// `silent` when its claim was taken.
    #[tracing::instrument(name = "cleanup", skip(self), fields(pool = %self.pool, node = %self.id))]
    async fn clean_dead_worker(&self, worker: &str, silent: Duration) -> Result<Claim> {
        let began = std::time::Instant::now();
        // Every step checks, in its script, that the claim is still this
        // node's: the worker may come back and clear a claim older than a
        // TTL (`keepalive.lua`), or another cleaner take it over.
        let cleaner = Some(self.id.as_str());
        // Read before the listing (the claim was taken before this call):
        // what a cleanup found is remembered for the rollback recovery
        // (`cleaned.rs`), with the time its runs were issued before. The
        // cleanup goes on without it (nothing is remembered then).
        let claimed_ms = self.server_time_floor().await.ok();
        let mut finds = CleanupFinds::default();
        let mut claim = self.requeue_owned_by(worker, cleaner, &mut finds).await;
        if claim == Claim::Held {
            claim = self
                .requeue_worker_inbox(worker, cleaner, &mut finds)
                .await?;
        }
        match claim {
            Claim::Held => {
                let removed = self
                    .remove_worker_entry(worker, cleaner, &mut finds)
                    .await?;
                if let (Claim::Held, Some(claimed_ms)) = (removed, claimed_ms) {
                    // A loss since a TTL before the worker fell silent
                    // may have taken records it could not re-assert.
                    let exposed = silent + self.options.worker_ttl + began.elapsed();
                    self.cleaned.remember(worker, claimed_ms, exposed, finds);
                }
                Ok(removed)
            }
            stopped => {
                stopped.log(worker);
                Ok(stopped)
            }
        }
    }

    /// Requeues every job Redis says `worker` owns, listed page by page
    /// from the jobs hash. A page that fails is retried with backoff; past
    /// that the rest waits for the orphan sweep (the worker is removed
    /// afterwards, which makes its jobs orphans). `cleaner`: this node's id
    /// when a cleanup moves a dead worker's jobs; no hand-off starts after
    /// the first that finds the claim gone or the pool recovering.
    /// `finds` gathers the keys listed.
    pub(crate) async fn requeue_owned_by(
        &self,
        worker: &str,
        cleaner: Option<&str>,
        finds: &mut CleanupFinds,
    ) -> Claim {
        let mut cursor = SCAN_START.to_string();
        loop {
            let page = (|| self.store.owned_page(worker, &cursor, OWNED_PAGE))
                .retry(
                    ExponentialBuilder::default()
                        .with_min_delay(Duration::from_millis(20))
                        .with_max_delay(Duration::from_secs(2))
                        .with_max_times(8),
                )
                .when(|e| !matches!(e, Error::Closed))
                .await;
            let page = match page {
                Ok(page) => page,
                Err(e) => {
                    tracing::warn!(worker, error = %e, "listing a worker's jobs failed; the orphan sweep requeues the rest");
                    finds.listed_all = false;
                    return Claim::Held;
                }
            };
            // Many hand-offs at once, pipelined on the node's connection:
            // each script decides for its key alone, and a failover must
            // not grow by a round trip per job. Once one finds the claim
            // gone or the pool recovering, no further one starts (those in
            // flight find it too).
            let claim_lost = AtomicBool::new(false);
            let paused = AtomicBool::new(false);
            finds.keys.extend(page.keys.iter().cloned());
            futures::stream::iter(page.keys)
                .for_each_concurrent(HANDOFFS_IN_FLIGHT, |key| {
                    let (claim_lost, paused) = (&claim_lost, &paused);
                    async move {
                        if claim_lost.load(Ordering::Relaxed) || paused.load(Ordering::Relaxed) {
                            return;
                        }
                        match self.ended_here(worker, &key).await {
                            Ok(false) => {}
                            Ok(true) => return,
                            Err(e) => {
                                // Handing it on might undo a stop: left to
                                // the node's rollback recovery.
                                tracing::warn!(key, worker, error = %e, "checking a record against the runs ended here failed; not handed on");
                                return;
                            }
                        }
                        match self.requeue_job(&key, worker, Mover::owner_or(cleaner)).await {
                            Some(Handoff::ClaimLost) => claim_lost.store(true, Ordering::Relaxed),
                            Some(Handoff::Recovering) => paused.store(true, Ordering::Relaxed),
                            _ => {}
                        }
                    }
                })
                .await;
            if claim_lost.into_inner() {
                return Claim::Lost;
            }
            if paused.into_inner() {
                return Claim::Paused;
            }
            if page.cursor == SCAN_START {
                return Claim::Held;
            }
            cursor = page.cursor;
        }
    }

    /// Whether the record Redis shows of `key` under `worker`, a worker of
    /// this node (a close hands on what Redis says it holds), is of a run
    /// that ended here: stopped on request, or passed on with a newer token
    /// since (and perhaps ended there since). Redis went back in time then,
    /// and this node may not have recovered yet (or its recovery leaves a
    /// closing worker to its close): handing the record on would undo a
    /// stop answered `Ok` (I2), or start the key beside the run it was
    /// passed to before that run re-asserts (I1). The stop, or the
    /// passed-on run's end, is made to stand; a passed-on run's record is
    /// otherwise released, as the rollback recovery does. Always `false`
    /// for a worker of another node (a cleanup of a dead worker waits for
    /// the pool's recovery window instead).
    async fn ended_here(&self, worker: &str, key: &str) -> Result<bool> {
        let Some(local) = self.workers.get(worker).map(|w| w.value().clone()) else {
            return Ok(false);
        };
        let Some(record) = self.store.job_record(key).await? else {
            return Ok(false);
        };
        let Some((owner, token)) = crate::store::records::job_owner(&record) else {
            return Ok(false);
        };
        if owner != worker {
            return Ok(false);
        }
        if let Some(stopped) = local.run_ended(key, token) {
            let status = self.store.stop_stands(key, stopped).await?;
            tracing::info!(
                key,
                token,
                worker,
                status = status.as_str(),
                "a record of a run that ended (stopped here, or passed on and stopped there), back in Redis: the end stands"
            );
            return Ok(true);
        }
        if local.handed_off.supersede(key, token) {
            let handed_on = local.handed_off.passed_on(key, token);
            let status = self.store.release_stale(key, &record, handed_on).await?;
            tracing::info!(
                key,
                token,
                worker,
                status = status.as_str(),
                "a record of a run passed on from here, back in Redis: released"
            );
            return Ok(true);
        }
        Ok(false)
    }

    /// Drops a start entry of a run that ended here (see
    /// [`ended_here`](Self::ended_here)), back in `worker`'s inbox because
    /// Redis went back in time; its stop is made to stand, which takes the
    /// run's pending guard too. `None`: not such an entry.
    async fn drop_ended_start(
        &self,
        worker: &str,
        id: &str,
        key: &str,
        token: u64,
        cleaner: Option<&str>,
    ) -> Result<Option<Claim>> {
        let Some(local) = self.workers.get(worker).map(|w| w.value().clone()) else {
            return Ok(None);
        };
        let stopped = local.run_ended(key, token);
        if stopped.is_none() && !local.handed_off.supersede(key, token) {
            return Ok(None);
        }
        if let Some(stopped) = stopped {
            self.store.stop_stands(key, stopped).await?;
        }
        let claim = self.drop_entry(worker, id, cleaner).await?;
        tracing::info!(
            worker,
            id,
            key,
            token,
            "a start of a run that ended here, back in the inbox: dropped"
        );
        Ok(Some(claim))
    }

    /// Hands job `key` from `from` to its new owner, retrying with
    /// exponential backoff until it is moved, moved by someone else, or no
    /// worker remains (the job then waits as an orphan for the next one).
    /// Returns the last hand-off's answer, if any. `mover`: see [`Mover`].
    pub(crate) async fn requeue_job(
        &self,
        key: &str,
        from: &str,
        mover: Mover<'_>,
    ) -> Option<Handoff> {
        let refusals = Refusals::default();
        let attempt = || async {
            let ring = self.ring.load_full();
            let target = match refusals.target(&ring, key, from) {
                Some(target) => Some(target),
                // A cleanup waits for the ring to fill again; a close or a
                // rebalance of the last worker releases at once.
                None if matches!(mover, Mover::Cleaner(_))
                    && self.target_within_a_ttl(key, from).await =>
                {
                    refusals.target(&self.ring.load_full(), key, from)
                }
                None => None,
            };
            let Some(target) = target else {
                return Ok::<_, Error>(None);
            };
            let status = self.handoff(key, from, &target, mover).await?;
            if status == Handoff::NoTarget {
                refusals.refused(target);
                self.refresh_ring();
                return Err(Error::NoActiveWorker(self.pool.clone()));
            }
            Ok(Some(status))
        };
        let result = attempt
            .retry(
                ExponentialBuilder::default()
                    .with_min_delay(Duration::from_millis(20))
                    .with_max_delay(Duration::from_secs(2))
                    .with_max_times(12),
            )
            .when(|e| !matches!(e, Error::Closed))
            .await;
        match result {
            Ok(Some(Handoff::Ok { token })) => {
                self.metrics.requeued.increment(1);
                Some(Handoff::Ok { token })
            }
            Ok(None) => {
                // Nobody to take it: release ownership so that the orphan
                // sweep requeues it once a worker joins. A cleanup does so
                // only while its claim holds: the worker may have renewed
                // while the cleanup waited for its ring, and resumed the
                // job (soak seed 1439: a stop answered from the orphan it
                // left, while the resumed run went on).
                let cleaner = match mover {
                    Mover::Cleaner(node) => Some(node),
                    _ => None,
                };
                match self.release_job(key, from, cleaner).await {
                    Ok(Released::ClaimLost) => Some(Handoff::ClaimLost),
                    _ => None,
                }
            }
            Ok(Some(Handoff::Ended)) => {
                tracing::warn!(
                    key,
                    from,
                    "a dispatch marked over (its stop or end made to stand again after a rollback) ended instead of moved on"
                );
                Some(Handoff::Ended)
            }
            Ok(Some(Handoff::NoPayload)) if matches!(mover, Mover::Cleaner(_)) => {
                // A start recorded while the pool recovered, its payload
                // lost with Redis's data, and its worker dead before it
                // re-asserted the job: `handoff.lua` released the record.
                tracing::warn!(
                    key,
                    from,
                    "job lost: its dead worker held the only copy of its payload (Redis lost \
                     it); its record is released so that the key can be dispatched again"
                );
                Some(Handoff::NoPayload)
            }
            Ok(status) => status,
            Err(e) => {
                tracing::warn!(key, from, error = %e, "requeue failed; the next sweep retries");
                None
            }
        }
    }

    /// Whether the ring shows a worker other than `from` to take `key`,
    /// waiting up to a worker TTL for one. Right after Redis refused writes
    /// or was out of reach for over a TTL every worker looks dead at once,
    /// and cleaners claim them all: the ring is empty until their renewals
    /// clear those claims, within a third of a TTL. A dead worker's jobs
    /// released then wait for the orphan sweep, a grace later, with Redis
    /// their only holder (soak seed 1439: 18 jobs released 100 ms after
    /// Redis took writes again, lost to an empty restart 1.4 s later).
    async fn target_within_a_ttl(&self, key: &str, from: &str) -> bool {
        let ttl = self.options.worker_ttl;
        let found = || async {
            self.refresh_ring();
            match self.ring.load().owner_excluding(key, from) {
                Some(_) => Ok(()),
                None => Err(Error::NoActiveWorker(self.pool.clone())),
            }
        };
        found
            .retry(
                ExponentialBuilder::default()
                    .with_min_delay(Duration::from_millis(10))
                    .with_max_delay(ttl / 10)
                    .with_total_delay(Some(ttl))
                    .without_max_times(),
            )
            .await
            .is_ok()
    }

    /// Drops `from`'s ownership of `key`, keeping the payload.
    pub(crate) async fn release_job(
        &self,
        key: &str,
        from: &str,
        cleaner: Option<&str>,
    ) -> Result<Released> {
        self.store.release_owner(key, from, cleaner).await
    }

    /// Moves every entry left in `worker`'s inbox to the new owner of its
    /// key, page by page. `cleaner`: this node's id when a cleanup moves a
    /// dead worker's entries; it stops at the first entry whose move finds
    /// the claim gone.
    pub(crate) async fn requeue_worker_inbox(
        &self,
        worker: &str,
        cleaner: Option<&str>,
        finds: &mut CleanupFinds,
    ) -> Result<Claim> {
        let mut after = None;
        loop {
            let entries = self.inbox_page(worker, after.as_deref()).await?;
            let Some((last, _)) = entries.last() else {
                return Ok(Claim::Held);
            };
            after = Some(last.clone());
            for (id, fields) in entries {
                let claim = self
                    .requeue_entry(worker, &id, &fields, cleaner, finds)
                    .await?;
                if claim != Claim::Held {
                    return Ok(claim);
                }
            }
        }
    }

    /// Drops entry `id` of `worker`'s inbox unless `cleaner`'s claim on
    /// the worker is gone (then the entry stays for whoever holds it now).
    async fn drop_entry(&self, worker: &str, id: &str, cleaner: Option<&str>) -> Result<Claim> {
        let inbox = self.inbox(worker)?;
        Ok(
            match self
                .store
                .drop_entry(worker, inbox.key(), id, cleaner)
                .await?
            {
                Dropped::Ok | Dropped::Gone => Claim::Held,
                Dropped::ClaimLost => Claim::Lost,
            },
        )
    }

    /// Up to [`INBOX_PAGE`] entries of `worker`'s inbox, oldest first,
    /// from the start or after entry `after`: `(id, fields)`.
    pub(crate) async fn inbox_page(
        &self,
        worker: &str,
        after: Option<&str>,
    ) -> Result<Vec<(String, HashMap<String, Bytes>)>> {
        let start = after.map_or_else(|| "-".to_string(), |id| format!("({id}"));
        self.store
            .client
            .xrange(
                self.inbox(worker)?.key(),
                start.as_str(),
                "+",
                Some(INBOX_PAGE),
            )
            .await
            .map_err(from_redis)
    }

    async fn requeue_entry(
        &self,
        worker: &str,
        id: &str,
        fields: &HashMap<String, Bytes>,
        cleaner: Option<&str>,
        finds: &mut CleanupFinds,
    ) -> Result<Claim> {
        let name = fields
            .get("n")
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .unwrap_or_default();
        let mut payload = fields.get("p").cloned().unwrap_or_default();
        let mut start_token = None;
        // A start's creation time and body, to remember it once moved.
        let mut start_body = None;
        let key = if name == EV_START {
            // One more hop marks the start as moved: its new stream id looks
            // fresh, but the entry may be a copy Redis brought back by going
            // back in time, of a run stopped since; the receiving worker
            // claims it in Redis before starting it (`freshness.rs`).
            StartEntry::parse(&payload).map(|e| {
                payload = e.forwarded();
                start_token = Some(e.token);
                start_body = Some((e.admitted, e.raw_body));
                e.body.key
            })
        } else if name == EV_KEEP {
            codec::decode::<KeptJobs>("keep entry", &payload)
                .map(|k| k.jobs.first().map(|j| j.key.clone()).unwrap_or_default())
        } else {
            codec::decode::<KeyedRequest>("inbox request", &payload).map(|r| r.key)
        };
        let key = match key {
            Ok(k) => {
                finds.keys.insert(k.clone());
                k
            }
            Err(e) => {
                let claim = self.drop_entry(worker, id, cleaner).await?;
                if claim == Claim::Held {
                    tracing::warn!(worker, id, error = %e, "malformed inbox entry dead-lettered during cleanup");
                }
                return Ok(claim);
            }
        };
        if let Some(token) = start_token
            && let Some(claim) = self
                .drop_ended_start(worker, id, &key, token, cleaner)
                .await?
        {
            return Ok(claim);
        }
        let target = if cleaner.is_some() {
            self.target_within_a_ttl(&key, worker).await
        } else {
            self.ring.load().owner_excluding(&key, worker).is_some()
        };
        if !target {
            // No other worker: a start entry's pending guard and payload
            // stay, so the job is requeued as an orphan once a worker joins;
            // a stop or notify for a job nobody runs has nowhere to go.
            let claim = self.drop_entry(worker, id, cleaner).await?;
            if claim == Claim::Held {
                tracing::info!(worker, id, key, event = %name, "no worker left for inbox entry; dropped it");
            }
            return Ok(claim);
        }
        let refusals = Refusals::default();
        let attempt = || async {
            let ring = self.ring.load_full();
            let target = refusals
                .target(&ring, &key, worker)
                .ok_or_else(|| Error::NoActiveWorker(self.pool.clone()))?;
            match self
                .move_entry(
                    worker,
                    &target,
                    id,
                    &name,
                    payload.clone(),
                    Requeue {
                        key: (name == EV_START).then_some(key.as_str()),
                        cleaner,
                    },
                )
                .await?
            {
                (Moved::NoTarget, _) => {
                    refusals.refused(target);
                    self.refresh_ring();
                    Err(Error::NoActiveWorker(self.pool.clone()))
                }
                (Moved::Ok, Some(token)) => {
                    // A dead worker's start moved under a new token: Redis
                    // alone holds it until its new owner starts it, and the
                    // dead worker cannot give it back after a loss.
                    if let (Some(_), Some((admitted, body))) = (cleaner, &start_body) {
                        self.remember_moved(&key, token, *admitted, body.clone(), &target);
                    }
                    Ok(Claim::Held)
                }
                (Moved::Ended, _) => {
                    tracing::warn!(
                        key,
                        worker,
                        "a dead worker's start of a dispatch marked over (its stop or end made to stand again after a rollback) ended instead of moved"
                    );
                    Ok(Claim::Held)
                }
                (Moved::Ok | Moved::Gone, _) => Ok(Claim::Held),
                (Moved::ClaimLost, _) => Ok(Claim::Lost),
                (Moved::Recovering, _) => Ok(Claim::Paused),
            }
        };
        attempt
            .retry(
                ExponentialBuilder::default()
                    .with_min_delay(Duration::from_millis(20))
                    .with_max_delay(Duration::from_secs(2))
                    .with_max_times(12),
            )
            .when(|e| !matches!(e, Error::Closed))
            .await
    }

    /// Removes a worker's registration, keep-alive, cleanup claim and inbox
    /// once its inbox is empty; moves late entries first. `cleaner`: this
    /// node's id when a cleanup removes a dead worker (nothing is done once
    /// its claim is not this node's any more).
    pub(crate) async fn remove_worker_entry(
        &self,
        worker: &str,
        cleaner: Option<&str>,
        finds: &mut CleanupFinds,
    ) -> Result<Claim> {
        for _ in 0..5 {
            let inbox = self.inbox(worker)?;
            let status = self
                .store
                .remove_worker(worker, inbox.key(), cleaner)
                .await?;
            match status {
                Removed::Ok => {
                    self.inboxes.remove(worker);
                    return Ok(Claim::Held);
                }
                Removed::NotClaimed => {
                    Claim::Lost.log(worker);
                    return Ok(Claim::Lost);
                }
                Removed::InboxNotEmpty => {}
            }
            let claim = self.requeue_worker_inbox(worker, cleaner, finds).await?;
            if claim != Claim::Held {
                claim.log(worker);
                return Ok(claim);
            }
        }
        Err(Error::Timeout(Duration::ZERO))
    }
}

/// Whether a cleanup may go on after its last step (always `Held` when no
/// cleanup claim is involved).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Still this node's (or none is needed): go on.
    Held,
    /// Gone (the worker came back and cleared it, or another node took it
    /// over): what is left of the worker is not this node's to move.
    Lost,
    /// Still this node's, but the pool recovers from a data loss or a
    /// rollback (or the state is older than this node has seen): the
    /// older state may show jobs this cleanup moved before it went back.
    /// The rest waits; the claim, left in place, is taken over once it is
    /// a TTL old and the recovery window is over (`claim_cleanup.lua`).
    Paused,
}

impl Claim {
    /// Logs why a cleanup of `worker` stopped before it was done.
    fn log(self, worker: &str) {
        match self {
            Claim::Held => {}
            Claim::Lost => tracing::info!(
                worker,
                "cleanup claim lost (the worker came back, or another node took it over): the rest of the worker left in place"
            ),
            Claim::Paused => tracing::info!(
                worker,
                "cleanup paused: the pool recovers from a data loss or a rollback; the rest of the worker waits for a cleanup after the window"
            ),
        }
    }
}
