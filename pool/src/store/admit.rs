//! Admission (`admit.lua`, batched), the idempotency marker of a refused
//! start (`unmark.lua`) and a schedule's job set (`schedule_forget.lua`).

use std::time::Duration;

use bytes::Bytes;
use fred::types::Value;

use super::PoolStore;
use super::call;
use crate::error::{Error, Result};
use crate::keys;

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
    /// A dispatch with an idempotency window: the key's marker and the
    /// window in ms.
    pub(crate) window: Option<(String, u64)>,
    /// A schedule's dispatch: leader token, job set and lock keys.
    pub(crate) schedule: Option<(u64, String, String)>,
    /// The run an earlier admission of this same dispatch started, whose
    /// start was answered `recovering` (Redis had lost the admission): the
    /// key is not admitted again once a token above it shows that run
    /// ended ([`Admitted::Ended`]).
    pub(crate) started: Option<u64>,
}

/// The node's limits every admission is held to.
#[derive(Debug, Clone)]
pub(crate) struct AdmitLimits {
    /// The admitting node's id (the pending guard names it).
    pub(crate) node: String,
    /// Most events queued in an owner's inbox (0: no limit).
    pub(crate) max_queued: u64,
    /// How long the pending guard of an admission lives.
    pub(crate) pending_ttl: Duration,
    /// The worker TTL (the recovery window after a data loss).
    pub(crate) worker_ttl: Duration,
}

/// What `admit.lua` decided for one admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admitted {
    /// Admitted (or a retry of that very admission) with this token.
    Ok { token: u64 },
    /// The key runs, or moves (a requeue or hand-off of a job that ran).
    Exists,
    /// Another dispatch admitted the key and its start is not recorded
    /// yet: it may still fail or be lost, so whether the key will run is
    /// not known.
    Pending,
    /// Admitted within the idempotency window; it ends after this long.
    Recent(Duration),
    /// A schedule's dispatch by a node that no longer leads it.
    NotLeader,
    /// The owner is not registered (or is being cleaned up).
    NoWorker,
    /// The owner's inbox holds this many events, the limit.
    Full(u64),
    /// The pool recovers from a loss (or rollback) of its Redis data.
    Recovering,
    /// The run this dispatch started earlier ([`Admission::started`]) has
    /// ended since: the job started, and is not started again.
    Ended,
}

impl Admitted {
    /// The script's word for this outcome.
    #[cfg(test)]
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Admitted::Ok { .. } => "ok",
            Admitted::Exists => "exists",
            Admitted::Pending => "pending",
            Admitted::Recent(_) => "recent",
            Admitted::NotLeader => "not_leader",
            Admitted::NoWorker => "no_worker",
            Admitted::Full(_) => "full",
            Admitted::Recovering => "recovering",
            Admitted::Ended => "ended",
        }
    }

    /// Reads one admission's reply: the token alone when admitted, else
    /// a word with, for `recent` and `full`, a number after it.
    fn parse(reply: Value) -> Result<Self> {
        const WHAT: &str = "admission reply";
        let malformed = |reason: String| Error::Malformed { what: WHAT, reason };
        if let Value::Integer(token) = reply {
            let token =
                u64::try_from(token).map_err(|_| malformed(format!("negative token {token}")))?;
            return Ok(Admitted::Ok { token });
        }
        let text = reply
            .as_str()
            .ok_or_else(|| malformed(format!("not a token or a word: {reply:?}")))?;
        let (word, number) = match text.split_once(' ') {
            Some((word, number)) => (
                word,
                Some(
                    number
                        .parse::<u64>()
                        .map_err(|_| malformed(format!("not a number in {text:?}")))?,
                ),
            ),
            None => (&*text, None),
        };
        Ok(match (word, number) {
            ("exists", None) => Admitted::Exists,
            ("pending", None) => Admitted::Pending,
            ("recent", Some(ms)) => Admitted::Recent(Duration::from_millis(ms)),
            ("not_leader", None) => Admitted::NotLeader,
            ("no_worker", None) => Admitted::NoWorker,
            ("full", Some(len)) => Admitted::Full(len),
            ("recovering", None) => Admitted::Recovering,
            ("ended", None) => Admitted::Ended,
            _ => return Err(call::unknown_status(WHAT, &text)),
        })
    }
}

call::status!(
    /// What `schedule_forget.lua` did.
    Forgot, "schedule_forget reply" {
        /// Dropped from the job set.
        Dropped = "1",
        /// Not in the job set.
        Absent = "0",
        /// The caller does not lead the schedule any more.
        NotLeader = "-1",
    }
);

