//! The Sentinel tests' harness: a Sentinel deployment, worker processes
//! writing ledgers, and a dispatcher node writing the driver's ledger, all
//! connected through the Sentinel URL.
#![allow(dead_code, unreachable_pub)]

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use flotilla_integration_tests::checker::{CheckOptions, Report, check};
use flotilla_integration_tests::clock::{ServerClock, mono_ns};
use flotilla_integration_tests::ledger::{FaultKind, LedgerWriter, Line, Record, read_ledger};
use flotilla_integration_tests::process::{WorkerProcess, WorkerSpec};
use flotilla_pool::{Error, Node, NodeOptions};
use flotilla_testkit::{SentinelOptions, Sentinels, unique_name, wait_until};
use nix::sys::signal::Signal;

pub const TTL: Duration = Duration::from_secs(2);
/// The bound on kill → first successful dispatch: Sentinel notices in
/// `down-after` (1 s), elects and promotes (about 1–2 s), clients reconnect
/// within their 1 s backoff cap, and a node that noticed the rollback waits
/// for its workers to re-assert (about one TTL).
pub const DISPATCH_BACK_WITHIN: Duration = Duration::from_secs(12);

pub struct HaHarness {
    pub ha: Sentinels,
    pub pool: String,
    pub dir: tempfile::TempDir,
    pub processes: Vec<WorkerProcess>,
    pub node: Node,
    pub driver: LedgerWriter,
}

/// A worker process of 2 workers on pool `pool` behind the Sentinels of
/// `ha`, its ledger `worker-<i>.jsonl` in `dir`.
pub async fn worker_process(ha: &Sentinels, dir: &Path, pool: &str, i: usize) -> WorkerProcess {
    let spec = WorkerSpec {
        mirror_jobs: true,
        lifecycle: false,
        node_id: None,
        start_max_ms: 0,
        worker_lanes: 0,
        requests: false,
        schedule: None,
        binary: env!("CARGO_BIN_EXE_flotilla-test-worker").into(),
        redis_url: ha.url(),
        pool: pool.to_string(),
        ttl: TTL,
        workers: 2,
        ledger: dir.join(format!("worker-{i}.jsonl")),
        stop_ms: (0, 20),
    };
    WorkerProcess::spawn(&spec, Duration::from_secs(20))
        .await
        .unwrap()
}

impl HaHarness {
    pub async fn start(prefix: &str, processes: usize) -> HaHarness {
        Self::start_with(prefix, processes, SentinelOptions::default()).await
    }

