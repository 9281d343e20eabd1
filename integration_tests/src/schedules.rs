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
//! * once the run is published ([`Schedule::runs`]), or at the latest
//!   when the producer runs next on this process (so before that call's
//!   lines): a [`Record::Admit`] for each key it started and a
//!   [`Record::StopDone`] (`ok`, asked by this process) for each it
//!   stopped — only while the lease's lock in Redis still carries the
//!   token the run was made under: otherwise another leader may already
//!   have stopped or started the keys again, and late lines would
//!   misstate the order. Skipped runs weaken the check; they never make it
//!   stricter than the pool's promise.
//!
//! The checker then holds scheduled keys to what it holds dispatched keys
//! to: never two runs at once (I1), an admitted key runs until stopped
//! (I2), no second admission without a stop between (I3), and a stop
//! holds until the next dispatch is sent.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use flotilla_pool::fred::prelude::{Client, HashesInterface};
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

/// Writes a node's published runs in its ledger, each once, before the
/// lines of the node's next producer call.
#[derive(Debug)]
struct Recorder {
    ledger: LedgerWriter,
    node: String,
    client: Client,
    /// The schedule's leader-lease lock (its holder record).
    lock_key: String,
    state: tokio::sync::Mutex<RecorderState>,
}

#[derive(Debug, Default)]
struct RecorderState {
    /// The slot of the last run recorded or skipped.
    last_slot: Option<u64>,
    /// The node's runs, once the schedule exists.
    runs: Option<watch::Receiver<Option<ScheduleRun>>>,
}

impl Recorder {
    /// Records the latest published run unless done already, if the lease
    /// it ran under is still this node's (no other leader can have acted
    /// on its keys since).
    async fn record_latest(&self, state: &mut RecorderState) {
        let Some(run) = state.runs.as_ref().and_then(|runs| runs.borrow().clone()) else {
            return;
        };
        if state.last_slot >= Some(run.slot) {
            return;
        }
        state.last_slot = Some(run.slot);
        if run.started.is_empty() && run.stopped.is_empty() {
            return;
        }
        let holder = tokio::time::timeout(
            Duration::from_millis(200),
            self.client
                .hget::<Option<String>, _, _>(&self.lock_key, "token"),
        )
        .await;
        let Ok(Ok(Some(token))) = holder else {
            return;
        };
        if token != run.leader_token.to_string() {
            return;
        }
        for key in run.started {
            self.ledger.record(Record::Admit {
                key,
                node: self.node.clone(),
                window_ms: None,
            });
        }
        for key in run.stopped {
            self.ledger.record(Record::StopDone {
                key,
                outcome: "ok".into(),
                via: Some(std::process::id()),
            });
        }
    }
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
        let recorder = Arc::new(Recorder {
            ledger,
            node: node.id().to_string(),
            client: node.client().clone(),
            lock_key: format!("fl:{{{}}}:lock:schedule:{SCHEDULE_NAME}", node.pool()),
            state: tokio::sync::Mutex::default(),
        });
        let producer = {
            let recorder = recorder.clone();
            move || {
                let (wanted, unwanted) = spec.wanted_at(wall_ms());
                let recorder = recorder.clone();
                async move {
                    let mut state = recorder.state.lock().await;
                    // The last run first, if its lines are not written yet.
                    recorder.record_latest(&mut state).await;
                    for key in &wanted {
                        recorder
                            .ledger
                            .record(Record::DispatchSent { key: key.clone() });
                    }
                    for key in &unwanted {
                        recorder
                            .ledger
                            .record(Record::StopSent { key: key.clone() });
                    }
                    drop(state);
                    Ok(wanted
                        .into_iter()
                        .map(|key| (key, Bytes::from_static(b"scheduled")))
                        .collect())
                }
            }
        };
        let options = ScheduleOptions::default()
            .leader_ttl(spec.leader_ttl)
            .follower_poll(spec.interval.min(Duration::from_millis(250)));
        let schedule = node
            .schedule_with(SCHEDULE_NAME, spec.interval, options, producer)
            .await?;
        let mut runs = schedule.runs();
        recorder.state.lock().await.runs = Some(runs.clone());
        let recorder = tokio::spawn(async move {
            while runs.changed().await.is_ok() {
                let mut state = recorder.state.lock().await;
                recorder.record_latest(&mut state).await;
            }
        });
        Ok(ScheduledLoad { schedule, recorder })
    }

    /// Stops competing for the schedule and the recorder.
    pub async fn close(self) {
        let _ = self.schedule.close().await;
        self.recorder.abort();
        let _ = self.recorder.await;
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
