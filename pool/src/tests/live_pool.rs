//! A pool of two live nodes running 40 jobs, for tests of faults of Redis
//! itself (a step of its clock, a freeze) that must judge no live worker
//! dead: nothing moves, nothing runs twice, and the pool admits new work
//! after the fault.

use std::collections::HashMap;

use super::*;

/// Two nodes with one worker each, sharing 40 running jobs.
pub(super) struct LivePool {
    pub(super) client: fred::prelude::Client,
    pub(super) a: Node,
    pub(super) b: Node,
    wa: Worker,
    wb: Worker,
    handler: Overlap,
    keys: Vec<String>,
    /// The keys `a`'s worker runs.
    on_a: Vec<String>,
}

impl LivePool {
    /// Joins the two nodes to a new pool on `url`, dispatches the jobs,
    /// and waits until every job runs and both nodes judge liveness (past
    /// the first TTL after joining, when a node judges nobody dead).
    pub(super) async fn start(url: &str, prefix: &str, options: NodeOptions) -> Self {
        let client = flotilla_testkit::client(url).await.unwrap();
        let name = flotilla_testkit::unique_name(prefix);
        let handler = Overlap::default();
        let (a, b, wa, wb) = two_nodes_sharing(&client, &name, options, &handler).await;
        let keys: Vec<String> = (0..40).map(|i| format!("k{i:02}")).collect();
        for key in &keys {
            a.dispatch_job(key, &b"p"[..]).await.unwrap();
        }
        let pool = LivePool {
            client,
            a,
            b,
            wa,
            wb,
            handler,
            keys,
            on_a: Vec::new(),
        };
        pool.wait_all_running(0).await;
        let on_a = pool.keys_on_a();
        assert!(
            !on_a.is_empty() && on_a.len() < pool.keys.len(),
            "{} of 40 jobs on a",
            on_a.len()
        );
        let (a, b) = (&pool.a, &pool.b);
        wait_until(
            Duration::from_secs(5),
            "both nodes judge liveness",
            || async { !a.inner.recently_connected().await && !b.inner.recently_connected().await },
        )
        .await
        .unwrap();
        LivePool { on_a, ..pool }
    }

    /// How many handler starts there were.
    pub(super) fn starts(&self) -> usize {
        self.handler.starts.load(Ordering::SeqCst)
    }

    /// Keys some handler runs now.
    fn running_keys(&self) -> usize {
        self.handler
            .running
            .iter()
            .filter(|n| *n.value() > 0)
            .count()
    }

    fn keys_on_a(&self) -> Vec<String> {
        self.keys
            .iter()
            .filter(|k| self.wa.job_token(k).is_some())
            .cloned()
            .collect()
    }

    async fn wait_all_running(&self, extra: usize) {
        wait_until(Duration::from_secs(10), "every job runs", || async {
            self.running_keys() == self.keys.len() + extra
        })
        .await
        .unwrap();
    }

    /// For `watch`, checks that no key runs twice at once and that no
    /// worker is claimed for a cleanup (a claim is a judgement that the
    /// worker is dead).
    pub(super) async fn watch_no_worker_judged_dead(&self, watch: Duration) {
        let cleanup_hash = self.a.inner.store.maps.cleanup.keys_info().hash.clone();
        let from = std::time::Instant::now();
        while from.elapsed() < watch {
            let most = self.handler.most.load(Ordering::SeqCst);
            assert!(most <= 1, "a key ran {most} times at once");
            let claims: HashMap<String, String> =
                self.client.hgetall(cleanup_hash.as_str()).await.unwrap();
            assert!(claims.is_empty(), "live workers judged dead: {claims:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Every job runs (again) where it ran before the fault, and both
    /// nodes admit and start new work; then the nodes close.
    pub(super) async fn ends_in_place_and_admitting(self) {
        self.wait_all_running(0).await;
        let on_b = self
            .keys
            .iter()
            .filter(|k| self.wb.job_token(k).is_some())
            .count();
        assert_eq!(
            self.keys_on_a(),
            self.on_a,
            "jobs moved between the workers"
        );
        assert_eq!(on_b, self.keys.len() - self.on_a.len());
        self.a.dispatch_job("after-a", &b"p"[..]).await.unwrap();
        self.b.dispatch_job("after-b", &b"p"[..]).await.unwrap();
        self.wait_all_running(2).await;
        assert!(self.handler.most.load(Ordering::SeqCst) <= 1);
        self.a.close().await.unwrap();
        self.b.close().await.unwrap();
    }
}
