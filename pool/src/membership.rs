//! Membership: registering and retiring workers, moving their jobs and
//! inbox entries to other workers, and the node's view of who is active.

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;

use crate::error::{Error, Result};
use crate::node::NodeInner;
use crate::routing::Ring;
use crate::store::records::WorkerEntry;
use crate::store::{EntryMove, Handoff, Moved, Mover, Reassert, Reasserted, Receiver, Requeue};
use crate::worker::WorkerInner;

/// Most hand-offs of one worker in flight at once when its jobs move (a
/// rebalance, a close, a dead worker's cleanup), pipelined on the node's
/// connection: each `handoff.lua` decides for its key alone, and moving N
/// jobs must not take N round trips one after the other.
pub(crate) const HANDOFFS_IN_FLIGHT: usize = 64;

impl NodeInner {
    /// Recomputes the ring and the drained set from the workers and
    /// cleanup maps: the ring holds the registered workers that are neither
    /// being cleaned up nor drained (the same test as `worker_active` in
    /// `store/scripts/base.lua`).
    pub(crate) fn refresh_ring(&self) {
        let cleaning = self.store.maps.cleanup.snapshot();
        let workers = self.store.maps.workers.snapshot();
        self.cleaned.forget_returned(&workers);
        let mut active = Vec::new();
        let mut drained = HashSet::new();
        for (id, raw) in workers.iter() {
            if cleaning.contains_key(id) {
                continue;
            }
            if WorkerEntry::parse(raw).is_some_and(|w| w.drained_at_ms.is_some()) {
                drained.insert(id.clone());
            } else {
                active.push(id.clone());
            }
        }
        if **self.drained.load() != drained {
            self.drained.store(Arc::new(drained));
        }
        let ring = Ring::new(active);
        if **self.ring.load() != ring {
            self.ring.store(Arc::new(ring));
            self.ring_version.send_modify(|v| *v += 1);
        }
    }

