//! The pool on a Redis Cluster of three local masters: join, worker,
//! dispatch, notify, message, stop, close, and a `ClusterLock`. Every key of
//! the pool carries its hash tag, so the whole pool lives in one slot (on
//! one master) and its multi-key scripts run there.

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use flotilla_pool::{
    ClusterLock, Handler, HandlerError, Job, LockOptions, Node, NodeOptions, Worker,
};
use flotilla_testkit::{RedisServer, ServerOptions, unique_name, wait_until};
use fred::prelude::*;

/// Records what the handler saw.
#[derive(Debug, Clone, Default)]
struct Seen {
    inner: Arc<Mutex<SeenState>>,
}

#[derive(Debug, Default)]
struct SeenState {
    running: HashMap<String, u64>,
    notes: Vec<(String, Bytes)>,
    messages: Vec<(String, Bytes)>,
}

#[async_trait]
impl Handler for Seen {
    async fn start(&self, job: Job) -> Result<(), HandlerError> {
        let mut s = self.inner.lock().unwrap();
        assert!(
            !s.running.contains_key(&job.key),
            "{} started twice",
            job.key
        );
        s.running.insert(job.key, job.fencing_token);
        Ok(())
    }
    async fn stop(&self, key: &str) -> Result<(), HandlerError> {
        self.inner.lock().unwrap().running.remove(key);
        Ok(())
    }
    async fn notify(&self, key: &str, payload: Bytes) -> Result<(), HandlerError> {
        self.inner
            .lock()
            .unwrap()
            .notes
            .push((key.to_string(), payload));
        Ok(())
    }
    async fn message(&self, key: &str, payload: Bytes) -> Result<(), HandlerError> {
        self.inner
            .lock()
            .unwrap()
            .messages
            .push((key.to_string(), payload));
        Ok(())
    }
}

impl Seen {
    fn running(&self, key: &str) -> bool {
        self.inner.lock().unwrap().running.contains_key(key)
    }
    fn notes(&self) -> usize {
        self.inner.lock().unwrap().notes.len()
    }
    fn messages(&self) -> usize {
        self.inner.lock().unwrap().messages.len()
    }
}

/// Three cluster-enabled masters, joined with `redis-cli --cluster create`.
fn start_cluster() -> Vec<RedisServer> {
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| {
            RedisServer::start_with(
                ServerOptions::default()
                    .arg("cluster-enabled", "yes")
                    .arg("cluster-config-file", "nodes.conf")
                    .arg("cluster-node-timeout", "5000"),
            )
            .expect("redis-server must be installed (apt-get install redis-server)")
        })
        .collect();
    let mut cmd = Command::new("redis-cli");
    cmd.arg("--cluster").arg("create");
    for s in &servers {
        cmd.arg(format!("127.0.0.1:{}", s.port()));
    }
    let out = cmd
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .expect("redis-cli must be installed (apt-get install redis-tools)");
    assert!(
        out.status.success(),
        "redis-cli --cluster create failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    servers
}

