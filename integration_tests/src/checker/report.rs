//! What the checker reports: the violations of each invariant, and the
//! counts of what it checked and of what it excused.

use std::fmt;

use serde::Serialize;

use super::Interval;

/// An invariant broken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Violation {
    /// I1: two workers ran `key` at once.
    Overlap {
        /// The earlier interval.
        first: Interval,
        /// The interval that started before the first ended.
        second: Interval,
    },
    /// I1: a paused process kept a job after resuming, or its stale
    /// window overlaps a run with a lower or equal fencing token.
    PausedOwnerNotFenced {
        /// The interval of the paused process (as recorded).
        stale: Interval,
        /// What was wrong.
        reason: String,
    },
    /// I2: an admitted, not stopped key runs nowhere at the check instant.
    NotRunning {
        /// Job key.
        key: String,
    },
    /// I2: a key whose stop was confirmed still runs at the check instant.
    StoppedStillRunning {
        /// The interval still open.
        interval: Interval,
    },
    /// I3: two admissions of a key without a stop request between them.
    DoubleAdmission {
        /// Job key.
        key: String,
        /// Times of the two `Ok`s, ns.
        at: (u64, u64),
    },
    /// I2: `stop_job` answered `Ok` or `JobNotFound`, yet the key ran
    /// after it (beyond `stop_grace`) before any new dispatch of it.
    StopUndone {
        /// `ok` or `not_found`.
        outcome: String,
        /// When `stop_job` answered, ns.
        stopped_at: u64,
        /// The interval that ran after it.
        interval: Interval,
    },
    /// I2: the pool recorded that a run finished (the job left the pool),
    /// yet a run of the key followed before any new dispatch of it.
    FinishUndone {
        /// When the finish was recorded, ns.
        finished_at: u64,
        /// The fencing token of the run that finished.
        token: u64,
        /// The run that followed.
        interval: Interval,
    },
    /// I3 with an idempotency window: a windowed dispatch admitted a key
    /// less than a window after another windowed admission of it, with
    /// Redis's data and clock kept in between.
    WindowBroken {
        /// Job key.
        key: String,
        /// The earliest the first admission can have been made, ns.
        first_earliest: u64,
        /// When the second admission's `Ok` came back, ns.
        second: u64,
        /// The first admission's window, ms.
        window_ms: u64,
    },
    /// I4: a worker gave up a key it still owned in every ring view nearby.
    NeedlessMove {
        /// Job key.
        key: String,
        /// The worker that stopped it.
        worker: String,
        /// When, ns.
        at: u64,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |ns: u64| ns as f64 / 1e6;
        let iv = |i: &Interval| {
            format!(
                "{}@{} (pid {}, token {}) [{:.1} ms, {}]",
                i.key,
                i.worker,
                i.pid,
                i.token,
                ms(i.start),
                i.end
                    .map_or("open".to_string(), |e| format!("{:.1} ms", ms(e)))
            )
        };
        match self {
            Violation::Overlap { first, second } => {
                write!(f, "I1 overlap: {} and {}", iv(first), iv(second))
            }
            Violation::PausedOwnerNotFenced { stale, reason } => {
                write!(f, "I1 paused owner: {}: {reason}", iv(stale))
            }
            Violation::NotRunning { key } => write!(f, "I2 lost: {key} runs nowhere"),
            Violation::StoppedStillRunning { interval } => {
                write!(f, "I2 stopped but running: {}", iv(interval))
            }
            Violation::DoubleAdmission { key, at } => write!(
                f,
                "I3 double admission of {key} at {:.1} ms and {:.1} ms",
                ms(at.0),
                ms(at.1)
            ),
            Violation::StopUndone {
                outcome,
                stopped_at,
                interval,
            } => write!(
                f,
                "I2 stop undone: stop_job answered {outcome} at {:.1} ms, yet {} ran after it",
                ms(*stopped_at),
                iv(interval)
            ),
            Violation::FinishUndone {
                finished_at,
                token,
                interval,
            } => write!(
                f,
                "I2 finish undone: run {token} finished (recorded) at {:.1} ms, yet {} ran after it",
                ms(*finished_at),
                iv(interval)
            ),
            Violation::WindowBroken {
                key,
                first_earliest,
                second,
                window_ms,
            } => write!(
                f,
                "I3 window broken: {key} admitted at {:.1} ms or later, and again by {:.1} ms, within its {window_ms} ms window",
                ms(*first_earliest),
                ms(*second)
            ),
            Violation::NeedlessMove { key, worker, at } => write!(
                f,
                "I4 needless move: {key} left {worker} at {:.1} ms though it still owned it",
                ms(*at)
            ),
        }
    }
}

