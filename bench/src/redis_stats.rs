//! What Redis and the OS say about a run: `INFO commandstats` deltas,
//! `used_memory`, process RSS.

use std::collections::BTreeMap;

use fred::prelude::*;
use fred::types::InfoKind;

use crate::BoxError;

/// Calls per command, from `INFO commandstats` (includes commands run
/// inside scripts).
#[derive(Debug, Clone, Default)]
pub struct CommandStats(pub BTreeMap<String, u64>);

impl CommandStats {
    /// Reads the current counters.
    pub async fn read(client: &Client) -> Result<CommandStats, BoxError> {
        Ok(CommandStats(
            flotilla_testkit::command_stats(client)
                .await?
                .into_iter()
                .collect(),
        ))
    }

    /// Calls made since `before`, without `INFO` (the measuring itself).
    pub fn since(&self, before: &CommandStats) -> CommandStats {
        CommandStats(
            self.0
                .iter()
                .filter(|(name, _)| name.as_str() != "info")
                .map(|(name, calls)| {
                    let prior = before.0.get(name).copied().unwrap_or(0);
                    (name.clone(), calls.saturating_sub(prior))
                })
                .filter(|(_, d)| *d > 0)
                .collect(),
        )
    }

    /// Sum of all calls.
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// `name per-unit, …`, largest first, at most `top` entries.
    pub fn breakdown(&self, per: f64, top: usize) -> String {
        let mut entries: Vec<(&String, &u64)> = self.0.iter().collect();
        entries.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        entries
            .into_iter()
            .take(top)
            .map(|(name, calls)| format!("{name} {:.2}", *calls as f64 / per))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// One field of an `INFO` section.
pub async fn info_field(client: &Client, kind: InfoKind, field: &str) -> Result<String, BoxError> {
    let info: String = client.info(Some(kind)).await?;
    info.lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .map(|v| v.trim().to_string())
        .ok_or_else(|| format!("INFO has no field {field}").into())
}

/// Redis `used_memory` in bytes.
pub async fn used_memory(client: &Client) -> Result<u64, BoxError> {
    Ok(info_field(client, InfoKind::Memory, "used_memory")
        .await?
        .parse()?)
}

/// Resident set size of a process (`None`: this one) in bytes, from
/// `/proc`; `None` where `/proc` is missing.
pub fn rss_bytes(pid: Option<u32>) -> Option<u64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_string(),
    };
    let status = std::fs::read_to_string(path).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
}

/// CPU seconds (user + system) Redis has used, from `INFO cpu`.
pub async fn redis_cpu_seconds(client: &Client) -> Result<f64, BoxError> {
    let user: f64 = info_field(client, InfoKind::Cpu, "used_cpu_user")
        .await?
        .parse()?;
    let sys: f64 = info_field(client, InfoKind::Cpu, "used_cpu_sys")
        .await?
        .parse()?;
    Ok(user + sys)
}

/// CPU seconds (user + system) this process has used, from
/// `/proc/self/stat` (clock ticks of 10 ms, the Linux default); `None`
/// where `/proc` is missing.
pub fn process_cpu_seconds() -> Option<f64> {
    process_cpu_seconds_of(None)
}

/// CPU seconds (user + system) of process `pid` (`None`: this one), from
/// `/proc/<pid>/stat`; `None` where `/proc` is missing.
pub fn process_cpu_seconds_of(pid: Option<u32>) -> Option<f64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".to_string(),
    };
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the command name, which is in parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line; `rest` starts at field 3.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}
