//! Stopping a job on request, from a worker's inbox: the run the stop was
//! sent for (and, for a stop of one dispatch, that dispatch) is stopped
//! here, a newer run or another dispatch's is left going on, and the stop
//! is recorded in Redis and answered (`stopped.lua`).

use flotilla_streaming::Event;

use crate::codec::{self, KeyedRequest};
use crate::error::Result;
use crate::lanes::StopFor;
use crate::node::NodeInner;
use crate::worker::{LocalJob, WorkerInner};

impl WorkerInner {
    #[tracing::instrument(name = "stop", level = "debug", skip_all, fields(worker = %self.id, key = %req.key))]
    pub(crate) async fn on_stop(
        &self,
        node: &NodeInner,
        event: &Event,
        req: KeyedRequest,
        target: StopFor,
    ) -> Result<()> {
        // A stop sent for an older run of the key (read again after Redis
        // went back in time, or moved here by a cleanup), or for another
        // dispatch of it (routed by an older dispatch's payload that a
        // rollback brought back), leaves the run here alone; stopped.lua
        // answers `retry` for it.
        let spared = |job: &LocalJob| {
            target.run.is_some_and(|t| job.token > t)
                || target.dispatch.is_some_and(|d| {
                    codec::stamp_is_exact(job.admitted) && codec::stamp_us(job.admitted) != d
                })
        };
        // Whether the run went on under a lease that held: nobody can have
        // moved it then (read before the stop, which may outlast it).
        let lease_held = self.holds_lease(node);
        let local = self.jobs.get(&req.key).map(|j| (j.token, spared(&j)));
        let suspended = (self.suspended.lock().await.get(&req.key)).map(|j| (j.token, spared(j)));
        let kept = local.filter(|j| j.1).or(suspended.filter(|j| j.1));
        if let Some((kept, _)) = kept {
            tracing::info!(worker = %self.id, key = %req.key, ?target, kept, "stop sent for an older run or another dispatch; the run here goes on");
        } else {
            self.stop_local(&req.key).await;
        }
        let (local, suspended) = (local.map(|j| j.0), suspended.map(|j| j.0));
        let held = local.or(suspended);
        let held_past_lease = held.is_some() && !(local.is_some() && lease_held);
        self.record_stop(
            node,
            event,
            &req,
            (held, held_past_lease),
            target,
            kept.map(|j| j.0),
        )
        .await
    }

    /// Stops the local run of `key` (running or suspended).
    async fn stop_local(&self, key: &str) {
        self.lifecycle.forget(key);
        if let Some((_, job)) = self.jobs.remove(key) {
            self.stopped.record_dispatch(key, job.token, job.admitted);
            if let Err(e) = self.stop_handler(key).await {
                tracing::warn!(worker = %self.id, key, error = %e, "handler stop failed; job dropped anyway");
            }
        }
        let held = self.suspended.lock().await.remove(key);
        if let Some(job) = held {
            // Its stop may still run: the lease watchdog moves each job to
            // the suspended set as its stop begins, and holds the lease
            // transition lock until all its stops have ended. Answered only
            // after, or the caller may start the key elsewhere while it
            // still stops here (I1).
            if let Some(node) = self.node() {
                drop(node.lease_transition.lock().await);
            }
            self.stopped.record_dispatch(key, job.token, job.admitted);
        }
    }

    /// Records a handled stop request in Redis and answers its sender.
    async fn record_stop(
        &self,
        node: &NodeInner,
        event: &Event,
        req: &KeyedRequest,
        (held, held_past_lease): (Option<u64>, bool),
        target: StopFor,
        kept: Option<u64>,
    ) -> Result<()> {
        let reply = match &req.reply {
            Some(r) => Some((node.reply_key(&r.node)?, r.request)),
            None => None,
        };
        let inbox = node.inbox(&self.id)?;
        node.store
            .stopped(crate::store::StopDone {
                key: &req.key,
                worker: &self.id,
                inbox: inbox.key(),
                entry_id: &event.id,
                reply: reply
                    .as_ref()
                    .map(|(stream, request)| (stream.as_str(), *request)),
                held,
                held_past_lease,
                worker_ttl: node.options.worker_ttl,
                target: target.run,
                kept,
                dispatch: target.dispatch,
            })
            .await?;
        node.metrics.jobs_stopped.increment(1);
        node.history.count(crate::history::PoolEvent::Stop);
        Ok(())
    }
}
