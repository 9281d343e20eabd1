//! Typed records of a pool's replicated maps, decoded from raw hash fields.
//!
//! Decoding never fails as a whole: a field that does not parse becomes a
//! [`MalformedField`] next to the records that did.

use std::time::Duration;

use crate::store::records::{WorkerEntry, job_owner, pending_guard};

/// A worker's registration (`workers` map) joined with its keep-alive,
/// cleanup claim and job count.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerRecord {
    /// Worker id.
    pub id: String,
    /// Node hosting the worker.
    pub node: String,
    /// Host name of that node's process.
    pub host: String,
    /// Process id of that node's process.
    pub pid: u32,
    /// Registration time (Redis server time, ms since the epoch).
    pub created_at_ms: u64,
    /// Last keep-alive (Redis server time, ms), if any was recorded.
    pub keepalive_ms: Option<u64>,
    /// The cleanup claim on this worker, when one exists.
    pub cleanup: Option<CleanupClaim>,
    /// When the worker was drained (Redis server time, ms), while it is
    /// ([`Node::drain_worker`](crate::Node::drain_worker)).
    pub drained_at_ms: Option<u64>,
    /// Jobs the `jobs` map says it owns.
    pub jobs: usize,
}

/// Liveness of a worker as an inspector judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WorkerState {
    /// Registered, renewing, not being cleaned up: in the ring.
    Active,
    /// No keep-alive within the worker TTL (by Redis server time); still in
    /// the ring until some node claims its cleanup.
    Stale,
    /// A cleanup claim exists (found dead, or its node is closing it): out
    /// of the ring, its jobs are moving.
    Cleaning,
    /// Alive but drained: out of the ring, its jobs move (or moved) to
    /// other workers and nothing new is given to it.
    Drained,
}

impl WorkerState {
    /// Lower-case name: `active`, `stale`, `cleaning` or `drained`.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Active => "active",
            WorkerState::Stale => "stale",
            WorkerState::Cleaning => "cleaning",
            WorkerState::Drained => "drained",
        }
    }
}

impl WorkerRecord {
    /// Time since the last keep-alive, on Redis server time alone.
    pub fn keepalive_age(&self, server_time_ms: u64) -> Option<Duration> {
        self.keepalive_ms
            .map(|ka| Duration::from_millis(server_time_ms.saturating_sub(ka)))
    }

    /// The worker's state given the pool's worker TTL (which Redis does not
    /// store: pass the TTL the pool's nodes run with).
    pub fn state(&self, server_time_ms: u64, worker_ttl: Duration) -> WorkerState {
        if self.cleanup.is_some() {
            return WorkerState::Cleaning;
        }
        match self.keepalive_age(server_time_ms) {
            Some(age) if age <= worker_ttl && self.drained_at_ms.is_some() => WorkerState::Drained,
            Some(age) if age <= worker_ttl => WorkerState::Active,
            _ => WorkerState::Stale,
        }
    }
}

/// A node: an entry of the `nodes` map (its keep-alive) or a node named by
/// a worker's registration (a node renews its first keep-alive one renewal
/// period after joining).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeRecord {
    /// Node id.
    pub id: String,
    /// Last keep-alive (Redis server time, ms), when one was recorded.
    pub keepalive_ms: Option<u64>,
    /// The `flotilla-pool` version the node runs, when it recorded one (a
    /// node records its version, host, pid and join time as it joins).
    pub version: Option<String>,
    /// When the node joined (Redis server time, ms), when recorded.
    pub joined_at_ms: Option<u64>,
}

/// A running job (`jobs` map).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobRecord {
    /// Job key.
    pub key: String,
    /// Worker that owns it.
    pub owner: String,
    /// Fencing token of the current start.
    pub token: u64,
}

/// A dispatch admitted but not yet started (`pending` map).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingRecord {
    /// Job key.
    pub key: String,
    /// Fencing token issued at admission.
    pub token: u64,
    /// After this server time (ms) the guard is stale and gets removed.
    pub deadline_ms: u64,
    /// Node waiting for the outcome, when a caller waits.
    pub dispatcher_node: Option<String>,
    /// That node's request id.
    pub request: Option<u64>,
}

/// A claim on the cleanup of a worker (`cleanup` map).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CleanupClaim {
    /// The worker being cleaned up.
    pub worker: String,
    /// The node doing it.
    pub node: String,
    /// Server time (ms) of the claim; `None` when the worker's own node is
    /// closing it (that claim carries no time).
    pub claimed_at_ms: Option<u64>,
}

/// A map field that did not decode; reported, never fatal.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MalformedField {
    /// The map (`workers`, `jobs`, ...).
    pub map: &'static str,
    /// The field.
    pub field: String,
    /// Why it did not decode.
    pub reason: String,
}

/// Raw map contents, field → value, as read by `HGETALL`.
pub(crate) type RawMap = std::collections::HashMap<String, String>;

