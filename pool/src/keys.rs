//! Every Redis key and stream name of the pool crate.
//!
//! All keys of one pool carry the pool's hash tag (`fl:{<pool>}:…`) so that
//! a pool lives in one cluster slot and multi-key scripts work on Redis
//! Cluster. Replicated maps and streams are named here but laid out by their
//! own crates (`flotilla-rmap`, `flotilla-streaming`), given the pool as hash
//! tag.

/// Name of the replicated map of worker registrations: worker id → JSON
/// object `{node, host, pid, created_at_ms}` (`register.lua`), plus
/// [`DRAINED_FIELD`] while the worker is drained.
pub(crate) const WORKERS_MAP: &str = "workers";
/// Field of a worker's record (in the workers map) that marks it drained:
/// the server time (ms) of the drain. A drained worker is out of the ring
/// and no script gives it a job (`worker_active` in `store/scripts/base.lua`
/// looks for this name); the mark lives in the record so that every node,
/// which mirrors the workers map already, sees it with the registration,
/// and it goes away with the worker.
pub(crate) const DRAINED_FIELD: &str = "drained_at_ms";
/// Name of the replicated map of worker keep-alives (server time, ms).
pub(crate) const KEEPALIVE_MAP: &str = "keepalive";
/// Name of the replicated map of cleanup claims on dead workers.
pub(crate) const CLEANUP_MAP: &str = "cleanup";
/// Name of the replicated map of job owners (job key → owner and token).
pub(crate) const JOBS_MAP: &str = "jobs";
/// Name of the replicated map of pending dispatches (job key → deadline).
pub(crate) const PENDING_MAP: &str = "pending";
/// Plain hash of what each node is (node id → JSON object `{version, host,
/// pid, joined_at_ms}`), written once as the node joins
/// (`store/scripts/node_info.lua`) and removed with the node's keep-alive;
/// read by inspectors only (no node routes by it).
pub(crate) fn node_info(pool: &str) -> String {
    format!("fl:{{{pool}}}:nodeinfo")
}

/// Name of the replicated map of node keep-alives.
pub(crate) const NODES_MAP: &str = "nodes";
/// Name of the replicated map holding the shutdown flag.
pub(crate) const SHUTDOWN_MAP: &str = "shutdown";

/// Plain hash of job payloads (job key → payload bytes), read on demand.
pub(crate) fn payloads(pool: &str) -> String {
    format!("fl:{{{pool}}}:payloads")
}

/// Field of the fencing hash holding the pool's epoch (no job key has a
/// control character, so no job key can be this field). Only the scripts
/// write it (`EPOCH` in `scripts/base.lua`); tests read and delete it.
#[cfg(test)]
pub(crate) const EPOCH_FIELD: &str = "\nepoch";

/// Prefix of the fencing hash's field that marks a key's dispatches over
/// up to an admission stamp or a stop's token (`ENDED` in
/// `scripts/base.lua`, which alone writes it, at every end of a dispatch):
/// the field is this prefix and the job key. Tests read it.
#[cfg(test)]
pub(crate) const ENDED_FIELD_PREFIX: &str = "\nended ";

/// Prefix of the fencing hash's field per key holding the stored payload
/// of a dispatch that waits for an older dispatch's run to end (`WAITING`
/// in `scripts/base.lua`).
#[cfg(test)]
pub(crate) const WAITING_FIELD_PREFIX: &str = "\nnext ";

/// Field of the fencing hash holding Redis's pulse, "<last_ms>
/// <resumed_ms>": when a keep-alive was last served, and when Redis came
/// back to serving after a gap of half a TTL (`PULSE` in
/// `scripts/base.lua`, which alone writes it). Tests read and set it.
#[cfg(test)]
pub(crate) const PULSE_FIELD: &str = "\npulse";

/// Plain hash of per-key fencing counters (job key → last token issued).
pub(crate) fn fencing(pool: &str) -> String {
    format!("fl:{{{pool}}}:fencing")
}

/// Plain hash of orphan marks (job key → `"<since_ms> <record or '-'>
/// <token>"`): when the orphan sweep first saw the key orphaned, or the
/// recovery script that made it one (`reassert.lua`, `handoff_stands.lua`)
/// ran, and in which state (see `scripts/sweep_orphans.lua`).
pub(crate) fn orphan_marks(pool: &str) -> String {
    format!("fl:{{{pool}}}:orphans")
}

