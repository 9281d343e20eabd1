//! Recovery when Redis went back in time: restarted from an older snapshot
//! or AOF, or a replica promoted with lost writes. Redis is then neither
//! empty (the data-loss path of `recovering` in `scripts/base.lua` does not
//! fire: the pool's epoch is still there) nor current.
//!
//! Every node notices on its own: a new server run id after a reconnect, a
//! resync of one of its replicas finding the revision in Redis *behind* the
//! replica (`Map::regressions`), or a script's `went_back`. It then opens
//! the recovery window (nothing is admitted while it lasts, as after a data
//! loss), marks itself as reconciling (the window lasts while any node's
//! mark does), makes the stops its `stop_job` calls were answered for
//! (`Ok`, or `JobNotFound` with the tombstone it left) stand again, and
//! each of its workers reconciles Redis with what it runs: it registers
//! again if Redis forgot it, re-asserts every job it runs or
//! holds suspended (a newer fencing token wins over a stale record), and
//! releases the records that still name it for jobs it no longer runs (a
//! stop or hand-off Redis lost; not a start claimed in Redis whose entry is
//! still in its inbox: that claim stands and is taken up again when the
//! worker reads the entry), then makes its own recent stops stand and
//! gives back its recent hand-offs where Redis went back to before them.
//! Starts it already ran and stopped are refused if their entries come back
//! (`crate::tombstones`).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;

use crate::codec::{EV_START, StartEntry};
use crate::error::Result;
use crate::node::NodeInner;
use crate::standing_stops::{STOP_CALLS_IN_FLIGHT, STOPS_BATCH};
use crate::worker::WorkerInner;

/// Pause between attempts when Redis is not answering yet.
pub(crate) const RETRY: Duration = Duration::from_millis(200);
/// Payload bytes given back in one call at most (a larger job alone).
const GIVE_BACK_BYTES: usize = 1 << 20;
/// Jobs-map keys read per page when a worker looks for records naming it.
const OWNED_PAGE: usize = 1000;
/// Records of jobs a worker no longer runs checked and released at once
/// after a rollback (each a read and a script, pipelined on the client's
/// connection).
const RELEASES_IN_FLIGHT: usize = 16;

impl NodeInner {
    /// Watches the pool's maps for Redis going back in time and recovers.
    pub(crate) async fn rollback_loop(self: Arc<Self>) {
        let mut watched = self.store.maps.regressions();
        watched.push(self.server_restarts.subscribe());
        let mut again = false;
        loop {
            if !again {
                let changed = futures::future::select_all(
                    watched.iter_mut().map(|rx| Box::pin(rx.changed())),
                );
                tokio::select! {
                    _ = self.cancel.cancelled() => return,
                    (result, _, _) = changed => if result.is_err() { return },
                }
            }
            // The server this recovery is for, known first: news of this
            // very rollback that reaches the other watchers meanwhile is
            // then known for what it is (see `news_of_another_rollback`).
            // An identity check that found a new server just noted it (the
            // last watcher); other news has it read now. The noted server
            // is read as noted, not under the identity checks' lock: a
            // check under way holds that lock for its round trip, up to
            // 314 ms on a loaded node after a restart (chaos soak seed
            // 1587), while this node's workers wait to re-assert. Should
            // that check find a newer server still, it says so like any
            // other (`newer` below, or the news after this recovery).
            let noted = watched
                .last()
                .is_some_and(|rx| rx.has_changed().unwrap_or(false));
            let woke = std::time::Instant::now();
            let mut recovered_from = if noted {
                self.store.noted_server()
            } else {
                self.current_server().await
            };
            for rx in &mut watched {
                rx.borrow_and_update();
            }
            // The time since the window was opened, when this node's
            // identity check opened it: the workers' re-assertions wait for
            // all of it.
            let since_window = self
                .window_opened_at
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .map(|at| at.elapsed());
            tracing::warn!(node = %self.id, noted, identity_wait = ?woke.elapsed(), ?since_window, "Redis went back in time: recovering");
            self.metrics.rollbacks.increment(1);
            self.recoveries_begun
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.cleaned.recovery_begins();
            loop {
                // A newer server found meanwhile (Redis restarted or lost
                // the pool's data again) ends this recovery, as an error
                // would, and the next begins at once with the
                // re-assertions: waiting for this one's tail (stops made to
                // stand, hand-offs given back, starts under way) left every
                // job Redis lost the second time unasserted for 1.3 s
                // (chaos soak seed 1564: a dispatch was admitted again over
                // a running job after a `rollback-twice`).
                let mut newer = self.server_restarts.subscribe();
                let recovered = tokio::select! {
                    result = self.recover_from_rollback() => Some(result),
                    changed = newer.changed() => match changed {
                        Ok(()) => None,
                        Err(_) => return,
                    },
                };
                let Some(recovered) = recovered else {
                    tracing::warn!(node = %self.id, "Redis restarted or lost data again during the recovery: recovering anew");
                    self.metrics.rollbacks.increment(1);
                    self.recoveries_begun
                        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    recovered_from = self.store.noted_server();
                    for rx in &mut watched {
                        rx.borrow_and_update();
                    }
                    continue;
                };
                match recovered {
                    Ok(()) => {
                        // Redis's older revisions are the current ones now.
                        self.store.maps.reset_revision_high_waters();
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(node = %self.id, error = %e, "rollback recovery failed; retrying");
                        tokio::select! {
                            _ = self.cancel.cancelled() => return,
                            _ = tokio::time::sleep(RETRY) => {}
                        }
                    }
                }
            }
            again = self
                .news_of_another_rollback(&mut watched, recovered_from)
                .await;
        }
    }