/// What the checker found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Every violation.
    pub violations: Vec<Violation>,
    /// Intervals built from the ledgers.
    pub intervals: usize,
    /// Admissions (`Ok`) seen.
    pub admissions: usize,
    /// Paused owners accepted as fenced stale windows.
    pub stale_windows: usize,
    /// Longest stale window (resume → watchdog stop), ns.
    pub worst_stale_window_ns: u64,
    /// Unrequested stops checked against the ring (I4).
    pub moves_checked: usize,
    /// Stop answers (`Ok` or `JobNotFound`) checked to hold.
    pub stops_checked: usize,
    /// Second admissions of a key after Redis lost its data while every
    /// process running the key was out of reach (see I3 above): nothing
    /// reachable knew the key then, so a new dispatch is admitted again
    /// (I1 is still checked: the cut-off copy must not run beside it).
    pub readmitted_after_loss: usize,
    /// Keys the dispatcher believes running that run nowhere at the end
    /// because two faults took every copy: the process that had stopped
    /// the key on a lease loss (and held it for re-assertion) was killed,
    /// and Redis lost its data before anything restarted the key (see
    /// `lost_with_killed_holder`). Counted, not flagged.
    pub lost_with_killed_holder: Vec<String>,
    /// Stop answers undone after Redis lost data while the worker process
    /// whose node asked for the stop, and the processes of the runs it
    /// stopped, had been killed or were out of reach from the loss on:
    /// two faults took every memory of the stop (see `stops.rs`). Counted,
    /// not flagged.
    pub stops_lost_with_their_holders: usize,
    /// Finishes recorded by the pool (`--lifecycle` runs) checked to hold.
    pub finishes_checked: usize,
    /// Recorded finishes undone after Redis lost data while the process
    /// that recorded the finish (the only one that remembers it) had been
    /// killed, or was out of reach from the loss on: two faults took every
    /// memory of the end. Counted, not flagged.
    pub finishes_lost_with_their_holder: usize,
    /// Final failures (`--fail-for-good` runs) whose process was killed
    /// after the pool recorded the failure and before it logged it (the
    /// ledger's `Finished` line): the key's pair ends at the failure, as
    /// at a finish. Counted, not flagged.
    pub final_failures_cut_short: usize,
    /// Keys the dispatcher believes running whose last run was such a
    /// final failure, at the I2 check instant: they left the pool and must
    /// run nowhere (a recovery or the final convergence does not wait for
    /// them).
    pub left_with_final_failure_cut_short: Vec<String>,
    /// Keys admitted and not running at the I2 check instant because their
    /// last run failed within `restart_within` before it (the pool waits
    /// out a backoff before the restart).
    pub restarting_at_end: usize,
    /// Admissions of dispatches with an idempotency window.
    pub windowed_admissions: usize,
    /// `AlreadyDispatched` answers.
    pub window_refusals: usize,
    /// Windowed admissions of a key within the window of the one before,
    /// with a loss of Redis's data or a step of its clock in between (the
    /// marker forgotten or expired early): counted, not flagged.
    pub window_readmissions_excused: usize,
}

impl Report {
    /// Whether no invariant was broken.
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }

    /// Whether a key believed running may run nowhere at the check
    /// instant: lost to two faults, or gone with a final failure whose log
    /// a kill cut short.
    pub fn not_expected_to_run(&self, key: &str) -> bool {
        self.lost_with_killed_holder.iter().any(|k| k == key)
            || self
                .left_with_final_failure_cut_short
                .iter()
                .any(|k| k == key)
    }

    /// The keys of [`not_expected_to_run`](Self::not_expected_to_run).
    pub fn not_expected_to_run_keys(&self) -> Vec<String> {
        let mut keys = self.lost_with_killed_holder.clone();
        keys.extend(self.left_with_final_failure_cut_short.iter().cloned());
        keys
    }
}
