//! Re-reading a worker's inbox from its oldest entry (a rewind) after an
//! event failed or the lease came back, paced so that events that keep
//! failing are not read again in a tight loop.

use std::sync::Arc;
use std::time::Duration;

use flotilla_streaming::StartPosition;

use crate::error::Error;
use crate::node::NodeInner;
use crate::worker::WorkerInner;

/// Pacing of inbox rewinds: at most one scheduled at a time, with a delay
/// that doubles while events keep failing.
#[derive(Debug, Default)]
pub(crate) struct RewindState {
    scheduled: std::sync::atomic::AtomicBool,
    failures: std::sync::atomic::AtomicU32,
    /// Cuts a scheduled rewind's delay short: what held the entries back
    /// is over (the lease is back, a cleanup claim is gone), and a delay
    /// grown while it lasted (up to 5 s) would let their pending guards
    /// run out first (chaos soak seed 1601: entries refused while the pool
    /// recovered waited out their guards after it had).
    soon: tokio::sync::Notify,
}

impl RewindState {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(5);

    /// The delay before the next rewind, or `None` if one is scheduled.
    fn schedule(&self) -> Option<Duration> {
        use std::sync::atomic::Ordering::AcqRel;
        if self.scheduled.swap(true, AcqRel) {
            return None;
        }
        let n = self.failures.fetch_add(1, AcqRel).min(6);
        Some((Self::FIRST * 2u32.pow(n)).min(Self::MAX))
    }

    fn started(&self) {
        self.scheduled
            .store(false, std::sync::atomic::Ordering::Release);
    }

    pub(crate) fn succeeded(&self) {
        self.failures.store(0, std::sync::atomic::Ordering::Release);
    }

    /// As if `n` events had failed in a row: the next rewind's delay is
    /// the one grown by them.
    #[cfg(test)]
    pub(crate) fn failed_in_a_row(&self, n: u32) {
        self.failures.store(n, std::sync::atomic::Ordering::Release);
    }
}

impl NodeInner {
    /// At a renewal: every worker's scheduled rewind runs now rather than
    /// after its grown delay (up to 5 s), so an entry refused while the
    /// pool recovered, or while the lease was lost, is read again within a
    /// renewal period of the refusal's end, well within its pending guard;
    /// one that still fails schedules the next with its delay grown on.
    /// A worker with no rewind scheduled is not woken: the wake-up would
    /// be kept and let its next rewind skip the delay that paces it.
    pub(crate) fn rewinds_due(&self) {
        use std::sync::atomic::Ordering::Acquire;
        for worker in self.workers.iter() {
            let rewind = &worker.rewind;
            if rewind.scheduled.load(Acquire) && rewind.failures.load(Acquire) > 0 {
                rewind.soon.notify_one();
            }
        }
    }
}

impl WorkerInner {
    /// Events that failed since the last one that succeeded, and whether a
    /// rewind is waiting to run.
    #[cfg(test)]
    pub(crate) fn rewind_state(&self) -> (u32, bool) {
        use std::sync::atomic::Ordering::Acquire;
        (
            self.rewind.failures.load(Acquire),
            self.rewind.scheduled.load(Acquire),
        )
    }

    /// Reads the inbox again after the shortest delay (the lease is back,
    /// or a cleanup claim on the worker is gone), also when a rewind is
    /// scheduled already with a longer one.
    pub(crate) fn rewind_soon(self: &Arc<Self>, node: &NodeInner) {
        self.rewind.succeeded();
        self.rewind.soon.notify_one();
        self.clone().rewind(node);
    }

    /// Reads the inbox again from its oldest entry, after a delay that grows
    /// while events keep failing (100 ms doubling up to 5 s; cut short at
    /// the node's next renewal, [`NodeInner::rewinds_due`]). Entries still
    /// there are the ones not handled yet; those queued or just finished
    /// are skipped by `seen`. Without a lease nothing is re-read: resuming
    /// after the lease is back rewinds every worker.
    pub(crate) fn rewind(self: Arc<Self>, node: &NodeInner) {
        let Some(delay) = self.rewind.schedule() else {
            return; // one is already on its way
        };
        node.tasks.spawn(async move {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
                () = self.rewind.soon.notified() => {}
            }
            self.rewind.started();
            let Some(node) = self.node() else { return };
            if self.lease_lost.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            let result = match node.inbox(&self.id) {
                Ok(inbox) => node
                    .reader
                    .add_stream(&inbox, Some(StartPosition::Oldest))
                    .await
                    .map_err(Error::from),
                Err(e) => Err(e),
            };
            if let Err(e) = result {
                tracing::warn!(worker = %self.id, error = %e, "re-reading the inbox failed");
            }
        });
    }
}
