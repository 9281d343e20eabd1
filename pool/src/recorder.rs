//! Start recorder: records the starts of fresh entries in batches.
//!
//! A worker's lane that started a job from a fresh entry (see
//! `freshness.rs`) hands the start to the node's recorder and waits for its
//! status. The recorder runs `record_starts.lua` for every start queued
//! while its previous call was in flight, so under load one script call,
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
use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, Result};
use crate::node::NodeInner;

/// Starts recorded by one script call at most.
const MAX_BATCH: usize = 128;

/// Starts queued before lanes wait (backpressure).
const QUEUE: usize = 1024;

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

struct Queued {
    start: StartToRecord,
    done: oneshot::Sender<Result<String>>,
}

/// The sending side, held by the node; the task owns the receiving side.
#[derive(Debug)]
pub(crate) struct StartRecorder {
    queue: mpsc::Sender<Queued>,
}

impl StartRecorder {
    /// A recorder and the receiving end its task (see
    /// [`NodeInner::recorder_loop`]) drains.
    pub(crate) fn new() -> (StartRecorder, RecorderQueue) {
        let (queue, rx) = mpsc::channel(QUEUE);
        (StartRecorder { queue }, RecorderQueue(rx))
    }

    /// Records `start` and returns its status (`ok`, `superseded`,
    /// `recovering` or `unregistered`, see `scripts/record_starts.lua`).
    ///
    /// # Errors
    /// [`Error::Closed`] when the node closed first; Redis errors (the
    /// outcome is then unknown: the script may have run).
    pub(crate) async fn record(&self, start: StartToRecord) -> Result<String> {
        let (done, answer) = oneshot::channel();
        self.queue
            .send(Queued { start, done })
            .await
            .map_err(|_| Error::Closed)?;
        answer.await.map_err(|_| Error::Closed)?
    }
}

/// The queue of starts waiting for the recorder task.
pub(crate) struct RecorderQueue(mpsc::Receiver<Queued>);

impl NodeInner {
    /// Records queued starts, one batch per script call, until the node
    /// closes. Starts still queued then get [`Error::Closed`].
    pub(crate) async fn recorder_loop(self: Arc<Self>, queue: RecorderQueue) {
        let mut queue = queue.0;
        let mut batch: Vec<Queued> = Vec::with_capacity(MAX_BATCH);
        loop {
            let first = tokio::select! {
                _ = self.cancel.cancelled() => return,
                q = queue.recv() => match q {
                    Some(q) => q,
                    None => return,
                },
            };
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match queue.try_recv() {
                    Ok(q) => batch.push(q),
                    Err(_) => break,
                }
            }
            metrics::histogram!("flotilla_pool_start_record_batch").record(batch.len() as f64);
            let starts: Vec<&StartToRecord> = batch.iter().map(|q| &q.start).collect();
            match self.record_starts(&starts).await {
                Ok(statuses) => {
                    for (q, status) in batch.drain(..).zip(statuses) {
                        let _ = q.done.send(Ok(status));
                    }
                }
                Err(e) => {
                    let text = e.to_string();
                    for q in batch.drain(..) {
                        let _ = q.done.send(Err(batch_error(&e, &text)));
                    }
                }
            }
        }
    }

    /// One `record_starts.lua` call for `starts`; one status per start.
    pub(crate) async fn record_starts(&self, starts: &[&StartToRecord]) -> Result<Vec<String>> {
        let mut keys = self.maps.base_keys();
        let base = keys.len();
        // A stream's 1-based index in KEYS, added on first use.
        let index_of = |key: &str, keys: &mut Vec<String>| -> usize {
            match keys[base..].iter().position(|k| k == key) {
                Some(i) => base + i + 1,
                None => {
                    keys.push(key.to_string());
                    keys.len()
                }
            }
        };
        let mut args = self.maps.base_args();
        args.push(Value::from(self.options.worker_ttl.as_millis().to_string()));
        for start in starts {
            let inbox = index_of(&start.inbox, &mut keys);
            let (request, reply) = match &start.reply {
                Some((stream, request)) => (*request, index_of(stream, &mut keys)),
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
            .run(&self.client, keys, args)
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

/// The error of one start of a failed batch: the batch's error, kept
/// matchable (connection trouble stays [`Error::Unavailable`]).
fn batch_error(e: &Error, text: &str) -> Error {
    match e {
        Error::Unavailable(inner) => Error::Unavailable(inner.clone()),
        Error::Redis(inner) => Error::Redis(inner.clone()),
        Error::Closed => Error::Closed,
        _ => Error::Malformed {
            what: "start record",
            reason: text.to_string(),
        },
    }
}
