//! Start recorder: records the starts of fresh entries in batches.
//!
//! A worker's lane that started a job from a fresh entry (see
//! `freshness.rs`) hands the start to the node's recorder and waits for its
//! outcome. The recorder runs `record_starts.lua` for every start queued
//! while its previous calls were in flight, so under load one script call,
//! one `XDEL` per inbox and one reply entry per dispatcher serve many jobs;
//! alone, a start is recorded at once, as before (one call, no added wait).
//!
//! ```text
//! lane ──start──▶ queue ──▶ record_batches ──PoolStore::record_starts (N)──▶ Redis
//!  ▲                               │
//!  └──────── outcome per start ◀───┘
//! ```

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::batch::{BatchQueue, Batcher};
use crate::store::{PoolStore, StartKept, StartToRecord};

/// Starts recorded by one script call at most.
const MAX_BATCH: usize = 128;

/// The node's start recorder.
pub(crate) type StartRecorder = Batcher<StartToRecord, StartKept>;

/// Records queued starts, one batch per script call, until `cancel` fires.
pub(crate) async fn record_batches(
    store: PoolStore,
    cancel: CancellationToken,
    worker_ttl: Duration,
    queue: BatchQueue<StartToRecord, StartKept>,
) {
    let sizes = metrics::histogram!(
        "flotilla_pool_batch_size", "pool" => store.pool.to_string(), "call" => "record_starts"
    );
    let store = Arc::new(store);
    queue
        .run("record_starts", sizes, &cancel, MAX_BATCH, |starts| {
            let store = store.clone();
            Box::pin(async move { store.record_starts(starts, worker_ttl).await })
        })
        .await;
}
