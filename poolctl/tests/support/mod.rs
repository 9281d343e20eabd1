//! Shared support for poolctl's tests: a live pool on a private Redis, and
//! a runner for the built binary.
#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use flotilla_pool::{
    ClusterLock, Handler, HandlerError, Job, LockGuard, LockOptions, Node, NodeOptions, Worker,
};
use flotilla_testkit::{FaultProxy, RedisServer};
use fred::prelude::*;
use tokio::sync::watch;

/// What the pool's handlers saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// key → (worker, payload) of the running jobs.
    pub running: HashMap<String, (String, Bytes)>,
    /// (key, payload) of notifications.
    pub notes: Vec<(String, Bytes)>,
}

/// A handler recording starts, stops and notifications. Keys starting with
/// `slow-` wait in `start` until the gate opens; keys starting with `fail-`
/// report their run failed right after it started.
#[derive(Debug, Clone)]
pub struct Recorder {
    pub worker: Arc<Mutex<String>>,
    pub seen: Arc<Mutex<Seen>>,
    pub gate: watch::Receiver<bool>,
}

#[async_trait]
impl Handler for Recorder {
    async fn start(&self, job: Job) -> Result<(), HandlerError> {
        if job.key.starts_with("slow-") {
            let mut gate = self.gate.clone();
            gate.wait_for(|open| *open).await?;
        }
        let worker = self.worker.lock().unwrap().clone();
        if job.key.starts_with("fail-") {
            job.outcome().failed("bad configuration");
        }
        self.seen
            .lock()
            .unwrap()
            .running
            .insert(job.key, (worker, job.payload));
        Ok(())
    }

    async fn stop(&self, key: &str) -> Result<(), HandlerError> {
        self.seen.lock().unwrap().running.remove(key);
        Ok(())
    }

    async fn notify(&self, key: &str, payload: Bytes) -> Result<(), HandlerError> {
        self.seen
            .lock()
            .unwrap()
            .notes
            .push((key.to_string(), payload));
        Ok(())
    }
}

/// A live pool: two nodes (two workers and one worker) reached through a
/// fault proxy, a few jobs, and a lock held under the pool's tag.
pub struct LivePool {
    pub server: RedisServer,
    pub proxy: FaultProxy,
    pub pool: String,
    /// A client connected straight to Redis (not through the proxy).
    pub direct: Client,
    pub nodes: Vec<Node>,
    pub workers: Vec<Worker>,
    pub seen: Arc<Mutex<Seen>>,
    pub gate: watch::Sender<bool>,
    pub lock: ClusterLock,
    pub guard: Option<LockGuard>,
}

/// Worker TTL of the live pool (poolctl is told the same).
pub const TTL: Duration = Duration::from_secs(6);

/// Jobs dispatched by [`LivePool::start`]: key → payload.
pub fn initial_jobs() -> Vec<(String, Vec<u8>)> {
    vec![
        ("job-a".into(), b"alpha".to_vec()),
        ("job-b".into(), b"bravo payload".to_vec()),
        ("job-c".into(), vec![0, 159, 146, 150, 255]),
        ("other-1".into(), Vec::new()),
        ("other-2".into(), b"{\"n\":2}".to_vec()),
    ]
}

impl LivePool {
    pub async fn start(prefix: &str) -> LivePool {
        let server = RedisServer::start()
            .expect("redis-server must be installed (apt-get install redis-server)");
        let proxy = FaultProxy::start(server.addr()).await.unwrap();
        let pool = flotilla_testkit::unique_name(prefix);
        let direct = flotilla_testkit::client(&server.url()).await.unwrap();
        let (gate, gate_rx) = watch::channel(false);
        let seen = Arc::new(Mutex::new(Seen::default()));
        // Mirroring the jobs map: the tests check poolctl's output against
        // the nodes' pool-wide view.
        let options = NodeOptions::default()
            .mirror_jobs(true)
            .worker_ttl(TTL)
            .dispatch_timeout(Duration::from_secs(10));
        let mut nodes = Vec::new();
        let mut workers = Vec::new();
        for per_node in [2, 1] {
            let client = flotilla_testkit::client(&proxy.url()).await.unwrap();
            let node = Node::join(&client, &pool, options.clone()).await.unwrap();
            for _ in 0..per_node {
                let name = Arc::new(Mutex::new(String::new()));
                let handler = Recorder {
                    worker: name.clone(),
                    seen: seen.clone(),
                    gate: gate_rx.clone(),
                };
                let worker = Worker::new(&node, handler).await.unwrap();
                *name.lock().unwrap() = worker.id().to_string();
                workers.push(worker);
            }
            nodes.push(node);
        }
        // Every node sees every worker before jobs are placed.
        flotilla_testkit::wait_until(Duration::from_secs(10), "nodes see 3 workers", || {
            let ok = nodes.iter().all(|n| n.pool_workers().len() == 3);
            async move { ok }
        })
        .await
        .unwrap();
        for (key, payload) in initial_jobs() {
            nodes[0].dispatch_job(&key, payload).await.unwrap();
        }
        let lock_client = flotilla_testkit::client(&proxy.url()).await.unwrap();
        let lock = ClusterLock::new(
            &lock_client,
            "scheduler",
            LockOptions::default()
                .hash_tag(pool.clone())
                .owner_id("test-owner")
                .ttl(Duration::from_secs(120)),
        )
        .unwrap();
        let guard = lock.try_acquire().await.unwrap();
        LivePool {
            server,
            proxy,
            pool,
            direct,
            nodes,
            workers,
            seen,
            gate,
            lock,
            guard: Some(guard),
        }
    }

    /// poolctl's global arguments for this pool.
    pub fn args(&self) -> Vec<String> {
        vec![
            "--redis".into(),
            self.server.url(),
            "--pool".into(),
            self.pool.clone(),
            "--worker-ttl".into(),
            format!("{}ms", TTL.as_millis()),
        ]
    }

    /// Runs poolctl with this pool's global arguments and `more`.
    pub async fn run(&self, more: &[&str]) -> Output {
        let mut args = self.args();
        args.extend(more.iter().map(|s| s.to_string()));
        poolctl(&args).await
    }

    /// Runs a read command with `--json`; it must succeed.
    pub async fn json(&self, more: &[&str]) -> serde_json::Value {
        let mut args: Vec<&str> = more.to_vec();
        args.push("--json");
        let out = self.run(&args).await;
        assert!(
            out.status.success(),
            "poolctl {more:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "poolctl {more:?} printed invalid JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }
}

/// Runs the built poolctl binary.
pub async fn poolctl<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_poolctl"))
        .args(args)
        .env_remove("REDIS_URL")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("poolctl runs")
}

/// Text of stdout.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Text of stderr.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub mod dashboard;