impl PoolStore {
    /// One `admit.lua` call for `admissions`; one outcome per admission, in
    /// order.
    pub(crate) async fn admit(
        &self,
        limits: &AdmitLimits,
        admissions: &[Admission],
    ) -> Result<Vec<Admitted>> {
        let mut fixed = self.maps.base_keys();
        fixed.push(self.maps.cleanup.keys_info().hash.clone());
        fixed.push(self.maps.keepalive_revision_key());
        let mut keys = BatchKeys::new(fixed);
        let mut args = self.maps.base_args();
        args.extend([
            Value::from(limits.node.as_str()),
            Value::from(limits.max_queued.to_string()),
            Value::from(limits.pending_ttl.as_millis().to_string()),
            Value::from(keys::INBOX_MAXLEN.to_string()),
            Value::from(limits.worker_ttl.as_millis().to_string()),
            Value::from(self.revision_floor()),
        ]);
        for a in admissions {
            let inbox = keys.index_of(&a.inbox);
            // A plain dispatch (the common case) names no further keys and
            // passes empty options: no marker key, no per-admission
            // formatting.
            let options = if a.window.is_none() && a.schedule.is_none() && a.started.is_none() {
                Value::from_static_str("")
            } else {
                let (marker, window_ms) = match &a.window {
                    Some((marker, ms)) => (keys.index_of(marker), *ms),
                    None => (inbox, 0),
                };
                let (leader, record, lock) = match &a.schedule {
                    Some((token, record, lock)) => {
                        (*token, keys.index_of(record), keys.index_of(lock))
                    }
                    None => (0, inbox, inbox),
                };
                let started = a.started.unwrap_or(0);
                Value::from(format!(
                    "{marker} {window_ms} {leader} {record} {lock} {started}"
                ))
            };
            args.extend([
                Value::from(a.key.as_str()),
                Value::Bytes(a.body.clone()),
                Value::from(a.owner.as_str()),
                number_arg(a.request),
                number_arg(inbox as u64),
                options,
            ]);
        }
        let replies: Vec<Value> = self
            .scripts
            .admit
            .run(&self.client, keys.into_keys(), args, self.timeout)
            .await?;
        replies.into_iter().map(Admitted::parse).collect()
    }

    /// Removes the idempotency marker `marker` if the admission with
    /// `token` wrote it; returns whether it did. Waits up to `timeout`.
    pub(crate) async fn unmark(&self, marker: &str, token: u64, timeout: Duration) -> Result<bool> {
        let removed: i64 = self
            .scripts
            .unmark
            .run(
                &self.client,
                vec![marker.to_string()],
                vec![Value::from(token.to_string())],
                timeout,
            )
            .await?;
        Ok(removed > 0)
    }

    /// Drops `key` from a schedule's job set (`record_key`) while the lease
    /// `lock_key` still carries `leader_token`. Waits up to `timeout`.
    pub(crate) async fn forget_scheduled(
        &self,
        record_key: &str,
        lock_key: &str,
        leader_token: u64,
        key: &str,
        timeout: Duration,
    ) -> Result<Forgot> {
        let dropped: i64 = self
            .scripts
            .schedule_forget
            .run(
                &self.client,
                vec![record_key.to_string(), lock_key.to_string()],
                vec![Value::from(leader_token.to_string()), Value::from(key)],
                timeout,
            )
            .await?;
        Forgot::parse(&dropped.to_string())
    }
}

/// An unsigned number as a script argument: an integer (sent as its
/// digits, without building a string first) when it fits.
pub(super) fn number_arg(n: u64) -> Value {
    i64::try_from(n).map_or_else(|_| Value::from(n.to_string()), Value::Integer)
}

/// KEYS of a batched script call: fixed keys first, then every other key
/// the items name, once, which items refer to by its 1-based index.
pub(super) struct BatchKeys {
    keys: Vec<String>,
    index: std::collections::HashMap<String, usize>,
}

impl BatchKeys {
    /// Starts with the script's fixed keys.
    pub(super) fn new(fixed: Vec<String>) -> BatchKeys {
        BatchKeys {
            keys: fixed,
            index: std::collections::HashMap::new(),
        }
    }

    /// The 1-based index of `key` in KEYS, added on first use.
    pub(super) fn index_of(&mut self, key: &str) -> usize {
        if let Some(i) = self.index.get(key) {
            return *i;
        }
        self.keys.push(key.to_string());
        self.index.insert(key.to_string(), self.keys.len());
        self.keys.len()
    }

    /// The KEYS list.
    pub(super) fn into_keys(self) -> Vec<String> {
        self.keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_keys_name_each_key_once_after_the_fixed_ones() {
        let mut keys = BatchKeys::new(vec!["a".into(), "b".into()]);
        assert_eq!(keys.index_of("x"), 3);
        assert_eq!(keys.index_of("y"), 4);
        assert_eq!(keys.index_of("x"), 3);
        assert_eq!(keys.into_keys(), ["a", "b", "x", "y"]);
    }
}
