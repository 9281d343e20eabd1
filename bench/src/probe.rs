//! A no-op job handler that records when each job started, and latency
//! histograms.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dashmap::DashMap;
use flotilla_pool::{Handler, HandlerError, Job};
use hdrhistogram::Histogram;

use crate::BoxError;

/// Job key → an instant, hashed with foldhash: the benchmark's own
/// bookkeeping runs once or twice per dispatch inside the measured process,
/// and SipHash over `String` keys cost a few percent of its CPU samples.
pub type Stamps = DashMap<String, Instant, foldhash::fast::RandomState>;

/// An empty [`Stamps`] with room for `capacity` keys.
pub fn stamps(capacity: usize) -> Stamps {
    DashMap::with_capacity_and_hasher(capacity, foldhash::fast::RandomState::default())
}

/// Records the instant of the latest start of every key.
#[derive(Clone)]
pub struct Probe {
    /// Job key → when `start` was last called for it here.
    pub started: Arc<Stamps>,
    /// Number of `start` calls.
    pub starts: Arc<AtomicU64>,
    /// Number of `stop` calls.
    pub stops: Arc<AtomicU64>,
}

#[async_trait]
impl Handler for Probe {
    async fn start(&self, job: Job) -> Result<(), HandlerError> {
        self.started.insert(job.key, Instant::now());
        self.starts.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn stop(&self, _key: &str) -> Result<(), HandlerError> {
        self.stops.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

impl Default for Probe {
    fn default() -> Self {
        Probe {
            started: Arc::new(stamps(0)),
            starts: Arc::default(),
            stops: Arc::default(),
        }
    }
}

impl Probe {
    /// When `key` was last started here.
    pub fn started_at(&self, key: &str) -> Option<Instant> {
        self.started.get(key).map(|at| *at)
    }
}

/// A histogram of durations in nanoseconds (1 ns … 10 min, 3 digits).
pub fn histogram() -> Result<Histogram<u64>, BoxError> {
    Ok(Histogram::new_with_bounds(1, 600_000_000_000, 3)?)
}

/// Records a duration.
pub fn record(h: &mut Histogram<u64>, d: Duration) {
    h.saturating_record(d.as_nanos().max(1) as u64);
}

/// A quantile in milliseconds.
pub fn quantile_ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1e6
}