    /// Records this node's version, host and pid with its join time, for
    /// inspectors. Informational: a failure is logged, not fatal.
    pub(crate) async fn record_node_info(&self) {
        let info = serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "host": self.host,
            "pid": self.pid,
        })
        .to_string();
        if let Err(e) = self.store.record_node(&self.id, &info).await {
            tracing::warn!(node = %self.id, error = %e, "recording the node's info failed");
        }
    }

    /// Registers (or re-registers) a worker on Redis.
    pub(crate) async fn register_worker(&self, id: &str) -> Result<()> {
        let info = serde_json::json!({
            "node": self.id,
            "host": self.host,
            "pid": self.pid,
        })
        .to_string();
        let sent = tokio::time::Instant::now();
        let now = self.store.register(id, &info).await?;
        if let Some(now) = now {
            self.freshness.server_time(now, sent);
        }
        Ok(())
    }

    /// Moves one inbox entry from `from`'s inbox to `to`'s.
    /// `requeue`: what the move requeues (`Requeue::default()` when
    /// forwarding). With the new token of a start a cleaner moved.
    pub(crate) async fn move_entry(
        &self,
        from: &str,
        to: &str,
        id: &str,
        name: &str,
        payload: Bytes,
        requeue: Requeue<'_>,
    ) -> Result<(Moved, Option<u64>)> {
        self.store
            .move_entry_token(EntryMove {
                from,
                from_inbox: self.inbox(from)?.key(),
                to,
                to_inbox: self.inbox(to)?.key(),
                id,
                name,
                payload,
                requeue,
                worker_ttl: self.options.worker_ttl,
                pending_ttl: self.options.pending_ttl(),
                floor_ms: self.server_clock.now_at_least(),
            })
            .await
    }

    /// Hands job `key`, owned by `from`, to `to`.
    /// `mover`: see [`Mover`].
    pub(crate) async fn handoff(
        &self,
        key: &str,
        from: &str,
        to: &str,
        mover: Mover<'_>,
    ) -> Result<Handoff> {
        let (status, stored) = self
            .store
            .handoff(
                key,
                from,
                Receiver {
                    worker: to,
                    inbox: self.inbox(to)?.key(),
                    floor_ms: self.server_clock.now_at_least(),
                },
                self.options.dispatch_timeout + self.options.ack_grace,
                self.options.worker_ttl,
                mover,
            )
            .await?;
        if let Handoff::Ok { token } = status {
            tracing::info!(key, from, to, "job handed off");
            self.metrics.handoffs.increment(1);
            self.history.count(crate::history::PoolEvent::Move);
            if let Some(stored) = stored {
                self.remember_cleaned(key, token, &stored, to);
            }
        }
        Ok(status)
    }

    /// A dead worker's job this node's cleanup moved: Redis alone holds it
    /// until its new owner starts it, and the worker it came from cannot
    /// give it back after a loss of Redis's data. One of this node's
    /// workers remembers it as its own hand-off (`handoffs.rs`): it gives
    /// the job back as an orphan after such a loss, and passes it on when
    /// it closes. Another worker than the job's new owner where the node
    /// has one: the memory is for a loss before the owner started the job,
    /// and the owner may die before it does. Not a worker that is closing
    /// (it may have passed on what it remembers already). A node without
    /// workers does not clean up.
    fn remember_cleaned(&self, key: &str, token: u64, stored: &[u8], owner: &str) {
        let Some((admitted, body)) = crate::codec::split_stored(stored) else {
            tracing::warn!(
                key,
                "a moved job's stored payload is malformed; not remembered"
            );
            return;
        };
        self.remember_moved(
            key,
            token,
            admitted,
            bytes::Bytes::copy_from_slice(body),
            owner,
        );
    }

    /// Remembers job `key` (created at `admitted`, `body`), moved by
    /// this node's cleanup under `token` to `owner`: a job (see
    /// [`remember_cleaned`](Self::remember_cleaned)), or a start entry left
    /// in the dead worker's inbox.
    pub(crate) fn remember_moved(
        &self,
        key: &str,
        token: u64,
        admitted: u64,
        body: bytes::Bytes,
        owner: &str,
    ) {
        let staying = || {
            self.workers
                .iter()
                .filter(|w| !w.value().cancel.is_cancelled())
        };
        let keeper = staying()
            .find(|w| w.key() != owner)
            .or_else(|| staying().next())
            .map(|w| w.value().clone());
        let Some(keeper) = keeper else {
            return;
        };
        keeper.handed_off.record(crate::handoffs::HandedOff {
            key: key.to_string(),
            token,
            admitted,
            body,
        });
    }

    /// Takes local worker `worker` out of the ring, so that dispatchers
    /// stop sending to it and hand-offs pass it by (the scripts refuse a
    /// worker under a cleanup claim), by `until`. The claim names this
    /// node: its renewals keep a claim of this form on its own worker
    /// (`keepalive.lua`), and any other stale claim goes. Returns once
    /// Redis has the claim (this node's replica, and so its ring, may show
    /// it later: a hand-off to the worker is refused by Redis meanwhile).
    pub(crate) async fn leave_ring(&self, worker: &str, until: tokio::time::Instant) -> Result<()> {
        let claim = format!("{} closing", self.id);
        match tokio::time::timeout_at(until, self.store.maps.cleanup.set(worker, &claim)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(Error::from(e)),
            Err(_) => Err(gave_up(worker, "leaving the ring")),
        }
    }

    /// Removes a local worker. With `handover`, its jobs and queued events
    /// move to other workers first; without, its jobs are only stopped
    /// (pool shutdown). The Redis part gives up at `until` (Redis down or
    /// too slow), but the handlers always stop, each within `stop_timeout`,
    /// and the worker leaves this node: what could not be handed over is
    /// requeued by the cleanup of the dead worker after its TTL.
    pub(crate) async fn retire_worker(
        &self,
        worker: &Arc<WorkerInner>,
        handover: bool,
        until: tokio::time::Instant,
    ) -> Result<()> {
        let _guard = worker.ops.write().await;
        worker.cancel.cancel();
        // What needs Redis before the stops ends by then, so that the
        // stops still fit before `until`.
        let stops_from = until
            .checked_sub(self.options.stop_timeout)
            .unwrap_or(until);
        let inbox = self.inbox(&worker.id)?;
        // Waits for the reader to let go of the inbox, which a reader stuck
        // on an unreachable Redis never does.
        let _ = tokio::time::timeout_at(stops_from, self.reader.remove_stream(inbox.name())).await;
        let mut failed = None;
        if handover {
            // Leave the ring first so that dispatchers stop sending here
            // (again, when a node's close did so for all its workers: the
            // claim is the same, and a loss of Redis's data since may have
            // taken it).
            match self.leave_ring(&worker.id, stops_from).await {
                Ok(()) => self.refresh_ring(),
                Err(e) => failed = Some(e),
            }
        }
        // Every job leaves the running set, and the suspended set is
        // emptied, under the lease transition lock: the lease watchdog
        // stops jobs without this worker's `ops` lock, moving each to the
        // suspended set before its stop ends, and holds that lock until all
        // its stops have ended. So nothing is taken from there while its
        // stop still runs, to be handed over to a worker that starts it
        // (I1), and the watchdog finds none of these jobs to stop again.
        let (running, held) = {
            let _transition = self.lease_transition.lock().await;
            let mut suspended = worker.suspended.lock().await;
            let keys: Vec<String> = worker.jobs.iter().map(|e| e.key().clone()).collect();
            let running: Vec<(String, crate::worker::LocalJob)> = keys
                .into_iter()
                .filter_map(|k| worker.jobs.remove(&k))
                .collect();
            let held: Vec<(String, crate::worker::LocalJob)> = suspended.drain().collect();
            (running, held)
        };
        // Every job stops at once (each within stop_timeout), so closing a
        // worker with many jobs takes one stop, not one per job; each is
        // handed on only after its own stop returned.
        let mut stopped: Vec<(String, crate::worker::LocalJob, Reassert)> =
            futures::future::join_all(running.into_iter().map(|(key, job)| async move {
                if let Err(e) = worker.stop_handler(&key).await {
                    tracing::warn!(key, error = %e, "handler stop failed during close");
                }
                // Ran here until now under a valid lease: nobody can have
                // moved it, and Redis may only have lost it. Past the lease
                // a cleanup may have, and a run elsewhere may not have
                // re-asserted yet: it is then given back as a suspended
                // job is (left to the orphan sweep while the pool recovers).
                let state = if worker.holds_lease(self) {
                    Reassert::Running
                } else {
                    Reassert::Suspended
                };
                (key, job, state)
            }))
            .await;
        // Jobs held suspended since a lease loss (stopped) go on like the
        // others.
        stopped.extend(
            held.into_iter()
                .map(|(key, job)| (key, job, Reassert::Suspended)),
        );
        let result = match failed {
            Some(e) => Err(e),
            None => tokio::time::timeout_at(until, async {
                if handover {
                    futures::stream::iter(stopped)
                        .for_each_concurrent(HANDOFFS_IN_FLIGHT, |(key, job, state)| async move {
                            let mover = match state {
                                Reassert::Running => Mover::Owner,
                                Reassert::Suspended => Mover::OwnerPastLease,
                            };
                            let moved = self.requeue_job(&key, &worker.id, mover).await;
                            let state = match moved {
                                Some(Handoff::Ok { token }) => return remember(worker, &key, &job, token),
                                // Redis has the record but not the body (a
                                // start recorded during a recovery): this
                                // copy is the only one.
                                Some(Handoff::NoPayload) => Reassert::Running,
                                // Redis names someone else or nobody: the job
                                // moved on, or Redis lost this run (a data
                                // loss this worker has not re-asserted after
                                // yet). Re-asserting tells them apart, as
                                // the reconcile would have before the close.
                                Some(Handoff::NotOwner) => state,
                                // Held past its lease while the pool
                                // recovers: the record naming this worker
                                // may be one a rollback brought back, over
                                // a move whose run has not re-asserted yet.
                                // Released, the job is given back as an
                                // orphan, which the sweep requeues after the
                                // window unless that run took it back.
                                Some(Handoff::Recovering) if mover == Mover::OwnerPastLease => {
                                    if let Err(e) = self.release_job(&key, &worker.id, None).await {
                                        tracing::warn!(key, error = %e, "closing: releasing a job held past the lease failed");
                                        return self.left_unplaced(worker, &key, &job).await;
                                    }
                                    state
                                }
                                None => return self.left_unplaced(worker, &key, &job).await,
                                _ => return,
                            };
                            match self.reassert(worker, &key, &job, state).await {
                                Ok(Reasserted::Ok) => {
                                    if let Some(Handoff::Ok { token }) =
                                        self.requeue_job(&key, &worker.id, mover).await
                                    {
                                        remember(worker, &key, &job, token);
                                    }
                                }
                                Ok(Reasserted::Orphaned) => {
                                    tracing::info!(key, worker = %worker.id, "closing: a job Redis did not hold left to the orphan sweep");
                                }
                                Ok(Reasserted::Lost
                | Reasserted::Pending
                | Reasserted::Unclaimed
                | Reasserted::Superseded(_)) => {}
                                Err(e) => {
                                    tracing::warn!(key, error = %e, "closing: giving back a job Redis did not hold failed");
                                }
                            }
                        })
                        .await;
                    // A close remembers nothing of what it finds (no
                    // cleanup of a dead worker, see `cleaned.rs`).
                    let mut finds = crate::cleaned::CleanupFinds::default();
                    self.requeue_owned_by(&worker.id, None, &mut finds).await;
                    self.requeue_worker_inbox(&worker.id, None, &mut finds).await?;
                    // Its recent stops go with what it remembers: the
                    // worker that keeps them makes them stand after a
                    // rollback, as this one would have.
                    crate::custody::remember_stops(
                        &worker.handed_off,
                        worker.stopped.recent_ends(crate::handoffs::ENDS_REMEMBERED),
                    );
                    // Leaves time to unregister the worker.
                    let entrust_until = until
                        .checked_sub(self.options.redis_timeout)
                        .unwrap_or(until);
                    // Through the node's own handle: a give-back may stop
                    // a run in the way, in the background (`custody.rs`).
                    if let Some(node) = worker.node() {
                        node.entrust_memory(&worker.id, &worker.handed_off, entrust_until)
                            .await;
                    }
                }
                // No cleanup claim involved: nothing stops it but errors.
                self.remove_worker_entry(&worker.id, None, &mut Default::default())
                    .await
                    .map(|_| ())
            })
            .await
            .unwrap_or_else(|_| Err(gave_up(&worker.id, "handing its jobs over"))),
        };
        self.workers.remove(&worker.id);
        self.refresh_ring();
        match &result {
            Ok(()) => tracing::info!(worker = %worker.id, handover, "worker removed"),
            Err(e) => tracing::warn!(
                worker = %worker.id, error = %e,
                "worker removed here with its jobs stopped; Redis did not take the handover, \
                 so they move to other workers after the worker TTL"
            ),
        }
        result
    }
}

