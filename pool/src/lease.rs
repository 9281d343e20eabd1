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
use std::time::Duration;

use fred::types::Value;
use tokio::time::Instant;

use crate::codec;
use crate::error::Result;
use crate::handler::{Job, guarded};
use crate::node::NodeInner;
use crate::options::LeasePolicy;
use crate::worker::{LocalJob, WorkerInner};

impl NodeInner {
    pub(crate) async fn keepalive_loop(self: Arc<Self>) {
        let period = self.options.worker_ttl / 3;
        let mut last_ok = Instant::now();
        let mut suspended = false;
        let mut next = Instant::now() + period;
        loop {
            let lease_deadline = last_ok + self.options.lease_stop_after;
            tokio::select! {
                // After a long pause both timers are due: the lease check
                // must come first, or a renewal would count the pause as
                // covered and jobs that a cleaner is moving would keep
                // running here.
                biased;
                _ = self.cancel.cancelled() => return,
                _ = tokio::time::sleep_until(lease_deadline), if !suspended => {
                    self.freshness.invalidate("lease lapsed");
                    if self.options.lease_policy == LeasePolicy::StopJobs && !self.workers.is_empty() {
                        tracing::warn!(node = %self.id, since = ?last_ok.elapsed(), "lease lost: stopping local jobs");
                        metrics::counter!("flotilla_pool_lease_lost_total").increment(1);
                        self.suspend_all().await;
                    }
                    suspended = true;
                }
                _ = tokio::time::sleep_until(next) => {
                    next = Instant::now() + period;
                    let sent = Instant::now();
                    // Never wait on a renewal past the lease deadline.
                    let budget = period
                        .min((last_ok + self.options.lease_stop_after).saturating_duration_since(sent))
                        .max(Duration::from_millis(1));
                    match tokio::time::timeout(budget, self.renew()).await {
                        Ok(Ok((server_ms, unknown))) => {
                            if sent.saturating_duration_since(last_ok) >= self.options.lease_stop_after {
                                self.freshness.invalidate("lease gap");
                            }
                            self.freshness.server_time(server_ms, sent);
                            last_ok = sent;
                            *self.last_renewal.lock().unwrap_or_else(|e| e.into_inner()) = sent;
                            for worker in unknown {
                                if let Err(e) = self.reregister(&worker).await {
                                    tracing::warn!(worker, error = %e, "re-registering worker failed");
                                }
                            }
                            if suspended {
                                suspended = false;
                                self.resume_all().await;
                            }
                        }
                        Ok(Err(e)) => tracing::warn!(node = %self.id, error = %e, "keep-alive failed"),
                        Err(_) => tracing::warn!(node = %self.id, "keep-alive timed out"),
                    }
                }
            }
        }
    }

