//! `GET /metrics`: pool-level gauges in the Prometheus text format, read
//! from the dashboard's current reading (no extra Redis command).

use std::fmt::Write as _;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::Shared;
use super::cache::Reading;

/// Content type of the Prometheus text format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `GET /metrics`. Answers 200 while Redis is unreachable, with
/// `flotilla_dashboard_redis_up 0` and no pool gauges.
pub(crate) async fn metrics(State(state): State<Shared>) -> Response {
    let current = state.cache.current().await;
    let mut out = String::new();
    gauge_help(
        &mut out,
        "flotilla_dashboard_redis_up",
        "Whether the last reading of the pool succeeded.",
    );
    let up = u8::from(current.error.is_none() && current.reading.is_some());
    let _ = writeln!(out, "flotilla_dashboard_redis_up {up}");
    if let (true, Some(reading)) = (up == 1, current.reading.as_deref()) {
        pool_gauges(&mut out, &state, reading);
    }
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], out).into_response()
}

fn gauge_help(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} gauge");
}

/// A label value with `\`, `"` and newlines escaped.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn pool_gauges(out: &mut String, state: &Shared, reading: &Reading) {
    let snap = &reading.snapshot;
    let pool = label(&snap.pool);
    gauge_help(out, "flotilla_pool_workers", "Registered workers by state.");
    for s in ["active", "stale", "cleaning", "drained"] {
        let n = snap
            .workers
            .iter()
            .filter(|w| w.state(snap.server_time_ms, state.worker_ttl).as_str() == s)
            .count();
        let _ = writeln!(
            out,
            "flotilla_pool_workers{{pool=\"{pool}\",state=\"{s}\"}} {n}"
        );
    }
    gauge_help(out, "flotilla_pool_nodes", "Nodes with a keep-alive.");
    let _ = writeln!(
        out,
        "flotilla_pool_nodes{{pool=\"{pool}\"}} {}",
        snap.nodes.len()
    );
    gauge_help(out, "flotilla_pool_jobs", "Jobs by state.");
    let running = snap.jobs.len() as u64;
    let pending = snap.pending.len() as u64;
    let orphaned = snap.payloads.saturating_sub(running + pending);
    for (s, n) in [
        ("running", running),
        ("pending", pending),
        ("orphaned", orphaned),
    ] {
        let _ = writeln!(
            out,
            "flotilla_pool_jobs{{pool=\"{pool}\",state=\"{s}\"}} {n}"
        );
    }
    gauge_help(out, "flotilla_pool_worker_jobs", "Jobs owned per worker.");
    for w in &snap.workers {
        let _ = writeln!(
            out,
            "flotilla_pool_worker_jobs{{pool=\"{pool}\",worker=\"{}\"}} {}",
            label(&w.id),
            w.jobs
        );
    }
    gauge_help(
        out,
        "flotilla_pool_inbox_depth",
        "Events queued in a worker's inbox.",
    );
    for i in &snap.inboxes {
        let _ = writeln!(
            out,
            "flotilla_pool_inbox_depth{{pool=\"{pool}\",worker=\"{}\"}} {}",
            label(&i.owner),
            i.length
        );
    }
    gauge_help(
        out,
        "flotilla_pool_lock_held",
        "Locks and leader leases held, with their holder.",
    );
    for l in &reading.locks {
        let _ = writeln!(
            out,
            "flotilla_pool_lock_held{{pool=\"{pool}\",lock=\"{}\",holder=\"{}\"}} 1",
            label(&l.info.name),
            label(&l.info.owner_id)
        );
    }
    gauge_help(
        out,
        "flotilla_pool_lock_token",
        "Fencing token of each held lock.",
    );
    for l in &reading.locks {
        let _ = writeln!(
            out,
            "flotilla_pool_lock_token{{pool=\"{pool}\",lock=\"{}\"}} {}",
            label(&l.info.name),
            l.info.token
        );
    }
    gauge_help(
        out,
        "flotilla_dashboard_reading_seconds",
        "How long the last reading of the pool took.",
    );
    let _ = writeln!(
        out,
        "flotilla_dashboard_reading_seconds{{pool=\"{pool}\"}} {:.6}",
        reading.took.as_secs_f64()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped() {
        assert_eq!(label(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(label("x\ny"), "x\\ny");
    }
}
