//! The Redis side of one start entry a worker handles: claim before the
//! handler runs (`claim_start.lua`), confirmation or drop (`started.lua`),
//! refusal (`start_failed.lua`), and the batched record of fresh starts
//! (`record_starts.lua`).

use std::time::Duration;

use fred::types::Value;

use super::PoolStore;
use super::admit::{BatchKeys, number_arg};
use super::call;
use crate::error::{Error, Result};

/// One start entry a worker handles: the entry's job key and token, the
/// worker, its inbox entry, and whom to answer.
#[derive(Debug, Clone)]
pub(crate) struct StartToRecord {
    pub(crate) key: String,
    pub(crate) token: u64,
    pub(crate) worker: String,
    /// The worker's inbox stream key.
    pub(crate) inbox: String,
    pub(crate) entry_id: String,
    /// Reply stream key and request id of the waiting dispatcher, if any.
    pub(crate) reply: Option<(String, u64)>,
    /// The admission stamp of the entry's dispatch (see
    /// `codec::stamp_us`): tells its payload from an older dispatch's
    /// that Redis went back to (`record_starts.lua`).
    pub(crate) admitted: u64,
}

call::status!(
    /// What `claim_start.lua` decided.
    Claimed, "claim_start reply" {
        /// Claimed: the handler may start the job.
        Ok = "ok",
        /// A newer start exists (entry removed, dispatcher answered).
        Superseded = "superseded",
        /// The worker is gone or being cleaned up (the entry stays).
        Unregistered = "unregistered",
        /// The entry is no longer in this worker's inbox.
        Gone = "gone",
        /// Redis lost its data or went back in time and the pool recovers:
        /// the entry stays, to be claimed once every running copy of the
        /// key has re-asserted.
        Recovering = "recovering",
        /// The entry was issued before the pool's last recovery began: it
        /// was replaced by one with a newer token in the same inbox, which
        /// the worker reads and claims in turn (a copy of the key with a
        /// token Redis lost may still run on a worker out of reach).
        Reissued = "reissued",
    }
);

call::status!(
    /// Whether a start the handler made is kept (`started.lua`,
    /// `record_starts.lua`).
    StartKept, "start record reply" {
        /// Recorded: the job runs here.
        Ok = "ok",
        /// A newer start exists: stop the run.
        Superseded = "superseded",
        /// The claim was taken: stop the run.
        Lost = "lost",
        /// Being cleaned up: stop the run (the entry stays for the cleaner).
        Unregistered = "unregistered",
        /// Redis lost its data or went back in time: keep the run and
        /// re-assert it.
        Recovering = "recovering",
    }
);

call::status!(
    /// The answer `started.lua` sends the dispatcher.
    Answer, "start answer" {
        /// The job started.
        Ok = "ok",
        /// A newer start of the key runs.
        Superseded = "superseded",
    }
);

impl StartToRecord {
    /// KEYS of the claim, confirmation and refusal scripts: base, the
    /// worker's inbox, the reply stream (the inbox when nobody waits).
    fn keys(&self, store: &PoolStore) -> Vec<String> {
        let mut keys = store.maps.base_keys();
        keys.push(self.inbox.clone());
        keys.push(match &self.reply {
            Some((stream, _)) => stream.clone(),
            None => self.inbox.clone(),
        });
        keys
    }

    /// ARGV of those scripts: base, job key, token, worker, entry id,
    /// reply request id (0: none).
    fn args(&self, store: &PoolStore) -> Vec<Value> {
        let mut args = store.maps.base_args();
        args.extend([
            Value::from(self.key.as_str()),
            Value::from(self.token.to_string()),
            Value::from(self.worker.as_str()),
            Value::from(self.entry_id.as_str()),
            Value::from(self.reply.as_ref().map_or(0, |(_, r)| *r).to_string()),
        ]);
        args
    }
}

impl PoolStore {
    /// Claims `start` before its handler runs. `pending_ttl` is the guard
    /// lifetime of an entry issued again ([`Claimed::Reissued`]).
    pub(crate) async fn claim_start(
        &self,
        start: &StartToRecord,
        worker_ttl: Duration,
        pending_ttl: Duration,
    ) -> Result<Claimed> {
        let mut keys = start.keys(self);
        keys.push(self.maps.cleanup.keys_info().hash.clone());
        keys.push(self.maps.keepalive_revision_key());
        let mut args = start.args(self);
        args.extend([
            Value::from(worker_ttl.as_millis().to_string()),
            Value::from(self.revision_floor()),
            Value::from(pending_ttl.as_millis().to_string()),
        ]);
        let status: String = self
            .scripts
            .claim_start
            .run(&self.client, keys, args, self.timeout)
            .await?;
        Claimed::parse(&status)
    }

    /// Removes the entry of `start` and answers its dispatcher with
    /// `answer`; returns whether the key is still claimed by this start.
    pub(crate) async fn started(
        &self,
        start: &StartToRecord,
        answer: Answer,
        worker_ttl: Duration,
    ) -> Result<StartKept> {
        let mut args = start.args(self);
        args.extend([
            Value::from(answer.as_str()),
            Value::from(worker_ttl.as_millis().to_string()),
            Value::from(self.revision_floor()),
        ]);
        let mut keys = start.keys(self);
        keys.push(self.maps.keepalive_revision_key());
        let status: String = self
            .scripts
            .started
            .run(&self.client, keys, args, self.timeout)
            .await?;
        StartKept::parse(&status)
    }

    /// Records that the handler refused `start` with `message`: claim (or
    /// pending guard) and payload dropped, entry removed, dispatcher
    /// answered.
    pub(crate) async fn start_failed(&self, start: &StartToRecord, message: &str) -> Result<()> {
        let mut args = start.args(self);
        args.push(Value::from(message));
        let _: Value = self
            .scripts
            .start_failed
            .run(&self.client, start.keys(self), args, self.timeout)
            .await?;
        Ok(())
    }

    /// One `record_starts.lua` call for `starts`; one outcome per start.
    pub(crate) async fn record_starts(
        &self,
        starts: &[StartToRecord],
        worker_ttl: Duration,
    ) -> Result<Vec<StartKept>> {
        let mut fixed = self.maps.base_keys();
        fixed.push(self.maps.keepalive_revision_key());
        let mut keys = BatchKeys::new(fixed);
        let mut args = self.maps.base_args_with_ttl(worker_ttl);
        args.push(Value::from(self.revision_floor()));
        for start in starts {
            let inbox = keys.index_of(&start.inbox);
            let (request, reply) = match &start.reply {
                Some((stream, request)) => (*request, keys.index_of(stream)),
                None => (0, 0),
            };
            args.extend([
                Value::from(start.key.as_str()),
                number_arg(start.token),
                Value::from(start.worker.as_str()),
                Value::from(start.entry_id.as_str()),
                number_arg(inbox as u64),
                number_arg(request),
                number_arg(reply as u64),
                number_arg(start.admitted),
            ]);
        }
        let statuses: Vec<Value> = self
            .scripts
            .record_starts
            .run(&self.client, keys.into_keys(), args, self.timeout)
            .await?;
        if statuses.len() != starts.len() {
            return Err(Error::Malformed {
                what: "record_starts reply",
                reason: format!("{} statuses for {} starts", statuses.len(), starts.len()),
            });
        }
        statuses
            .iter()
            .map(|s| match s.as_str() {
                Some(word) => StartKept::parse(&word),
                None => Err(Error::Malformed {
                    what: "record_starts reply",
                    reason: format!("not a status: {s:?}"),
                }),
            })
            .collect()
    }
}
