//! Shared support for the process-level tests: a Redis, worker processes
//! writing ledgers, a dispatcher node writing the driver ledger.
#![allow(dead_code, unreachable_pub)]

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use flotilla_integration_tests::checker::{CheckOptions, Report, check};
use flotilla_integration_tests::clock::{ServerClock, mono_ns};
use flotilla_integration_tests::ledger::{LedgerWriter, Line, Record, read_ledger};
use flotilla_integration_tests::process::{WorkerProcess, WorkerSpec};
use flotilla_pool::{Node, NodeOptions};
use flotilla_testkit::{FaultProxy, RedisServer, unique_name, wait_until};

pub const TTL: Duration = Duration::from_secs(2);

/// How to build a [`Harness`].
#[derive(Debug, Clone, Copy)]
pub struct HarnessOptions {
    pub processes: usize,
    pub workers_each: usize,
    /// Redis persistence (AOF).
    pub aof: bool,
    /// Range of handler stop durations (ms).
    pub stop_ms: (u64, u64),
    /// The first `proxied` processes reach Redis through a [`FaultProxy`].
    pub proxied: usize,
}

impl Default for HarnessOptions {
    fn default() -> Self {
        HarnessOptions {
            processes: 3,
            workers_each: 2,
            aof: false,
            stop_ms: (0, 0),
            proxied: 0,
        }
    }
}

/// A Redis, a pool name, a ledger directory, worker processes and a
/// client-only dispatcher node.
pub struct Harness {
    pub server: RedisServer,
    pub dir: tempfile::TempDir,
    pub pool: String,
    pub processes: Vec<WorkerProcess>,
    /// The fault proxy between process `i` and Redis, if it has one.
    pub proxies: Vec<Option<FaultProxy>>,
    pub gone: Vec<PathBuf>,
    pub node: Node,
    pub driver: LedgerWriter,
}

impl Harness {
    pub async fn start(prefix: &str, processes: usize, workers_each: usize) -> Harness {
        Self::start_with(prefix, processes, workers_each, false).await
    }

    /// As [`Harness::start`], with Redis persistence (AOF) on or off.
    pub async fn start_with(
        prefix: &str,
        processes: usize,
        workers_each: usize,
        aof: bool,
    ) -> Harness {
        Self::start_opts(
            prefix,
            HarnessOptions {
                processes,
                workers_each,
                aof,
                ..HarnessOptions::default()
            },
        )
        .await
    }

    /// A harness with every option.
    pub async fn start_opts(prefix: &str, o: HarnessOptions) -> Harness {
        let HarnessOptions {
            processes,
            workers_each,
            aof,
            stop_ms,
            proxied,
        } = o;
        let server = RedisServer::start_with(flotilla_testkit::ServerOptions::default().aof(aof))
            .expect("redis-server must be installed (apt-get install redis-server)");
        let dir = tempfile::tempdir().unwrap();
        let pool = unique_name(prefix);
        let mut procs = Vec::new();
        let mut proxies = Vec::new();
        for i in 0..processes {
            let proxy = if i < proxied {
                Some(FaultProxy::start(server.addr()).await.unwrap())
            } else {
                None
            };
            let spec = WorkerSpec {
                mirror_jobs: true,
                lifecycle: false,
                node_id: None,
                start_max_ms: 0,
                worker_lanes: 0,
                requests: false,
                schedule: None,
                binary: env!("CARGO_BIN_EXE_flotilla-test-worker").into(),
                redis_url: proxy.as_ref().map_or_else(|| server.url(), FaultProxy::url),
                pool: pool.clone(),
                ttl: TTL,
                workers: workers_each,
                ledger: dir.path().join(format!("worker-{i}.jsonl")),
                stop_ms,
            };
            proxies.push(proxy);
            procs.push(
                WorkerProcess::spawn(&spec, Duration::from_secs(20))
                    .await
                    .unwrap(),
            );
        }
        let client = flotilla_testkit::client(&server.url()).await.unwrap();
        let clock = ServerClock::new();
        clock.sample(&client, true).await.unwrap();
        let driver = LedgerWriter::open(&dir.path().join("driver.jsonl"), clock).unwrap();
        // The dispatcher mirrors the jobs map: the tests watch every job's
        // owner in its replica.
        let node = Node::join(
            &client,
            &pool,
            NodeOptions::default()
                .client_only(true)
                .mirror_jobs(true)
                .worker_ttl(TTL)
                .dispatch_timeout(Duration::from_secs(10)),
        )
        .await
        .unwrap();
        let all: usize = procs.iter().map(|p| p.workers.len()).sum();
        wait_until(
            Duration::from_secs(10),
            "dispatcher sees every worker",
            || {
                let n = node.pool_workers().len();
                async move { n == all }
            },
        )
        .await
        .unwrap();
        Harness {
            server,
            dir,
            pool,
            processes: procs,
            proxies,
            gone: Vec::new(),
            node,
            driver,
        }
    }

