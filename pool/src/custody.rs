//! What a closing worker remembers, left with workers that stay.
//!
//! A worker remembers the jobs it passed on lately (hand-offs, orphans it
//! left, runs it saw end; `handoffs.rs`) to give them back, or make their
//! ends stand, if Redis loses its data. A close passes on every job it has,
//! and then the process exits: until each new owner has read its start
//! entry, and until the orphan sweep requeued the orphans a close leaves
//! while the pool recovers from a loss (a few TTLs), Redis alone holds
//! those jobs, and a second loss would take them with nobody left to give
//! them back (the integration README's Finding 19).
//!
//! So before its worker goes, a close leaves that memory with the workers
//! that stay, as `keep` entries in their inboxes (one per receiving worker
//! and [`JOBS_PER_ENTRY`] jobs, each with the worker the ring would give
//! its key, and with a second worker, on another node where the pool has
//! one), and waits, within the close's deadline, until each entry has
//! been read: the reader remembers the jobs as its own hand-offs from then
//! on (given back after a loss, settled once they end). Meanwhile the
//! close gives each job back where Redis went back to before it
//! (`handoff_stands.lua`, a no-op otherwise), and does it again, and
//! leaves the entries again, whenever Redis's identity (run id and data
//! generation) changes before an entry was read: the loss may have taken
//! the entry too.
//!
//! ```text
//! close ─▶ hand-offs / orphans ─▶ remembered here
//!   └▶ entrust.lua: XADD keep ─▶ inbox of a worker that stays ─▶ read: remembered there
//!   └▶ handoff_stands.lua per job (gives back what a loss already took)
//!   └▶ entrusted_left.lua until every entry is read (same identity) or the deadline
//!        identity changed ─▶ give back again, leave the unread entries again
//! ```

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio::time::Instant;

use crate::codec::{self, KeptJob, KeptJobs};
use crate::handoffs::{ENDS_REMEMBERED, HandedOff, Handoffs};
use crate::membership::HANDOFFS_IN_FLIGHT;
use crate::node::NodeInner;
use crate::routing::Ring;
use crate::store::Entrusted;

/// Jobs per `keep` entry.
const JOBS_PER_ENTRY: usize = 256;
/// Pause between two looks at the entries left.
const POLL: Duration = Duration::from_millis(20);
/// Pause before a parcel is offered again to a pool that recovers from a
/// loss (its workers come back within a renewal period, a third of a TTL):
/// each offer carries the whole entry.
const RECOVERY_POLL: Duration = Duration::from_millis(250);
/// Entries looked at per call of `entrusted_left.lua`.
const CHECK_BATCH: usize = 256;

/// Remembers here the jobs of a `keep` entry a closing worker left.
pub(crate) fn keep_here(handed_off: &Handoffs, kept: KeptJobs) {
    for job in kept.jobs {
        let handed = HandedOff {
            key: job.key,
            token: job.token,
            admitted: job.admitted,
            body: Bytes::from(job.body),
        };
        let keep = Duration::from_millis(job.keep_ms);
        match (job.ended_at, job.ended_dispatch) {
            (Some(counter), Some(dispatch)) => {
                handed_off.take_over_dispatch_end(handed, keep, counter, dispatch)
            }
            (ended_at, _) => handed_off.take_over(handed, keep, ended_at),
        }
    }
}

/// Adds `stops`, `(key, token, what it ended)` of runs stopped lately, to
/// `memory` as ends: whoever keeps them makes each stand after a rollback.
/// What a stop ended, when it ended a whole dispatch (a stop `stop_job`
/// asked for, a worker's stop of the dispatch on request or its end for
/// good), is that dispatch's admission stamp, or the stop's own token for
/// a stop of the whole key: the keeper makes it stand as the stopper would
/// have, recording that end in Redis (see [`Handoffs::ended_dispatch`]).
pub(crate) fn remember_stops(memory: &Handoffs, stops: Vec<(String, u64, Option<u64>)>) {
    for (key, token, dispatch) in stops {
        let handed = HandedOff {
            key,
            token,
            admitted: 0,
            body: Bytes::new(),
        };
        match dispatch {
            Some(dispatch) => {
                memory.take_over_dispatch_end(handed, ENDS_REMEMBERED, token, dispatch)
            }
            None => memory.take_over(handed, ENDS_REMEMBERED, Some(token)),
        }
    }
}

