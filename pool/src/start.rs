//! Starting a job from a start entry in a worker's inbox: forwarded to
//! the ring owner, dropped when a newer start exists, claimed in Redis
//! unless fresh (see `freshness.rs`), started by the handler, then
//! confirmed or recorded (see `recorder.rs`), and re-asserted when Redis
//! lost the start meanwhile.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use flotilla_streaming::Event;

use crate::codec::{EV_START, StartEntry};
use crate::error::{Error, Result};
use crate::handler::Job;
use crate::node::NodeInner;
use crate::store::records::job_owner;
use crate::store::{Answer, Claimed, Moved, Reasserted, Requeue, StartKept, StartToRecord};
use crate::worker::{HandlerStart, LocalJob, WorkerInner};

impl WorkerInner {
    /// Re-asserts a run whose start Redis lost (data loss, or Redis went
    /// back in time): takes ownership unless a newer start exists, in which
    /// case the run here stops. Errors leave it to the re-assertion that
    /// follows re-registration or the rollback recovery.
    async fn reassert_start(&self, node: &NodeInner, key: &str) {
        let Some(job) = self.jobs.get(key).map(|j| j.clone()) else {
            return;
        };
        match node
            .reassert(self, key, &job, crate::store::Reassert::Running)
            .await
        {
            Ok(Reasserted::Ok) => {}
            Ok(status) => {
                tracing::info!(
                    worker = %self.id,
                    key,
                    status = status.as_str(),
                    "a newer start exists; stopping the local run"
                );
                if self.jobs.remove(key).is_some() {
                    let _ = self.stop_handler(key).await;
                }
            }
            Err(e) => {
                tracing::warn!(worker = %self.id, key, error = %e, "re-asserting a start failed; retried on recovery")
            }
        }
    }