/// Decoded maps of one pool.
#[derive(Debug, Default)]
pub(crate) struct Decoded {
    pub(crate) workers: Vec<WorkerRecord>,
    pub(crate) nodes: Vec<NodeRecord>,
    pub(crate) jobs: Vec<JobRecord>,
    pub(crate) pending: Vec<PendingRecord>,
    pub(crate) cleanups: Vec<CleanupClaim>,
    pub(crate) malformed: Vec<MalformedField>,
}

/// The raw maps of one pool.
#[derive(Debug, Default)]
pub(crate) struct RawMaps {
    pub(crate) workers: RawMap,
    pub(crate) keepalive: RawMap,
    pub(crate) cleanup: RawMap,
    pub(crate) jobs: RawMap,
    pub(crate) pending: RawMap,
    pub(crate) nodes: RawMap,
    /// Node id → info JSON (`nodeinfo` hash).
    pub(crate) node_info: RawMap,
}

impl Decoded {
    /// Decodes every map; each list is sorted (workers by registration).
    pub(crate) fn from_raw(raw: &RawMaps) -> Decoded {
        let mut out = Decoded::default();
        for (field, value) in &raw.cleanup {
            match parse_cleanup(field, value) {
                Some(c) => out.cleanups.push(c),
                None => out.bad("cleanup", field, value),
            }
        }
        for (key, value) in &raw.jobs {
            match job_owner(value) {
                Some((owner, token)) => out.jobs.push(JobRecord {
                    key: key.clone(),
                    owner: owner.to_string(),
                    token,
                }),
                None => out.bad("jobs", key, value),
            }
        }
        for (key, value) in &raw.pending {
            match parse_pending(key, value) {
                Some(p) => out.pending.push(p),
                None => out.bad("pending", key, value),
            }
        }
        for (id, value) in &raw.nodes {
            match value.parse() {
                Ok(keepalive_ms) => out.nodes.push(NodeRecord {
                    id: id.clone(),
                    keepalive_ms: Some(keepalive_ms),
                    version: None,
                    joined_at_ms: None,
                }),
                Err(_) => out.bad("nodes", id, value),
            }
        }
        for (id, value) in &raw.keepalive {
            if value.parse::<u64>().is_err() {
                out.bad("keepalive", id, value);
            }
        }
        for (id, value) in &raw.workers {
            let Some(mut w) = parse_worker(id, value) else {
                out.bad("workers", id, value);
                continue;
            };
            w.keepalive_ms = raw.keepalive.get(id).and_then(|v| v.parse().ok());
            w.cleanup = out.cleanups.iter().find(|c| &c.worker == id).cloned();
            w.jobs = out.jobs.iter().filter(|j| &j.owner == id).count();
            out.workers.push(w);
        }
        for w in &out.workers {
            if !out.nodes.iter().any(|n| n.id == w.node) {
                out.nodes.push(NodeRecord {
                    id: w.node.clone(),
                    keepalive_ms: None,
                    version: None,
                    joined_at_ms: None,
                });
            }
        }
        for node in &mut out.nodes {
            let Some(raw) = raw.node_info.get(&node.id) else {
                continue;
            };
            match serde_json::from_str::<serde_json::Value>(raw) {
                Ok(info) if info.is_object() => {
                    node.version = info["version"].as_str().map(str::to_string);
                    node.joined_at_ms = info["joined_at_ms"].as_u64();
                }
                _ => out.malformed.push(MalformedField {
                    map: "nodeinfo",
                    field: node.id.clone(),
                    reason: format!(
                        "cannot decode {:?}",
                        raw.chars().take(80).collect::<String>()
                    ),
                }),
            }
        }
        out.workers
            .sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        out.nodes.sort_by(|a, b| a.id.cmp(&b.id));
        out.jobs.sort_by(|a, b| a.key.cmp(&b.key));
        out.pending.sort_by(|a, b| a.key.cmp(&b.key));
        out.cleanups.sort_by(|a, b| a.worker.cmp(&b.worker));
        out.malformed
            .sort_by(|a, b| (a.map, &a.field).cmp(&(b.map, &b.field)));
        out
    }

    fn bad(&mut self, map: &'static str, field: &str, value: &str) {
        self.malformed.push(MalformedField {
            map,
            field: field.to_string(),
            reason: format!(
                "cannot decode {:?}",
                value.chars().take(80).collect::<String>()
            ),
        });
    }
}

/// A `workers` map value: a JSON object with node, host, pid, created_at_ms.
fn parse_worker(id: &str, value: &str) -> Option<WorkerRecord> {
    let info = WorkerEntry::parse(value)?;
    Some(WorkerRecord {
        id: id.to_string(),
        node: info.node?,
        host: info.host,
        pid: info.pid,
        created_at_ms: info.created_at_ms?,
        keepalive_ms: None,
        cleanup: None,
        drained_at_ms: info.drained_at_ms,
        jobs: 0,
    })
}

