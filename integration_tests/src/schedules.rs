//! Scheduled jobs in a chaos run (`chaos --schedule-keys N`).
//!
//! Every worker process runs [`Node::schedule`] for one schedule
//! ([`SCHEDULE_NAME`]), so its leader is one of the processes the faults
//! hit (cut, paused, killed, its Redis rolled back). The producer wants
//! the keys `sched-0` … `sched-<N-1>` but a quarter of them, and which
//! quarter rotates every [`ScheduleSpec::rotate`] (by the host's wall
//! clock, which every process on it shares) until the fault phase ends: so
//! the leader keeps starting keys that came back and stopping the ones
//! that left, across leader hand-overs.
//!
//! What the leader writes in its process's ledger, for the checker:
//! * each time the producer runs: a [`Record::DispatchSent`] for every
//!   wanted key (the run is about to dispatch the missing ones) and a
//!   [`Record::StopSent`] for every unwanted one (it is about to stop those
//!   it started);
//! * once the run is published ([`Schedule::runs`]): a [`Record::Admit`]
//!   for each key it started and a [`Record::StopDone`] (`ok`, asked by
//!   this process) for each it stopped. A run's records are written only
//!   while no later run has begun anywhere in the pool (the schedule's
//!   ticker in Redis, `fl:{pool}:ticker:schedule:chaos`, still holds the
//!   run's slot): later (the process was paused or cut off meanwhile),
//!   another leader may already have stopped or started the key again,
//!   and a late line would misstate the order. Skipped runs weaken the
//!   check; they never make it stricter than the pool's promise.
//!
//! The checker then holds scheduled keys to what it holds dispatched keys
//! to: never two runs at once (I1), an admitted key runs until stopped
//! (I2), no second admission without a stop between (I3), and a stop
//! holds until the next dispatch is sent.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use flotilla_pool::fred::prelude::{Client, KeysInterface};
use flotilla_pool::{Node, Schedule, ScheduleOptions, ScheduleRun};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::ledger::{LedgerWriter, Record};

/// The name of the chaos run's schedule.
pub const SCHEDULE_NAME: &str = "chaos";

/// The job key of scheduled key number `i`.
pub fn key(i: usize) -> String {
    format!("sched-{i}")
}

/// Whether `key` is one of the schedule's keys.
pub fn is_scheduled(key: &str) -> bool {
    key.starts_with("sched-")
}

/// What the worker processes' schedule wants, and how often it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduleSpec {
    /// How many keys (`sched-0` …).
    pub keys: usize,
    /// The schedule's interval.
    pub interval: Duration,
    /// How often the unwanted quarter of the keys changes.
    pub rotate: Duration,
    /// Wall-clock time (ms since the UNIX epoch) after which the wanted
    /// keys stay as they are: the end of the fault phase, so that the
    /// pool converges in the recovery window.
    pub rotate_until_ms: u64,
    /// The schedule's leader lease TTL.
    pub leader_ttl: Duration,
}

impl ScheduleSpec {
    /// A spec for a pool with worker TTL `ttl`: an interval of half a TTL,
    /// a rotation every 3 TTLs, a leader lease of one TTL.
    pub fn for_ttl(keys: usize, ttl: Duration, rotate_until_ms: u64) -> Self {
        ScheduleSpec {
            keys,
            interval: ttl / 2,
            rotate: ttl * 3,
            rotate_until_ms,
            leader_ttl: ttl,
        }
    }

    /// The wanted and the unwanted keys at wall-clock time `now_ms`.
    pub fn wanted_at(&self, now_ms: u64) -> (Vec<String>, Vec<String>) {
        let rotate_ms = (self.rotate.as_millis() as u64).max(1);
        let phase = (now_ms.min(self.rotate_until_ms) / rotate_ms) % 4;
        let (mut wanted, mut unwanted) = (Vec::new(), Vec::new());
        for i in 0..self.keys {
            if (i as u64 + phase).is_multiple_of(4) {
                unwanted.push(key(i));
            } else {
                wanted.push(key(i));
            }
        }
        (wanted, unwanted)
    }

    /// The worker process's command-line arguments for this spec.
    pub fn args(&self) -> Vec<String> {
        vec![
            "--schedule-keys".into(),
            self.keys.to_string(),
            "--schedule-interval-ms".into(),
            self.interval.as_millis().to_string(),
            "--schedule-rotate-ms".into(),
            self.rotate.as_millis().to_string(),
            "--schedule-rotate-until-ms".into(),
            self.rotate_until_ms.to_string(),
            "--schedule-leader-ttl-ms".into(),
            self.leader_ttl.as_millis().to_string(),
        ]
    }
}

/// Wall-clock time, ms since the UNIX epoch.
pub fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What the producer and the run recorder share.
#[derive(Debug, Default)]
struct Progress {
    /// The slot of the last run recorded or skipped.
    last_slot: Option<u64>,
    /// How many times the producer ran.
    produced: u64,
}

