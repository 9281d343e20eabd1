//! The pool's replicated maps and the shared key/argument head every pool
//! script expects (see `scripts/base.lua`).

use flotilla_rmap::{Map, MapOptions};
use fred::prelude::*;
use fred::types::Value;

use crate::error::Result;
use crate::keys;

/// The replicated maps of one pool, as joined by one node.
#[derive(Debug, Clone)]
pub(crate) struct PoolMaps {
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
    /// Joins every map of `pool`.
    pub(crate) async fn join(client: &Client, pool: &str) -> Result<PoolMaps> {
        let opts = || MapOptions::default().hash_tag(pool);
        let (workers, keepalive, cleanup, jobs, pending, nodes, shutdown) = tokio::try_join!(
            Map::join(client, keys::WORKERS_MAP, opts()),
            Map::join(client, keys::KEEPALIVE_MAP, opts()),
            Map::join(client, keys::CLEANUP_MAP, opts()),
            Map::join(client, keys::JOBS_MAP, opts()),
            Map::join(client, keys::PENDING_MAP, opts()),
            Map::join(client, keys::NODES_MAP, opts()),
            Map::join(client, keys::SHUTDOWN_MAP, opts()),
        )?;
        Ok(PoolMaps {
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

    /// Leaves every map.
    pub(crate) async fn close(&self) {
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