/// One `keep` entry on its way.
struct Parcel {
    /// The receiving worker.
    to: String,
    jobs: Vec<KeptJob>,
    /// A second copy of what another parcel carries too (not given back
    /// twice by the close itself).
    copy: bool,
    /// Where it was left, and Redis's identity then.
    left: Option<Left>,
    /// Workers found dead (silent for over a TTL) while the ring still
    /// names them: not chosen again.
    dead: HashSet<String>,
    /// Given up: no other worker was left to keep it.
    unkept: bool,
    /// Not offered again before this (the pool recovers).
    not_before: Option<Instant>,
}

/// Where a parcel was left: its inbox, its entry id, and Redis's identity
/// (`"<run id> <generation>"`) then. The entry counts as read once gone
/// while Redis still has that identity; under another, a loss may have
/// taken it unread.
struct Left {
    inbox: String,
    id: String,
    identity: String,
}

impl NodeInner {
    /// Leaves what worker `leaving` (closing; or a node closing, whose
    /// requested stops these are) remembers with the workers that stay and
    /// waits until they read it, or until `until`.
    pub(crate) async fn entrust_memory(
        self: &Arc<Self>,
        leaving: &str,
        handed_off: &Handoffs,
        until: Instant,
    ) {
        let remembered = handed_off.everything();
        if remembered.is_empty() {
            return;
        }
        let ring = self.ring.load_full();
        let node_of = self.node_of_workers();
        // (receiving worker, a second copy) → jobs.
        let mut by_worker: HashMap<(String, bool), Vec<KeptJob>> = HashMap::new();
        for (handed, keep, ended_at, ended_dispatch) in remembered {
            // No other worker in the ring: nobody to leave it with, unless
            // the pool recovers from a loss and the others are not back yet
            // (see `leave_parcel`).
            let to = ring.owner_excluding(&handed.key, leaving).unwrap_or("");
            let job = KeptJob {
                key: handed.key,
                token: handed.token,
                admitted: handed.admitted,
                body: handed.body.to_vec(),
                ended_at,
                keep_ms: u64::try_from(keep.as_millis()).unwrap_or(u64::MAX),
                ended_dispatch,
            };
            // Kept twice, on two nodes where the pool has them: once this
            // process exits, this memory may be the only trace of a stop
            // (after a rollback) or of a job (after a loss, while Redis
            // alone held it), and one keeper's process may be cut off
            // through the recovery, or die before it gives the job back
            // (chaos soak seed 1564: killed 374 ms after an empty restart,
            // 14 jobs ran nowhere). Making an end stand or giving a job
            // back twice changes nothing (`handoff_stands.lua` gives back
            // only where Redis holds nothing of the key).
            if let Some(second) = second_keeper(&ring, &job.key, leaving, to, &node_of) {
                by_worker
                    .entry((second.to_string(), true))
                    .or_default()
                    .push(job.clone());
            }
            by_worker
                .entry((to.to_string(), false))
                .or_default()
                .push(job);
        }
        let mut parcels: Vec<Parcel> = by_worker
            .into_iter()
            .flat_map(|((to, copy), jobs)| {
                jobs.chunks(JOBS_PER_ENTRY)
                    .map(|chunk| Parcel {
                        to: to.clone(),
                        jobs: chunk.to_vec(),
                        copy,
                        left: None,
                        dead: HashSet::new(),
                        unkept: false,
                        not_before: None,
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        let sizes: Vec<usize> = parcels.iter().map(|p| p.jobs.len()).collect();
        let total: usize = sizes.iter().sum();
        let started = Instant::now();
        let waited =
            tokio::time::timeout_at(until, self.hand_over_parcels(leaving, &mut parcels)).await;
        let unkept: usize = parcels
            .iter()
            .zip(&sizes)
            .filter(|(p, _)| p.unkept)
            .map(|(_, n)| n)
            .sum::<usize>();
        match waited {
            Ok(()) if unkept == total => tracing::info!(
                worker = leaving,
                jobs = total,
                "closing: no other worker to keep what this worker remembered"
            ),
            Ok(()) => tracing::info!(
                worker = leaving,
                jobs = total,
                unkept,
                took_ms = started.elapsed().as_millis() as u64,
                "closing: what this worker remembered is kept by workers that stay \
                 (unkept: no other worker was left to keep them)"
            ),
            Err(_) => tracing::warn!(
                worker = leaving,
                jobs = total,
                unread = parcels
                    .iter()
                    .filter(|p| !p.jobs.is_empty())
                    .map(|p| p.jobs.len())
                    .sum::<usize>(),
                "closing: not every job this worker remembered was taken up by a worker that stays \
                 before the close's deadline; Redis alone holds those until they start elsewhere"
            ),
        }
    }

    /// Leaves `parcels` and waits until each was read; a parcel read is
    /// emptied of its jobs.
    async fn hand_over_parcels(self: &Arc<Self>, leaving: &str, parcels: &mut [Parcel]) {
        // Redis's identity when every job was last given back.
        let mut given_back: Option<String> = None;
        // The first give-back covers every job, those read meanwhile too:
        // a loss before they were left may have come before their reader's
        // own recovery.
        let mut first: Vec<KeptJob> = parcels
            .iter()
            .filter(|p| !p.copy)
            .flat_map(|p| p.jobs.clone())
            .collect();
        loop {
            let mut seen = self.leave_parcels(leaving, parcels).await;
            seen.extend(self.look_at_parcels(leaving, parcels).await);
            if let Some(identity) = seen.last()
                && seen
                    .iter()
                    .any(|i| given_back.as_deref() != Some(i.as_str()))
            {
                // The first time, for a loss before the entries were left;
                // then after every loss seen since, for the jobs not read.
                if given_back.is_none() {
                    self.give_back(std::mem::take(&mut first).iter(), false)
                        .await;
                } else {
                    let unread = parcels.iter().filter(|p| !p.copy);
                    self.give_back(unread.flat_map(|p| p.jobs.iter()), true)
                        .await;
                }
                given_back = Some(identity.clone());
                continue;
            }
            if parcels.iter().all(|p| p.jobs.is_empty()) {
                return;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Leaves each parcel not left yet; returns the identities Redis had
    /// meanwhile.
    async fn leave_parcels(&self, leaving: &str, parcels: &mut [Parcel]) -> Vec<String> {
        let waiting: Vec<&mut Parcel> = parcels
            .iter_mut()
            .filter(|p| p.left.is_none() && !p.jobs.is_empty())
            .filter(|p| p.not_before.is_none_or(|at| at <= Instant::now()))
            .collect();
        // The futures made first: a stream mapping with a closure over
        // borrowed parcels is not `Send` for every lifetime.
        let leaves: Vec<_> = waiting
            .into_iter()
            .map(|parcel| self.leave_parcel(leaving, parcel))
            .collect();
        let identities: Vec<Option<String>> = futures::stream::iter(leaves)
            .buffer_unordered(HANDOFFS_IN_FLIGHT)
            .collect()
            .await;
        identities.into_iter().flatten().collect()
    }

    async fn leave_parcel(&self, leaving: &str, parcel: &mut Parcel) -> Option<String> {
        if parcel.to.is_empty() {
            // No other worker in the ring: gone for good, unless the pool
            // recovers from a loss and they have not registered again yet.
            self.refresh_ring();
            self.retarget(parcel, leaving, true);
            if parcel.to.is_empty() {
                if self.pool_recovering().await {
                    parcel.not_before = Some(Instant::now() + RECOVERY_POLL);
                } else {
                    parcel.jobs.clear();
                    parcel.unkept = true;
                }
                return None;
            }
        }
        let inbox = match self.inbox(&parcel.to) {
            Ok(inbox) => inbox.key().to_string(),
            Err(e) => {
                tracing::warn!(worker = leaving, to = %parcel.to, error = %e, "closing: no inbox to leave remembered jobs in");
                parcel.jobs.clear();
                return None;
            }
        };
        let entry = codec::encode(&KeptJobs {
            jobs: parcel.jobs.clone(),
        });
        match self
            .store
            .entrust(&parcel.to, &inbox, entry, self.options.worker_ttl)
            .await
        {
            Ok(Entrusted::Left { id, identity }) => {
                parcel.left = Some(Left {
                    inbox,
                    id,
                    identity: identity.clone(),
                });
                Some(identity)
            }
            Ok(Entrusted::Silent) => {
                parcel.dead.insert(parcel.to.clone());
                self.retarget(parcel, leaving, false);
                None
            }
            Ok(Entrusted::NoTarget) => {
                // Gone or closing too: another worker.
                self.refresh_ring();
                self.retarget(parcel, leaving, false);
                None
            }
            Ok(Entrusted::Recovering) => {
                // Not registered again, or not renewed, yet after a loss:
                // another worker if one is back, else this one later (the
                // pool's workers come back within a renewal; giving up
                // here would leave the jobs with Redis alone).
                self.refresh_ring();
                self.retarget(parcel, leaving, true);
                parcel.not_before = Some(Instant::now() + RECOVERY_POLL);
                None
            }
            Err(e) => {
                tracing::debug!(worker = leaving, to = %parcel.to, error = %e, "closing: leaving remembered jobs failed; trying again");
                None
            }
        }
    }

    /// Looks which parcels were read and empties those; leaves again
    /// those whose worker went away unread, and those a loss may have
    /// taken. Returns the identities Redis had meanwhile.
    async fn look_at_parcels(&self, leaving: &str, parcels: &mut [Parcel]) -> Vec<String> {
        let left: Vec<usize> = (0..parcels.len())
            .filter(|i| parcels[*i].left.is_some() && !parcels[*i].jobs.is_empty())
            .collect();
        let mut seen = Vec::new();
        for batch in left.chunks(CHECK_BATCH) {
            let entries: Vec<(String, String, String)> = batch
                .iter()
                .filter_map(|i| {
                    let parcel = &parcels[*i];
                    let left = parcel.left.as_ref()?;
                    Some((left.inbox.clone(), left.id.clone(), parcel.to.clone()))
                })
                .collect();
            let (identity, unread) = match self
                .store
                .entrusted_left(&entries, self.options.worker_ttl)
                .await
            {
                Ok(answer) => answer,
                Err(e) => {
                    tracing::debug!(error = %e, "closing: looking at the remembered jobs left failed; looking again");
                    continue;
                }
            };
            let unread: HashMap<usize, bool> = unread.into_iter().collect();
            for (at, i) in batch.iter().enumerate() {
                let parcel = &mut parcels[*i];
                let same = parcel.left.as_ref().is_some_and(|l| l.identity == identity);
                match unread.get(&at) {
                    _ if !same => parcel.left = None,
                    None => parcel.jobs.clear(),
                    Some(true) => {}
                    Some(false) => {
                        // Its worker closes or died: whoever moves its
                        // inbox on may drop the entry.
                        parcel.left = None;
                        self.refresh_ring();
                        self.retarget(parcel, leaving, false);
                    }
                }
            }
            seen.push(identity);
        }
        seen
    }

    /// Whether the pool recovers from a loss of Redis's data (its workers
    /// may not have registered again yet); an error counts as yes, to ask
    /// again.
    async fn pool_recovering(&self) -> bool {
        // The script needs a key of the pool's slot for the inbox it does
        // not write: this node's reply stream.
        !matches!(
            self.store
                .pool_recovering(self.reply_stream.key(), self.options.worker_ttl)
                .await,
            Ok(false)
        )
    }

    /// The node of each registered worker, as the membership replica shows.
    fn node_of_workers(&self) -> HashMap<String, String> {
        self.store
            .maps
            .workers
            .snapshot()
            .iter()
            .filter_map(|(worker, raw)| {
                let node = crate::store::records::WorkerEntry::parse(raw)?.node?;
                Some((worker.clone(), node))
            })
            .collect()
    }

    /// Sends `parcel` to the worker the ring now gives its first key
    /// (leaving out the workers found dead). When no other worker is in the
    /// ring, it keeps its worker to try again with `wait` (the pool
    /// recovers: workers come back), else gives it up (nobody can keep it;
    /// the pool is shutting down or this was its last worker).
    fn retarget(&self, parcel: &mut Parcel, leaving: &str, wait: bool) {
        let ring = self.ring.load();
        let to = parcel.jobs.first().and_then(|job| {
            ring.owner_among(&job.key, |w| w != leaving && !parcel.dead.contains(w))
        });
        match to {
            Some(to) => parcel.to = to.to_string(),
            None if wait => {}
            None => {
                parcel.jobs.clear();
                parcel.unkept = true;
            }
        }
    }

    /// Gives back each of `jobs` where Redis went back to before it
    /// (`handoff_stands.lua`; nothing happens where Redis holds it). With
    /// `lost`, Redis lost data since the jobs were last given back: the
    /// ends they name are made to stand again too.
    async fn give_back<'a>(self: &Arc<Self>, jobs: impl Iterator<Item = &'a KeptJob>, lost: bool) {
        let gives: Vec<_> = jobs.map(|job| self.give_back_job(job, lost)).collect();
        futures::stream::iter(gives)
            .buffer_unordered(HANDOFFS_IN_FLIGHT)
            .collect::<Vec<()>>()
            .await;
    }

    async fn give_back_job(self: &Arc<Self>, job: &KeptJob, lost: bool) {
        let result = match job.ended_at {
            Some(counter) if lost => match job.ended_dispatch {
                // As its keeper will (see `Handoffs::ended_dispatch`).
                Some(dispatch) => self
                    .store
                    .stops_stand_yielding(
                        &[(job.key.as_str(), counter, dispatch)],
                        crate::store::StopKind::Dispatch,
                        false,
                    )
                    .await
                    .map(|_| ()),
                None => self.store.stop_stands(&job.key, counter).await.map(|_| ()),
            },
            Some(_) => Ok(()),
            None => self
                .store
                .handoff_stands(&job.key, job.token, codec::stored(job.admitted, &job.body))
                .await
                .map(|status| match status {
                    crate::store::HandoffStands::Restored => tracing::info!(
                        key = job.key,
                        token = job.token,
                        "closing: a job passed on that Redis lost is an orphan again"
                    ),
                    // It waits for that dispatch's run to end: stopped
                    // here, as a re-assertion does (`stop_superseded`).
                    crate::store::HandoffStands::Superseded(older) => {
                        self.stop_superseded(&job.key, job.token, older);
                    }
                    _ => {}
                }),
        };
        if let Err(e) = result {
            tracing::debug!(key = job.key, error = %e, "closing: giving back a job passed on failed");
        }
    }
}

/// A second worker to keep the end of `key`'s run besides `first`: the
/// ring's choice among the workers of other nodes than `first`'s (a crash
/// or a partition takes a process's workers together), else among the
/// other workers; `None` when no other worker is left.
fn second_keeper<'a>(
    ring: &'a Ring,
    key: &str,
    leaving: &str,
    first: &str,
    node_of: &HashMap<String, String>,
) -> Option<&'a str> {
    if first.is_empty() {
        return None;
    }
    let first_node = node_of.get(first);
    let other = |w: &str| w != leaving && w != first;
    ring.owner_among(key, |w| {
        other(w) && first_node.is_none_or(|n| node_of.get(w) != Some(n))
    })
    .or_else(|| ring.owner_among(key, other))
}
