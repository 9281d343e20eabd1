//! Rebalance: when the set of active workers changes, each worker hands
//! off the jobs that now hash elsewhere — stop locally first, then one
//! script moves ownership and enqueues the start at the new owner. The job
//! is never owned by two workers: handoff is at-most-once.

use std::sync::Arc;
use std::time::Duration;

use crate::handler::guarded;
use crate::lease::{Reassert, Restart};
use crate::node::NodeInner;
use crate::worker::WorkerInner;

/// Wait after a ring change before moving jobs, so that a burst of joins
/// moves each job once.
const SETTLE: Duration = Duration::from_millis(100);

impl NodeInner {
    pub(crate) async fn rebalance_loop(self: Arc<Self>) {
        let mut version = self.ring_version.subscribe();
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                r = version.changed() => if r.is_err() { return },
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
            self.rebalance().await;
        }
    }

    /// Hands off every local job whose ring owner is another worker.
    pub(crate) async fn rebalance(&self) {
        let workers: Vec<Arc<WorkerInner>> =
            self.workers.iter().map(|w| w.value().clone()).collect();
        for worker in workers {
            let ring = self.ring.load_full();
            if !ring.contains(&worker.id) {
                continue; // leaving or being cleaned: not ours to move
            }
            let moving: Vec<String> = worker
                .jobs
                .iter()
                .filter(|e| ring.owner(e.key()).is_some_and(|o| o != worker.id))
                .map(|e| e.key().clone())
                .collect();
            if moving.is_empty() {
                continue;
            }
            tracing::info!(worker = %worker.id, jobs = moving.len(), "rebalancing");
            for key in moving {
                if worker.cancel.is_cancelled() {
                    break;
                }
                self.hand_off_local(&worker, &key).await;
            }
        }
    }

    pub(crate) async fn hand_off_local(&self, worker: &Arc<WorkerInner>, key: &str) {
        let _ops = worker.ops.read().await;
        let _key = worker.lock_key(key).await;
        let Some((_, job)) = worker.jobs.remove(key) else {
            return;
        };
        if let Err(e) = guarded("stop", worker.handler.stop(key)).await {
            tracing::warn!(key, error = %e, "handler stop failed during handoff; moving anyway");
        }
        for _ in 0..3 {
            let ring = self.ring.load_full();
            let Some(target) = ring.owner(key).map(str::to_string) else {
                break;
            };
            if target == worker.id {
                break;
            }
            match self.handoff(key, &worker.id, &target).await {
                Ok(s) if s == "ok" => return,
                Ok(s) if s == "not_owner" => {
                    // Nobody may own it any more because Redis lost its
                    // data (before this node re-asserted): take it back and
                    // run it here again rather than lose it. If another
                    // worker owns it, it moved: forget it.
                    match self.reassert(worker, key, &job, Reassert::Running).await {
                        Ok(s) if s == "ok" => break,
                        Ok(_) => return,
                        Err(e) => {
                            tracing::warn!(key, error = %e, "re-asserting after a refused handoff failed");
                            break;
                        }
                    }
                }
                Ok(_) => self.refresh_ring(),
                Err(e) => {
                    tracing::warn!(key, error = %e, "handoff failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        // Could not move it: run it here again, with a new token.
        match self.restart_owned(worker, key, job).await {
            Ok(Restart::Started) | Ok(Restart::Moved) => {}
            Ok(Restart::StartFailed(e)) => {
                tracing::warn!(key, error = %e, "restart after failed handoff refused; requeueing");
                self.requeue_job(key, &worker.id).await;
            }
            Err(e) => {
                tracing::warn!(key, error = %e, "restart after failed handoff failed; cleanup will requeue");
            }
        }
    }
}
