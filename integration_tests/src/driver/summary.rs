//! The result of a chaos run: what was injected, what was dispatched, what
//! the checker found.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::PathBuf;
use std::time::Duration;

use crate::checker::Report;
use crate::ledger::FaultKind;

/// What a chaos run did and found.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ChaosSummary {
    /// Wall-clock length of the run (faults, then recovery window).
    pub duration: Duration,
    /// The seed used.
    pub seed: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<FaultKind, u64>,
    /// Worst time from a fault to "every running key runs on a member
    /// that is up", by kind.
    pub worst_recovery_by_kind: BTreeMap<FaultKind, Duration>,
    /// The keys that came back last (at most 5, those still not running at
    /// the poll before recovery) in each kind's worst recovery: where to
    /// look in the ledgers and logs when a recovery is slow.
    pub last_to_recover_by_kind: BTreeMap<FaultKind, Vec<String>>,
    /// Faults that did not recover within the limit, and harness problems.
    pub unrecovered: Vec<String>,
    /// Time to converge in the final recovery window.
    pub final_convergence: Option<Duration>,
    /// `dispatch_job` returned `Ok`.
    pub dispatch_ok: u64,
    /// `dispatch_job` returned `JobExists`.
    pub dispatch_exists: u64,
    /// Admissions (`Ok`) of dispatches with an idempotency window.
    pub windowed_ok: u64,
    /// `AlreadyDispatched` answers (dispatches with a window).
    pub dispatch_recent: u64,
    /// Admissions and stops of scheduled keys the schedule's leaders
    /// recorded (`--schedule-keys`).
    pub scheduled: (u64, u64),
    /// Other dispatch errors, by kind.
    pub dispatch_errors: BTreeMap<String, u64>,
    /// `stop_job` returned `Ok`.
    pub stop_ok: u64,
    /// `stop_job` returned `JobNotFound`.
    pub stop_not_found: u64,
    /// `stop_job` failed otherwise.
    pub stop_errors: u64,
    /// Concurrent dispatches of one key from both nodes.
    pub races: u64,
    /// Dispatches and stops sent through a worker process's node.
    pub via_workers: u64,
    /// Keys believed running at the end.
    pub running_at_end: usize,
    /// Every violation, as text.
    pub violations: Vec<String>,
    /// The checker's report.
    pub report: Report,
    /// Where the ledgers were kept, if asked.
    pub ledger_dir: Option<PathBuf>,
}

impl ChaosSummary {
    /// The worst recovery time over all faults.
    pub fn worst_recovery(&self) -> Duration {
        self.worst_recovery_by_kind
            .values()
            .copied()
            .max()
            .unwrap_or_default()
    }

    /// Whether the run found nothing wrong.
    pub fn passed(&self) -> bool {
        self.violations.is_empty() && self.unrecovered.is_empty()
    }