    /// Renews the node's and its workers' keep-alives. Returns Redis server
    /// time (ms) and the local workers Redis does not know.
    async fn renew(&self) -> Result<(u64, Vec<String>)> {
        let ka = self.maps.keepalive.keys_info();
        let nodes = self.maps.nodes.keys_info();
        let mut keys = self.maps.base_keys();
        keys.extend([
            ka.hash.clone(),
            ka.revision.clone(),
            nodes.hash.clone(),
            nodes.revision.clone(),
        ]);
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(ka.channel.clone()),
            Value::from(nodes.channel.clone()),
            Value::from(self.id.as_str()),
            Value::from(self.options.worker_ttl.as_millis().to_string()),
        ]);
        args.extend(self.workers.iter().map(|w| Value::from(w.key().as_str())));
        let reply: Vec<Value> = self.scripts.keepalive.run(&self.client, keys, args).await?;
        let server_ms = reply
            .first()
            .and_then(|v| v.as_string())
            .and_then(|s| s.parse().ok())
            .unwrap_or_default();
        let unknown = reply
            .into_iter()
            .skip(1)
            .filter_map(|v| v.as_string())
            .collect();
        Ok((server_ms, unknown))
    }

    /// Registers a worker Redis forgot and re-asserts its jobs: those nobody
    /// else took keep running (after data loss), the others stop here.
    pub(crate) async fn reregister(&self, id: &str) -> Result<()> {
        let Some(worker) = self.workers.get(id).map(|w| w.value().clone()) else {
            return Ok(());
        };
        tracing::warn!(worker = id, "worker unknown to redis: registering again");
        self.freshness.invalidate("re-registered");
        self.register_worker(id).await?;
        let _guard = worker.ops.write().await;
        let running: Vec<(String, LocalJob)> = worker
            .jobs
            .iter()
            .map(|e| (e.key().clone(), e.value().clone()))
            .collect();
        for (key, job) in running {
            if self
                .reassert(&worker, &key, &job, Reassert::Running)
                .await?
                != "ok"
            {
                tracing::info!(
                    key,
                    worker = id,
                    "job moved while we were away; stopping it here"
                );
                let _ = guarded("stop", worker.handler.stop(&key)).await;
                worker.jobs.remove(&key);
            }
        }
        // Jobs suspended on lease loss come back too if nobody took them;
        // while the pool recovers from a data loss they are left to the
        // orphan sweep instead (see `scripts/reassert.lua`).
        let suspended: Vec<(String, LocalJob)> = worker.suspended.lock().await.drain().collect();
        for (key, job) in suspended {
            match self
                .reassert(&worker, &key, &job, Reassert::Suspended)
                .await?
                .as_str()
            {
                "ok" => {
                    worker.suspended.lock().await.insert(key, job);
                }
                "orphaned" => {
                    tracing::info!(key, worker = id, "suspended job left to the orphan sweep");
                }
                _ => {}
            }
        }
        Ok(())
    }

    pub(crate) async fn reassert(
        &self,
        worker: &WorkerInner,
        key: &str,
        job: &LocalJob,
        state: Reassert,
    ) -> Result<String> {
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(key),
            Value::from(worker.id.as_str()),
            Value::from(job.token.to_string()),
            Value::Bytes(codec::stored(job.created_at_ms, &job.raw_body)),
            Value::from(match state {
                Reassert::Running => "running",
                Reassert::Suspended => "suspended",
            }),
            Value::from(self.options.worker_ttl.as_millis().to_string()),
        ]);
        self.scripts
            .reassert
            .run(&self.client, self.maps.base_keys(), args)
            .await
    }

    /// Stops every local job, remembering them to resume later.
    async fn suspend_all(&self) {
        let workers: Vec<Arc<WorkerInner>> =
            self.workers.iter().map(|w| w.value().clone()).collect();
        for worker in workers {
            // No ops lock here: the worker's loop may be blocked on the very
            // Redis that is unreachable, and the jobs must stop now.
            worker
                .lease_lost
                .store(true, std::sync::atomic::Ordering::Release);
            let keys: Vec<String> = worker.jobs.iter().map(|e| e.key().clone()).collect();
            for key in keys {
                if let Some((_, job)) = worker.jobs.remove(&key) {
                    if let Err(e) = guarded("stop", worker.handler.stop(&key)).await {
                        tracing::warn!(key, error = %e, "handler stop failed on lease loss");
                    }
                    worker.suspended.lock().await.insert(key, job);
                }
            }
        }
    }

    /// Restarts suspended jobs that are still ours, with new tokens.
    pub(crate) async fn resume_all(&self) {
        let workers: Vec<Arc<WorkerInner>> =
            self.workers.iter().map(|w| w.value().clone()).collect();
        for worker in workers {
            let _guard = worker.ops.write().await;
            worker
                .lease_lost
                .store(false, std::sync::atomic::Ordering::Release);
            let suspended: Vec<(String, LocalJob)> =
                worker.suspended.lock().await.drain().collect();
            for (key, job) in suspended {
                match self.restart_owned(&worker, &key, job.clone()).await {
                    Ok(Restart::Started) => {}
                    Ok(Restart::Moved) => {
                        tracing::info!(key, "job moved during lease loss; forgetting it");
                    }
                    Ok(Restart::StartFailed(e)) => {
                        // Still recorded as ours but not running: hand it to
                        // another worker for a fresh start.
                        tracing::warn!(key, error = %e, "restart after lease loss failed; requeueing");
                        self.requeue_job(&key, &worker.id).await;
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
        let mut keys = self.maps.base_keys();
        keys.push(self.maps.cleanup.keys_info().hash.clone());
        let mut args = self.maps.base_args();
        args.extend([Value::from(key), Value::from(worker.id.as_str())]);
        let token: Option<u64> = self.scripts.resume.run(&self.client, keys, args).await?;
        let Some(token) = token else {
            return Ok(Restart::Moved);
        };
        let run = Job {
            key: key.to_string(),
            payload: job.payload.clone(),
            created_at: std::time::SystemTime::UNIX_EPOCH
                + Duration::from_millis(job.created_at_ms),
            fencing_token: token,
        };
        match guarded("start", worker.handler.start(run)).await {
            Ok(()) => {
                worker
                    .jobs
                    .insert(key.to_string(), LocalJob { token, ..job });
                Ok(Restart::Started)
            }
            Err(e) => Ok(Restart::StartFailed(e)),
        }
    }
}

/// Whether a re-asserted job runs here or was suspended on lease loss.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Reassert {
    Running,
    Suspended,
}

/// Outcome of [`NodeInner::restart_owned`].
pub(crate) enum Restart {
    /// Running again here with a new token.
    Started,
    /// The job belongs to another worker now; nothing to do here.
    Moved,
    /// The handler refused; the job is still recorded as ours.
    StartFailed(String),
}
