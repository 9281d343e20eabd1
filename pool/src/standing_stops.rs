//! Stops made to stand again after Redis went back in time: those this
//! node's `stop_job` calls were answered for, and those its workers carried
//! out lately (see `crate::rollback`, which calls these during a recovery).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;

use crate::error::Result;
use crate::node::NodeInner;
use crate::store::{StopKind, StopStands};
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
/// How long a stop undone by a newer run of its dispatch is asked again
/// (the run's worker may be cut off, or the pool recovering).
const UNDONE_STOPPED_WITHIN: Duration = Duration::from_secs(120);

impl NodeInner {
    /// Makes the stops this node's `stop_job` calls were answered for lately
    /// stand again: the worker that carried one out may have died within the
    /// writes Redis lost, and nothing else remembers that stop. A stop
    /// answered `JobNotFound` counts too: a worker cut off from Redis may
    /// hold a suspended copy that only the stop's tombstone kept out.
    /// A run of a stopped dispatch issued after its stop, on the state
    /// Redis went back to (a cleanup moved the stopped run off a dead
    /// worker before anyone made the stop stand), undid the stop: that
    /// dispatch is stopped again through its worker, in the background.
    pub(crate) async fn requested_stops_stand(self: &Arc<Self>) -> Result<()> {
        let stops = self.stops_requested.recent(STOPS_REMEMBERED);
        let (count, began) = (stops.len(), std::time::Instant::now());
        let dispatch_of = |key: &str, token| self.stops_requested.dispatch_of(key, token);
        self.make_stand(stops.into_iter(), StopKind::Dispatch, dispatch_of, |key, token, status| {
            match status {
                StopStands::Undone(dispatch) => self.stop_undone(key, token, dispatch),
                _ => tracing::info!(key, token, node = %self.id, "a stop asked from this node and lost by Redis stands again"),
            }
        })
        .await?;
        if count > 0 {
            tracing::info!(node = %self.id, count, took = ?began.elapsed(), "the stops asked from this node checked against Redis");
        }
        Ok(())
    }

    /// Makes stand, before `worker` re-asserts what it runs and holds, the
    /// stops this node's `stop_job` calls were answered for of those very
    /// runs (the run's token at or below the stopped one's): a worker cut
    /// off when its job was stopped holds a suspended copy that only the
    /// stop's tombstone keeps out, and Redis may have lost that tombstone.
    /// Re-asserted first, the copy would come back over a stop answered
    /// `Ok` (or be left to the orphan sweep, which would start it again);
    /// made to stand first, its re-assertion finds it ended. Every
    /// re-assertion does this, the one a renewal makes when Redis forgot
    /// the worker as well as a recovery's, so the node's other requested
    /// stops ([`requested_stops_stand`](Self::requested_stops_stand)) need
    /// not hold the workers back. An undone stop found here is stopped
    /// again by that pass, which finds it the same way.
    pub(crate) async fn requested_stops_of_runs_here(&self, worker: &WorkerInner) -> Result<()> {
        // A node that never stopped a job (most that run workers) has none.
        if self.stops_requested.is_empty() {
            return Ok(());
        }
        let covered = |key: &str, token: u64| {
            self.stops_requested
                .newest(key)
                .filter(|stopped| token <= *stopped)
                .map(|stopped| (key.to_string(), stopped))
        };
        let mut stops: Vec<(String, u64)> = worker
            .jobs
            .iter()
            .filter_map(|job| covered(job.key(), job.value().token))
            .collect();
        stops.extend(
            worker
                .suspended
                .lock()
                .await
                .iter()
                .filter_map(|(key, job)| covered(key, job.token)),
        );
        if stops.is_empty() {
            return Ok(());
        }
        stops.sort_unstable();
        stops.dedup();
        let dispatch_of = |key: &str, token| self.stops_requested.dispatch_of(key, token);
        self.make_stand(stops.into_iter(), StopKind::Dispatch, dispatch_of, |key, token, status| {
            tracing::info!(key, token, worker = %worker.id, status = ?status, "a stop asked from this node of a run the worker holds stands again before it re-asserts");
        })
        .await
    }

    /// Stops dispatch `dispatch` (its admission stamp) of `key` again,
    /// whose stop of run `token` was undone (see
    /// [`requested_stops_stand`](Self::requested_stops_stand)), in the
    /// background, for up to [`UNDONE_STOPPED_WITHIN`] while the pool
    /// recovers or the run's worker does not answer.
    fn stop_undone(self: &Arc<Self>, key: &str, token: u64, dispatch: u64) {
        tracing::warn!(
            key,
            token,
            dispatch,
            node = %self.id,
            "a stop Redis lost was undone by a newer run of its dispatch: stopping it again"
        );
        self.stop_dispatch_in_background(key, dispatch);
    }

    /// Stops dispatch `older` (its admission stamp) of `key`, over before
    /// the dispatch a worker of this node holds under `token` was admitted,
    /// whose run Redis went back to and recorded over the held one (see
    /// [`Reasserted::Superseded`](crate::store::Reasserted::Superseded)):
    /// in the background, for up to [`UNDONE_STOPPED_WITHIN`]. The held
    /// dispatch takes its place in Redis when it ends.
    pub(crate) fn stop_superseded(self: &Arc<Self>, key: &str, token: u64, older: u64) {
        tracing::warn!(
            key,
            token,
            older,
            node = %self.id,
            "a run of an older dispatch holds a key over a newer one held here: stopping it"
        );
        self.stop_dispatch_in_background(key, older);
    }