    /// Dispatches `keys`, recording each admission.
    pub async fn dispatch(&self, keys: &[String]) {
        for key in keys {
            self.driver
                .record(Record::DispatchSent { key: key.clone() });
            self.node.dispatch_job(key, &b"x"[..]).await.unwrap();
            self.driver.record(Record::Admit {
                key: key.clone(),
                node: self.node.id().to_string(),
                window_ms: None,
            });
        }
    }

    /// Keys running on process `i` now, from its ledger.
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

    /// The process running the most jobs.
    pub fn busiest(&self) -> usize {
        (0..self.processes.len())
            .max_by_key(|i| self.running_on(*i).len())
            .unwrap()
    }

    pub fn driver_path(&self) -> PathBuf {
        self.dir.path().join("driver.jsonl")
    }

    /// Every ledger (driver, live and gone processes).
    pub fn ledgers(&self) -> Vec<Vec<Line>> {
        let mut out = vec![read_ledger(&self.driver_path()).unwrap()];
        for p in &self.processes {
            out.push(read_ledger(&p.ledger).unwrap());
        }
        for p in &self.gone {
            out.push(read_ledger(p).unwrap());
        }
        out
    }

    /// Runs the checker with I2 checked now.
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

    pub async fn kill_all(&mut self) {
        for mut p in self.processes.drain(..) {
            let _ = p.signal(nix::sys::signal::Signal::SIGCONT);
            let _ = p.sigkill().await;
        }
    }
}

/// Starts recorded after `after_ns` in `lines`: (key, time).
pub fn starts_after(lines: &[Line], after_ns: u64) -> Vec<(String, u64)> {
    lines
        .iter()
        .filter_map(|l| match &l.record {
            Record::Start { key, .. } if l.mono_ns > after_ns => Some((key.clone(), l.mono_ns)),
            _ => None,
        })
        .collect()
}

/// A readable history of every process's ring views and lease losses
/// (worker ids shortened, times in ms from `from_ns`), for failure messages.
pub fn ring_history(h: &Harness, from_ns: u64) -> String {
    let mut names = std::collections::HashMap::new();
    for p in &h.processes {
        for w in &p.workers {
            names.insert(w.clone(), format!("{}:{}", p.pid(), &w[2..6]));
        }
    }
    let mut rows = Vec::new();
    for ledger in h.ledgers() {
        for l in ledger {
            let t = (l.mono_ns as i64 - from_ns as i64) as f64 / 1e6;
            match &l.record {
                Record::Ring { workers } => {
                    let mut w: Vec<String> = workers
                        .iter()
                        .map(|w| names.get(w).cloned().unwrap_or_else(|| w.clone()))
                        .collect();
                    w.sort();
                    rows.push((l.mono_ns, format!("{t:>8.0} ms pid {} ring {:?}", l.pid, w)));
                }
                Record::LeaseLost | Record::Fault { .. } => {
                    rows.push((
                        l.mono_ns,
                        format!("{t:>8.0} ms pid {} {:?}", l.pid, l.record),
                    ));
                }
                _ => {}
            }
        }
    }
    rows.sort();
    rows.into_iter()
        .map(|(_, r)| r)
        .collect::<Vec<_>>()
        .join("\n")
}