    /// The identity of the server holding the pool's keys, checked now
    /// (a change found opens the recovery window, see
    /// [`Self::check_identity_once`]); `None` when it cannot be read.
    /// A check under way when the news came (after a reconnect, most
    /// often) serves: its read went out when the server had changed, or
    /// is answered by the new one; waiting for it and then reading again
    /// cost a loaded node's recovery a second round trip before its
    /// workers re-assert. Should it have read the old server still, the
    /// recovery opens the window itself (none was opened lately), and
    /// the news after it finds the server is not the one recovered from.
    async fn current_server(&self) -> Option<crate::store::ServerIdentity> {
        if self.server_seen.try_lock().is_err() {
            drop(self.server_seen.lock().await);
            return self.store.noted_server();
        }
        self.check_identity_once().await.ok()?;
        self.store.noted_server()
    }

    /// After a recovery: whether what `watched` told meanwhile needs
    /// another. A map's replica resyncs when its subscription reconnects,
    /// and finds Redis behind it: that is most often the very rollback the
    /// identity check found and this recovery dealt with (it read Redis
    /// itself, not the replicas). Recovering again would interrupt every
    /// start under way a second time and hold the pool's recovery window
    /// open as long again (soak seed 1432: a second recovery 1.7 s after
    /// the first, moving jobs of live workers). So the news counts only
    /// when the server is not the one recovered from: it restarted or lost
    /// the pool's data since, or its identity cannot be read. Marked seen
    /// before the identity is read: what comes after is news for the next
    /// round.
    async fn news_of_another_rollback(
        &self,
        watched: &mut [tokio::sync::watch::Receiver<u64>],
        recovered_from: Option<crate::store::ServerIdentity>,
    ) -> bool {
        let mut news = false;
        for rx in watched.iter_mut() {
            news |= rx.has_changed().unwrap_or(false);
            rx.borrow_and_update();
        }
        if !news {
            return false;
        }
        let Some(recovered_from) = recovered_from else {
            return true;
        };
        let same = self.current_server().await.as_ref() == Some(&recovered_from);
        if same {
            tracing::info!(node = %self.id, "a replica found Redis behind it: the rollback just recovered from, not another");
        }
        !same
    }

