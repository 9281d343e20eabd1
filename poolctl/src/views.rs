//! What each read command reports, as serialisable structs: the `--json`
//! schema (documented in README.md; fields are only ever added).

use std::time::Duration;

use flotilla_pool::inspect::{
    self, LockRecord, PayloadSummary, PoolSnapshot, StreamDetail, WorkerRecord,
};
use serde::Serialize;

/// `workers` (also inside `status`).
#[derive(Debug, Serialize)]
pub(crate) struct WorkersView {
    pub(crate) pool: String,
    pub(crate) server_time_ms: u64,
    pub(crate) worker_ttl_ms: u64,
    pub(crate) workers: Vec<WorkerView>,
}

/// One worker.
#[derive(Debug, Serialize)]
pub(crate) struct WorkerView {
    pub(crate) id: String,
    pub(crate) node: String,
    pub(crate) host: String,
    pub(crate) pid: u32,
    pub(crate) created_at_ms: u64,
    pub(crate) age_ms: u64,
    pub(crate) keepalive_ms: Option<u64>,
    pub(crate) keepalive_age_ms: Option<u64>,
    pub(crate) jobs: usize,
    pub(crate) inbox_length: u64,
    /// `active`, `stale`, `cleaning` or `drained`.
    pub(crate) state: &'static str,
    pub(crate) cleanup: Option<CleanupView>,
    /// When the worker was drained (server ms), while it is.
    pub(crate) drained_at_ms: Option<u64>,
}

/// A cleanup claim.
#[derive(Debug, Serialize)]
pub(crate) struct CleanupView {
    pub(crate) worker: String,
    pub(crate) node: String,
    /// `None` when the worker's own node is closing it.
    pub(crate) claimed_at_ms: Option<u64>,
    pub(crate) age_ms: Option<u64>,
}

/// `nodes`.
#[derive(Debug, Serialize)]
pub(crate) struct NodesView {
    pub(crate) pool: String,
    pub(crate) server_time_ms: u64,
    pub(crate) nodes: Vec<NodeView>,
}

/// One node.
#[derive(Debug, Serialize)]
pub(crate) struct NodeView {
    pub(crate) id: String,
    /// `None` until the node's first keep-alive.
    pub(crate) keepalive_ms: Option<u64>,
    pub(crate) keepalive_age_ms: Option<u64>,
    pub(crate) workers: usize,
    pub(crate) jobs: usize,
    pub(crate) reply_stream_length: u64,
    /// The `flotilla-pool` version it runs (`None`: not recorded).
    pub(crate) version: Option<String>,
    /// When it joined (server ms; `None`: not recorded).
    pub(crate) joined_at_ms: Option<u64>,
}

/// `jobs`.
#[derive(Debug, Serialize)]
pub(crate) struct JobsView {
    pub(crate) pool: String,
    pub(crate) server_time_ms: u64,
    pub(crate) jobs: Vec<JobView>,
    /// Jobs that failed too often and are not restarted.
    pub(crate) failed: Vec<FailedJobView>,
}

/// A job that failed for good.
#[derive(Debug, Serialize)]
pub(crate) struct FailedJobView {
    pub(crate) key: String,
    pub(crate) failures: u32,
    pub(crate) failed_at_ms: u64,
    pub(crate) last_error: String,
}

/// One running job.
#[derive(Debug, Serialize)]
pub(crate) struct JobView {
    pub(crate) key: String,
    /// `running`, or `restarting` (waiting out a backoff after a failure).
    pub(crate) state: &'static str,
    /// Consecutive failures before this run (or before the restart).
    pub(crate) failures: u32,
    pub(crate) owner: String,
    pub(crate) token: u64,
    /// First admission, server time (the job's `created_at`).
    pub(crate) created_at_ms: Option<u64>,
    pub(crate) age_ms: Option<u64>,
    pub(crate) payload_size: Option<usize>,
}

/// `job KEY`.
#[derive(Debug, Serialize)]
pub(crate) struct JobDetailView {
    pub(crate) pool: String,
    pub(crate) key: String,
    /// `running`, `restarting`, `pending`, `failed` or `orphaned` (payload
    /// only).
    pub(crate) state: &'static str,
    /// Consecutive failures, when the job failed.
    pub(crate) failures: Option<u32>,
    /// The last run's error, when the job failed.
    pub(crate) last_error: Option<String>,
    /// When a restarting job restarts, or when a failed job failed
    /// (server time).
    pub(crate) failure_at_ms: Option<u64>,
    pub(crate) owner: Option<String>,
    pub(crate) token: Option<u64>,
    pub(crate) created_at_ms: Option<u64>,
    pub(crate) age_ms: Option<u64>,
    pub(crate) payload_size: Option<usize>,
    pub(crate) payload_hex: Option<String>,
    /// The payload as UTF-8 (invalid sequences replaced), when it has one.
    pub(crate) payload_utf8: Option<String>,
    pub(crate) payload_is_utf8: Option<bool>,
    pub(crate) pending: Option<PendingView>,
}

