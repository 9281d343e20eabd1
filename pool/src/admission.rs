//! Admission: the node's dispatches admitted in batches.
//!
//! `dispatch_job` hands its admission to the node's admitter and waits for
//! its answer; the admitter runs `admit.lua` once for every admission
//! queued while its previous calls were in flight (see [`crate::batch`]), so
//! under load one script call and one pending-map message serve many jobs,
//! and alone an admission goes out at once. Each admission is decided as
//! if it had its own call (I3: two admissions of one key in one batch, the
//! second finds the first).

use std::sync::Arc;

use bytes::Bytes;
use fred::types::Value;

use crate::batch::{BatchKeys, BatchQueue, Batcher};
use crate::error::Result;
use crate::node::NodeInner;

/// Admissions made by one script call at most.
const MAX_BATCH: usize = 128;

/// One job to admit.
#[derive(Debug, Clone)]
pub(crate) struct Admission {
    pub(crate) key: String,
    /// The encoded job body.
    pub(crate) body: Bytes,
    /// The ring owner the start entry goes to.
    pub(crate) owner: String,
    /// The owner's inbox stream key.
    pub(crate) inbox: String,
    /// The dispatcher's request id (its reply comes back with it).
    pub(crate) request: u64,
    /// The key's idempotency marker, and its window in ms (0: none).
    pub(crate) marker: String,
    pub(crate) window_ms: u64,
    /// A schedule's dispatch: leader token, job set and lock keys.
    pub(crate) schedule: Option<(u64, String, String)>,
}

/// The node's admitter: status and the rest of `admit.lua`'s reply.
pub(crate) type Admitter = Batcher<Admission, (String, Vec<Value>)>;

impl NodeInner {
    /// Admits queued dispatches, one batch per script call, until the node
    /// closes.
    pub(crate) async fn admission_loop(
        self: Arc<Self>,
        queue: BatchQueue<Admission, (String, Vec<Value>)>,
    ) {
        queue
            .run("admit", &self.cancel, MAX_BATCH, |admissions| {
                let me = self.clone();
                Box::pin(async move { me.admit(admissions).await })
            })
            .await;
    }

    /// One `admit.lua` call for `admissions`; one reply per admission.
    pub(crate) async fn admit(
        &self,
        admissions: &[Admission],
    ) -> Result<Vec<(String, Vec<Value>)>> {
        let mut fixed = self.maps.base_keys();
        fixed.push(self.maps.cleanup.keys_info().hash.clone());
        let mut keys = BatchKeys::new(fixed);
        let pending_ttl =
            (self.options.dispatch_timeout + self.options.ack_grace).as_millis() as u64;
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(self.id.as_str()),
            Value::from(self.options.max_queued_jobs.to_string()),
            Value::from(pending_ttl.to_string()),
            Value::from(crate::dispatch::INBOX_MAXLEN.to_string()),
            Value::from(self.options.worker_ttl.as_millis().to_string()),
            Value::from(self.jobs_revision_floor().to_string()),
        ]);
        for a in admissions {
            let inbox = keys.index_of(&a.inbox);
            let marker = keys.index_of(&a.marker);
            // A dispatch that is not a schedule's names its marker for the
            // schedule's keys (unused by the script).
            let (leader, record, lock) = match &a.schedule {
                Some((token, record, lock)) => (*token, keys.index_of(record), keys.index_of(lock)),
                None => (0, marker, marker),
            };
            args.extend([
                Value::from(a.key.as_str()),
                Value::Bytes(a.body.clone()),
                Value::from(a.owner.as_str()),
                Value::from(a.request.to_string()),
                Value::from(inbox.to_string()),
                Value::from(marker.to_string()),
                Value::from(a.window_ms.to_string()),
                Value::from(leader.to_string()),
                Value::from(record.to_string()),
                Value::from(lock.to_string()),
            ]);
        }
        let replies: Vec<Value> = self
            .scripts
            .admit
            .run(&self.client, keys.into_keys(), args)
            .await?;
        replies
            .into_iter()
            .map(crate::scripts::status_reply)
            .collect()
    }
}
