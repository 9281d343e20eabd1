//! Jobs that end on their own, for the chaos suite's `--lifecycle` runs.
//!
//! With `flotilla-test-worker --lifecycle`, a key's class (a hash of the
//! key, so every process agrees) decides how its runs end:
//! * [`KeyClass::Flaky`] (1 key in 8): each run fails 0.3–4 s after its
//!   start (one run in four at once, within 50 ms: before its start may
//!   be recorded) (`JobOutcome::failed`); the pool restarts it after a backoff
//!   ([`restart_policy`]: 0.1–1 s), on the same worker, for ever;
//! * [`KeyClass::Finite`] (1 in 8): each run finishes 1–8 s after its start
//!   (one in four within 50 ms)
//!   (`JobOutcome::finished`): the job leaves the pool until the load
//!   dispatches it again;
//! * the rest run until stopped, as in every other run.
//!
//! With the chaos suite's `--fail-for-good`, half the flaky keys
//! ([`fails_for_good`]) are dispatched with [`final_failure_policy`]: their
//! second failure in a row is recorded as final, and the job leaves the
//! pool until the load dispatches it again.
//!
//! The handler writes an [`Ended`](Record::Ended) line when a run ends on
//! its own, before it reports the end; [`FinishedLayer`] writes a
//! [`Finished`](Record::Finished) line when the pool has recorded a
//! finished run in Redis (its `job finished` event), or a run's failure as
//! final (`job failed too often; not restarted`), which is when the end
//! must hold (the checker: no run of the key after it until a new
//! dispatch).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use flotilla_pool::{Job, RestartPolicy};
use rand::Rng;
use tokio_util::sync::CancellationToken;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::Context;

use crate::ledger::{LedgerWriter, Record};

/// How a key's runs end (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyClass {
    /// Runs until stopped.
    LongLived,
    /// Each run fails after a while; the pool restarts it.
    Flaky,
    /// Each run finishes after a while.
    Finite,
}

