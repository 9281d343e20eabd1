//! The handler each home's worker runs: the one shared user handler behind
//! a per-home key prefix and the home's share of capacity.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use super::capacity::HomeSlots;
use crate::handler::{AtCapacity, Handler, HandlerError, Job, guarded};

/// The job key the shared handler sees for `key` of home `home`.
pub fn home_job_key(home: &str, key: &str) -> String {
    format!("{home}/{key}")
}

/// Splits a key given to a multi-home worker's handler into the home's name
/// and the job key within that home's pool.
///
/// ```
/// use flotilla_pool::multihome::split_home_job_key;
/// assert_eq!(split_home_job_key("eu/order-7"), Some(("eu", "order-7")));
/// assert_eq!(split_home_job_key("plain"), None);
/// ```
pub fn split_home_job_key(key: &str) -> Option<(&str, &str)> {
    key.split_once('/')
}

/// What a home shares with its handler.
#[derive(Debug)]
pub(crate) struct HomeShared {
    pub(crate) name: String,
    pub(crate) slots: HomeSlots,
}

/// Wraps the shared handler for one home.
pub(crate) struct HomeHandler {
    pub(crate) home: Arc<HomeShared>,
    pub(crate) inner: Arc<dyn Handler>,
}

#[async_trait]
impl Handler for HomeHandler {
    async fn start(&self, mut job: Job) -> Result<(), HandlerError> {
        let key = job.key.clone();
        if let Err(full) = self.home.slots.acquire(&key) {
            metrics::counter!("flotilla_multihome_starts_refused_total", "home" => self.home.name.clone())
                .increment(1);
            tracing::debug!(home = %self.home.name, key, running = full.running, allotted = full.allotted, "start refused: home at capacity");
            return Err(Box::new(AtCapacity::new(full.running, full.allotted)));
        }
        job.key = home_job_key(&self.home.name, &key);
        // Caught here (not only by the worker) so that a panic frees the slot.
        match guarded("start", self.inner.start(job)).await {
            Ok(()) => Ok(()),
            Err(message) => {
                self.home.slots.release(&key);
                Err(message.into())
            }
        }
    }

    async fn stop(&self, key: &str) -> Result<(), HandlerError> {
        // Released also when the pool cuts an overrunning stop short (this
        // future is dropped then).
        let _release = ReleaseSlot {
            home: &self.home,
            key,
        };
        guarded("stop", self.inner.stop(&home_job_key(&self.home.name, key)))
            .await
            .map_err(Into::into)
    }

    fn stop_budget(&self) -> Option<std::time::Duration> {
        self.inner.stop_budget()
    }

    async fn notify(&self, key: &str, payload: Bytes) -> Result<(), HandlerError> {
        self.inner
            .notify(&home_job_key(&self.home.name, key), payload)
            .await
    }

    async fn message(&self, key: &str, payload: Bytes) -> Result<(), HandlerError> {
        self.inner
            .message(&home_job_key(&self.home.name, key), payload)
            .await
    }
}

/// Frees a job's capacity slot when dropped.
struct ReleaseSlot<'a> {
    home: &'a HomeShared,
    key: &'a str,
}

impl Drop for ReleaseSlot<'_> {
    fn drop(&mut self) {
        self.home.slots.release(self.key);
    }
}
