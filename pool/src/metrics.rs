//! The pool's metrics, registered once per node with a `pool` label (so
//! one process can serve several pools) through the `metrics` facade. The
//! catalogue is in the pool README ("Metrics").

use metrics::{Counter, Gauge, Histogram, counter, gauge, histogram};

/// Handles of every pool metric, labelled with the node's pool.
pub(crate) struct PoolMetrics {
    pub(crate) dispatch_ok: Counter,
    pub(crate) dispatch_exists: Counter,
    pub(crate) dispatch_recent: Counter,
    pub(crate) dispatch_error: Counter,
    pub(crate) dispatch_seconds: Histogram,
    pub(crate) jobs_started: Counter,
    pub(crate) jobs_stopped: Counter,
    pub(crate) jobs_finished: Counter,
    pub(crate) job_failures: Counter,
    pub(crate) jobs_failed: Counter,
    pub(crate) job_restarts: Counter,
    pub(crate) start_claims: Counter,
    pub(crate) start_failed: Counter,
    pub(crate) dead_letters: Counter,
    pub(crate) stop_overruns: Counter,
    pub(crate) nodes_joined: Counter,
    pub(crate) workers_joined: Counter,
    pub(crate) handoffs: Counter,
    pub(crate) dead_workers: Counter,
    pub(crate) requeued: Counter,
    pub(crate) orphans_requeued: Counter,
    pub(crate) malformed_records: Counter,
    pub(crate) lease_lost: Counter,
    pub(crate) lease_stop_seconds: Histogram,
    pub(crate) rollbacks: Counter,
    pub(crate) jobs_running: Gauge,
    pub(crate) jobs_restarting: Gauge,
    pub(crate) jobs_suspended: Gauge,
    pub(crate) workers: Gauge,
}

impl PoolMetrics {
    pub(crate) fn new(pool: &str) -> Self {
        let p = pool.to_string();
        let dispatch = |outcome: &'static str| counter!("flotilla_pool_dispatch_total", "pool" => p.clone(), "outcome" => outcome);
        macro_rules! c {
            ($name:literal) => {
                counter!($name, "pool" => p.clone())
            };
        }
        PoolMetrics {
            dispatch_ok: dispatch("ok"),
            dispatch_exists: dispatch("exists"),
            dispatch_recent: dispatch("recent"),
            dispatch_error: dispatch("error"),
            dispatch_seconds: histogram!("flotilla_pool_dispatch_seconds", "pool" => p.clone()),
            jobs_started: c!("flotilla_pool_jobs_started_total"),
            jobs_stopped: c!("flotilla_pool_jobs_stopped_total"),
            jobs_finished: c!("flotilla_pool_jobs_finished_total"),
            job_failures: c!("flotilla_pool_job_failures_total"),
            jobs_failed: c!("flotilla_pool_jobs_failed_total"),
            job_restarts: c!("flotilla_pool_job_restarts_total"),
            start_claims: c!("flotilla_pool_start_claims_total"),
            start_failed: c!("flotilla_pool_start_failed_total"),
            dead_letters: c!("flotilla_pool_dead_letters_total"),
            stop_overruns: c!("flotilla_pool_stop_overruns_total"),
            nodes_joined: c!("flotilla_pool_nodes_joined_total"),
            workers_joined: c!("flotilla_pool_workers_joined_total"),
            handoffs: c!("flotilla_pool_handoffs_total"),
            dead_workers: c!("flotilla_pool_dead_workers_total"),
            requeued: c!("flotilla_pool_requeued_total"),
            orphans_requeued: c!("flotilla_pool_orphans_requeued_total"),
            malformed_records: c!("flotilla_pool_malformed_records_total"),
            lease_lost: c!("flotilla_pool_lease_lost_total"),
            lease_stop_seconds: histogram!("flotilla_pool_lease_stop_seconds", "pool" => p.clone()),
            rollbacks: c!("flotilla_pool_rollbacks_total"),
            jobs_running: gauge!("flotilla_pool_jobs_running", "pool" => p.clone()),
            jobs_restarting: gauge!("flotilla_pool_jobs_restarting", "pool" => p.clone()),
            jobs_suspended: gauge!("flotilla_pool_jobs_suspended", "pool" => p.clone()),
            workers: gauge!("flotilla_pool_workers", "pool" => p.clone()),
        }
    }
}