    // DEBUG, not INFO: a span per start costs a service that logs at INFO
    // several µs of CPU per job (its events name the worker and key).
    #[tracing::instrument(name = "start", level = "debug", skip_all, fields(pool = %node.pool, worker = %self.id, key))]
    pub(crate) async fn on_start(
        &self,
        node: &NodeInner,
        event: &Event,
        mut entry: StartEntry,
    ) -> Result<()> {
        let key = entry.body.key.clone();
        tracing::Span::current().record("key", key.as_str());
        // Checked before the forward: the ring may place the key on another
        // worker now, which does not remember this end and would claim the
        // start (its pending guard may be back with it) and run it again.
        if let Some(ended) = self.run_ended(&key, entry.token) {
            // A start of a run that ended (stopped here on request, or
            // passed on and stopped there), back in the inbox because Redis
            // went back in time: the end stands, pending guard and all.
            tracing::info!(
                worker = %self.id,
                key,
                token = entry.token,
                ended,
                "start of a run that ended already; its end stands, the start is dropped"
            );
            node.store.stop_stands(&key, ended).await?;
            let start = self.start_to_record(node, event, &entry)?;
            return drop_superseded(node, &start).await;
        }
        if let Some(stopped) = self.stopped.stopped_dispatch(&key, entry.admitted) {
            // A run of a dispatch stopped here on request (or ended here
            // for good), issued after the stop on a state Redis went back
            // to (a cleanup moved the stopped run on again): that dispatch
            // is over, so its stop stands over this run too, guard and
            // payload.
            tracing::info!(
                worker = %self.id,
                key,
                token = entry.token,
                stopped,
                "start of a dispatch stopped or ended here; its end stands, the start is dropped"
            );
            node.store
                .stop_stands(&key, entry.token.max(stopped))
                .await?;
            let start = self.start_to_record(node, event, &entry)?;
            return drop_superseded(node, &start).await;
        }
        if self.handed_off.supersede(&key, entry.token) {
            // A start of a run this worker handed on since, back in its
            // inbox because Redis went back in time (with that run's
            // pending guard, so a claim would be accepted): the run it was
            // handed to may have been stopped since, elsewhere.
            tracing::info!(
                worker = %self.id,
                key,
                token = entry.token,
                "start older than a hand-off made here; dropped"
            );
            let start = self.start_to_record(node, event, &entry)?;
            return drop_superseded(node, &start).await;
        }
        let start = self.start_to_record(node, event, &entry)?;
        if let Some(running) = self.jobs.get(&key).map(|j| j.token)
            && running >= entry.token
        {
            if running > entry.token {
                // An older start that was moved on and came back: the key
                // runs here already.
                return drop_superseded(node, &start).await;
            }
            // This very start, read again by a rewind because recording it
            // failed: record it now (it may be recorded already). Before
            // any forward: the ring may place the key elsewhere by now, and
            // the entry forwarded there, with this run's token and guard,
            // would be claimed and started while it runs here (a rebalance
            // hands a running job on, stopping it first).
            let status = node.recorder.submit(start).await?;
            if status == StartKept::Recovering {
                self.reassert_start(node, &key).await;
            } else if status != StartKept::Ok {
                tracing::warn!(
                    worker = %self.id,
                    key,
                    status = status.as_str(),
                    "start not kept; stopping the local run"
                );
                let _ = self.stop_handler(&key).await;
                self.jobs.remove(&key);
            }
            return Ok(());
        }
        let held = self.suspended.lock().await.get(&key).map(|j| j.token);
        if let Some(held) = held
            && held >= entry.token
        {
            if held > entry.token {
                return drop_superseded(node, &start).await;
            }
            // This very start, whose run the lease watchdog took from the
            // running set before it was recorded: the resume settles that
            // run (restarts it here, or forgets it if it moved). Until
            // then the entry stays; forwarded, it would be claimed and
            // started elsewhere, maybe while the stop here still runs.
            return Err(held_here());
        }
        if let Some(target) = self.forward_target(node, &key, entry.hops) {
            match node
                .move_entry(
                    &self.id,
                    &target,
                    &event.id,
                    EV_START,
                    entry.forwarded(),
                    Requeue::default(),
                )
                .await?
                .0
            {
                // A forward names no cleaner: no claim to lose.
                Moved::Ok | Moved::Gone | Moved::ClaimLost | Moved::Recovering | Moved::Ended => {
                    return Ok(());
                }
                Moved::NoTarget => node.refresh_ring(), // target left: run it here
            }
        }
        let superseded = node.store.maps.jobs.as_ref().is_some_and(|jobs| {
            jobs.get(&key).is_some_and(|v| {
                job_owner(&v).is_some_and(|(w, t)| w != self.id && t >= entry.token)
            })
        });
        if superseded {
            // Another worker runs this key with a token at least as new (a
            // start that was moved on while this process was cut off or
            // paused). The claim below would refuse it too; the replica,
            // where the node mirrors the jobs map, saves the round trip.
            tracing::info!(
                worker = %self.id,
                key,
                token = entry.token,
                "stale start dropped: the key runs elsewhere"
            );
            return drop_superseded(node, &start).await;
        }
        if self.jobs.contains_key(&key) {
            // Started again while running here: stop the old run first so
            // the key never runs twice.
            let _ = self.stop_handler(&key).await;
            self.jobs.remove(&key);
        }
        // Without a lease nothing starts; the entry stays in the inbox and
        // is read again once the lease is back (or moved by cleanup). The
        // clock check catches a process resumed after a long pause before
        // its lease watchdog could run.
        self.check_lease(node)?;
        // An entry that may be stale is claimed in Redis before the
        // handler runs: only the worker whose claim is accepted starts the
        // key, whatever its replica says. A fresh one cannot be stale and
        // is recorded after the start (see `freshness.rs`).
        // A forwarded or moved entry (one hop or more) is never fresh: its
        // stream id is the time of the move, not of the admission. Nor is
        // one read from another server than the commands go to (behind
        // Sentinel, a primary that woke after its failover).
        let mut fresh = entry.hops == 0
            && node.start_is_fresh(&event.id)
            && node.read_where_commands_go(event.server.as_ref());
        if !fresh {
            node.metrics.start_claims.increment(1);
            let claim = node
                .store
                .claim_start(&start, node.options.worker_ttl, node.options.pending_ttl())
                .await?;
            if claim == Claimed::Recovering {
                return Err(recovering());
            }
            if claim != Claimed::Ok {
                self.claim_refused(node, &entry, claim, "start not claimed")
                    .await;
                return Ok(());
            }
            // The claim took a round trip: a stall or a pause meanwhile
            // (past the lease) lets a cleaner move the job and another
            // worker start it before this one would. The claim stands in
            // Redis (a retry finds it), the start waits for the lease.
            self.check_lease(node)?;
        }
        let job = Job::new_run(
            &key,
            // The decoded payload is the run's (not read from the entry again).
            Bytes::from(std::mem::take(&mut entry.body.payload)),
            SystemTime::UNIX_EPOCH + Duration::from_micros(crate::codec::stamp_us(entry.admitted)),
            entry.token,
            self.lifecycle.outcome(&key, entry.token),
        );
        let started = if fresh {
            match self.start_fresh(node, &start, &entry, job.clone()).await? {
                Some((started, still_fresh)) => {
                    fresh = still_fresh;
                    started
                }
                None => return Ok(()),
            }
        } else {
            self.start_handler(job.clone()).await
        };
        // The run as the worker keeps it, running or held suspended.
        let run = LocalJob {
            token: entry.token,
            admitted: entry.admitted,
            payload: job.payload.clone(),
            raw_body: entry.raw_body.clone(),
        };
        match started {
            HandlerStart::Cancelled => {
                // Undone here, and held like the runs the lapse stopped:
                // the resume starts it again once the lease is back (it
                // re-asserts it first if Redis lost it meanwhile; a claim,
                // if any, names this worker). The entry waits for that
                // (`held_here`): Redis may lose it, and a cleaner move it.
                let _ = self.stop_handler(&key).await;
                self.suspended.lock().await.insert(key.clone(), run);
                Err(lease_lost())
            }
            HandlerStart::Refused(message) => {
                tracing::info!(worker = %self.id, key, error = %message, "handler refused to start job");
                node.metrics.start_failed.increment(1);
                node.store.start_failed(&start, &message).await?;
                Ok(())
            }
            HandlerStart::Started => {
                self.jobs.insert(key.clone(), run);
                node.note_running(&self.id, &key);
                // A lease loss while the handler started: the watchdog's
                // stop may have missed this job (inserted after it looked),
                // and recording the start may wait on an unreachable Redis
                // for a long time. Stop it now; it resumes with the others.
                if self.lease_lost.load(std::sync::atomic::Ordering::SeqCst)
                    && let Some((k, job)) = self.jobs.remove(&key)
                {
                    let _ = self.stop_handler(&k).await;
                    self.suspended.lock().await.insert(k, job);
                }
                // On an error the outcome is unknown (the script may have
                // run, removing the entry): the job keeps running, and if
                // the entry is still there the rewind records it then.
                // Stopping instead would lose a job that Redis records as
                // running here.
                let status = if fresh {
                    node.recorder.submit(start).await?
                } else {
                    node.store
                        .started(&start, Answer::Ok, node.options.worker_ttl)
                        .await?
                };
                if status == StartKept::Recovering {
                    // Redis lost its data or went back in time since the
                    // entry was written: the run stays and is re-asserted
                    // now (and again when the worker registers again).
                    tracing::warn!(worker = %self.id, key, "start lost with Redis's data; re-asserting it");
                    self.reassert_start(node, &key).await;
                } else if status != StartKept::Ok {
                    tracing::warn!(
                        worker = %self.id,
                        key,
                        status = status.as_str(),
                        "start not kept (superseded, or the worker is being cleaned up); stopping the local run"
                    );
                    let _ = self.stop_handler(&key).await;
                    self.jobs.remove(&key);
                } else if self.lease_lost.load(std::sync::atomic::Ordering::SeqCst) {
                    // The lease lapsed while recording: stop now (unless the
                    // watchdog or the check above did), resume later.
                    if let Some((k, job)) = self.jobs.remove(&key) {
                        let _ = self.stop_handler(&k).await;
                        self.suspended.lock().await.insert(k, job);
                    }
                } else {
                    tracing::debug!(key, token = entry.token, "job started");
                    node.metrics.jobs_started.increment(1);
                    node.history.count(crate::history::PoolEvent::Start);
                }
                Ok(())
            }
        }
    }

