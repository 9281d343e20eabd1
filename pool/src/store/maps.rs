//! The pool's replicated maps and the shared key/argument head every pool
//! script expects (see `scripts/base.lua`).

use flotilla_rmap::{Map, MapOptions, Subscriptions, SubscriptionsOptions};
use fred::prelude::*;
use fred::types::Value;

use crate::error::Result;
use crate::keys;

/// The replicated maps of one pool, as joined by one node. They share one
/// subscriber connection: a node holds one however many maps it mirrors.
#[derive(Debug, Clone)]
pub(crate) struct PoolMaps {
    /// The node's one pub/sub connection, shared by its maps.
    pub(crate) subscriptions: Subscriptions,
    pub(crate) workers: Map,
    pub(crate) keepalive: Map,
    pub(crate) cleanup: Map,
    pub(crate) jobs: Map,
    pub(crate) pending: Map,
    pub(crate) nodes: Map,
    pub(crate) shutdown: Map,
    payloads: String,
    fencing: String,
}

impl PoolMaps {
    /// Joins every map of `pool` through one new subscriber connection.
    /// The maps share the pool's hash tag, so on Redis Cluster their
    /// channels live on one node too.
    pub(crate) async fn join(client: &Client, pool: &str) -> Result<PoolMaps> {
        let subscriptions = Subscriptions::connect(client, SubscriptionsOptions::default()).await?;
        let opts = || MapOptions::default().hash_tag(pool);
        let s = &subscriptions;
        let joined = tokio::try_join!(
            Map::join_shared(s, keys::WORKERS_MAP, opts()),
            Map::join_shared(s, keys::KEEPALIVE_MAP, opts()),
            Map::join_shared(s, keys::CLEANUP_MAP, opts()),
            Map::join_shared(s, keys::JOBS_MAP, opts()),
            Map::join_shared(s, keys::PENDING_MAP, opts()),
            Map::join_shared(s, keys::NODES_MAP, opts()),
            Map::join_shared(s, keys::SHUTDOWN_MAP, opts()),
        );
        let (workers, keepalive, cleanup, jobs, pending, nodes, shutdown) = match joined {
            Ok(maps) => maps,
            Err(e) => {
                // Closes the maps that did join, too.
                subscriptions.close().await;
                return Err(e.into());
            }
        };
        Ok(PoolMaps {
            subscriptions,
            workers,
            keepalive,
            cleanup,
            jobs,
            pending,
            nodes,
            shutdown,
            payloads: keys::payloads(pool),
            fencing: keys::fencing(pool),
        })
    }

    /// The payloads hash key.
    pub(crate) fn payloads_key(&self) -> &str {
        &self.payloads
    }

    /// KEYS[1..8] of every pool script.
    pub(super) fn base_keys(&self) -> Vec<String> {
        let (j, p, w) = (
            self.jobs.keys_info(),
            self.pending.keys_info(),
            self.workers.keys_info(),
        );
        vec![
            j.hash.clone(),
            j.revision.clone(),
            p.hash.clone(),
            p.revision.clone(),
            w.hash.clone(),
            w.revision.clone(),
            self.payloads.clone(),
            self.fencing.clone(),
        ]
    }

    /// ARGV[1..3] of every pool script.
    pub(super) fn base_args(&self) -> Vec<Value> {
        vec![
            self.jobs.keys_info().channel.clone().into(),
            self.pending.keys_info().channel.clone().into(),
            self.workers.keys_info().channel.clone().into(),
        ]
    }

    /// Closes the maps' subscriber connection, which ends every map (no
    /// unsubscribe per map: one bounded quit, even with Redis down).
    pub(crate) async fn close(&self) {
        self.subscriptions.close().await;
        tokio::join!(
            self.workers.close(),
            self.keepalive.close(),
            self.cleanup.close(),
            self.jobs.close(),
            self.pending.close(),
            self.nodes.close(),
            self.shutdown.close(),
        );
    }
}