/// `pending`.
#[derive(Debug, Serialize)]
pub(crate) struct PendingListView {
    pub(crate) pool: String,
    pub(crate) server_time_ms: u64,
    pub(crate) pending: Vec<PendingView>,
}

/// One pending dispatch.
#[derive(Debug, Serialize)]
pub(crate) struct PendingView {
    pub(crate) key: String,
    pub(crate) token: u64,
    pub(crate) deadline_ms: u64,
    /// Negative once the deadline passed.
    pub(crate) expires_in_ms: i64,
    pub(crate) dispatcher_node: Option<String>,
    pub(crate) request: Option<u64>,
}

/// `locks`.
#[derive(Debug, Serialize)]
pub(crate) struct LocksView {
    pub(crate) pool: Option<String>,
    pub(crate) server_time_ms: u64,
    pub(crate) locks: Vec<LockView>,
}

/// One lock or leader lease.
#[derive(Debug, Serialize)]
pub(crate) struct LockView {
    pub(crate) key: String,
    pub(crate) name: String,
    pub(crate) hash_tag: Option<String>,
    pub(crate) owner: String,
    pub(crate) host: String,
    pub(crate) pid: u32,
    pub(crate) token: u64,
    pub(crate) acquired_at_ms: u64,
    pub(crate) heartbeat_at_ms: u64,
    pub(crate) heartbeat_age_ms: u64,
    pub(crate) held_for_ms: u64,
    pub(crate) ttl_remaining_ms: u64,
}

/// `streams`.
#[derive(Debug, Serialize)]
pub(crate) struct StreamsView {
    pub(crate) pool: String,
    pub(crate) streams: Vec<StreamView>,
}

/// One stream.
#[derive(Debug, Serialize)]
pub(crate) struct StreamView {
    pub(crate) key: String,
    pub(crate) name: String,
    /// `inbox` (a worker's), `replies` (a node's) or `other`.
    pub(crate) kind: &'static str,
    /// The worker or node it belongs to.
    pub(crate) owner: Option<String>,
    pub(crate) length: u64,
    pub(crate) last_generated_id: String,
    pub(crate) groups: Vec<GroupView>,
}

/// One consumer group.
#[derive(Debug, Serialize)]
pub(crate) struct GroupView {
    pub(crate) name: String,
    pub(crate) consumers: u64,
    pub(crate) pending: u64,
    pub(crate) last_delivered_id: String,
    pub(crate) lag: Option<u64>,
}

/// `placement KEY`.
#[derive(Debug, Serialize)]
pub(crate) struct PlacementView {
    pub(crate) pool: String,
    pub(crate) key: String,
    /// The worker the ring chooses now (`None`: no worker in the ring).
    pub(crate) chosen: Option<String>,
    /// The job's owner now, when it runs.
    pub(crate) current_owner: Option<String>,
    /// Ring members, best first.
    pub(crate) ranking: Vec<RankView>,
    /// Registered workers left out of the ring, and why.
    pub(crate) excluded: Vec<ExcludedView>,
}

/// One ring member's score for the key.
#[derive(Debug, Serialize)]
pub(crate) struct RankView {
    pub(crate) rank: usize,
    pub(crate) worker: String,
    pub(crate) score: u64,
    pub(crate) state: &'static str,
}

/// A worker outside the ring.
#[derive(Debug, Serialize)]
pub(crate) struct ExcludedView {
    pub(crate) worker: String,
    pub(crate) reason: String,
}

/// `pools`.
#[derive(Debug, Serialize)]
pub(crate) struct PoolsView {
    pub(crate) pools: Vec<PoolView>,
}

/// One pool.
#[derive(Debug, Serialize)]
pub(crate) struct PoolView {
    pub(crate) name: String,
    pub(crate) keys: u64,
    pub(crate) nodes: usize,
    pub(crate) workers: usize,
    pub(crate) jobs: usize,
    pub(crate) pending: usize,
    pub(crate) shutting_down: bool,
}

/// `status`.
#[derive(Debug, Serialize)]
pub(crate) struct StatusView {
    pub(crate) pool: String,
    pub(crate) server_time_ms: u64,
    pub(crate) worker_ttl_ms: u64,
    pub(crate) shutdown_requested_by: Option<String>,
    pub(crate) counts: Counts,
    pub(crate) nodes: Vec<NodeView>,
    pub(crate) workers: Vec<WorkerView>,
    pub(crate) pending: Vec<PendingView>,
    pub(crate) cleanups: Vec<CleanupView>,
    pub(crate) locks: Vec<LockView>,
    pub(crate) malformed: Vec<MalformedView>,
}

