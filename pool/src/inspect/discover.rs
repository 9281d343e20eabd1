//! Discovery by `SCAN`: pools, locks and streams.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use flotilla_rmap::MapKeys;
use fred::prelude::*;
use fred::types::Value;
use fred::types::scan::ScanType;

use super::{glob_escape, pool_stream_key, server_time_ms};
use crate::error::{Result, from_redis};
use crate::keys;
use crate::lock::LockInfo;

/// Keys asked for per `SCAN` page.
const SCAN_COUNT: u32 = 1000;

/// A pool found in Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolSummary {
    /// The pool's name (its hash tag).
    pub name: String,
    /// Redis keys carrying the pool's hash tag.
    pub keys: u64,
}

/// A lock found in Redis, with its holder.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockRecord {
    /// The holder record's Redis key.
    pub key: String,
    /// The lock's hash tag when it lives in another name's slot (a pool's
    /// lock or leader lease); `None` for a standalone lock.
    pub hash_tag: Option<String>,
    /// The holder, as [`ClusterLock::info`](crate::ClusterLock::info)
    /// reports it.
    pub info: LockInfo,
}

/// One of a pool's streams (worker inboxes, node reply streams, and any
/// other stream under the pool's hash tag).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamDetail {
    /// The stream's Redis key.
    pub key: String,
    /// The stream's name within the pool (`inbox:<worker>`,
    /// `replies:<node>`, ...).
    pub name: String,
    /// Entries in the stream.
    pub length: u64,
    /// Id of the last entry ever added.
    pub last_generated_id: String,
    /// Its consumer groups (the pool's own streams have none).
    pub groups: Vec<ConsumerGroupInfo>,
}

/// A consumer group of a stream (`XINFO GROUPS`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerGroupInfo {
    /// Group name.
    pub name: String,
    /// Consumers in the group.
    pub consumers: u64,
    /// Entries delivered but not acknowledged.
    pub pending: u64,
    /// Id of the last entry delivered to the group.
    pub last_delivered_id: String,
    /// Entries not yet delivered, when Redis can tell.
    pub lag: Option<u64>,
}

/// Every pool in Redis: hash tags `T` with at least one of the pool's own
/// keys (`fl:{T}:map:workers`, `…:payloads`, …), by name.
///
/// # Errors
/// Redis errors.
pub async fn list_pools(client: &Client) -> Result<Vec<PoolSummary>> {
    let found = scan_all(client, "fl:{*}:*", None).await?;
    let mut by_tag: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for key in &found {
        if let Some(tag) = hash_tag(key) {
            by_tag.entry(tag).or_default().push(key);
        }
    }
    let mut pools = Vec::new();
    for (tag, tagged) in by_tag {
        let Ok(markers) = pool_marker_keys(tag) else {
            continue;
        };
        if tagged.iter().any(|k| markers.contains(*k)) {
            pools.push(PoolSummary {
                name: tag.to_string(),
                keys: tagged.len() as u64,
            });
        }
    }
    Ok(pools)
}

/// Every lock held now, with its holder; with `pool`, only the locks under
/// the pool's hash tag. Read with `HGETALL`, `PTTL` and `TIME` (never the
/// lock scripts, which are `EVALSHA`). Sorted by key.
///
/// # Errors
/// Redis errors.
pub async fn locks(client: &Client, pool: Option<&str>) -> Result<Vec<LockRecord>> {
    let pattern = match pool {
        Some(p) => {
            crate::keys::check_name("pool name", p)?;
            keys::lock(Some(&glob_escape(p)), "*")
        }
        None => "fl:{*}:lock*".to_string(),
    };
    let found = scan_all(client, &pattern, Some(ScanType::Hash)).await?;
    let now = server_time_ms(client).await?;
    let mut out = Vec::new();
    for key in found {
        let Some((hash_tag, name)) = lock_name(&key) else {
            continue;
        };
        let fields: HashMap<String, String> = client.hgetall(&key).await.map_err(from_redis)?;
        let pttl: i64 = client.pttl(&key).await.map_err(from_redis)?;
        let num = |f: &str| fields.get(f).and_then(|v| v.parse::<u64>().ok());
        let Some(token) = num("token") else {
            // Expired between SCAN and HGETALL, or not a lock record.
            continue;
        };
        out.push(LockRecord {
            key,
            hash_tag,
            info: LockInfo {
                name,
                owner_id: fields.get("owner").cloned().unwrap_or_default(),
                host: fields.get("host").cloned().unwrap_or_default(),
                pid: num("pid").unwrap_or(0) as u32,
                acquired_at_ms: num("acquired_at").unwrap_or(0),
                heartbeat_at_ms: num("heartbeat_at").unwrap_or(0),
                token,
                ttl_remaining: Duration::from_millis(pttl.max(0).unsigned_abs()),
                server_time_ms: now,
            },
        });
    }
    out.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(out)
}