/// The schedule of one worker process, and the task recording its runs.
#[derive(Debug)]
pub struct ScheduledLoad {
    schedule: Schedule,
    recorder: JoinHandle<()>,
}

impl ScheduledLoad {
    /// Starts the schedule on `node`, recording in `ledger`.
    ///
    /// # Errors
    /// What [`Node::schedule_with`] returns.
    pub async fn start(
        node: &Node,
        ledger: LedgerWriter,
        spec: ScheduleSpec,
    ) -> flotilla_pool::Result<Self> {
        let progress = Arc::new(Mutex::new(Progress::default()));
        let producer = {
            let (progress, ledger) = (progress.clone(), ledger.clone());
            move || {
                let (wanted, unwanted) = spec.wanted_at(wall_ms());
                if let Ok(mut p) = progress.lock() {
                    p.produced += 1;
                    for key in &wanted {
                        ledger.record(Record::DispatchSent { key: key.clone() });
                    }
                    for key in &unwanted {
                        ledger.record(Record::StopSent { key: key.clone() });
                    }
                }
                let jobs: Vec<(String, Bytes)> = wanted
                    .into_iter()
                    .map(|key| (key, Bytes::from_static(b"scheduled")))
                    .collect();
                async move { Ok(jobs) }
            }
        };
        let options = ScheduleOptions::default()
            .leader_ttl(spec.leader_ttl)
            .follower_poll(spec.interval.min(Duration::from_millis(250)));
        let schedule = node
            .schedule_with(SCHEDULE_NAME, spec.interval, options, producer)
            .await?;
        let runs = schedule.runs();
        let recorder = tokio::spawn(record_runs(
            runs,
            progress,
            ledger,
            node.id().to_string(),
            (node.client().clone(), ticker_key(node.pool())),
        ));
        Ok(ScheduledLoad { schedule, recorder })
    }

    /// Stops competing for the schedule and the recorder.
    pub async fn close(self) {
        let _ = self.schedule.close().await;
        self.recorder.abort();
        let _ = self.recorder.await;
    }
}

/// The schedule's ticker in Redis: the last slot run pool-wide.
fn ticker_key(pool: &str) -> String {
    format!("fl:{{{pool}}}:ticker:schedule:{SCHEDULE_NAME}")
}

/// Writes each published run's admissions and stops, while no later run
/// has begun (see the module doc).
async fn record_runs(
    mut runs: watch::Receiver<Option<ScheduleRun>>,
    progress: Arc<Mutex<Progress>>,
    ledger: LedgerWriter,
    node: String,
    (client, ticker): (Client, String),
) {
    let pid = std::process::id();
    while runs.changed().await.is_ok() {
        let Some(run) = runs.borrow_and_update().clone() else {
            continue;
        };
        let produced = {
            let Ok(mut p) = progress.lock() else {
                return;
            };
            if p.last_slot >= Some(run.slot) {
                continue;
            }
            p.last_slot = Some(run.slot);
            p.produced
        };
        if run.started.is_empty() && run.stopped.is_empty() {
            continue;
        }
        let ticked = tokio::time::timeout(
            Duration::from_millis(200),
            client.get::<Option<String>, _>(&ticker),
        )
        .await;
        let Ok(Ok(ticked)) = ticked else {
            continue;
        };
        let latest = ticked.and_then(|slot| slot.parse::<u64>().ok());
        if latest.is_none_or(|latest| latest > run.slot) {
            continue;
        }
        // A later run of this process may have begun since the ticker
        // was read: its producer's lines came first.
        let Ok(p) = progress.lock() else {
            return;
        };
        if p.produced != produced {
            continue;
        }
        for key in run.started {
            ledger.record(Record::Admit {
                key,
                node: node.clone(),
                window_ms: None,
            });
        }
        for key in run.stopped {
            ledger.record(Record::StopDone {
                key,
                outcome: "ok".into(),
                via: Some(pid),
            });
        }
        drop(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quarter_of_the_keys_is_unwanted_and_it_rotates_until_the_end() {
        let spec = ScheduleSpec::for_ttl(8, Duration::from_secs(1), 30_000);
        let (wanted, unwanted) = spec.wanted_at(0);
        assert_eq!(unwanted, vec![key(0), key(4)]);
        assert_eq!(wanted.len(), 6);
        let (_, later) = spec.wanted_at(3_000);
        assert_eq!(later, vec![key(3), key(7)]);
        // Past the end the set stays as it was at the end.
        assert_eq!(spec.wanted_at(30_000), spec.wanted_at(99_000));
        assert!(is_scheduled(&key(3)) && !is_scheduled("job-0003"));
    }

    #[test]
    fn the_arguments_name_every_field() {
        let spec = ScheduleSpec::for_ttl(24, Duration::from_secs(2), 123);
        let args = spec.args();
        assert_eq!(args.len(), 10);
        assert_eq!(args[1], "24");
        assert_eq!(args[3], "1000");
        assert_eq!(args[5], "6000");
        assert_eq!(args[7], "123");
        assert_eq!(args[9], "2000");
    }
}
