//! One decoder per record format of the pool's maps.

/// Owner worker and fencing token of a `jobs` map value
/// (`"<worker> <token>"`).
pub(crate) fn job_owner(value: &str) -> Option<(&str, u64)> {
    let (worker, token) = value.split_once(' ')?;
    Some((worker, token.parse().ok()?))
}

/// Token and deadline of a `pending` map value
/// (`"<token> <deadline_ms>[ <node>/<request>]"`).
pub(crate) fn pending_guard(value: &str) -> Option<(u64, u64)> {
    let mut parts = value.split(' ');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// A `workers` map value: a JSON object with node, host, pid and
/// created_at_ms (written by `register.lua`), and drained_at_ms while the
/// worker is drained (`drain_worker.lua`). Fields that are missing or of
/// another type read as `None` / empty / 0.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct WorkerEntry {
    pub(crate) node: Option<String>,
    pub(crate) host: String,
    pub(crate) pid: u32,
    pub(crate) created_at_ms: Option<u64>,
    pub(crate) drained_at_ms: Option<u64>,
}

impl WorkerEntry {
    /// Decodes a `workers` map value; `None` when it is not a JSON object.
    pub(crate) fn parse(value: &str) -> Option<WorkerEntry> {
        let info: serde_json::Value = serde_json::from_str(value).ok()?;
        let info = info.as_object()?;
        Some(WorkerEntry {
            node: info
                .get("node")
                .and_then(|n| n.as_str())
                .map(str::to_string),
            host: info
                .get("host")
                .and_then(|h| h.as_str())
                .unwrap_or_default()
                .to_string(),
            pid: info.get("pid").and_then(|p| p.as_u64()).unwrap_or(0) as u32,
            created_at_ms: info.get("created_at_ms").and_then(|c| c.as_u64()),
            drained_at_ms: info
                .get(crate::keys::DRAINED_FIELD)
                .and_then(|d| d.as_u64()),
        })
    }
}
