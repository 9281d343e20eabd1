//! Text rendering of the views: tables that fit in 80 columns.

use std::fmt::Write as _;

use crate::format::{Table, ago, bytes, duration_ms, fit, hex_dump, until};
use crate::views::*;

/// Column width of worker, node and job ids in tables (ids are longer;
/// `--json` has them whole).
const ID: usize = 14;

pub(crate) fn workers(v: &[WorkerView]) -> String {
    let mut t = Table::new(&[
        ("WORKER", ID),
        ("NODE", 12),
        ("HOST", 10),
        ("PID", 7),
        ("AGE", 6),
        ("KEEPALIVE", 10),
        ("JOBS", 5),
        ("STATE", 8),
    ]);
    for w in v {
        t.row(vec![
            w.id.clone(),
            w.node.clone(),
            w.host.clone(),
            w.pid.to_string(),
            duration_ms(w.age_ms),
            ago(w.keepalive_age_ms),
            w.jobs.to_string(),
            w.state.to_string(),
        ]);
    }
    t.render()
}

pub(crate) fn nodes(v: &[NodeView]) -> String {
    let mut t = Table::new(&[
        ("NODE", 36),
        ("KEEPALIVE", 10),
        ("WORKERS", 7),
        ("JOBS", 6),
        ("REPLIES", 7),
    ]);
    for n in v {
        t.row(vec![
            n.id.clone(),
            ago(n.keepalive_age_ms),
            n.workers.to_string(),
            n.jobs.to_string(),
            n.reply_stream_length.to_string(),
        ]);
    }
    t.render()
}

pub(crate) fn jobs(v: &JobsView) -> String {
    let mut t = Table::new(&[
        ("KEY", 24),
        ("STATE", 10),
        ("OWNER", ID),
        ("TOKEN", 12),
        ("AGE", 7),
        ("PAYLOAD", 9),
    ]);
    for j in &v.jobs {
        t.row(vec![
            j.key.clone(),
            j.state.to_string(),
            j.owner.clone(),
            j.token.to_string(),
            j.age_ms.map_or("-".into(), duration_ms),
            j.payload_size.map_or("-".into(), bytes),
        ]);
    }
    let mut out = t.render();
    let _ = writeln!(out, "{} job(s)", v.jobs.len());
    if !v.failed.is_empty() {
        let mut f = Table::new(&[("FAILED JOB", 24), ("FAILURES", 8), ("LAST ERROR", 60)]);
        for j in &v.failed {
            f.row(vec![
                j.key.clone(),
                j.failures.to_string(),
                fit(&j.last_error, 60),
            ]);
        }
        out.push_str(&f.render());
        let _ = writeln!(
            out,
            "{} failed job(s) (stop or dispatch again to clear)",
            v.failed.len()
        );
    }
    out
}

/// Hex dumps in text output stop after this many bytes (`--json` has all).
const HEX_LIMIT: usize = 4096;

pub(crate) fn job(v: &JobDetailView, payload: &[u8]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "job      {}", v.key);
    let _ = writeln!(out, "state    {}", v.state);
    if let Some(n) = v.failures {
        let _ = writeln!(
            out,
            "failures {n}, last error: {}",
            fit(v.last_error.as_deref().unwrap_or(""), 200)
        );
    }
    let _ = writeln!(out, "owner    {}", v.owner.as_deref().unwrap_or("-"));
    let _ = writeln!(
        out,
        "token    {}",
        v.token.map_or("-".into(), |t| t.to_string())
    );
    let _ = writeln!(
        out,
        "created  {}",
        v.age_ms.map_or("-".into(), |a| ago(Some(a)))
    );
    if let Some(p) = &v.pending {
        let _ = writeln!(
            out,
            "pending  token {}, deadline {}",
            p.token,
            until(p.expires_in_ms)
        );
    }
    match (&v.payload_hex, v.payload_size) {
        (Some(_), Some(size)) => {
            if size < 1024 {
                let _ = writeln!(out, "payload  {size} bytes");
            } else {
                let _ = writeln!(out, "payload  {} ({size} bytes)", bytes(size));
            }
            if let Some(text) = &v.payload_utf8 {
                let note = if v.payload_is_utf8 == Some(true) {
                    ""
                } else {
                    " (not valid UTF-8)"
                };
                let _ = writeln!(
                    out,
                    "utf-8{note}: {}",
                    fit(&text.escape_debug().to_string(), 400)
                );
            }
            let _ = writeln!(out, "hex:");
            out.push_str(&hex_dump(&payload[..payload.len().min(HEX_LIMIT)]));
            if payload.len() > HEX_LIMIT {
                let _ = writeln!(
                    out,
                    "… {} more bytes (see --json)",
                    payload.len() - HEX_LIMIT
                );
            }
        }
        _ => {
            let _ = writeln!(out, "payload  -");
        }
    }
    out
}

