//! What a node can tell of the pool: its registered workers and its
//! running jobs, from the node's replicas where it mirrors the jobs map
//! (`NodeOptions::mirror_jobs`, off by default), otherwise from its own
//! workers and Redis.

use crate::error::Result;
use crate::node::Node;
use crate::store::records::{WorkerEntry, job_owner};

/// A worker of the pool as registered in Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerInfo {
    /// Worker id.
    pub id: String,
    /// Node hosting the worker.
    pub node: String,
    /// Host name of that node's process.
    pub host: String,
    /// Process id of that node's process.
    pub pid: u32,
    /// Registration time, Redis server time in ms.
    pub created_at_ms: u64,
    /// Last keep-alive, Redis server time in ms.
    pub keepalive_ms: Option<u64>,
    /// Whether a cleanup of this worker is under way (it was found dead).
    pub cleaning: bool,
    /// Whether the worker is drained ([`Node::drain_worker`]): out of the
    /// ring, its jobs moving or moved to other workers.
    pub drained: bool,
    /// Jobs it owns.
    pub jobs: usize,
}

impl Node {
    /// Every worker registered in the pool, from this node's replicas. A
    /// worker's job count comes from the jobs map's replica where this node
    /// mirrors it ([`NodeOptions::mirror_jobs`](crate::NodeOptions::mirror_jobs));
    /// by default only this node's workers have a count (the others show 0).
    pub fn pool_workers(&self) -> Vec<WorkerInfo> {
        let maps = &self.inner.store.maps;
        let mut counts = std::collections::HashMap::<String, usize>::new();
        match &maps.jobs {
            Some(jobs) => {
                for (_, v) in jobs.snapshot().iter() {
                    if let Some((owner, _)) = job_owner(v) {
                        *counts.entry(owner.to_string()).or_default() += 1;
                    }
                }
            }
            None => {
                for w in self.inner.workers.iter() {
                    counts.insert(w.key().clone(), w.value().jobs.len());
                }
            }
        }
        let cleanup = maps.cleanup.snapshot();
        let keepalive = maps.keepalive.snapshot();
        let mut out: Vec<WorkerInfo> = maps
            .workers
            .snapshot()
            .iter()
            .map(|(id, raw)| {
                let info = WorkerEntry::parse(raw).unwrap_or_default();
                WorkerInfo {
                    id: id.clone(),
                    node: info.node.unwrap_or_default(),
                    host: info.host,
                    pid: info.pid,
                    created_at_ms: info.created_at_ms.unwrap_or_default(),
                    keepalive_ms: keepalive.get(id).and_then(|v| v.parse().ok()),
                    cleaning: cleanup.contains_key(id),
                    drained: info.drained_at_ms.is_some(),
                    jobs: counts.get(id).copied().unwrap_or(0),
                }
            })
            .collect();
        out.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        out
    }

    /// Keys of the jobs this node's workers run; on a node that mirrors
    /// the jobs map ([`NodeOptions::mirror_jobs`](crate::NodeOptions::mirror_jobs),
    /// off by default), of every job running in the pool, from that replica.
    /// See [`lookup_job_keys`](Self::lookup_job_keys) for the pool's from
    /// Redis.
    pub fn job_keys(&self) -> Vec<String> {
        match &self.inner.store.maps.jobs {
            Some(jobs) => jobs.keys(),
            None => self
                .inner
                .workers
                .iter()
                .flat_map(|w| {
                    w.value()
                        .jobs
                        .iter()
                        .map(|j| j.key().clone())
                        .collect::<Vec<_>>()
                })
                .collect(),
        }
    }

    /// The owner and fencing token of a job this node's workers run; on a
    /// node that mirrors the jobs map
    /// ([`NodeOptions::mirror_jobs`](crate::NodeOptions::mirror_jobs), off by
    /// default), of any running job, from that replica. See
    /// [`lookup_job_owner`](Self::lookup_job_owner) for any job from Redis.
    pub fn job_owner(&self, key: &str) -> Option<(String, u64)> {
        match &self.inner.store.maps.jobs {
            Some(jobs) => {
                let v = jobs.get(key)?;
                job_owner(&v).map(|(w, t)| (w.to_string(), t))
            }
            None => self.inner.workers.iter().find_map(|w| {
                let token = w.value().jobs.get(key)?.token;
                Some((w.key().clone(), token))
            }),
        }
    }

    /// The owner and fencing token of a running job, as Redis has it now
    /// (one `HGET`, whether or not this node mirrors the jobs map).
    ///
    /// # Errors
    /// [`Error::Unavailable`](crate::Error::Unavailable) when Redis does not answer within
    /// `redis_timeout`; [`Error::Malformed`](crate::Error::Malformed) for a record that does not
    /// parse.
    pub async fn lookup_job_owner(&self, key: &str) -> Result<Option<(String, u64)>> {
        self.inner.store.job_owner(key).await
    }

    /// Keys of every job running in the pool, as Redis has them now (an
    /// `HSCAN` of the jobs map, whether or not this node mirrors it: cost
    /// grows with the pool).
    ///
    /// # Errors
    /// [`Error::Unavailable`](crate::Error::Unavailable) when Redis does not answer within
    /// `redis_timeout`.
    pub async fn lookup_job_keys(&self) -> Result<Vec<String>> {
        self.inner.store.job_keys().await
    }
}