    /// A start entry this worker read and could not claim because Redis no
    /// longer shows the worker or the entry: a cleaner moved it (its copy
    /// elsewhere is the live one), or Redis lost its data between the read
    /// and the claim, and the entry read is the job's only copy (chaos
    /// soak seed 503: a closing process handed a job off, Redis was
    /// flushed before the new owner's claim, and the job ran nowhere). It
    /// is given back as an orphan where Redis holds nothing newer of the
    /// key (`handoff_stands.lua`: in the first case Redis holds the move,
    /// and nothing changes), and remembered as a hand-off is, for a loss
    /// still to come.
    async fn keep_unclaimed(&self, node: &NodeInner, entry: &StartEntry) {
        let handed = crate::handoffs::HandedOff {
            key: entry.body.key.clone(),
            token: entry.token,
            admitted: entry.admitted,
            body: entry.raw_body.clone(),
        };
        let stored = crate::codec::stored(handed.admitted, &handed.body);
        match node
            .store
            .handoff_stands(&handed.key, handed.token, stored)
            .await
        {
            Ok(crate::store::HandoffStands::Restored) => tracing::info!(
                worker = %self.id,
                key = handed.key,
                token = handed.token,
                "a start Redis lost before its claim: it is an orphan again"
            ),
            Ok(crate::store::HandoffStands::Superseded(older)) => {
                if let Some(node) = self.node() {
                    node.stop_superseded(&handed.key, handed.token, older);
                }
            }
            Ok(_) => {}
            // Given back by the recovery that follows a loss, from the
            // memory below.
            Err(e) => tracing::warn!(
                worker = %self.id,
                key = handed.key,
                error = %e,
                "giving back a start that could not be claimed failed"
            ),
        }
        self.handed_off
            .record_orphan(handed, node.orphan_exposure());
    }

