//! Connecting by URL ([`Node::connect`]), and the checks [`Node::join`]
//! runs on a client it is handed, so that a node never hangs on a client
//! that cannot reach Redis.
//!
//! # URLs
//!
//! Everything [`fred::prelude::Config::from_url`] parses:
//!
//! | deployment | URL |
//! |---|---|
//! | one server | `redis://[user[:password]@]host[:port][/db]` |
//! | one server, TLS | `rediss://…` (needs the `tls` feature) |
//! | Sentinel | `redis-sentinel://[user[:password]@]host[:port][/db]?sentinelServiceName=NAME[&node=host:port]…` |
//! | Sentinel, TLS | `rediss-sentinel://…` (the same, needs the `tls` feature) |
//! | Cluster | `redis-cluster://host:port[?node=host:port]…` |
//!
//! In a Sentinel URL the host and every `node=` are **Sentinels** (default
//! port 26379), not Redis servers; `sentinelServiceName` is the name the
//! Sentinels monitor (`sentinel monitor NAME …`). The user and password
//! authenticate to the Redis servers *and* to the Sentinels. With TLS, the
//! Sentinels and the servers must all speak TLS. The client asks a Sentinel
//! for the primary on every (re)connection and checks its `ROLE`, so after
//! a failover it follows the promoted replica by itself.

use std::time::Duration;

use fred::prelude::*;

use crate::client::{bad_url, client_builder, connect_client};
use crate::error::Result;
use crate::node::Node;
use crate::options::NodeOptions;

impl Node {
    /// Connects to Redis at `url` and joins `pool`: builds a fred client
    /// with [`client_builder`] (reconnects forever with exponential
    /// backoff, 10 ms … 1 s; connection and command timeouts of
    /// `redis_timeout`; follows a Sentinel failover), connects it, then
    /// [`Node::join`]s. The node owns the client and quits it on
    /// [`close`](Node::close).
    ///
    /// See the [module docs](crate::connect) for the URL forms (one server,
    /// TLS, Sentinel, Cluster).
    ///
    /// ```no_run
    /// use flotilla_pool::{Node, NodeOptions};
    ///
    /// # async fn demo() -> Result<(), flotilla_pool::Error> {
    /// let node = Node::connect("redis://127.0.0.1:6379", "billing", NodeOptions::default()).await?;
    /// // Behind Sentinel: the Sentinels' addresses and the service name.
    /// let ha = Node::connect(
    ///     "redis-sentinel://127.0.0.1:26379?sentinelServiceName=mymaster&node=127.0.0.1:26380",
    ///     "billing",
    ///     NodeOptions::default(),
    /// )
    /// .await?;
    /// # drop((node, ha)); Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidOptions`](crate::Error::InvalidOptions) for a URL that does not parse, or a TLS
    /// URL in a build without the `tls` feature (the message names it);
    /// [`Error::Unavailable`](crate::Error::Unavailable) naming the address when Redis does not answer
    /// within `redis_timeout` (a refused or reset connection, or a Sentinel
    /// that still names a demoted primary, is tried again until then, the
    /// next attempt asking the next Sentinel; a wrong password or TLS
    /// setting fails at once); then as [`Node::join`].
    pub async fn connect(url: &str, pool: &str, options: NodeOptions) -> Result<Node> {
        options.validate()?;
        crate::keys::check_name("pool name", pool)?;
        let client = client_builder(url, &options)?
            .build()
            .map_err(|e| bad_url(url, e))?;
        let client = connect_client(client, options.redis_timeout).await?;
        warn_if_primary_unguarded(&client, options.redis_timeout).await;
        match Node::join(&client, pool, options).await {
            Ok(node) => {
                node.inner
                    .owns_client
                    .store(true, std::sync::atomic::Ordering::Release);
                Ok(node)
            }
            Err(e) => {
                let _ = tokio::time::timeout(Duration::from_secs(1), client.quit()).await;
                Err(e)
            }
        }
    }

    /// The fred client the node sends its commands on (the one given to
    /// [`Node::join`], or the one [`Node::connect`] built).
    pub fn client(&self) -> &Client {
        &self.inner.store.client
    }
}

/// Behind Sentinel, warns when the primary takes writes with no replica
/// attached (`min-replicas-to-write 0`, Redis's default). A primary that
/// stalls past `down-after-milliseconds` (a paused VM, a swapping host)
/// and wakes after its failover answers, as a primary, the clients still
/// connected to it, until a Sentinel demotes it seconds later. Renewals
/// there do not count and `stop_job` answers from it are asked again
/// (`primary_check`), but the ends of runs it records meanwhile are lost
/// with its demotion, and such a job runs again (the chaos suite's
/// `frozen-failover` fault; the pool README's "HA Redis" section has the
/// figures). Nothing is said when `CONFIG GET` is refused.
async fn warn_if_primary_unguarded(client: &Client, timeout: Duration) {
    if !matches!(
        client.client_config().server,
        fred::types::config::ServerConfig::Sentinel { .. }
    ) {
        return;
    }
    let setting = tokio::time::timeout(
        timeout,
        client.config_get::<std::collections::HashMap<String, String>, _>("min-replicas-to-write"),
    )
    .await;
    match setting {
        Ok(Ok(values)) if values.get("min-replicas-to-write").map(String::as_str) == Some("0") => {
            tracing::warn!(
                "the Redis primary takes writes with no replica attached \
                 (min-replicas-to-write 0): a primary that stalls through its failover and \
                 wakes takes writes until a Sentinel demotes it, and the ends of runs it \
                 records meanwhile are lost (those jobs run again); set min-replicas-to-write 1 \
                 and min-replicas-max-lag on every server, with two replicas (see the pool \
                 README, HA Redis)"
            );
        }
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::debug!(error = %e, "min-replicas-to-write not readable"),
        Err(_) => tracing::debug!("min-replicas-to-write not read in time"),
    }
}
