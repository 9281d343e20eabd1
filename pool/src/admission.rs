//! Admission: the node's dispatches admitted in batches.
//!
//! `dispatch_job` hands its admission to the node's admitter and waits for
//! its answer; the admitter runs `admit.lua` once for every admission
//! queued while its previous calls were in flight (see [`crate::batch`]), so
//! under load one script call and one pending-map message serve many jobs,
//! and alone an admission goes out at once. Each admission is decided as
//! if it had its own call (I3: two admissions of one key in one batch, the
//! second finds the first).
//!
//! ```text
//! dispatch ──Admission──▶ admitter ──▶ admit_batches ──PoolStore::admit (N)──▶ Redis
//!     ▲                                      │
//!     └──────────── Admitted per job ◀───────┘
//! ```

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::batch::{BatchQueue, Batcher};
use crate::store::{Admission, AdmitLimits, Admitted, PoolStore};

/// Admissions made by one script call at most.
const MAX_BATCH: usize = 128;

/// The node's admitter.
pub(crate) type Admitter = Batcher<Admission, Admitted>;

/// Admits queued dispatches, one batch per script call, until `cancel`
/// fires.
pub(crate) async fn admit_batches(
    store: PoolStore,
    cancel: CancellationToken,
    limits: AdmitLimits,
    queue: BatchQueue<Admission, Admitted>,
) {
    let sizes = metrics::histogram!(
        "flotilla_pool_batch_size", "pool" => store.pool.to_string(), "call" => "admit"
    );
    let shared = Arc::new((store, limits));
    queue
        .run("admit", sizes, &cancel, MAX_BATCH, |admissions| {
            let shared = shared.clone();
            Box::pin(async move {
                let (store, limits) = &*shared;
                store.admit(limits, admissions).await
            })
        })
        .await;
}