    /// Starts a fresh entry, to be recorded once the handler's `start`
    /// returns; unless that takes a while. A fresh entry's pending guard
    /// has at least half its life left (see `freshness.rs`); past a
    /// quarter of it, the start is claimed in Redis while the handler goes
    /// on, as an entry that is not fresh is before its start: the guard
    /// would otherwise lapse under a slow `start`, and the job, taken for
    /// an orphan, start elsewhere too. Returns how the start went and
    /// whether it is still to be recorded as fresh (not claimed); `None`
    /// when Redis refused the claim (the start was cancelled and undone).
    async fn start_fresh(
        &self,
        node: &NodeInner,
        start: &StartToRecord,
        entry: &StartEntry,
        job: Job,
    ) -> Result<Option<(HandlerStart, bool)>> {
        let key = job.key.clone();
        let claimed = {
            let handler_start = self.start_handler(job);
            tokio::pin!(handler_start);
            // Most starts are done at the first poll: no timer for them.
            if let std::task::Poll::Ready(started) = futures::poll!(&mut handler_start) {
                return Ok(Some((started, true)));
            }
            let claim_after = (node.options.dispatch_timeout + node.options.ack_grace) / 4;
            tokio::select! {
                started = &mut handler_start => return Ok(Some((started, true))),
                _ = tokio::time::sleep(claim_after) => {}
            }
            node.metrics.start_claims.increment(1);
            // The handler's start waits meanwhile, but it has begun: a
            // lapse during the claim's round trip (a cut link) must still
            // undo it within the stop budget, not once the call gives up.
            let lapse = self.lapse_token();
            let claimed = tokio::select! {
                biased;
                _ = lapse.cancelled() => None,
                claimed = node.store.claim_start(start, node.options.worker_ttl, node.options.pending_ttl()) => Some(claimed),
            };
            let Some(claimed) = claimed else {
                // The start goes no further (its future is dropped here);
                // the caller undoes it and holds the job.
                return Ok(Some((HandlerStart::Cancelled, false)));
            };
            if matches!(claimed, Ok(Claimed::Ok)) {
                return Ok(Some((handler_start.await, false)));
            }
            claimed
            // Refused, or not known: the start goes no further (its
            // future is dropped here) and the handler undoes it. On an
            // error the entry is read again (a claim that went through is
            // found then).
        };
        let _ = self.stop_handler(&key).await;
        let claimed = claimed?;
        if claimed == Claimed::Recovering {
            // Undone; the entry stays and is claimed again after the
            // recovery (the caller's error has it read again).
            return Err(recovering());
        }
        self.claim_refused(node, entry, claimed, "slow start not claimed; cancelled")
            .await;
        Ok(None)
    }