pub(crate) fn pending(v: &[PendingView]) -> String {
    let mut t = Table::new(&[
        ("KEY", 30),
        ("TOKEN", 12),
        ("DEADLINE", 16),
        ("DISPATCHER", 16),
    ]);
    for p in v {
        t.row(vec![
            p.key.clone(),
            p.token.to_string(),
            until(p.expires_in_ms),
            p.dispatcher_node.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    t.render()
}

/// Locks; a lock under `pool`'s tag shows by name alone, others as
/// `tag/name`.
pub(crate) fn locks(v: &[LockView], pool: Option<&str>) -> String {
    let mut t = Table::new(&[
        ("LOCK", 16),
        ("HOLDER", 12),
        ("HOST", 8),
        ("PID", 7),
        ("TOKEN", 16),
        ("HEARTBEAT", 9),
    ]);
    for l in v {
        let name = match &l.hash_tag {
            Some(tag) if Some(tag.as_str()) != pool => format!("{tag}/{}", l.name),
            _ => l.name.clone(),
        };
        t.row(vec![
            name,
            l.owner.clone(),
            l.host.clone(),
            l.pid.to_string(),
            l.token.to_string(),
            ago(Some(l.heartbeat_age_ms)),
        ]);
    }
    t.render()
}

pub(crate) fn streams(v: &StreamsView) -> String {
    let mut t = Table::new(&[
        ("STREAM", 30),
        ("KIND", 7),
        ("LENGTH", 8),
        ("GROUPS", 6),
        ("CONSUMERS", 9),
        ("PENDING", 8),
    ]);
    for s in &v.streams {
        t.row(vec![
            s.name.clone(),
            s.kind.to_string(),
            s.length.to_string(),
            s.groups.len().to_string(),
            s.groups
                .iter()
                .map(|g| g.consumers)
                .sum::<u64>()
                .to_string(),
            s.groups.iter().map(|g| g.pending).sum::<u64>().to_string(),
        ]);
    }
    t.render()
}

pub(crate) fn placement(v: &PlacementView) -> String {
    let mut out = String::new();
    match &v.chosen {
        Some(w) => {
            let _ = writeln!(
                out,
                "{} → {w} (highest rendezvous score of {} worker(s) in the ring)",
                v.key,
                v.ranking.len()
            );
        }
        None => {
            let _ = writeln!(out, "{} → no worker: the ring is empty", v.key);
        }
    }
    match &v.current_owner {
        Some(o) if Some(o) == v.chosen.as_ref() => {
            let _ = writeln!(out, "running now on {o} (where the ring puts it)");
        }
        Some(o) => {
            let _ = writeln!(
                out,
                "running now on {o}; a rebalance will move it to the chosen worker"
            );
        }
        None => {
            let _ = writeln!(out, "not running now");
        }
    }
    let mut t = Table::new(&[("RANK", 4), ("WORKER", 36), ("SCORE", 18), ("STATE", 8)]);
    for r in &v.ranking {
        t.row(vec![
            r.rank.to_string(),
            r.worker.clone(),
            format!("{:016x}", r.score),
            r.state.to_string(),
        ]);
    }
    out.push_str(&t.render());
    for e in &v.excluded {
        let _ = writeln!(out, "not in the ring: {} ({})", e.worker, e.reason);
    }
    out
}

pub(crate) fn pools(v: &PoolsView) -> String {
    let mut t = Table::new(&[
        ("POOL", 30),
        ("KEYS", 6),
        ("NODES", 5),
        ("WORKERS", 7),
        ("JOBS", 7),
        ("PENDING", 7),
        ("SHUTDOWN", 8),
    ]);
    for p in &v.pools {
        t.row(vec![
            p.name.clone(),
            p.keys.to_string(),
            p.nodes.to_string(),
            p.workers.to_string(),
            p.jobs.to_string(),
            p.pending.to_string(),
            if p.shutting_down { "yes" } else { "no" }.into(),
        ]);
    }
    t.render()
}

pub(crate) fn status(v: &StatusView) -> String {
    let c = &v.counts;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "pool {}  (worker TTL {}){}",
        v.pool,
        duration_ms(v.worker_ttl_ms),
        match &v.shutdown_requested_by {
            Some(n) => format!("  SHUTTING DOWN (requested by {n})"),
            None => String::new(),
        }
    );
    let _ = writeln!(out, "{}", c.membership_line());
    let _ = writeln!(
        out,
        "pending {}  cleanups {}  queued events {}  payloads {}  locks {}",
        c.pending, c.cleanups, c.queued_events, c.payloads, c.locks
    );
    if !v.nodes.is_empty() {
        out.push('\n');
        out.push_str(&nodes(&v.nodes));
    }
    if !v.workers.is_empty() {
        out.push('\n');
        out.push_str(&workers(&v.workers));
    }
    if !v.pending.is_empty() {
        out.push('\n');
        out.push_str(&pending(&v.pending));
    }
    for cl in &v.cleanups {
        let _ = writeln!(
            out,
            "cleanup of {} by {} ({})",
            cl.worker,
            cl.node,
            cl.age_ms
                .map_or("closing".into(), |a| format!("claimed {}", ago(Some(a))))
        );
    }
    if !v.locks.is_empty() {
        out.push('\n');
        out.push_str(&locks(&v.locks, Some(&v.pool)));
    }
    for m in &v.malformed {
        let _ = writeln!(out, "malformed {}[{}]: {}", m.map, m.field, m.reason);
    }
    out
}
