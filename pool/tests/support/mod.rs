//! Shared support for the pool's integration tests.
#![allow(dead_code, unreachable_pub)]

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use flotilla_pool::{Handler, HandlerError, Job, Node, NodeOptions, Worker};
use flotilla_testkit::{FaultProxy, RedisServer};

/// One start or stop seen by a handler.
#[derive(Debug, Clone)]
pub struct Entry {
    pub worker: String,
    pub key: String,
    pub token: u64,
    pub start: bool,
}

/// A ledger shared by every handler of a test: records starts and stops and
/// catches a key running on two workers at once (I1).
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    inner: Arc<Mutex<LedgerState>>,
}

#[derive(Debug, Default)]
struct LedgerState {
    entries: Vec<Entry>,
    running: HashMap<String, String>,
    violations: Vec<String>,
    notes: Vec<(String, Bytes)>,
    messages: Vec<(String, Bytes)>,
}

impl Ledger {
    pub fn handler(&self, worker: &str) -> RecordingHandler {
        RecordingHandler {
            worker: worker.to_string(),
            ledger: self.clone(),
            stop_ms: (0, 0),
        }
    }

    /// A handler whose `stop` takes a random `min..=max` ms before the job
    /// counts as stopped (it keeps counting as running meanwhile), like
    /// closing a connection.
    pub fn slow_stop_handler(&self, worker: &str, min: u64, max: u64) -> RecordingHandler {
        RecordingHandler {
            worker: worker.to_string(),
            ledger: self.clone(),
            stop_ms: (min, max.max(min)),
        }
    }

    pub fn starts(&self, key: &str) -> usize {
        let s = self.inner.lock().unwrap();
        s.entries.iter().filter(|e| e.start && e.key == key).count()
    }

    pub fn total_starts(&self) -> usize {
        self.inner
            .lock()
            .unwrap()
            .entries
            .iter()
            .filter(|e| e.start)
            .count()
    }

    pub fn running(&self) -> HashMap<String, String> {
        self.inner.lock().unwrap().running.clone()
    }

    pub fn running_keys(&self) -> HashSet<String> {
        self.inner.lock().unwrap().running.keys().cloned().collect()
    }

    pub fn violations(&self) -> Vec<String> {
        self.inner.lock().unwrap().violations.clone()
    }

    pub fn entries(&self) -> Vec<Entry> {
        self.inner.lock().unwrap().entries.clone()
    }

    pub fn notes(&self) -> Vec<(String, Bytes)> {
        self.inner.lock().unwrap().notes.clone()
    }

    pub fn messages(&self) -> Vec<(String, Bytes)> {
        self.inner.lock().unwrap().messages.clone()
    }

    /// Tokens of each start of `key`, in order.
    pub fn tokens(&self, key: &str) -> Vec<u64> {
        let s = self.inner.lock().unwrap();
        s.entries
            .iter()
            .filter(|e| e.start && e.key == key)
            .map(|e| e.token)
            .collect()
    }
}

/// Records into a [`Ledger`]. Keys starting with `fail-` fail to start,
/// keys starting with `panic-` panic in start.
#[derive(Debug, Clone)]
pub struct RecordingHandler {
    pub worker: String,
    ledger: Ledger,
    stop_ms: (u64, u64),
}

#[async_trait]
impl Handler for RecordingHandler {
    async fn start(&self, job: Job) -> Result<(), HandlerError> {
        if job.key.starts_with("fail-") {
            return Err("refused by handler".into());
        }
        if job.key.starts_with("panic-") {
            panic!("handler exploded");
        }
        let mut s = self.ledger.inner.lock().unwrap();
        if let Some(other) = s.running.get(&job.key) {
            let v = format!(
                "{} started on {} while running on {}",
                job.key, self.worker, other
            );
            s.violations.push(v);
        }
        s.running.insert(job.key.clone(), self.worker.clone());
        s.entries.push(Entry {
            worker: self.worker.clone(),
            key: job.key,
            token: job.fencing_token,
            start: true,
        });
        Ok(())
    }

    async fn stop(&self, key: &str) -> Result<(), HandlerError> {
        let (min, max) = self.stop_ms;
        if max > 0 {
            let ms = rand::Rng::random_range(&mut rand::rng(), min..=max);
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        let mut s = self.ledger.inner.lock().unwrap();
        if s.running.get(key) == Some(&self.worker) {
            s.running.remove(key);
        }
        s.entries.push(Entry {
            worker: self.worker.clone(),
            key: key.to_string(),
            token: 0,
            start: false,
        });
        Ok(())
    }

    async fn notify(&self, key: &str, payload: Bytes) -> Result<(), HandlerError> {
        self.ledger
            .inner
            .lock()
            .unwrap()
            .notes
            .push((key.to_string(), payload));
        Ok(())
    }

    async fn message(&self, key: &str, payload: Bytes) -> Result<(), HandlerError> {
        self.ledger
            .inner
            .lock()
            .unwrap()
            .messages
            .push((key.to_string(), payload));
        Ok(())
    }
}

/// A private Redis plus a unique pool name.
pub struct Env {
    pub server: RedisServer,
    pub pool: String,
}

/// Logs to the test output when RUST_LOG is set.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

impl Env {
    pub fn new(prefix: &str) -> Env {
        init_tracing();
        Env {
            server: RedisServer::start()
                .expect("redis-server must be installed (apt-get install redis-server)"),
            pool: flotilla_testkit::unique_name(prefix),
        }
    }

    pub async fn node(&self, options: NodeOptions) -> Node {
        let client = flotilla_testkit::client(&self.server.url()).await.unwrap();
        Node::join(&client, &self.pool, options).await.unwrap()
    }

    /// A node of the pool whose connections go through `proxy`, which the
    /// test can cut: a stand-in for a crashed or partitioned process.
    pub async fn proxied_node(&self, proxy: &FaultProxy, options: NodeOptions) -> Node {
        let client = flotilla_testkit::client(&proxy.url()).await.unwrap();
        Node::join(&client, &self.pool, options).await.unwrap()
    }
}

/// A worker named "victim" recording into `ledger`, on a node behind a
/// proxy of its own ([`Env::proxied_node`], [`fast`] timings).
pub async fn victim(env: &Env, ledger: &Ledger) -> (FaultProxy, Node, Worker) {
    let proxy = FaultProxy::start(env.server.addr()).await.unwrap();
    let node = env.proxied_node(&proxy, fast()).await;
    let worker = Worker::new(&node, ledger.handler("victim")).await.unwrap();
    (proxy, node, worker)
}

/// Short timings for tests.
pub fn fast() -> NodeOptions {
    NodeOptions::default()
        .worker_ttl(Duration::from_millis(1500))
        .dispatch_timeout(Duration::from_secs(5))
        .ack_grace(Duration::from_secs(2))
}

pub async fn eventually(what: &str, deadline: Duration, mut check: impl FnMut() -> bool) {
    flotilla_testkit::wait_until(deadline, what, || {
        let ok = check();
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}