    /// A claim Redis refused: logged (`what`), and an entry that Redis no
    /// longer shows with this worker is given back (`keep_unclaimed`). An
    /// entry issued again ([`Claimed::Reissued`]) is read again from the
    /// inbox under its new token.
    async fn claim_refused(
        &self,
        node: &NodeInner,
        entry: &StartEntry,
        claim: Claimed,
        what: &'static str,
    ) {
        if claim == Claimed::Reissued {
            tracing::info!(
                worker = %self.id,
                key = entry.body.key,
                token = entry.token,
                "start issued before the pool's last recovery: issued again with a newer token"
            );
            return;
        }
        tracing::info!(
            worker = %self.id,
            key = entry.body.key,
            token = entry.token,
            claim = claim.as_str(),
            "{what}"
        );
        if claim == Claimed::Unregistered {
            // Redis forgot this worker (lost its data, or a cleaner is
            // taking its jobs): the renewal settles which, now.
            node.renewal_wanted.notify_one();
        }
        if matches!(claim, Claimed::Unregistered | Claimed::Gone) {
            self.keep_unclaimed(node, entry).await;
        }
    }

    /// `Unavailable` ("lease lost") unless a run may start here now
    /// ([`WorkerInner::may_start`]).
    fn check_lease(&self, node: &NodeInner) -> Result<()> {
        if !self.may_start(node) {
            return Err(lease_lost());
        }
        Ok(())
    }

    /// The token up to which every run of `key` is over by this worker's
    /// memory, when that covers `token`: a run it stopped on request, or
    /// one it passed on that ended since (the key's counter when Redis
    /// showed that end).
    pub(crate) fn run_ended(&self, key: &str, token: u64) -> Option<u64> {
        let stopped = self.stopped.newest(key);
        let passed_on = self.handed_off.ended_counter(key);
        stopped.max(passed_on).filter(|ended| token <= *ended)
    }

    /// The Redis side of start entry `event` in this worker's inbox.
    fn start_to_record(
        &self,
        node: &NodeInner,
        event: &Event,
        entry: &StartEntry,
    ) -> Result<StartToRecord> {
        let reply = match &entry.reply {
            Some(r) => Some((node.reply_key(&r.node)?, r.request)),
            None => None,
        };
        Ok(StartToRecord {
            key: entry.body.key.clone(),
            token: entry.token,
            worker: self.id.clone(),
            inbox: node.inbox(&self.id)?.key().to_string(),
            entry_id: event.id.clone(),
            reply,
            admitted: entry.admitted,
        })
    }
}

/// What a start that cannot go on without the lease fails with: the entry
/// stays in the inbox, read again once the lease is back.
fn lease_lost() -> Error {
    Error::Unavailable(fred::error::Error::new(
        fred::error::ErrorKind::Timeout,
        "lease lost",
    ))
}

/// What a start entry whose run is held suspended here fails with: the
/// entry stays in the inbox until the resume has settled the run.
fn held_here() -> Error {
    Error::Unavailable(fred::error::Error::new(
        fred::error::ErrorKind::Timeout,
        "its run is held suspended here",
    ))
}

/// What a start entry Redis would not let be claimed while the pool
/// recovers from a loss of its data fails with: the entry stays in the
/// inbox, read again (and claimed) once every running copy has re-asserted.
fn recovering() -> Error {
    Error::Unavailable(fred::error::Error::new(
        fred::error::ErrorKind::Timeout,
        "the pool recovers from a loss of Redis data: claimed once every running copy has re-asserted",
    ))
}

/// Drops a start entry whose key runs elsewhere (or here with a newer
/// token): entry removed, dispatcher told `superseded`.
async fn drop_superseded(node: &NodeInner, start: &StartToRecord) -> Result<()> {
    node.store
        .started(start, Answer::Superseded, node.options.worker_ttl)
        .await?;
    Ok(())
}