    /// Opens the recovery window, then reconciles every local worker while
    /// this node's recovery mark holds the window open (the window ends
    /// when every node that recovers is done, see `recovery_mark.lua`).
    async fn recover_from_rollback(self: &Arc<Self>) -> Result<()> {
        self.freshness.invalidate("redis went back in time");
        let ttl = self.options.worker_ttl;
        // The identity check that found a new server opened the window
        // right before this (or found it open): a window lasts a TTL from
        // its opening, so one opened less than a third of a TTL ago is
        // open long enough for the mark, set beside the reconcile below,
        // to hold it. Opening it again first cost a round trip, 10-60 ms
        // on a loaded node after a restart, while the workers'
        // re-assertions waited (chaos soak seed 1439). Any other news
        // (a replica found Redis behind it, a retry) opens it here.
        let opened_lately = self
            .window_opened_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
            .is_some_and(|at| at.elapsed() < ttl / 3);
        if !opened_lately {
            let opened = self.store.begin_recovery(ttl).await?;
            tracing::info!(node = %self.id, window = opened.as_str(), "recovery window after a rollback");
        }
        let began = std::time::Instant::now();
        // The mark is renewed beside the reconcile, not in turns with it: a
        // renewal waiting for its answer over a cut link held the reconcile
        // still, and with it the re-assertions under way (soak seed 1439).
        let result = tokio::select! {
            result = self.reconcile_everything() => result,
            never = self.renew_recovery_mark(ttl) => match never {},
        };
        // On an error the mark stays (it lapses within a TTL) and the whole
        // recovery runs again.
        result?;
        tracing::info!(node = %self.id, took = ?began.elapsed(), "recovered: every worker reconciled with Redis");
        if let Err(e) = self.store.recovery_mark(&self.id, ttl, false).await {
            tracing::warn!(node = %self.id, error = %e, "clearing the recovery mark failed (it lapses within a TTL)");
        }
        Ok(())
    }

    /// Sets this node's recovery mark now and renews it every third of
    /// `ttl`, until the caller drops the future.
    async fn renew_recovery_mark(&self, ttl: Duration) -> std::convert::Infallible {
        let mut renew = tokio::time::interval(ttl / 3);
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut first = true;
        loop {
            renew.tick().await; // the first tick is now
            match self.store.recovery_mark(&self.id, ttl, true).await {
                Ok(crate::store::RecoveryMark::Late) if first => {
                    tracing::warn!(node = %self.id, "recovering more than 10 TTLs after the window opened: not holding it open any longer");
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(node = %self.id, error = %e, "setting or renewing the recovery mark failed")
                }
            }
            first = false;
        }
    }

    /// Every local worker: registered, re-asserted, its lost stops and
    /// hand-offs made to stand; beside them, the stops this node asked for.
    async fn reconcile_everything(self: &Arc<Self>) -> Result<()> {
        let workers: Vec<Arc<WorkerInner>> =
            self.workers.iter().map(|w| w.value().clone()).collect();
        // The stops this node asked for, beside the workers' reconciles:
        // made to stand first, a node that had stopped 2,000 jobs in the
        // last two minutes held every worker's re-assertion back 88 ms at
        // the median, 175 ms at p90 (chaos soak seed 1587, the dispatching
        // nodes), and a worker is the only holder of what Redis lost until
        // it re-asserts. A stop of a run a worker still holds stands before
        // that worker re-asserts (`requested_stops_of_runs_here`, in every
        // re-assertion); the rest need only come before a hand-off is given
        // back below: a worker may give back a job it handed off whose new
        // owner then stopped it on request and is gone now
        // (`handoff_stands.lua` refuses once the counter is above the
        // hand-off's token, which these raise). Their effects do not
        // depend on the order in which they meet the re-assertions and
        // releases (each removes what is at or below its token and raises
        // the counter; `release_stale.lua` keeps a payload a newer run may
        // need, which the stop then finds undone).
        let requested = self.requested_stops_stand();
        // Side by side too, every worker's reconcile and the stops and
        // ends of runs the workers neither run nor hold any more. Each is
        // known to this node alone until it is done, and a crash meanwhile
        // takes it along: neither waits for the other. A busy worker
        // remembers thousands of stops (two minutes of them), and made to
        // stand first they held its re-assertion back past a third of a
        // TTL on a loaded node (chaos soak seed 1439: 104 ms, then a kill
        // lost every job it ran); the re-assertion in turn may wait for
        // starts under way. (Stops of a key a worker runs or holds again
        // wait for that run's re-assertion, below.) Every worker's
        // reconcile at once (each under its own lock): a node with many
        // workers would otherwise leave the last one's jobs exposed for
        // the sum of the others' reconciles.
        let ended = futures::future::join_all(workers.iter().map(|w| self.ended_stops_stand(w)));
        let reconciled = futures::future::join_all(workers.iter().map(|w| self.reconcile(w)));
        // Beside them, the runs that had left workers this node cleaned up
        // (`cleaned.rs`): a run passed on from one re-asserts its newer
        // token, which such an end leaves, whichever comes first.
        let (((stood, reconciled), cleaned), requested) = futures::future::join(
            futures::future::join(
                futures::future::join(ended, reconciled),
                self.cleaned_runs_stand(),
            ),
            requested,
        )
        .await;
        requested?;
        cleaned?;
        let stood = stood.into_iter().collect::<Result<Vec<_>>>()?;
        reconciled.into_iter().collect::<Result<Vec<()>>>()?;
        // Then the workers' own stops, before any hand-off is given back;
        // each step for every worker at once: one after the other, a
        // process of three workers gave back the last one's hand-offs
        // 350-580 ms after an empty restart, and a kill then took the jobs
        // only it remembered (chaos soak seed 1564).
        futures::future::join_all(
            workers
                .iter()
                .zip(&stood)
                .map(|(worker, stood)| self.stops_stand(worker, stood)),
        )
        .await
        .into_iter()
        .collect::<Result<Vec<()>>>()?;
        futures::future::join_all(workers.iter().map(|w| self.handoffs_stand(w)))
            .await
            .into_iter()
            .collect::<Result<Vec<()>>>()?;
        Ok(())
    }