/// Totals of `status`.
#[derive(Debug, Serialize)]
pub(crate) struct Counts {
    pub(crate) nodes: usize,
    pub(crate) workers: usize,
    pub(crate) active_workers: usize,
    pub(crate) stale_workers: usize,
    pub(crate) cleaning_workers: usize,
    pub(crate) drained_workers: usize,
    pub(crate) jobs: usize,
    pub(crate) pending: usize,
    pub(crate) cleanups: usize,
    pub(crate) payloads: u64,
    /// Events queued in all worker inboxes.
    pub(crate) queued_events: u64,
    pub(crate) locks: usize,
}

impl Counts {
    /// The membership line of `status` and `watch`: nodes, workers by
    /// state, jobs.
    pub(crate) fn membership_line(&self) -> String {
        format!(
            "nodes {}  workers {} ({} active, {} stale, {} cleaning, {} drained)  jobs {}",
            self.nodes,
            self.workers,
            self.active_workers,
            self.stale_workers,
            self.cleaning_workers,
            self.drained_workers,
            self.jobs
        )
    }
}

/// A map field that did not decode.
#[derive(Debug, Serialize)]
pub(crate) struct MalformedView {
    pub(crate) map: &'static str,
    pub(crate) field: String,
    pub(crate) reason: String,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub(crate) fn worker_view(snap: &PoolSnapshot, w: &WorkerRecord, ttl: Duration) -> WorkerView {
    let now = snap.server_time_ms;
    WorkerView {
        id: w.id.clone(),
        node: w.node.clone(),
        host: w.host.clone(),
        pid: w.pid,
        created_at_ms: w.created_at_ms,
        age_ms: now.saturating_sub(w.created_at_ms),
        keepalive_ms: w.keepalive_ms,
        keepalive_age_ms: w.keepalive_age(now).map(ms),
        jobs: w.jobs,
        inbox_length: snap
            .inboxes
            .iter()
            .find(|s| s.owner == w.id)
            .map_or(0, |s| s.length),
        state: w.state(now, ttl).as_str(),
        cleanup: w.cleanup.as_ref().map(|c| cleanup_view(now, c)),
        drained_at_ms: w.drained_at_ms,
    }
}

fn cleanup_view(now: u64, c: &inspect::CleanupClaim) -> CleanupView {
    CleanupView {
        worker: c.worker.clone(),
        node: c.node.clone(),
        claimed_at_ms: c.claimed_at_ms,
        age_ms: c.claimed_at_ms.map(|t| now.saturating_sub(t)),
    }
}

pub(crate) fn workers_view(snap: &PoolSnapshot, ttl: Duration) -> WorkersView {
    WorkersView {
        pool: snap.pool.clone(),
        server_time_ms: snap.server_time_ms,
        worker_ttl_ms: ms(ttl),
        workers: snap
            .workers
            .iter()
            .map(|w| worker_view(snap, w, ttl))
            .collect(),
    }
}

pub(crate) fn node_views(snap: &PoolSnapshot) -> Vec<NodeView> {
    snap.nodes
        .iter()
        .map(|n| NodeView {
            id: n.id.clone(),
            keepalive_ms: n.keepalive_ms,
            keepalive_age_ms: n
                .keepalive_ms
                .map(|k| snap.server_time_ms.saturating_sub(k)),
            workers: snap.workers.iter().filter(|w| w.node == n.id).count(),
            jobs: snap
                .workers
                .iter()
                .filter(|w| w.node == n.id)
                .map(|w| w.jobs)
                .sum(),
            reply_stream_length: snap
                .reply_streams
                .iter()
                .find(|s| s.owner == n.id)
                .map_or(0, |s| s.length),
            version: n.version.clone(),
            joined_at_ms: n.joined_at_ms,
        })
        .collect()
}

pub(crate) fn pending_views(snap: &PoolSnapshot) -> Vec<PendingView> {
    snap.pending
        .iter()
        .map(|p| PendingView {
            key: p.key.clone(),
            token: p.token,
            deadline_ms: p.deadline_ms,
            expires_in_ms: p.deadline_ms as i64 - snap.server_time_ms as i64,
            dispatcher_node: p.dispatcher_node.clone(),
            request: p.request,
        })
        .collect()
}

pub(crate) fn lock_views(locks: &[LockRecord]) -> Vec<LockView> {
    locks
        .iter()
        .map(|l| LockView {
            key: l.key.clone(),
            name: l.info.name.clone(),
            hash_tag: l.hash_tag.clone(),
            owner: l.info.owner_id.clone(),
            host: l.info.host.clone(),
            pid: l.info.pid,
            token: l.info.token,
            acquired_at_ms: l.info.acquired_at_ms,
            heartbeat_at_ms: l.info.heartbeat_at_ms,
            heartbeat_age_ms: ms(l.info.heartbeat_age()),
            held_for_ms: ms(l.info.held_for()),
            ttl_remaining_ms: ms(l.info.ttl_remaining),
        })
        .collect()
}

pub(crate) fn job_view(
    snap: &PoolSnapshot,
    job: &inspect::JobRecord,
    payload: Option<PayloadSummary>,
    failure: Option<&inspect::JobFailure>,
) -> JobView {
    // A record about another run is stale (the job moved on since).
    let failure = failure.filter(|f| f.token == job.token);
    JobView {
        key: job.key.clone(),
        state: match failure.map(|f| f.state) {
            Some(inspect::JobFailureState::Restarting) => "restarting",
            _ => "running",
        },
        failures: failure.map_or(0, |f| f.failures),
        owner: job.owner.clone(),
        token: job.token,
        created_at_ms: payload.map(|p| p.created_at_ms),
        age_ms: payload.map(|p| snap.server_time_ms.saturating_sub(p.created_at_ms)),
        payload_size: payload.map(|p| p.size),
    }
}

pub(crate) fn stream_view(snap: &PoolSnapshot, s: StreamDetail) -> StreamView {
    let (kind, owner) = if let Some(i) = snap.inboxes.iter().find(|i| i.key == s.key) {
        ("inbox", Some(i.owner.clone()))
    } else if let Some(r) = snap.reply_streams.iter().find(|r| r.key == s.key) {
        ("replies", Some(r.owner.clone()))
    } else {
        ("other", None)
    };
    StreamView {
        kind,
        owner,
        length: s.length,
        last_generated_id: s.last_generated_id,
        groups: s
            .groups
            .into_iter()
            .map(|g| GroupView {
                name: g.name,
                consumers: g.consumers,
                pending: g.pending,
                last_delivered_id: g.last_delivered_id,
                lag: g.lag,
            })
            .collect(),
        key: s.key,
        name: s.name,
    }
}

pub(crate) fn placement_view(snap: &PoolSnapshot, key: &str, ttl: Duration) -> PlacementView {
    let ranking: Vec<RankView> = inspect::placement(snap, key)
        .into_iter()
        .enumerate()
        .map(|(i, s)| RankView {
            rank: i + 1,
            state: snap
                .worker(&s.worker)
                .map_or("unknown", |w| w.state(snap.server_time_ms, ttl).as_str()),
            worker: s.worker,
            score: s.score,
        })
        .collect();
    PlacementView {
        pool: snap.pool.clone(),
        key: key.to_string(),
        chosen: ranking.first().map(|r| r.worker.clone()),
        current_owner: snap.job(key).map(|j| j.owner.clone()),
        ranking,
        excluded: snap
            .workers
            .iter()
            .filter_map(|w| {
                let reason = match (&w.cleanup, w.drained_at_ms) {
                    (Some(c), _) => match c.claimed_at_ms {
                        Some(_) => format!("being cleaned up by node {}", c.node),
                        None => format!("its node {} is closing it", c.node),
                    },
                    (None, Some(_)) => "drained".to_string(),
                    (None, None) => return None,
                };
                Some(ExcludedView {
                    worker: w.id.clone(),
                    reason,
                })
            })
            .collect(),
    }
}

pub(crate) fn status_view(snap: &PoolSnapshot, locks: &[LockRecord], ttl: Duration) -> StatusView {
    let workers: Vec<WorkerView> = snap
        .workers
        .iter()
        .map(|w| worker_view(snap, w, ttl))
        .collect();
    let count = |state: &str| workers.iter().filter(|w| w.state == state).count();
    StatusView {
        pool: snap.pool.clone(),
        server_time_ms: snap.server_time_ms,
        worker_ttl_ms: ms(ttl),
        shutdown_requested_by: snap.shutdown_requested_by.clone(),
        counts: Counts {
            nodes: snap.nodes.len(),
            workers: workers.len(),
            active_workers: count("active"),
            stale_workers: count("stale"),
            cleaning_workers: count("cleaning"),
            drained_workers: count("drained"),
            jobs: snap.jobs.len(),
            pending: snap.pending.len(),
            cleanups: snap.cleanups.len(),
            payloads: snap.payloads,
            queued_events: snap.queued_events(),
            locks: locks.len(),
        },
        nodes: node_views(snap),
        pending: pending_views(snap),
        cleanups: snap
            .cleanups
            .iter()
            .map(|c| cleanup_view(snap.server_time_ms, c))
            .collect(),
        locks: lock_views(locks),
        malformed: snap
            .malformed
            .iter()
            .map(|m| MalformedView {
                map: m.map,
                field: m.field.clone(),
                reason: m.reason.clone(),
            })
            .collect(),
        workers,
    }
}