async fn cluster_ok(servers: &[RedisServer]) -> Vec<Client> {
    let mut direct = Vec::new();
    for s in servers {
        direct.push(flotilla_testkit::client(&s.url()).await.unwrap());
    }
    for c in &direct {
        wait_until(Duration::from_secs(20), "cluster_state:ok", || async {
            let info: String = c
                .custom(fred::cmd!("CLUSTER"), vec!["INFO"])
                .await
                .unwrap_or_default();
            info.contains("cluster_state:ok")
        })
        .await
        .unwrap();
    }
    direct
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_and_lock_work_on_a_three_master_cluster() {
    let servers = start_cluster();
    let direct = cluster_ok(&servers).await;
    let url = format!(
        "redis-cluster://127.0.0.1:{}?node=127.0.0.1:{}&node=127.0.0.1:{}",
        servers[0].port(),
        servers[1].port(),
        servers[2].port()
    );
    let client = flotilla_testkit::client(&url).await.unwrap();
    assert!(client.is_clustered());
    let pool = unique_name("cluster");
    // Mirroring: the replicas of the jobs map are checked on a cluster too.
    let options = NodeOptions::default()
        .mirror_jobs(true)
        .worker_ttl(Duration::from_secs(2))
        .dispatch_timeout(Duration::from_secs(5));
    let node = Node::join(&client, &pool, options.clone()).await.unwrap();
    let seen = Seen::default();
    let worker = Worker::new(&node, seen.clone()).await.unwrap();
    let dispatcher_client = flotilla_testkit::client(&url).await.unwrap();
    let dispatcher = Node::join(&dispatcher_client, &pool, options.clone().client_only(true))
        .await
        .unwrap();

    // Dispatch from both nodes; a second dispatch is refused.
    let keys: Vec<String> = (0..20).map(|i| format!("job-{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        let from = if i % 2 == 0 { &node } else { &dispatcher };
        from.dispatch_job(key, &b"payload"[..]).await.unwrap();
        assert!(seen.running(key));
    }
    assert!(matches!(
        dispatcher.dispatch_job(&keys[0], &b"again"[..]).await,
        Err(flotilla_pool::Error::JobExists(_))
    ));
    wait_until(
        Duration::from_secs(5),
        "dispatcher replica shows every job",
        || {
            let ok = dispatcher.job_keys().len() == keys.len();
            async move { ok }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        dispatcher.job_owner(&keys[3]).map(|(w, _)| w),
        Some(worker.id().to_string())
    );
    assert_eq!(
        dispatcher.job_payload(&keys[3]).await.unwrap().as_deref(),
        Some(&b"payload"[..])
    );

    // Notify and keyed message reach the handler.
    dispatcher
        .notify_worker(&keys[1], &b"hi"[..])
        .await
        .unwrap();
    dispatcher
        .dispatch_message("any-key", &b"msg"[..])
        .await
        .unwrap();
    wait_until(
        Duration::from_secs(5),
        "notify and message delivered",
        || {
            let ok = seen.notes() == 1 && seen.messages() == 1;
            async move { ok }
        },
    )
    .await
    .unwrap();

    // Stop routes to the owner; a missing job is reported.
    dispatcher.stop_job(&keys[2]).await.unwrap();
    assert!(!seen.running(&keys[2]));
    assert!(matches!(
        dispatcher.stop_job(&keys[2]).await,
        Err(flotilla_pool::Error::JobNotFound(_))
    ));

    // Every key of the pool sits on one master (one hash slot).
    let pattern = format!("fl:{{{pool}}}:*");
    let mut holders = 0;
    for c in &direct {
        let keys: Vec<String> = c
            .custom(fred::cmd!("KEYS"), vec![pattern.clone()])
            .await
            .unwrap();
        if !keys.is_empty() {
            holders += 1;
        }
    }
    assert_eq!(
        holders, 1,
        "the pool's keys are spread over {holders} masters"
    );

    // A second worker node joins; closing the first hands every job over.
    let other_client = flotilla_testkit::client(&url).await.unwrap();
    let other_node = Node::join(&other_client, &pool, options.clone())
        .await
        .unwrap();
    let other_seen = Seen::default();
    let _other = Worker::new(&other_node, other_seen.clone()).await.unwrap();
    node.close().await.unwrap();
    wait_until(Duration::from_secs(10), "jobs handed over on close", || {
        let ok = keys
            .iter()
            .filter(|k| *k != &keys[2])
            .all(|k| other_seen.running(k));
        async move { ok }
    })
    .await
    .unwrap();

    // ClusterLock: exclusive, inspectable, released.
    let lock_a = ClusterLock::new(&client, "cluster-lock", LockOptions::default()).unwrap();
    let lock_b = ClusterLock::new(&other_client, "cluster-lock", LockOptions::default()).unwrap();
    let guard = lock_a.try_acquire().await.unwrap();
    assert!(matches!(
        lock_b.try_acquire().await,
        Err(flotilla_pool::Error::LockHeld { .. })
    ));
    let info = lock_b.info().await.unwrap().expect("holder info");
    assert_eq!(info.token, guard.token());
    guard.refresh().await.unwrap();
    guard.release().await.unwrap();
    let guard_b = lock_b.try_acquire().await.unwrap();
    assert!(guard_b.token() > info.token);
    guard_b.release().await.unwrap();

    other_node.close().await.unwrap();
    dispatcher.close().await.unwrap();
}