    /// Makes Redis show what `worker` runs, and nothing else.
    /// Not a worker that is closing: its close (`retire_worker`) holds its
    /// lock until its jobs are handed over, re-asserting first what Redis
    /// lost, and then removes it. That may wait for the pool's recovery to
    /// end, which this node's mark holds open until this reconcile is done:
    /// waiting here held the whole pool's recovery window open (no cleanup,
    /// no admission) until the close's deadline (chaos soak seed 1002).
    pub(crate) async fn reconcile(&self, worker: &Arc<WorkerInner>) -> Result<()> {
        if worker.cancel.is_cancelled() {
            return Ok(());
        }
        if !self.store.maps.workers.contains_key(&worker.id) {
            // Registered after the state Redis went back to, or removed by
            // a cleanup since: registered again, its jobs re-asserted. The
            // state Redis went back to may still hold records naming it
            // all the same, of jobs it no longer runs, which its
            // registration now passes for running: released below, as any
            // worker's are (chaos soak seed 1573: a cleanup had removed
            // the worker just before a rollback to a state from before
            // that cleanup moved its jobs; the records sat under the
            // worker, registered again, for 33 s, and a later empty
            // restart took the jobs).
            self.reregister(&worker.id).await?;
            let Some(_guard) = worker.lock_for_reassertion().await else {
                return Ok(());
            };
            return self.release_records_not_run(worker).await;
        }
        // A close takes the lock, then cancels the worker.
        let began = std::time::Instant::now();
        let Some(_guard) = worker.lock_for_reassertion().await else {
            return Ok(());
        };
        let lock_wait = began.elapsed();
        self.reassert_all(worker).await?;
        // Until here the worker was the only holder of what Redis lost.
        tracing::info!(
            worker = %worker.id,
            running = worker.jobs.len(),
            ?lock_wait,
            took = ?began.elapsed(),
            "jobs re-asserted after Redis went back in time"
        );
        self.release_records_not_run(worker).await
    }

    /// Releases the records Redis shows naming `worker` (whose lock the
    /// caller holds) for jobs it neither runs nor holds, but for starts
    /// claimed that it has yet to run.
    async fn release_records_not_run(&self, worker: &WorkerInner) -> Result<()> {
        // Starts claimed in Redis that the worker has not run yet: the lease
        // lapsed right after the claim, or its reply was lost. The entry
        // stays in the inbox and the worker's next read claims it again
        // (the claim stands), so its record stands too. Read under the
        // lock, which keeps this worker's inbox reads out meanwhile.
        let claimable = self.claimable_starts(worker).await?;
        // The records naming this worker, read from Redis page by page (a
        // replica, where the node has one, may not show Redis's older state
        // yet); release_stale.lua checks each record again.
        let mut cursor = crate::store::SCAN_START.to_string();
        loop {
            let page = self
                .store
                .owned_page(&worker.id, &cursor, OWNED_PAGE)
                .await?;
            // Many keys at once: one after the other, each a read and a
            // script, 69 of them held the worker's lock for 600 ms on a
            // loaded node, and with it the re-assertion a rollback that
            // came meanwhile needed (chaos soak seed 1440: a kill then
            // took the 440 jobs Redis had just lost).
            futures::stream::iter(page.keys.into_iter().map(Ok))
                .try_for_each_concurrent(RELEASES_IN_FLIGHT, |key| {
                    self.release_if_stale(worker, &claimable, key)
                })
                .await?;
            if page.cursor == crate::store::SCAN_START {
                return Ok(());
            }
            cursor = page.cursor;
        }
    }

