//! Start recorder: records the starts of fresh entries in batches.
//!
//! A worker's lane that started a job from a fresh entry (see
//! `freshness.rs`) hands the start to the node's recorder and waits for its
//! status. The recorder runs `record_starts.lua` for every start queued
//! while its previous calls were in flight, so under load one script call,
//! one `XDEL` per inbox and one reply entry per dispatcher serve many jobs;
//! alone, a start is recorded at once, as before (one call, no added wait).
//!
//! ```text
//! lane ──start──▶ queue ──▶ recorder task ──EVALSHA record_starts (N)──▶ Redis
//!  ▲                               │
//!  └──────── status per start ◀────┘
//! ```

use std::sync::Arc;

use fred::types::Value;

use crate::batch::{BatchKeys, BatchQueue, Batcher};
use crate::error::{Error, Result};
use crate::node::NodeInner;

/// Starts recorded by one script call at most.
const MAX_BATCH: usize = 128;

/// One start to record: the entry's job key and token, the worker that
/// started it, its inbox entry, and whom to answer.
#[derive(Debug, Clone)]
pub(crate) struct StartToRecord {
    pub(crate) key: String,
    pub(crate) token: u64,
    pub(crate) worker: String,
    pub(crate) inbox: String,
    pub(crate) entry_id: String,
    /// Reply stream and request id of the waiting dispatcher, if any.
    pub(crate) reply: Option<(String, u64)>,
}

/// The node's start recorder.
pub(crate) type StartRecorder = Batcher<StartToRecord, String>;

impl NodeInner {
    /// Records queued starts, one batch per script call, until the node
    /// closes.
    pub(crate) async fn recorder_loop(self: Arc<Self>, queue: BatchQueue<StartToRecord, String>) {
        queue
            .run("record_starts", &self.cancel, MAX_BATCH, |starts| {
                let me = self.clone();
                Box::pin(async move { me.record_starts(starts).await })
            })
            .await;
    }

    /// One `record_starts.lua` call for `starts`; one status per start.
    pub(crate) async fn record_starts(&self, starts: &[StartToRecord]) -> Result<Vec<String>> {
        let mut keys = BatchKeys::new(self.maps.base_keys());
        let mut args = self.maps.base_args();
        args.push(Value::from(self.options.worker_ttl.as_millis().to_string()));
        args.push(Value::from(self.jobs_revision_floor().to_string()));
        for start in starts {
            let inbox = keys.index_of(&start.inbox);
            let (request, reply) = match &start.reply {
                Some((stream, request)) => (*request, keys.index_of(stream)),
                None => (0, 0),
            };
            args.extend([
                Value::from(start.key.as_str()),
                Value::from(start.token.to_string()),
                Value::from(start.worker.as_str()),
                Value::from(start.entry_id.as_str()),
                Value::from(inbox.to_string()),
                Value::from(request.to_string()),
                Value::from(reply.to_string()),
            ]);
        }
        let statuses: Vec<String> = self
            .scripts
            .record_starts
            .run(&self.client, keys.into_keys(), args)
            .await?;
        if statuses.len() != starts.len() {
            return Err(Error::Malformed {
                what: "record_starts reply",
                reason: format!("{} statuses for {} starts", statuses.len(), starts.len()),
            });
        }
        Ok(statuses)
    }
}
