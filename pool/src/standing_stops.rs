//! Stops made to stand again after Redis went back in time: those this
//! node's `stop_job` calls were answered for, and those its workers carried
//! out lately (see `crate::rollback`, which calls these during a recovery).

use std::collections::HashSet;
use std::time::Duration;

use futures::TryStreamExt;

use crate::error::Result;
use crate::node::NodeInner;
use crate::worker::WorkerInner;

/// How far back stops are made to stand again after a rollback (a rollback
/// loses seconds of writes, not minutes).
const STOPS_REMEMBERED: Duration = Duration::from_secs(120);
/// Stops made to stand again in one call of `stop_stands.lua`: a node that
/// stopped or ended hundreds of runs in the last minutes gets through them
/// in a few calls (a call costs Redis as much as a few stops), while its
/// recovery mark holds the window open and beside its workers'
/// re-assertions.
/// The stops' effects do not depend on their order (each removes what is
/// at or below its token and only raises the counter).
pub(crate) const STOPS_BATCH: usize = 64;
/// Batches of stops (or of hand-offs given back, as many per call) in
/// flight at once (pipelined on the client's connection).
pub(crate) const STOP_CALLS_IN_FLIGHT: usize = 4;

impl NodeInner {
    /// Makes the stops this node's `stop_job` calls were answered for lately
    /// stand again: the worker that carried one out may have died within the
    /// writes Redis lost, and nothing else remembers that stop. A stop
    /// answered `JobNotFound` counts too: a worker cut off from Redis may
    /// hold a suspended copy that only the stop's tombstone kept out.
    pub(crate) async fn requested_stops_stand(&self) -> Result<()> {
        let stops = self.stops_requested.recent(STOPS_REMEMBERED);
        self.make_stand(stops.into_iter(), |key, token| {
            tracing::info!(key, token, node = %self.id, "a stop asked from this node and lost by Redis stands again");
        })
        .await
    }

    /// Makes the stops `worker` carried out lately stand again: Redis may
    /// have lost them, and the older state may show a stopped run under
    /// another (perhaps dead) worker, which a cleanup would start again.
    /// So are the ends of runs it handed off that Redis showed it (see
    /// `handoffs.rs`): the worker that stopped one and the node that asked
    /// may both be gone.
    /// `stood`: those [`ended_stops_stand`](Self::ended_stops_stand) made
    /// stand already in this recovery.
    pub(crate) async fn stops_stand(
        &self,
        worker: &WorkerInner,
        stood: &HashSet<(String, u64)>,
    ) -> Result<()> {
        let stops = worker
            .stopped
            .recent(STOPS_REMEMBERED)
            .into_iter()
            .chain(worker.handed_off.ended())
            .filter(|stop| !stood.contains(stop))
            // A newer run of the key goes on here.
            .filter(|(key, token)| worker.jobs.get(key).is_none_or(|j| j.token <= *token));
        self.make_stand(stops, |key, token| {
            tracing::info!(key, token, worker = %worker.id, "a stop Redis lost stands again after a rollback");
        })
        .await
    }

    /// The part of [`stops_stand`](Self::stops_stand) that need not wait
    /// for `worker`'s re-assertion: stops and ends of keys it neither runs
    /// nor holds suspended; returns them.
    pub(crate) async fn ended_stops_stand(
        &self,
        worker: &WorkerInner,
    ) -> Result<HashSet<(String, u64)>> {
        let mut stops = Vec::new();
        for (key, token) in worker
            .stopped
            .recent(STOPS_REMEMBERED)
            .into_iter()
            .chain(worker.handed_off.ended())
        {
            if !worker.runs_or_holds(&key).await {
                stops.push((key, token));
            }
        }
        self.make_stand(stops.iter().cloned(), |key, token| {
            tracing::info!(key, token, worker = %worker.id, "a stop Redis lost stands again after a rollback");
        })
        .await?;
        Ok(stops.into_iter().collect())
    }

    /// Runs `stop_stands.lua` for `stops`, [`STOPS_BATCH`] per call and
    /// [`STOP_CALLS_IN_FLIGHT`] calls at a time; `removed` hears of each
    /// that took something away.
    async fn make_stand(
        &self,
        stops: impl Iterator<Item = (String, u64)>,
        removed: impl Fn(&str, u64) + Sync,
    ) -> Result<()> {
        let stops: Vec<(String, u64)> = stops.collect();
        let removed = &removed;
        futures::stream::iter(stops.chunks(STOPS_BATCH).map(Ok))
            .try_for_each_concurrent(STOP_CALLS_IN_FLIGHT, |batch| async move {
                let batch: Vec<(&str, u64)> = batch.iter().map(|(k, t)| (k.as_str(), *t)).collect();
                let statuses = self.store.stop_stands_batch(&batch).await?;
                for ((key, token), status) in batch.into_iter().zip(statuses) {
                    if status == crate::store::StopStands::Removed {
                        removed(key, token);
                    }
                }
                Ok(())
            })
            .await
    }
}
