//! A dispatching node that restarts under its node id (a pod that keeps
//! its name): the new run shares the earlier run's reply stream, on which
//! answers to the earlier run's requests keep arriving.

use std::time::Duration;

use flotilla_pool::Node;
use flotilla_testkit::{FaultProxy, ProxyMode};
use rand::Rng;
use tokio::time::Instant;

use super::{ChaosError, Run};
use crate::ledger::FaultKind;

/// How long a new run of a dispatcher keeps trying to join (Redis may be
/// down meanwhile: faults overlap).
const JOIN_FOR: Duration = Duration::from_secs(60);

impl Run {
    /// [`FaultKind::RestartDispatcher`]: one dispatching node goes, either
    /// closed (its calls in flight end in errors; the stops it asked for
    /// are left with the workers) or as in a crash (its link refused for
    /// good, its close reaching nothing), and 0–1 TTL later a new node
    /// joins under its id through a fresh link.
    pub(super) async fn restart_dispatcher(&mut self) -> Result<(), ChaosError> {
        let i = self.rng.random_range(0..self.load.node_count());
        let old = self.load.node(i);
        let options = old.options().clone().node_id(old.id());
        let crash = self.rng.random_bool(0.5);
        let gap = self.rng.random_range(Duration::ZERO..=self.options.ttl);
        self.record(FaultKind::RestartDispatcher, None, false);
        if crash && !self.dispatcher_proxies.is_empty() {
            // Nothing the old run sends from here on reaches Redis; its
            // close runs in the background, as a dying process's would
            // not run at all.
            self.dispatcher_proxies[i].set_mode(ProxyMode::Refuse);
            self.closing
                .push(tokio::spawn(async move { old.close().await.map(|_| ()) }));
        } else if let Err(e) = Box::pin(old.close()).await {
            tracing::warn!(error = %e, "closing a dispatcher failed");
        }
        tokio::time::sleep(gap).await;
        let node = self.join_dispatcher(i, options).await?;
        self.load.replace_node(i, node);
        self.record(FaultKind::RestartDispatcher, None, true);
        Ok(())
    }

    /// Joins a dispatcher in place `i` with `options`: through a new proxy
    /// when the dispatchers have proxies (the old one, refused for good,
    /// is kept until the end of the run), else by the Sentinel URL.
    async fn join_dispatcher(
        &mut self,
        i: usize,
        options: flotilla_pool::NodeOptions,
    ) -> Result<Node, ChaosError> {
        let (url, pool, _) = self.transient.clone();
        let mut via = None;
        if !self.dispatcher_proxies.is_empty() {
            let proxy = FaultProxy::start(self.server_addr()?)
                .await
                .map_err(|e| flotilla_testkit::Error::Startup(format!("proxy: {e}")))?;
            via = Some(proxy.url());
            let old = std::mem::replace(&mut self.dispatcher_proxies[i], proxy);
            self.old_proxies.push(old);
        }
        let until = Instant::now() + JOIN_FOR;
        loop {
            let joined = match &via {
                Some(proxy_url) => match super::node_client(proxy_url, &options).await {
                    Ok(client) => Box::pin(Node::join(&client, &pool, options.clone()))
                        .await
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                },
                None => Box::pin(Node::connect(&url, &pool, options.clone()))
                    .await
                    .map_err(|e| e.to_string()),
            };
            match joined {
                Ok(node) => return Ok(node),
                Err(e) if Instant::now() < until => {
                    tracing::debug!(error = %e, "a dispatcher's new run could not join yet");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => {
                    return Err(flotilla_testkit::Error::Startup(format!(
                        "dispatcher rejoin: {e}"
                    ))
                    .into());
                }
            }
        }
    }
}