    /// Releases the record of `key`, read on a page of the records naming
    /// `worker`, when it still names `worker` and the worker neither runs
    /// nor holds the job (see [`reconcile`](Self::reconcile)).
    async fn release_if_stale(
        &self,
        worker: &WorkerInner,
        claimable: &HashSet<(String, u64)>,
        key: String,
    ) -> Result<()> {
        // Looked at now, not before the pages were read: a lease loss
        // meanwhile moves the jobs from the running set to the suspended
        // one, under the suspended set's lock (see `suspend_all`), and a
        // suspended job is still this worker's to resume.
        if worker.runs_or_holds(&key).await {
            return Ok(());
        }
        // Read again: the page is a moment old, and the key may have been
        // re-asserted by the worker that runs it since (release_stale.lua
        // only checks the record is unchanged from this read).
        let Some(record) = self.store.job_record(&key).await? else {
            return Ok(());
        };
        let Some((owner, token)) = crate::store::records::job_owner(&record) else {
            return Ok(());
        };
        if owner != worker.id {
            return Ok(());
        }
        if claimable.contains(&(key.clone(), token)) {
            tracing::info!(key, token, worker = %worker.id, "record of a start claimed before the rollback and still in the inbox: kept");
            return Ok(());
        }
        // Passed on since (the hand-off Redis lost may have been made on a
        // primary that stalled through its failover): the payload stays.
        let handed_on = worker.handed_off.passed_on(&key, token);
        let status = self.store.release_stale(&key, &record, handed_on).await?;
        tracing::info!(key, worker = %worker.id, status = status.as_str(), "record of a job not running here after a rollback");
        Ok(())
    }

    /// The `(key, token)` of the start entries in `worker`'s inbox that it
    /// may still run: not a run it stopped on request, nor one older than
    /// a hand-off it made of the key (Redis may have gone back to before
    /// that run ended here).
    async fn claimable_starts(&self, worker: &WorkerInner) -> Result<HashSet<(String, u64)>> {
        let mut starts = HashSet::new();
        let mut after = None;
        loop {
            let entries = self.inbox_page(&worker.id, after.as_deref()).await?;
            let Some((last, _)) = entries.last() else {
                return Ok(starts);
            };
            after = Some(last.clone());
            for (_, fields) in &entries {
                if fields
                    .get("n")
                    .is_none_or(|n| n.as_ref() != EV_START.as_bytes())
                {
                    continue;
                }
                // A malformed entry is dead-lettered when the worker reads it.
                let Some(entry) = fields.get("p").and_then(|p| StartEntry::parse(p).ok()) else {
                    continue;
                };
                let key = entry.body.key;
                if worker.stopped.covers(&key, entry.token)
                    || worker.handed_off.supersede(&key, entry.token)
                {
                    continue;
                }
                starts.insert((key, entry.token));
            }
        }
    }

    /// Gives back the payloads of the jobs `worker` handed off or left to
    /// the orphan sweep lately, where nothing newer happened to them: Redis
    /// may have lost a hand-off whose start entry the new owner had not
    /// started yet, or an orphan the sweep had not requeued yet, and the job
    /// would run nowhere (see `handoffs.rs`).
    pub(crate) async fn handoffs_stand(&self, worker: &WorkerInner) -> Result<()> {
        let remembered: Vec<crate::handoffs::HandedOff> = worker
            .handed_off
            .remembered()
            .into_iter()
            // One that came back here is re-asserted with the worker's jobs.
            .filter(|handed| !worker.jobs.contains_key(&handed.key))
            .collect();
        self.give_back_passed_on(worker, remembered).await
    }