/// Name of the pool's sweeper lease (a leader lease with the pool as hash
/// tag: `fl:{pool}:lock:sweeper`): its holder runs the pool-wide sweeps.
pub(crate) const SWEEPER_LEASE: &str = "sweeper";

/// Prefix of the stream names of worker inboxes.
const INBOX_PREFIX: &str = "inbox:";

/// Stream name (inside the pool's tag) of a worker's inbox.
pub(crate) fn worker_inbox(worker_id: &str) -> String {
    format!("{INBOX_PREFIX}{worker_id}")
}

/// The worker whose inbox the stream name `stream` is, if it is one.
pub(crate) fn inbox_worker(stream: &str) -> Option<&str> {
    stream.strip_prefix(INBOX_PREFIX)
}

/// Bound of the inbox and reply streams (approximate MAXLEN; 0: none).
pub(crate) const INBOX_MAXLEN: u64 = 0;

/// Key of the shutdown flag in the `shutdown` map.
pub(crate) const SHUTDOWN_FLAG: &str = "shutdown";

/// Validates a name or key with the rule shared by every Flotilla crate.
pub(crate) fn check_name(what: &'static str, value: &str) -> crate::error::Result<()> {
    flotilla_rmap::check_name(value).map_err(|reason| crate::error::Error::InvalidName {
        what,
        value: value.chars().take(64).collect(),
        reason,
    })
}

/// Stream name (inside the pool's tag) of a node's reply stream.
pub(crate) fn node_replies(node_id: &str) -> String {
    format!("replies:{node_id}")
}

/// Key of a lock. A lock that belongs to a pool (e.g. a scheduler's leader
/// lease) lives in the pool's slot; a standalone lock gets its own tag.
pub(crate) fn lock(hash_tag: Option<&str>, name: &str) -> String {
    match hash_tag {
        Some(tag) => format!("fl:{{{tag}}}:lock:{name}"),
        None => format!("fl:{{{name}}}:lock"),
    }
}

/// Key of a lock's fencing counter (survives the lock's expiry so tokens
/// keep increasing).
pub(crate) fn lock_fencing(hash_tag: Option<&str>, name: &str) -> String {
    format!("{}:fencing", lock(hash_tag, name))
}

/// Key of a distributed ticker's state (last tick slot).
pub(crate) fn ticker(hash_tag: Option<&str>, name: &str) -> String {
    match hash_tag {
        Some(tag) => format!("fl:{{{tag}}}:ticker:{name}"),
        None => format!("fl:{{{name}}}:ticker"),
    }
}

/// Idempotency marker of a job key: written by an admission that asked for
/// an idempotency window, expires with the window (`PX`).
pub(crate) fn dispatched(pool: &str, key: &str) -> String {
    format!("fl:{{{pool}}}:dispatched:{key}")
}

/// Hash of the jobs a schedule started (job key → fencing token), so that a
/// new leader knows what the previous one started.
pub(crate) fn schedule(pool: &str, name: &str) -> String {
    format!("fl:{{{pool}}}:schedule:{name}")
}

/// Name of a schedule's leader lease and ticker (both given the pool as
/// hash tag: `fl:{pool}:lock:schedule:<name>`, `fl:{pool}:ticker:schedule:<name>`).
pub(crate) fn schedule_lease(name: &str) -> String {
    format!("schedule:{name}")
}

/// Pattern matching every key of a pool (for `SCAN` during shutdown and by
/// inspectors).
pub(crate) fn pool_pattern(pool: &str) -> String {
    format!("fl:{{{pool}}}:*")
}

/// Key (in the pool's slot) where a multi-home worker publishes the breaker
/// state of its homes, for inspectors. Expires unless refreshed.
pub(crate) fn multihome_state(pool: &str, worker_id: &str) -> String {
    format!("fl:{{{pool}}}:multihome:{worker_id}")
}

/// Pattern matching every multi-home state key of a pool.
pub(crate) fn multihome_state_pattern(pool: &str) -> String {
    format!("fl:{{{pool}}}:multihome:*")
}

/// Plain hash of failure records (job key → `"<state> <n> <token> <at_ms>
/// <error>"`, see `scripts/job_ended.lua`).
pub(crate) fn failures(pool: &str) -> String {
    format!("fl:{{{pool}}}:failures")
}

/// Stream of per-node event counts, the last hour (see `history.rs`).
pub(crate) fn history(pool: &str) -> String {
    format!("fl:{{{pool}}}:history")
}
