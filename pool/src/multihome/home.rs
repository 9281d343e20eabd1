//! One home at run time: its client (built with the poll timeout), its node
//! and worker once joined, its breaker and its share of capacity.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use fred::prelude::*;
use fred::types::config::Config;
use tokio::sync::watch;

use super::breaker::{Breaker, BreakerState};
use super::capacity::HomeSlots;
use super::home_handler::{HomeHandler, HomeShared};
use super::options::MultiHomeOptions;
use crate::client::connect_client;
use crate::error::{Error, Result};
use crate::handler::Handler;
use crate::node::Node;
use crate::worker::Worker;

/// A joined home: its client, node and worker.
pub(crate) struct Joined {
    pub(crate) client: Client,
    pub(crate) node: Node,
    pub(crate) worker: Worker,
}

/// A home of a multi-home worker.
pub(crate) struct Home {
    pub(crate) shared: Arc<HomeShared>,
    pub(crate) pool: String,
    /// The URL with its password masked.
    pub(crate) url: String,
    config: Config,
    breaker: Mutex<Breaker>,
    pub(crate) joined: ArcSwapOption<Joined>,
    pub(crate) state: watch::Sender<BreakerState>,
}

impl Home {
    pub(crate) fn new(
        name: String,
        pool: String,
        url: String,
        config: Config,
        options: &MultiHomeOptions,
    ) -> Self {
        let (state, _) = watch::channel(BreakerState::Closed);
        Home {
            shared: Arc::new(HomeShared {
                name,
                slots: HomeSlots::new(options.max_concurrent_jobs),
            }),
            pool,
            url,
            config,
            breaker: Mutex::new(Breaker::new(options.failure_threshold, options.reset_after)),
            joined: ArcSwapOption::empty(),
            state,
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.shared.name
    }

    pub(crate) fn breaker(&self) -> MutexGuard<'_, Breaker> {
        // Breaker updates are single assignments: a panic elsewhere cannot
        // leave it half-changed, so recover from poisoning.
        self.breaker.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the home should get capacity: joined and closed.
    pub(crate) fn is_healthy(&self) -> bool {
        self.joined.load().is_some() && self.breaker().state() == BreakerState::Closed
    }

    /// Connects, joins the pool and starts this home's worker, within
    /// `3 × poll_timeout` (each call is bounded by the poll timeout too).
    ///
    /// # Errors
    /// [`Error::Timeout`], Redis and pool errors.
    pub(crate) async fn join(
        &self,
        handler: &Arc<dyn Handler>,
        options: &MultiHomeOptions,
    ) -> Result<()> {
        let client = build_client(self.config.clone(), options.poll_timeout, &options.node)?;
        let bound = options.poll_timeout * 3;
        let deadline = tokio::time::Instant::now() + bound;
        // Tried again within the poll timeout like `Node::connect`: a home
        // joining during its Redis's restart or failover waits for it.
        let client = connect_client(client, options.poll_timeout).await?;
        let joined = tokio::time::timeout_at(deadline, async {
            let node = Node::join(&client, &self.pool, options.node.clone()).await?;
            let handler = HomeHandler {
                home: self.shared.clone(),
                inner: handler.clone(),
            };
            match Worker::new(&node, handler).await {
                Ok(worker) => Ok((node, worker)),
                Err(e) => {
                    let _ = tokio::time::timeout(options.poll_timeout, node.close()).await;
                    Err(e)
                }
            }
        })
        .await;
        let result = match joined {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout(bound)),
        };
        match result {
            Ok((node, worker)) => {
                tracing::info!(home = %self.name(), pool = %self.pool, url = %self.url, node = %node.id(), "home joined");
                self.joined.store(Some(Arc::new(Joined {
                    client,
                    node,
                    worker,
                })));
                Ok(())
            }
            Err(e) => {
                let _ = tokio::time::timeout(Duration::from_secs(1), client.quit()).await;
                Err(e)
            }
        }
    }

    /// Closes the node (its jobs move to other workers of the pool) and
    /// the client, within the node's shutdown TTL plus the poll timeout.
    pub(crate) async fn close(&self, options: &MultiHomeOptions, state_key: &str) -> Result<()> {
        let Some(joined) = self.joined.swap(None) else {
            return Ok(());
        };
        let bound = options.node.worker_shutdown_ttl + options.poll_timeout;
        let result = match tokio::time::timeout(bound, joined.node.close()).await {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout(bound)),
        };
        let _ = tokio::time::timeout(options.poll_timeout, async {
            let _: std::result::Result<i64, _> = joined.client.del(state_key).await;
            let _ = joined.client.quit().await;
        })
        .await;
        result
    }
}

/// A fred client for a home: every command, connection and internal call
/// bounded by the poll timeout, reconnecting forever with the policy of
/// the home's node options (see [`crate::client::reconnect_policy`]).
pub(crate) fn build_client(
    config: Config,
    poll_timeout: Duration,
    node: &crate::NodeOptions,
) -> Result<Client> {
    crate::client::resilient_builder(config, poll_timeout, crate::client::reconnect_policy(node))
        .build()
        .map_err(Error::Redis)
}