/// Every stream under `pool`'s hash tag, with length and consumer groups,
/// sorted by name.
///
/// # Errors
/// Redis errors.
pub async fn streams(client: &Client, pool: &str) -> Result<Vec<StreamDetail>> {
    crate::keys::check_name("pool name", pool)?;
    let pattern = pool_stream_key(client, &glob_escape(pool), "*")?;
    let probe = pool_stream_key(client, pool, "x")?;
    let prefix = &probe[..probe.len() - 1];
    let mut out = Vec::new();
    for key in scan_all(client, &pattern, Some(ScanType::Stream)).await? {
        let Some(name) = key.strip_prefix(prefix).map(str::to_string) else {
            continue;
        };
        let info: Value = match client.xinfo_stream(&key, false, None).await {
            Ok(v) => v,
            // Deleted between SCAN and XINFO.
            Err(e) if e.details().contains("no such key") => continue,
            Err(e) => return Err(from_redis(e)),
        };
        let info = value_map(info);
        let group_count = info.get("groups").and_then(Value::as_u64).unwrap_or(0);
        let mut groups = Vec::new();
        if group_count > 0 {
            let raw: Value = client.xinfo_groups(&key).await.map_err(from_redis)?;
            for g in raw.into_array() {
                let g = value_map(g);
                groups.push(ConsumerGroupInfo {
                    name: text(&g, "name"),
                    consumers: g.get("consumers").and_then(Value::as_u64).unwrap_or(0),
                    pending: g.get("pending").and_then(Value::as_u64).unwrap_or(0),
                    last_delivered_id: text(&g, "last-delivered-id"),
                    lag: g.get("lag").and_then(Value::as_u64),
                });
            }
        }
        out.push(StreamDetail {
            name,
            length: info.get("length").and_then(Value::as_u64).unwrap_or(0),
            last_generated_id: text(&info, "last-generated-id"),
            groups,
            key,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Every key matching `pattern` (optionally of one type), deduplicated,
/// sorted; paged with `SCAN`.
async fn scan_all(client: &Client, pattern: &str, kind: Option<ScanType>) -> Result<Vec<String>> {
    let mut seen = HashSet::new();
    let mut cursor = "0".to_string();
    loop {
        let (next, page): (String, Vec<String>) = client
            .scan_page(cursor, pattern.to_string(), Some(SCAN_COUNT), kind.clone())
            .await
            .map_err(from_redis)?;
        seen.extend(page);
        if next == "0" {
            break;
        }
        cursor = next;
    }
    let mut keys: Vec<String> = seen.into_iter().collect();
    keys.sort();
    Ok(keys)
}

/// The hash tag of a Flotilla key `fl:{tag}:…`.
fn hash_tag(key: &str) -> Option<&str> {
    let rest = key.strip_prefix("fl:{")?;
    let end = rest.find('}')?;
    Some(&rest[..end])
}

/// Keys that only a pool named `tag` has.
fn pool_marker_keys(tag: &str) -> Result<HashSet<String>> {
    let mut markers = HashSet::new();
    for map in [
        keys::WORKERS_MAP,
        keys::KEEPALIVE_MAP,
        keys::CLEANUP_MAP,
        keys::JOBS_MAP,
        keys::PENDING_MAP,
        keys::NODES_MAP,
        keys::SHUTDOWN_MAP,
    ] {
        let k = MapKeys::new(map, Some(tag))?;
        markers.insert(k.hash);
        markers.insert(k.revision);
    }
    markers.insert(keys::payloads(tag));
    markers.insert(keys::fencing(tag));
    Ok(markers)
}

/// Hash tag (when not standalone) and name of a lock holder key; `None`
/// for a key that is not in the lock layout.
fn lock_name(key: &str) -> Option<(Option<String>, String)> {
    let tag = hash_tag(key)?;
    if keys::lock(None, tag) == key {
        return Some((None, tag.to_string()));
    }
    let probe = keys::lock(Some(tag), "x");
    let name = key.strip_prefix(&probe[..probe.len() - 1])?;
    (!name.is_empty() && keys::lock(Some(tag), name) == key)
        .then(|| (Some(tag.to_string()), name.to_string()))
}

/// A reply that is a map (RESP3) or a flat key/value array (RESP2).
fn value_map(value: Value) -> HashMap<String, Value> {
    let mut out = HashMap::new();
    match value {
        Value::Map(map) => {
            for (k, v) in map.inner() {
                if let Some(k) = k.as_str() {
                    out.insert(k.to_string(), v);
                }
            }
        }
        Value::Array(items) => {
            let mut it = items.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                if let Some(k) = k.as_string() {
                    out.insert(k, v);
                }
            }
        }
        _ => {}
    }
    out
}

fn text(map: &HashMap<String, Value>, field: &str) -> String {
    map.get(field)
        .and_then(Value::as_string)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names_round_trip_through_the_key_layout() {
        assert_eq!(
            lock_name(&keys::lock(None, "nightly")),
            Some((None, "nightly".into()))
        );
        assert_eq!(
            lock_name(&keys::lock(Some("pool-a"), "scheduler")),
            Some((Some("pool-a".into()), "scheduler".into()))
        );
        assert_eq!(lock_name("fl:{pool-a}:map:jobs"), None);
        assert_eq!(lock_name("other"), None);
    }

    #[test]
    fn pool_markers_name_the_pool_maps() {
        let m = pool_marker_keys("p").unwrap();
        assert!(m.contains("fl:{p}:map:workers"));
        assert!(m.contains("fl:{p}:payloads"));
        assert!(!m.contains("fl:{p}:lock"));
        assert_eq!(hash_tag("fl:{p}:map:jobs"), Some("p"));
        assert_eq!(hash_tag("nope"), None);
    }
}
