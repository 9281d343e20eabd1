//! The Redis side of one start entry a worker handles: claim, confirmation
//! and refusal (`claim_start.lua`, `started.lua`, `start_failed.lua`) and
//! the batched record of fresh starts (`recorder.rs`).

use fred::types::Value;

use crate::codec::StartEntry;
use crate::error::Result;
use crate::node::NodeInner;
use flotilla_streaming::Event;

/// The Redis side of one start entry: what the claim, confirmation and
/// refusal scripts (and the batched record) need to know of it.
pub(crate) struct StartRecord(crate::recorder::StartToRecord);

impl StartRecord {
    pub(crate) fn new(
        node: &NodeInner,
        worker: &str,
        event: &Event,
        entry: &StartEntry,
    ) -> Result<Self> {
        let reply = match &entry.reply {
            Some(r) => Some((node.reply_key(&r.node)?, r.request)),
            None => None,
        };
        Ok(StartRecord(crate::recorder::StartToRecord {
            key: entry.body.key.clone(),
            token: entry.token,
            worker: worker.to_string(),
            inbox: node.inbox(worker)?.key().to_string(),
            entry_id: event.id.clone(),
            reply,
        }))
    }

    /// KEYS of the claim, confirmation and refusal scripts: base, the
    /// worker's inbox, the reply stream (the inbox when nobody waits).
    pub(crate) fn keys(&self, node: &NodeInner) -> Vec<String> {
        let mut keys = node.maps.base_keys();
        keys.push(self.0.inbox.clone());
        keys.push(match &self.0.reply {
            Some((stream, _)) => stream.clone(),
            None => self.0.inbox.clone(),
        });
        keys
    }

    /// ARGV of those scripts: base, job key, token, worker, entry id,
    /// reply request id (0: none).
    pub(crate) fn args(&self, node: &NodeInner) -> Vec<Value> {
        let mut args = node.maps.base_args();
        args.extend([
            Value::from(self.0.key.as_str()),
            Value::from(self.0.token.to_string()),
            Value::from(self.0.worker.as_str()),
            Value::from(self.0.entry_id.as_str()),
            Value::from(self.0.reply.as_ref().map_or(0, |(_, r)| *r).to_string()),
        ]);
        args
    }

    pub(crate) fn claim_keys(&self, node: &NodeInner) -> Vec<String> {
        let mut keys = self.keys(node);
        keys.push(node.maps.cleanup.keys_info().hash.clone());
        keys
    }

    /// Records a start made before any claim (a fresh entry): ownership,
    /// pending guard cleared, entry removed, dispatcher answered; batched
    /// with other starts of the node (see `recorder.rs`).
    pub(crate) async fn record(self, node: &NodeInner) -> Result<String> {
        node.recorder.submit(self.0).await
    }

    /// Removes the entry and answers the dispatcher with `status`; returns
    /// whether the key is still claimed by this start (`"ok"`/`"lost"`).
    pub(crate) async fn finish(&self, node: &NodeInner, status: &str) -> Result<String> {
        let mut args = self.args(node);
        args.push(Value::from(status));
        args.push(Value::from(node.options.worker_ttl.as_millis().to_string()));
        args.push(Value::from(node.jobs_revision_floor().to_string()));
        node.scripts
            .started
            .run(&node.client, self.keys(node), args)
            .await
    }
}