    /// Gives back the payloads of `remembered`, jobs `worker` passed on,
    /// where Redis holds nothing newer of them (`handoff_stands.lua`); one
    /// given back is an orphan, remembered as such.
    async fn give_back_passed_on(
        &self,
        worker: &WorkerInner,
        remembered: Vec<crate::handoffs::HandedOff>,
    ) -> Result<()> {
        let batches = crate::batch::bounded(remembered, STOPS_BATCH, GIVE_BACK_BYTES, |handed| {
            handed.key.len() + handed.body.len()
        });
        futures::stream::iter(batches.into_iter().map(Ok))
            .try_for_each_concurrent(STOP_CALLS_IN_FLIGHT, |batch| async move {
                let jobs = batch
                    .iter()
                    .map(|handed| {
                        let stored = crate::codec::stored(handed.admitted, &handed.body);
                        (handed.key.as_str(), handed.token, stored)
                    })
                    .collect();
                let statuses = self.store.handoff_stands_batch(jobs).await?;
                for (handed, status) in batch.into_iter().zip(statuses) {
                    if let crate::store::HandoffStands::Superseded(older) = status
                        && let Some(node) = worker.node()
                    {
                        node.stop_superseded(&handed.key, handed.token, older);
                    }
                    if status == crate::store::HandoffStands::Restored {
                        tracing::info!(key = handed.key, token = handed.token, worker = %worker.id, "a job passed on that Redis lost (hand-off or orphan): it is an orphan again");
                        // Redis holds the only copy again, until the sweep
                        // requeues it: kept as long as any orphan.
                        worker
                            .handed_off
                            .record_orphan(handed, self.orphan_exposure());
                    }
                }
                Ok(())
            })
            .await
    }

    /// Asks Redis every [`SETTLE_EVERY`](crate::handoffs::SETTLE_EVERY)
    /// which jobs the local workers remember passing on ended since, so
    /// that a later loss does not give them back (see `handoffs.rs`). An
    /// error leaves them unsettled until the next round.
    pub(crate) async fn settle_handoffs_loop(self: Arc<Self>) {
        let mut every = tokio::time::interval(crate::handoffs::SETTLE_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = every.tick() => {}
            }
            let workers: Vec<Arc<WorkerInner>> =
                self.workers.iter().map(|w| w.value().clone()).collect();
            for worker in workers {
                if let Err(e) = self.settle_handoffs(&worker).await {
                    tracing::debug!(worker = %worker.id, error = %e, "asking which jobs passed on ended failed; asking again next round");
                }
            }
        }
    }

    /// One round of [`settle_handoffs_loop`](Self::settle_handoffs_loop)
    /// for `worker`. Behind Sentinel, an answer from a server the
    /// Sentinels no longer name is dropped (asked again next round).
    pub(crate) async fn settle_handoffs(self: &Arc<Self>, worker: &WorkerInner) -> Result<()> {
        #[cfg(test)]
        if worker.handed_off.settling_held() {
            return Ok(());
        }
        let unsettled = worker.handed_off.unsettled();
        for jobs in unsettled.chunks(crate::handoffs::SETTLE_BATCH) {
            let asked = self.commands_server();
            let answer = self.store.handoffs_ended(jobs).await?;
            if (!answer.ended.is_empty() || !answer.waiting.is_empty() || !answer.passed.is_empty())
                && !self.handoff_ends_hold(asked.as_ref()).await
            {
                return Ok(());
            }
            let ended: Vec<(String, u64, u64)> = answer
                .ended
                .into_iter()
                .map(|(at, counter)| (jobs[at].0.clone(), jobs[at].1, counter))
                .collect();
            worker.handed_off.settle(&ended);
            let waiting: Vec<(String, u64, u64)> = answer
                .waiting
                .into_iter()
                .map(|(at, admitted_us)| (jobs[at].0.clone(), jobs[at].1, admitted_us))
                .collect();
            worker.handed_off.keep_waiting(&waiting);
            if !answer.passed.is_empty() {
                // Only ends of older dispatches passed these (a rollback
                // took their admission): Redis holds nothing of them, the
                // worker the only copy.
                let passed: Vec<&(String, u64, u64)> =
                    answer.passed.iter().map(|at| &jobs[*at]).collect();
                let give: Vec<crate::handoffs::HandedOff> = worker
                    .handed_off
                    .remembered()
                    .into_iter()
                    .filter(|h| passed.iter().any(|p| p.0 == h.key && p.1 == h.token))
                    .collect();
                tracing::info!(worker = %worker.id, jobs = give.len(), "jobs passed on that only older dispatches' ends outranked: given back");
                self.give_back_passed_on(worker, give).await?;
            }
        }
        Ok(())
    }
}