    pub async fn start_with(prefix: &str, processes: usize, options: SentinelOptions) -> HaHarness {
        // The dispatcher's log (RUST_LOG), shown for a failing test.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let ha = tokio::task::block_in_place(|| Sentinels::start_with(options)).expect(
            "redis-sentinel must be installed (apt-get install redis-sentinel redis-server)",
        );
        let dir = tempfile::tempdir().unwrap();
        let pool = unique_name(prefix);
        let mut procs = Vec::new();
        for i in 0..processes {
            procs.push(worker_process(&ha, dir.path(), &pool, i).await);
        }
        // The dispatcher mirrors the jobs map: the tests watch every job's
        // owner in its replica.
        let options = NodeOptions::default()
            .client_only(true)
            .mirror_jobs(true)
            .worker_ttl(TTL)
            .dispatch_timeout(Duration::from_secs(3))
            .redis_timeout(Duration::from_secs(1));
        let node = Node::connect(&ha.url(), &pool, options).await.unwrap();
        let clock = ServerClock::new();
        clock.sample(node.client(), true).await.unwrap();
        let driver = LedgerWriter::open(&dir.path().join("driver.jsonl"), clock).unwrap();
        let all = processes * 2;
        let n = node.clone();
        wait_until(
            Duration::from_secs(10),
            "dispatcher sees every worker",
            || {
                let seen = n.pool_workers().len();
                async move { seen == all }
            },
        )
        .await
        .unwrap();
        HaHarness {
            ha,
            pool,
            dir,
            processes: procs,
            node,
            driver,
        }
    }

    pub async fn dispatch(&self, key: &str) -> Result<(), Error> {
        let result = self.node.dispatch_job(key, "x").await;
        match &result {
            Ok(()) => self.driver.record(Record::Admit {
                key: key.to_string(),
                node: self.node.id().to_string(),
                window_ms: None,
            }),
            Err(Error::JobExists(_)) => self.driver.record(Record::Exists {
                key: key.to_string(),
            }),
            Err(_) => self.driver.record(Record::DispatchUnknown {
                key: key.to_string(),
            }),
        };
        result
    }

    pub async fn stop(&self, key: &str) {
        let outcome = self.stop_any(key).await;
        assert_eq!(outcome, "ok", "stop of {key} before the failover");
    }

    /// Stops `key` and records the outcome, whatever it is.
    pub async fn stop_any(&self, key: &str) -> &'static str {
        self.driver.record(Record::StopSent {
            key: key.to_string(),
        });
        let outcome = match self.node.stop_job(key).await {
            Ok(()) => "ok",
            Err(Error::JobNotFound(_)) => "not_found",
            Err(_) => "unknown",
        };
        self.driver.record(Record::StopDone {
            key: key.to_string(),
            outcome: outcome.into(),
            via: None,
        });
        outcome
    }

    pub fn ledgers(&self) -> Vec<Vec<Line>> {
        let mut out = vec![read_ledger(&self.dir.path().join("driver.jsonl")).unwrap()];
        for p in &self.processes {
            out.push(read_ledger(&p.ledger).unwrap());
        }
        out
    }

    pub fn check_now(&self) -> Report {
        check(
            &self.ledgers(),
            &CheckOptions {
                lease_stop_after: TTL * 2 / 3,
                end_ns: Some(mono_ns()),
                ..CheckOptions::default()
            },
        )
    }

    pub fn running_on(&self, i: usize) -> HashSet<String> {
        let mut open = HashSet::new();
        for l in read_ledger(&self.processes[i].ledger).unwrap() {
            match l.record {
                Record::Start { key, .. } => {
                    open.insert(key);
                }
                Record::Stop { key, .. } => {
                    open.remove(&key);
                }
                _ => {}
            }
        }
        open
    }

    /// Kills the primary, records the failover, and returns when the
    /// Sentinels agree on the promoted replica.
    pub async fn fail_over(&mut self) -> Instant {
        self.driver.record(Record::Fault {
            kind: FaultKind::Failover,
            target: None,
            end: false,
        });
        let killed = Instant::now();
        let old = self.ha.kill_primary().unwrap();
        let ha = &self.ha;
        let new =
            tokio::task::block_in_place(|| ha.wait_for_failover(old, Duration::from_secs(20)))
                .unwrap();
        println!(
            "sentinel promoted 127.0.0.1:{new} {:?} after the kill",
            killed.elapsed()
        );
        self.driver.record(Record::Fault {
            kind: FaultKind::Failover,
            target: None,
            end: true,
        });
        killed
    }

    /// Dispatches `key` until it is admitted; returns how long after
    /// `since` that happened.
    pub async fn dispatch_until_ok(&self, key: &str, since: Instant) -> Duration {
        loop {
            match self.dispatch(key).await {
                Ok(()) => return since.elapsed(),
                Err(e) => {
                    assert!(
                        since.elapsed() < DISPATCH_BACK_WITHIN,
                        "dispatch still failing {:?} after the kill: {e}",
                        since.elapsed()
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// Waits until every worker is active again and every key in `running`
    /// has an owner.
    pub async fn settle(&self, running: &[String]) {
        let all = self.processes.len() * 2;
        let node = self.node.clone();
        wait_until(
            Duration::from_secs(20),
            "pool settled after the failover",
            || {
                let active = node.pool_workers().iter().filter(|w| !w.cleaning).count();
                let owned = running.iter().all(|k| node.job_owner(k).is_some());
                async move { active == all && owned }
            },
        )
        .await
        .unwrap();
    }

    pub async fn kill_all(&mut self) {
        for mut p in self.processes.drain(..) {
            let _ = p.signal(Signal::SIGCONT);
            let _ = p.sigkill().await;
        }
    }
}
