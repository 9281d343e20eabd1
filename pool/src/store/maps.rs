//! The pool's replicated maps and the shared key/argument head every pool
//! script expects (see `scripts/base.lua`).

use flotilla_rmap::{Map, MapKeys, MapOptions, Subscriptions, SubscriptionsOptions};
use fred::prelude::*;
use fred::types::Value;

use crate::error::Result;
use crate::keys;

/// The replicated maps of one pool, as joined by one node. They share one
/// subscriber connection: a node holds one however many maps it mirrors.
///
/// The membership maps (workers, keep-alives, cleanup, nodes, shutdown) are
/// small and always mirrored. The jobs and pending maps grow with the pool
/// and change with every dispatch: a node mirrors them only when asked
/// (`NodeOptions::mirror_jobs`); otherwise it knows their key names only,
/// and what it must know of them it reads from Redis.
#[derive(Debug, Clone)]
pub(crate) struct PoolMaps {
    /// The node's one pub/sub connection, shared by its maps.
    pub(crate) subscriptions: Subscriptions,
    pub(crate) workers: Map,
    pub(crate) keepalive: Map,
    pub(crate) cleanup: Map,
    /// The jobs map's replica, when this node mirrors it.
    pub(crate) jobs: Option<Map>,
    /// The pending map's replica, when this node mirrors it.
    pub(crate) pending: Option<Map>,
    pub(crate) nodes: Map,
    pub(crate) shutdown: Map,
    pub(crate) jobs_keys: MapKeys,
    pub(crate) pending_keys: MapKeys,
    payloads: String,
    fencing: String,
}

impl PoolMaps {
    /// Joins the maps of `pool` through one new subscriber connection: the
    /// jobs and pending maps too when `mirror_jobs`. The maps share the
    /// pool's hash tag, so on Redis Cluster their channels live on one node
    /// too.
    pub(crate) async fn join(client: &Client, pool: &str, mirror_jobs: bool) -> Result<PoolMaps> {
        let jobs_keys = MapKeys::new(keys::JOBS_MAP, Some(pool))?;
        let pending_keys = MapKeys::new(keys::PENDING_MAP, Some(pool))?;
        let subscriptions = Subscriptions::connect(client, SubscriptionsOptions::default()).await?;
        let opts = || MapOptions::default().hash_tag(pool);
        let s = &subscriptions;
        let mirrored = |name: &'static str| async move {
            match mirror_jobs {
                true => Map::join_shared(s, name, opts()).await.map(Some),
                false => Ok(None),
            }
        };
        let joined = tokio::try_join!(
            Map::join_shared(s, keys::WORKERS_MAP, opts()),
            Map::join_shared(s, keys::KEEPALIVE_MAP, opts()),
            Map::join_shared(s, keys::CLEANUP_MAP, opts()),
            mirrored(keys::JOBS_MAP),
            mirrored(keys::PENDING_MAP),
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
            jobs_keys,
            pending_keys,
            payloads: keys::payloads(pool),
            fencing: keys::fencing(pool),
        })
    }

    /// What the scripts that check for Redis going back in time are given
    /// (see `went_back` in `scripts/base.lua`): "<jobs> <keep-alives>", the
    /// highest revisions of the jobs map (0 when this node does not mirror
    /// it) and of the keep-alive map this node has applied. The keep-alive
    /// map changes with every renewal of every node, so a node that does not
    /// mirror the jobs still sees Redis lose whatever seconds of writes
    /// hold a renewal.
    pub(crate) fn seen_revisions(&self) -> String {
        let jobs = self.jobs.as_ref().map_or(0, Map::revision_high_water);
        format!("{jobs} {}", self.keepalive.revision_high_water())
    }

    /// The keep-alive map's revision key (the one `went_back` compares).
    pub(crate) fn keepalive_revision_key(&self) -> String {
        self.keepalive.keys_info().revision.clone()
    }

    /// Lowers the high-water marks [`seen_revisions`](Self::seen_revisions)
    /// reports to the current revisions, once the node has dealt with Redis
    /// going back in time.
    pub(crate) fn reset_revision_high_waters(&self) {
        if let Some(jobs) = &self.jobs {
            jobs.reset_revision_high_water();
        }
        self.keepalive.reset_revision_high_water();
    }

    /// The maps whose regressions (a resync that found Redis behind the
    /// replica) mean Redis went back in time.
    pub(crate) fn regressions(&self) -> Vec<tokio::sync::watch::Receiver<u64>> {
        let mut watched = vec![self.workers.regressions(), self.keepalive.regressions()];
        watched.extend(self.jobs.iter().chain(&self.pending).map(Map::regressions));
        watched
    }

    /// The owner of job `key` in the jobs map's replica; `None` when this
    /// node does not mirror the map or the replica has no record.
    pub(crate) fn replica_owner(&self, key: &str) -> Option<String> {
        let record = self.jobs.as_ref()?.get(key)?;
        crate::store::records::job_owner(&record).map(|(w, _)| w.to_string())
    }

    /// The jobs map's replica (tests join with mirroring on).
    #[cfg(test)]
    pub(crate) fn jobs_map(&self) -> &Map {
        self.jobs
            .as_ref()
            .expect("the test node mirrors the jobs map")
    }

    /// The pending map's replica (tests join with mirroring on).
    #[cfg(test)]
    pub(crate) fn pending_map(&self) -> &Map {
        self.pending
            .as_ref()
            .expect("the test node mirrors the pending map")
    }

    /// The payloads hash key.
    pub(crate) fn payloads_key(&self) -> &str {
        &self.payloads
    }

    /// KEYS[1..8] of every pool script.
    pub(super) fn base_keys(&self) -> Vec<String> {
        let (j, p, w) = (
            &self.jobs_keys,
            &self.pending_keys,
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
            self.jobs_keys.channel.clone().into(),
            self.pending_keys.channel.clone().into(),
            self.workers.keys_info().channel.clone().into(),
        ]
    }

    /// ARGV[1..4] of the pool scripts whose first own argument is the
    /// worker TTL in ms.
    pub(super) fn base_args_with_ttl(&self, ttl: std::time::Duration) -> Vec<Value> {
        let mut args = self.base_args();
        args.push(Value::from(ttl.as_millis().to_string()));
        args
    }

    /// Closes the maps' subscriber connection, which ends every map (no
    /// unsubscribe per map: one bounded quit, even with Redis down).
    pub(crate) async fn close(&self) {
        self.subscriptions.close().await;
        tokio::join!(
            self.workers.close(),
            self.keepalive.close(),
            self.cleanup.close(),
            async {
                if let Some(jobs) = &self.jobs {
                    jobs.close().await;
                }
            },
            async {
                if let Some(pending) = &self.pending {
                    pending.close().await;
                }
            },
            self.nodes.close(),
            self.shutdown.close(),
        );
    }
}