    /// A plain-text summary table.
    pub fn table(&self) -> String {
        let mut t = String::new();
        let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1e3);
        let _ = writeln!(
            t,
            "chaos run: {:.1} s, seed {}",
            self.duration.as_secs_f64(),
            self.seed
        );
        let _ = writeln!(
            t,
            "| fault | injected | worst recovery | its last keys to recover |"
        );
        let _ = writeln!(t, "|---|---:|---:|---|");
        for kind in FaultKind::ALL {
            let n = self.faults.get(&kind).copied().unwrap_or(0);
            let r = self
                .worst_recovery_by_kind
                .get(&kind)
                .map_or("-".to_string(), |d| ms(*d));
            let last = self
                .last_to_recover_by_kind
                .get(&kind)
                .map_or(String::new(), |keys| keys.join(", "));
            let _ = writeln!(t, "| {} | {n} | {r} | {last} |", kind.name());
        }
        let total: u64 = self.faults.values().sum();
        let _ = writeln!(
            t,
            "| **all faults** | {total} | {} | |",
            ms(self.worst_recovery())
        );
        let _ = writeln!(t);
        let errors: u64 = self.dispatch_errors.values().sum();
        let _ = writeln!(t, "| measure | value |");
        let _ = writeln!(t, "|---|---:|");
        let rows = [
            ("jobs dispatched (Ok)", self.dispatch_ok.to_string()),
            ("dispatch → JobExists", self.dispatch_exists.to_string()),
            (
                "windowed: Ok / AlreadyDispatched / within a window after a loss",
                format!(
                    "{} / {} / {}",
                    self.windowed_ok, self.dispatch_recent, self.report.window_readmissions_excused
                ),
            ),
            (
                "scheduled: started / stopped (recorded by the leaders)",
                format!("{} / {}", self.scheduled.0, self.scheduled.1),
            ),
            (
                "dispatch errors (timeout/unavailable/...)",
                errors.to_string(),
            ),
            ("concurrent dispatch races", self.races.to_string()),
            (
                "dispatches and stops through worker processes",
                self.via_workers.to_string(),
            ),
            (
                "stops Ok / not found / failed",
                format!(
                    "{} / {} / {}",
                    self.stop_ok, self.stop_not_found, self.stop_errors
                ),
            ),
            (
                "job runs checked (intervals)",
                self.report.intervals.to_string(),
            ),
            (
                "paused owners fenced (stale windows)",
                format!(
                    "{} (worst {:.1} ms after SIGCONT)",
                    self.report.stale_windows,
                    self.report.worst_stale_window_ns as f64 / 1e6
                ),
            ),
            (
                "admitted again after a data loss, the key's holder out of reach",
                self.report.readmitted_after_loss.to_string(),
            ),
            (
                "lost with a killed holder and Redis's data (two faults)",
                self.report.lost_with_killed_holder.len().to_string(),
            ),
            (
                "unrequested moves checked against the ring",
                self.report.moves_checked.to_string(),
            ),
            (
                "stop answers checked to hold (undone with the worker processes that asked and stopped killed or cut off and Redis's data)",
                format!(
                    "{} ({})",
                    self.report.stops_checked, self.report.stops_lost_with_their_holders
                ),
            ),
            (
                "recorded finishes checked to hold (undone with their holder killed or cut off and Redis's data)",
                format!(
                    "{} ({})",
                    self.report.finishes_checked, self.report.finishes_lost_with_their_holder
                ),
            ),
            (
                "final failures whose log a kill cut short (the pair ends at the failure)",
                self.report.final_failures_cut_short.to_string(),
            ),
            (
                "keys waiting out a restart backoff at the end",
                self.report.restarting_at_end.to_string(),
            ),
            ("keys running at the end", self.running_at_end.to_string()),
            (
                "final convergence",
                self.final_convergence.map_or("not reached".into(), ms),
            ),
            (
                "faults not recovered in time",
                self.unrecovered.len().to_string(),
            ),
            ("violations (I1–I4)", self.violations.len().to_string()),
            ("worst recovery time", ms(self.worst_recovery())),
        ];
        // The windowed and scheduled rows only for runs with windows
        // (`--window-ms`) or a schedule (`--schedule-keys`).
        let windowed = self.windowed_ok + self.dispatch_recent > 0;
        let scheduled = self.scheduled != (0, 0);
        for (k, v) in rows {
            if (k.starts_with("windowed") && !windowed)
                || (k.starts_with("scheduled") && !scheduled)
            {
                continue;
            }
            let _ = writeln!(t, "| {k} | {v} |");
        }
        for (k, v) in &self.dispatch_errors {
            let _ = writeln!(t, "dispatch error {k}: {v}");
        }
        for u in &self.unrecovered {
            let _ = writeln!(t, "NOT RECOVERED: {u}");
        }
        for v in self.violations.iter().take(50) {
            let _ = writeln!(t, "VIOLATION: {v}");
        }
        if let Some(dir) = &self.ledger_dir {
            let _ = writeln!(t, "ledgers kept in {}", dir.display());
        }
        t
    }

    /// The summary as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        let faults: BTreeMap<String, u64> = self
            .faults
            .iter()
            .map(|(k, v)| (format!("{k:?}"), *v))
            .collect();
        let recovery: BTreeMap<String, u128> = self
            .worst_recovery_by_kind
            .iter()
            .map(|(k, v)| (format!("{k:?}"), v.as_millis()))
            .collect();
        serde_json::json!({
            "duration_ms": self.duration.as_millis(),
            "seed": self.seed,
            "faults": faults,
            "worst_recovery_ms_by_fault": recovery,
            "last_to_recover_by_fault": self
                .last_to_recover_by_kind
                .iter()
                .map(|(k, v)| (format!("{k:?}"), v.clone()))
                .collect::<BTreeMap<String, Vec<String>>>(),
            "worst_recovery_ms": self.worst_recovery().as_millis(),
            "unrecovered": self.unrecovered,
            "final_convergence_ms": self.final_convergence.map(|d| d.as_millis()),
            "dispatch_ok": self.dispatch_ok,
            "dispatch_exists": self.dispatch_exists,
            "windowed_ok": self.windowed_ok,
            "dispatch_recent": self.dispatch_recent,
            "window_readmissions_excused": self.report.window_readmissions_excused,
            "scheduled_started": self.scheduled.0,
            "scheduled_stopped": self.scheduled.1,
            "dispatch_errors": self.dispatch_errors,
            "stop_ok": self.stop_ok,
            "stop_not_found": self.stop_not_found,
            "stop_errors": self.stop_errors,
            "races": self.races,
            "via_workers": self.via_workers,
            "running_at_end": self.running_at_end,
            "intervals": self.report.intervals,
            "stale_windows": self.report.stale_windows,
            "readmitted_after_loss": self.report.readmitted_after_loss,
            "lost_with_killed_holder": self.report.lost_with_killed_holder,
            "moves_checked": self.report.moves_checked,
            "stops_checked": self.report.stops_checked,
            "stops_lost_with_their_holders": self.report.stops_lost_with_their_holders,
            "finishes_checked": self.report.finishes_checked,
            "finishes_lost_with_their_holder": self.report.finishes_lost_with_their_holder,
            "final_failures_cut_short": self.report.final_failures_cut_short,
            "restarting_at_end": self.report.restarting_at_end,
            "violations": self.violations,
            "passed": self.passed(),
        })
    }
}