/// FNV-1a of `key`: every process computes the same classes.
pub(crate) fn key_hash(key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The class of `key` (its hash modulo 8).
pub fn class_of(key: &str) -> KeyClass {
    match key_hash(key) % 8 {
        0 => KeyClass::Flaky,
        1 => KeyClass::Finite,
        _ => KeyClass::LongLived,
    }
}

/// Whether `key` is one of the flaky keys (half of them) the load
/// dispatches with [`final_failure_policy`] when asked to (the chaos
/// suite's `--fail-for-good`): their second failure in a row is their
/// last, and the job leaves the pool as a finished one does.
pub fn fails_for_good(key: &str) -> bool {
    let h = key_hash(key);
    h.is_multiple_of(8) && (h / 8).is_multiple_of(2)
}

/// The restart policy of the keys that [`fails_for_good`]: one restart
/// after 0.1 s, then failed for good (the count never starts over).
pub fn final_failure_policy() -> RestartPolicy {
    RestartPolicy::default()
        .first_delay(Duration::from_millis(100))
        .max_delay(Duration::from_secs(1))
        .max_failures(2)
        .reset_after(Duration::from_secs(3_600))
}

/// The restart policy of lifecycle runs: quick restarts (0.1–1 s), as
/// many as the pool allows, the count starting over after a 2 s run.
pub fn restart_policy() -> RestartPolicy {
    RestartPolicy::default()
        .first_delay(Duration::from_millis(100))
        .max_delay(Duration::from_secs(1))
        .max_failures(RestartPolicy::MAX_FAILURES)
        .reset_after(Duration::from_secs(2))
}

/// The longest a flaky key waits between a failed run and its restart
/// (the policy's `max_delay`, with room for a slow worker).
pub const RESTART_WITHIN: Duration = Duration::from_secs(3);

/// [`RESTART_WITHIN`] when handler starts take up to `start_max`
/// (`--start-max-ms`): a run may fail while its own `start` is still under
/// way (its timer runs from the start line), and the pool handles that
/// report once the start has returned.
pub fn restart_within(start_max: Duration) -> Duration {
    RESTART_WITHIN + start_max
}

/// One handler's runs of lifecycle keys: a timer per run that ends it.
#[derive(Debug, Default)]
pub struct RunTimers {
    runs: Arc<Mutex<HashMap<String, Run>>>,
}

#[derive(Debug)]
struct Run {
    token: u64,
    ended: bool,
    timer: CancellationToken,
}

impl RunTimers {
    /// Starts the timer that ends run `job` on `worker`, if its key's class
    /// ends runs; a run of the key still here is replaced.
    pub fn begin(&self, job: &Job, worker: &str, ledger: &LedgerWriter) {
        let mut rng = rand::rng();
        // One run in four ends at once, racing the record of its start.
        let at_once = rng.random_ratio(1, 4);
        let (after, fail) = match class_of(&job.key) {
            KeyClass::LongLived => return,
            _ if at_once => (
                rng.random_range(0..=50),
                class_of(&job.key) == KeyClass::Flaky,
            ),
            KeyClass::Flaky => (rng.random_range(300..=4_000), true),
            KeyClass::Finite => (rng.random_range(1_000..=8_000), false),
        };
        let timer = CancellationToken::new();
        let replaced = self.lock().insert(
            job.key.clone(),
            Run {
                token: job.fencing_token,
                ended: false,
                timer: timer.clone(),
            },
        );
        if let Some(old) = replaced {
            old.timer.cancel();
        }
        let runs = self.runs.clone();
        let (key, token, worker) = (job.key.clone(), job.fencing_token, worker.to_string());
        let outcome = job.outcome();
        let ledger = ledger.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = timer.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(after)) => {}
            }
            {
                let mut runs = runs.lock().unwrap_or_else(|e| e.into_inner());
                match runs.get_mut(&key) {
                    Some(run) if run.token == token && !run.ended => run.ended = true,
                    _ => return, // stopped or replaced meanwhile
                }
                // Under the lock: a `stop` racing this end sees it ended.
                ledger.record(Record::Ended {
                    key: key.clone(),
                    worker,
                    token,
                    outcome: if fail { "failed" } else { "finished" }.to_string(),
                });
            }
            if fail {
                outcome.failed("lifecycle run failed on purpose");
            } else {
                outcome.finished();
            }
        });
    }

    /// Forgets the run of `key` as the pool stops it; whether it had ended
    /// on its own already (its end is in the ledger: the stop ends
    /// nothing).
    pub fn end(&self, key: &str) -> bool {
        match self.lock().remove(key) {
            Some(run) => {
                run.timer.cancel();
                run.ended
            }
            None => false,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Run>> {
        self.runs.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A tracing layer that writes a [`Record::Finished`] line for each
/// `job finished` event of the pool (a finished run recorded in Redis) and
/// each `job failed too often; not restarted` (a final failure recorded).
/// The ledger is set once it is open; events before that are dropped
/// (no job runs before the workers exist).
#[derive(Debug, Clone, Default)]
pub struct FinishedLayer {
    ledger: Arc<OnceLock<LedgerWriter>>,
}

impl FinishedLayer {
    /// The cell the ledger goes into once open.
    pub fn ledger(&self) -> Arc<OnceLock<LedgerWriter>> {
        self.ledger.clone()
    }
}

/// The target of the pool's `job finished` and `job failed too often; not
/// restarted` events.
pub const FINISHED_TARGET: &str = "flotilla_pool::lifecycle::restart";

/// Whether a pool event's message reports an end that took the job out of
/// the pool.
fn is_final_end(message: &str) -> bool {
    message == "job finished" || message == "job failed too often; not restarted"
}

#[derive(Default)]
struct FinishedFields {
    message: bool,
    key: Option<String>,
    token: Option<u64>,
}

impl Visit for FinishedFields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = is_final_end(&format!("{value:?}")),
            "key" => self.key = Some(format!("{value:?}").trim_matches('"').to_string()),
            _ => {}
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message = is_final_end(value),
            "key" => self.key = Some(value.to_string()),
            _ => {}
        }
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "token" {
            self.token = Some(value);
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for FinishedLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != FINISHED_TARGET {
            return;
        }
        let mut fields = FinishedFields::default();
        event.record(&mut fields);
        if let (true, Some(key), Some(token), Some(ledger)) =
            (fields.message, fields.key, fields.token, self.ledger.get())
        {
            ledger.record(Record::Finished { key, token });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn about_a_quarter_of_keys_end_on_their_own() {
        let classes: Vec<KeyClass> = (0..4_000)
            .map(|i| class_of(&format!("job-{i:04}")))
            .collect();
        let count = |c: KeyClass| classes.iter().filter(|k| **k == c).count();
        assert!(
            (350..650).contains(&count(KeyClass::Flaky)),
            "{}",
            count(KeyClass::Flaky)
        );
        assert!(
            (350..650).contains(&count(KeyClass::Finite)),
            "{}",
            count(KeyClass::Finite)
        );
        assert!(restart_policy().validate().is_ok());
        let final_failures = (0..4_000)
            .filter(|i| fails_for_good(&format!("job-{i:04}")))
            .count();
        assert!((150..350).contains(&final_failures), "{final_failures}");
        assert!(final_failure_policy().validate().is_ok());
    }

    /// The pool's two final ends (a finish, a last failure) become
    /// `Finished` lines; its other events of that target do not.
    #[test]
    fn finishes_and_final_failures_reach_the_ledger() {
        use tracing_subscriber::layer::SubscriberExt;

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.jsonl");
        let layer = FinishedLayer::default();
        let writer = LedgerWriter::open(&path, crate::clock::ServerClock::new()).unwrap();
        assert!(layer.ledger().set(writer).is_ok());
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: FINISHED_TARGET, key = "a", token = 3u64, "job finished");
            tracing::error!(
                target: FINISHED_TARGET,
                key = "b",
                token = 9u64,
                failures = 2u32,
                error = %"boom",
                "job failed too often; not restarted"
            );
            tracing::warn!(target: FINISHED_TARGET, key = "c", token = 4u64, "job failed; restarting after a backoff");
        });
        let records: Vec<Record> = crate::ledger::read_ledger(&path)
            .unwrap()
            .into_iter()
            .map(|l| l.record)
            .collect();
        assert_eq!(
            records,
            vec![
                Record::Finished {
                    key: "a".into(),
                    token: 3
                },
                Record::Finished {
                    key: "b".into(),
                    token: 9
                },
            ]
        );
    }
}