    /// Stops dispatch `dispatch` of `key` through its worker, in the
    /// background, asking again for up to [`UNDONE_STOPPED_WITHIN`].
    fn stop_dispatch_in_background(self: &Arc<Self>, key: &str, dispatch: u64) {
        let node = self.clone();
        let key = key.to_string();
        self.tasks.spawn(async move {
            match node
                .stop_dispatch(&key, dispatch, UNDONE_STOPPED_WITHIN)
                .await
            {
                Ok(()) => {
                    tracing::info!(key, dispatch, node = %node.id, "a dispatch over for good is stopped")
                }
                Err(Some(e)) => tracing::warn!(
                    key,
                    dispatch,
                    error = %e,
                    "a dispatch over for good could not be stopped: its run goes on"
                ),
                Err(None) => {}
            }
        });
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
        self.worker_stops_stand(worker, stops.collect()).await
    }

    /// Makes `stops` of `worker` stand: those that ended a whole dispatch
    /// (stopped on request, or ended for good: `record_dispatch`) as
    /// [`StopKind::Dispatch`], so that a newer run of that dispatch marks
    /// it over in Redis (a cleanup or the sweep ends it rather than moving
    /// it on: chaos soak seed 1586, finished jobs run again); the others
    /// (a run's end Redis did not record as the dispatch's, runs passed on
    /// that ended elsewhere) as [`StopKind::Run`]. So are the stops a
    /// closing worker or node left here, each as its stopper would have
    /// made it stand ([`Handoffs::ended_dispatch`]).
    ///
    /// [`Handoffs::ended_dispatch`]: crate::handoffs::Handoffs::ended_dispatch
    async fn worker_stops_stand(
        &self,
        worker: &WorkerInner,
        stops: Vec<(String, u64)>,
    ) -> Result<()> {
        let (whole, runs): (Vec<_>, Vec<_>) = stops
            .into_iter()
            .partition(|(key, token)| dispatch_of(worker, key, *token).is_some());
        let log = |key: &str, token: u64, status: StopStands| match status {
            StopStands::Undone(dispatch) => {
                tracing::warn!(
                    key,
                    token,
                    dispatch,
                    worker = %worker.id,
                    "a dispatch that ended here has a newer run on the state Redis went back to: marked over"
                );
                // Marked over, it is ended instead of moved on by a cleanup
                // or a hand-off; on a live worker that keeps it, only a
                // stop ends it, as for a stop this node asked for.
                if let Some(node) = worker.node() {
                    node.stop_undone(key, token, dispatch);
                }
            }
            _ => {
                tracing::info!(key, token, worker = %worker.id, "a stop Redis lost stands again after a rollback")
            }
        };
        let dispatch_of = |key: &str, token| dispatch_of(worker, key, token);
        self.make_stand(whole.into_iter(), StopKind::Dispatch, dispatch_of, log)
            .await?;
        self.make_stand(runs.into_iter(), StopKind::Run, |_: &str, _| None, log)
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
        self.worker_stops_stand(worker, stops.clone()).await?;
        Ok(stops.into_iter().collect())
    }

    /// Runs `stop_stands.lua` for `stops` of `kind`, [`STOPS_BATCH`] per
    /// call and [`STOP_CALLS_IN_FLIGHT`] calls at a time; `changed` hears
    /// of each that took something away or was undone.
    /// `dispatch_of`: the admission stamp of the one dispatch a stop ended,
    /// when it ended one (see [`StopTombstones::dispatch_of`]).
    ///
    /// [`StopTombstones::dispatch_of`]: crate::tombstones::StopTombstones::dispatch_of
    pub(crate) async fn make_stand(
        &self,
        stops: impl Iterator<Item = (String, u64)>,
        kind: StopKind,
        dispatch_of: impl Fn(&str, u64) -> Option<u64>,
        changed: impl Fn(&str, u64, StopStands) + Sync,
    ) -> Result<()> {
        let stops: Vec<(String, u64, u64)> = stops
            .map(|(key, token)| {
                let dispatch = dispatch_of(&key, token).unwrap_or(0);
                (key, token, dispatch)
            })
            .collect();
        let changed = &changed;
        futures::stream::iter(stops.chunks(STOPS_BATCH).map(Ok))
            .try_for_each_concurrent(STOP_CALLS_IN_FLIGHT, |batch| async move {
                let batch: Vec<(&str, u64, u64)> =
                    batch.iter().map(|(k, t, d)| (k.as_str(), *t, *d)).collect();
                let statuses = self
                    .store
                    .stops_stand_yielding(&batch, kind, self.store.diverged())
                    .await?;
                for ((key, token, _), status) in batch.into_iter().zip(statuses) {
                    if matches!(status, StopStands::Removed | StopStands::Undone(_)) {
                        changed(key, token, status);
                    }
                }
                Ok(())
            })
            .await
    }
}

/// What the stop of `key` at `token` that `worker` remembers ended, when it
/// ended a whole dispatch: a stop it carried out ([`StopTombstones`]), or
/// one a closing worker or node left with it ([`Handoffs::ended_dispatch`]).
///
/// [`StopTombstones`]: crate::tombstones::StopTombstones
/// [`Handoffs::ended_dispatch`]: crate::handoffs::Handoffs::ended_dispatch
fn dispatch_of(worker: &WorkerInner, key: &str, token: u64) -> Option<u64> {
    worker
        .stopped
        .dispatch_of(key, token)
        .or_else(|| worker.handed_off.ended_dispatch(key, token))
}