impl NodeInner {
    /// A job a close could not hand on (no other worker in the ring; its
    /// record released for the orphan sweep, see `requeue_job`): given back
    /// as an orphan where Redis lost it (the other workers may not have
    /// registered again after a loss yet), and remembered like any orphan
    /// a close leaves, so that a worker that comes back while the pool
    /// recovers keeps it (`custody.rs`).
    async fn left_unplaced(&self, worker: &WorkerInner, key: &str, job: &crate::worker::LocalJob) {
        let stored = crate::codec::stored(job.admitted, &job.raw_body);
        match self.store.handoff_stands(key, job.token, stored).await {
            Ok(crate::store::HandoffStands::Restored) => {
                tracing::info!(key, worker = %worker.id, "closing: a job Redis lost and no other worker could take left to the orphan sweep");
            }
            // Waits for an older dispatch's run to end: stopped, as a
            // re-assertion does.
            Ok(crate::store::HandoffStands::Superseded(older)) => {
                if let Some(node) = worker.node() {
                    node.stop_superseded(key, job.token, older);
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(key, error = %e, "closing: giving back a job no other worker could take failed");
            }
        }
        worker.handed_off.record_orphan(
            crate::handoffs::HandedOff::of(key, job.token, job),
            self.orphan_exposure(),
        );
    }
}

/// Remembers a job a close handed on, until a worker that stays keeps it
/// (`custody.rs`).
fn remember(worker: &WorkerInner, key: &str, job: &crate::worker::LocalJob, token: u64) {
    worker
        .handed_off
        .record(crate::handoffs::HandedOff::of(key, token, job));
}

/// The error of a retirement whose Redis part ran out of time.
fn gave_up(worker: &str, what: &str) -> Error {
    Error::Unavailable(fred::error::Error::new(
        fred::error::ErrorKind::Timeout,
        format!("no answer from Redis in time while {what} for worker {worker}"),
    ))
}
