//! Recovery when Redis went back in time: restarted from an older snapshot
//! or AOF, or a replica promoted with lost writes. Redis is then neither
//! empty (the data-loss path of `recovering` in `scripts/base.lua` does not
//! fire: the pool's epoch is still there) nor current.
//!
//! Every node notices on its own: a resync of one of its replicas finds the
//! revision in Redis *behind* the replica (`Map::regressions`). It then
//! opens the recovery window (nothing is admitted while it lasts, as after a
//! data loss) and each of its workers reconciles Redis with what it runs:
//! it registers again if Redis forgot it, re-asserts every job it runs or
//! holds suspended (a newer fencing token wins over a stale record), and
//! releases the records that still name it for jobs it no longer runs (a
//! stop or hand-off Redis lost). Starts it already ran and stopped are
//! refused if their entries come back (`crate::tombstones`).

use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::node::NodeInner;
use crate::worker::WorkerInner;

/// Pause between attempts when Redis is not answering yet.
const RETRY: Duration = Duration::from_millis(200);
/// How far back stops are made to stand again after a rollback (a rollback
/// loses seconds of writes, not minutes).
const STOPS_REMEMBERED: Duration = Duration::from_secs(120);

impl NodeInner {
    /// Watches the pool's maps for Redis going back in time and recovers.
    pub(crate) async fn rollback_loop(self: Arc<Self>) {
        let mut watched = [
            self.store.maps.jobs.regressions(),
            self.store.maps.pending.regressions(),
            self.store.maps.workers.regressions(),
            self.store.maps.keepalive.regressions(),
        ];
        loop {
            let changed =
                futures::future::select_all(watched.iter_mut().map(|rx| Box::pin(rx.changed())));
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                (result, _, _) = changed => if result.is_err() { return },
            }
            for rx in &mut watched {
                rx.borrow_and_update();
            }
            tracing::warn!(node = %self.id, "Redis went back in time: recovering");
            self.metrics.rollbacks.increment(1);
            loop {
                match self.recover_from_rollback().await {
                    Ok(()) => {
                        // Redis's older revisions are the current ones now.
                        self.store.maps.jobs.reset_revision_high_water();
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
        }
    }

    /// Opens the recovery window, then reconciles every local worker.
    async fn recover_from_rollback(&self) -> Result<()> {
        self.freshness.invalidate("redis went back in time");
        let opened = self.store.begin_recovery(self.options.worker_ttl).await?;
        tracing::info!(node = %self.id, window = opened.as_str(), "recovery window after a rollback");
        let workers: Vec<Arc<WorkerInner>> =
            self.workers.iter().map(|w| w.value().clone()).collect();
        for worker in workers {
            self.reconcile(&worker).await?;
            self.stops_stand(&worker).await?;
        }
        Ok(())
    }

    /// Makes Redis show what `worker` runs, and nothing else.
    async fn reconcile(&self, worker: &Arc<WorkerInner>) -> Result<()> {
        if !self.store.maps.workers.contains_key(&worker.id) {
            // Registered after the state Redis went back to.
            return self.reregister(&worker.id).await;
        }
        let _guard = worker.ops.write().await;
        self.reassert_all(worker).await?;
        let kept = worker
            .suspended
            .lock()
            .await
            .keys()
            .cloned()
            .collect::<Vec<_>>();
        let stale: Vec<(String, String)> = self
            .store
            .maps
            .jobs
            .snapshot()
            .iter()
            .filter(|(k, v)| {
                crate::store::records::job_owner(v).is_some_and(|(w, _)| w == worker.id)
                    && !worker.jobs.contains_key(*k)
                    && !kept.contains(k)
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (key, record) in stale {
            let status = self.store.release_stale(&key, &record).await?;
            tracing::info!(key, worker = %worker.id, status = status.as_str(), "record of a job not running here after a rollback");
        }
        Ok(())
    }

    /// Makes the stops `worker` carried out lately stand again: Redis may
    /// have lost them, and the older state may show a stopped run under
    /// another (perhaps dead) worker, which a cleanup would start again.
    async fn stops_stand(&self, worker: &WorkerInner) -> Result<()> {
        for (key, token) in worker.stopped.recent(STOPS_REMEMBERED) {
            if worker.jobs.get(&key).is_some_and(|j| j.token > token) {
                continue; // a newer run goes on here
            }
            let status = self.store.stop_stands(&key, token).await?;
            if status == crate::store::StopStands::Removed {
                tracing::info!(key, token, worker = %worker.id, "a stop Redis lost stands again after a rollback");
            }
        }
        Ok(())
    }
}