/// A `cleanup` map value: `"<node> <claimed_ms>"` or `"<node> closing"`.
fn parse_cleanup(worker: &str, value: &str) -> Option<CleanupClaim> {
    let (node, rest) = value.split_once(' ')?;
    let claimed_at_ms = match rest {
        "closing" => None,
        ms => Some(ms.parse().ok()?),
    };
    Some(CleanupClaim {
        worker: worker.to_string(),
        node: node.to_string(),
        claimed_at_ms,
    })
}

/// A `pending` map value: `"<token> <deadline_ms>[ <node>/<request>]"`.
fn parse_pending(key: &str, value: &str) -> Option<PendingRecord> {
    let (token, deadline_ms) = pending_guard(value)?;
    let waiter = value.splitn(3, ' ').nth(2).and_then(|w| w.rsplit_once('/'));
    Some(PendingRecord {
        key: key.to_string(),
        token,
        deadline_ms,
        dispatcher_node: waiter.map(|(node, _)| node.to_string()),
        request: waiter.and_then(|(_, r)| r.parse().ok()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(pairs: &[(&str, &str)]) -> RawMap {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn decodes_every_map_and_joins_workers() {
        let maps = RawMaps {
            workers: raw(&[
                (
                    "w-b",
                    r#"{"node":"n1","host":"h","pid":7,"created_at_ms":20}"#,
                ),
                (
                    "w-a",
                    r#"{"node":"n1","host":"h","pid":7,"created_at_ms":10}"#,
                ),
                ("w-bad", "not json"),
                (
                    "w-c",
                    r#"{"node":"n1","host":"h","pid":7,"created_at_ms":30,"drained_at_ms":40}"#,
                ),
            ]),
            keepalive: raw(&[("w-a", "1000"), ("w-b", "oops"), ("w-c", "1000")]),
            cleanup: raw(&[("w-b", "n2 closing")]),
            jobs: raw(&[("k1", "w-a 3"), ("k2", "w-a 4"), ("k3", "w-b")]),
            pending: raw(&[("k9", "5 2000 n1/17"), ("k8", "6 3000")]),
            nodes: raw(&[("n0", "1000")]),
            node_info: raw(&[(
                "n1",
                r#"{"version":"0.1.0","host":"h","pid":7,"joined_at_ms":5}"#,
            )]),
        };
        let d = Decoded::from_raw(&maps);
        assert_eq!(d.workers.len(), 3);
        assert_eq!(d.workers[2].drained_at_ms, Some(40));
        assert_eq!(
            d.workers[2].state(1500, Duration::from_secs(1)),
            WorkerState::Drained
        );
        assert_eq!(
            d.workers[2].state(2500, Duration::from_secs(1)),
            WorkerState::Stale
        );
        assert_eq!(d.workers[0].id, "w-a");
        assert_eq!(d.workers[0].jobs, 2);
        assert_eq!(d.workers[0].keepalive_ms, Some(1000));
        assert_eq!(d.workers[1].keepalive_ms, None);
        assert_eq!(d.workers[1].cleanup.as_ref().unwrap().claimed_at_ms, None);
        assert_eq!(
            d.workers[0].state(1500, Duration::from_secs(1)),
            WorkerState::Active
        );
        assert_eq!(
            d.workers[0].state(2500, Duration::from_secs(1)),
            WorkerState::Stale
        );
        assert_eq!(d.workers[1].state(0, Duration::ZERO), WorkerState::Cleaning);
        assert_eq!(d.pending[1].dispatcher_node.as_deref(), Some("n1"));
        assert_eq!(d.pending[1].request, Some(17));
        assert_eq!(d.pending[0].dispatcher_node, None);
        let nodes: Vec<_> = d
            .nodes
            .iter()
            .map(|n| (n.id.as_str(), n.keepalive_ms))
            .collect();
        assert_eq!(nodes, vec![("n0", Some(1000)), ("n1", None)]);
        assert_eq!(d.nodes[1].version.as_deref(), Some("0.1.0"));
        assert_eq!(d.nodes[1].joined_at_ms, Some(5));
        assert_eq!(d.nodes[0].version, None);
        let bad: Vec<_> = d
            .malformed
            .iter()
            .map(|m| (m.map, m.field.as_str()))
            .collect();
        assert_eq!(
            bad,
            vec![("jobs", "k3"), ("keepalive", "w-b"), ("workers", "w-bad")]
        );
    }

    #[test]
    fn cleanup_claims_with_time() {
        let c = parse_cleanup("w", "n-1 12345").unwrap();
        assert_eq!((c.node.as_str(), c.claimed_at_ms), ("n-1", Some(12345)));
        assert!(parse_cleanup("w", "garbage").is_none());
    }
}
