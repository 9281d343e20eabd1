//! What this node's cleanups of dead workers found, remembered for a while,
//! and the ends it makes stand with that after Redis went back in time.
//!
//! A run that had left a worker before the worker's cleanup listed its jobs
//! ended there (stopped on request, finished, failed for good) or was
//! passed on (its new owner re-asserts its own, newer run; a node that
//! moved it gives it back). A state from before that, which Redis may go
//! back to, shows the run under the dead worker again, registered again,
//! and the next cleanup would move it: a job stopped on request starts
//! again when the worker that stopped it and the node that asked are gone
//! too (chaos soak seed 1567: a stop answered, its worker's process killed
//! 2.8 s later and cleaned up, Redis back 19.5 s after the stop to a state
//! from before it, the asking dispatcher crashed 33 ms after that). The
//! node that cleaned the worker up still knows what its cleanup found: in
//! its recovery, a run Redis shows under that worker again, issued before
//! the cleanup and neither listed nor queued there by it, is ended as a
//! run a worker stopped (`stop_stands.lua`: a newer run of the key goes on).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cleanup::OWNED_PAGE;
use crate::error::Result;
use crate::node::NodeInner;
use crate::store::{SCAN_START, StopKind};

/// How long a cleanup's finds are kept: as long as stops are made to stand
/// again (a rollback loses seconds of writes, not minutes).
const KEPT: Duration = Duration::from_secs(120);
/// Most cleanups remembered (a pool loses a few workers a minute, not
/// hundreds).
const MAX: usize = 256;

/// The keys one cleanup found of its worker: records listed from the jobs
/// hash and entries of its inbox. `listed_all`: every page of the listing
/// was read (a page that failed leaves the rest to the orphan sweep, and
/// what it held is not known).
#[derive(Debug)]
pub(crate) struct CleanupFinds {
    pub(crate) keys: HashSet<String>,
    pub(crate) listed_all: bool,
}

impl Default for CleanupFinds {
    fn default() -> Self {
        Self {
            keys: HashSet::new(),
            listed_all: true,
        }
    }
}

/// One finished cleanup.
#[derive(Debug)]
pub(crate) struct Cleaned {
    at: Instant,
    /// The worker cleaned up.
    pub(crate) worker: String,
    /// Server time (µs) before the cleanup's claim: every token issued
    /// after it is at least this (a token is at least the server's time).
    pub(crate) issued_before_us: u64,
    /// What the cleanup found there.
    pub(crate) found: HashSet<String>,
}

/// The cleanups this node finished lately.
#[derive(Debug, Default)]
pub(crate) struct CleanedWorkers {
    inner: Mutex<VecDeque<Arc<Cleaned>>>,
}

impl CleanedWorkers {
    /// Remembers that this node cleaned `worker` up, claimed at server time
    /// `claimed_ms` or later, and found `finds` there. A cleanup whose
    /// listing did not finish is not remembered: runs it did not list may
    /// have been there.
    pub(crate) fn remember(&self, worker: &str, claimed_ms: u64, finds: CleanupFinds) {
        if !finds.listed_all {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        while inner
            .front()
            .is_some_and(|c| inner.len() >= MAX || now.duration_since(c.at) >= KEPT)
        {
            inner.pop_front();
        }
        inner.push_back(Arc::new(Cleaned {
            at: now,
            worker: worker.to_string(),
            issued_before_us: claimed_ms.saturating_mul(1000),
            found: finds.keys,
        }));
    }

    /// The cleanups finished within `within`, oldest first.
    pub(crate) fn recent(&self, within: Duration) -> Vec<Arc<Cleaned>> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner
            .iter()
            .filter(|c| c.at.elapsed() < within)
            .cloned()
            .collect()
    }
}

impl NodeInner {
    /// Ends the runs that had left a worker this node cleaned up lately,
    /// shown under it again by the state Redis went back to (see the
    /// module's doc). Called in the recovery, while this node's mark holds
    /// the pool's recovery window open: no cleanup moves them meanwhile.
    pub(crate) async fn cleaned_runs_stand(&self) -> Result<()> {
        for cleaned in self.cleaned.recent(KEPT) {
            // A worker Redis does not show registered holds nothing a
            // cleanup would move (one `HEXISTS` instead of a listing).
            if !self.store.worker_registered(&cleaned.worker).await? {
                continue;
            }
            let left = self.runs_left_before_cleanup(&cleaned).await?;
            if left.is_empty() {
                continue;
            }
            self.make_stand(left.into_iter(), StopKind::Run, |key, token, _| {
                tracing::info!(
                    key,
                    token,
                    worker = %cleaned.worker,
                    node = %self.id,
                    "a run that had left a worker before its cleanup here, back under it after Redis went back in time: its end stands"
                );
            })
            .await?;
        }
        Ok(())
    }

    /// The runs Redis records under `cleaned.worker` now that its cleanup
    /// did not find and that were issued before it.
    async fn runs_left_before_cleanup(&self, cleaned: &Cleaned) -> Result<Vec<(String, u64)>> {
        // `HSCAN` may list a key twice.
        let mut left = HashMap::new();
        let mut cursor = SCAN_START.to_string();
        loop {
            let page = self
                .store
                .owned_page(&cleaned.worker, &cursor, OWNED_PAGE)
                .await?;
            for key in page.keys {
                if cleaned.found.contains(&key) || left.contains_key(&key) {
                    continue;
                }
                // The page names the owner only: the token is read again.
                if let Some((owner, token)) = self.store.job_owner(&key).await?
                    && owner == cleaned.worker
                    && token < cleaned.issued_before_us
                {
                    left.insert(key, token);
                }
            }
            if page.cursor == SCAN_START {
                return Ok(left.into_iter().collect());
            }
            cursor = page.cursor;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finds(keys: &[&str], listed_all: bool) -> CleanupFinds {
        CleanupFinds {
            keys: keys.iter().map(|k| k.to_string()).collect(),
            listed_all,
        }
    }

    #[test]
    fn a_cleanup_whose_listing_failed_is_not_remembered() {
        let cleaned = CleanedWorkers::default();
        cleaned.remember("w1", 5, finds(&["a"], false));
        cleaned.remember("w2", 7, finds(&["b"], true));
        let recent = cleaned.recent(KEPT);
        assert_eq!(recent.len(), 1);
        assert_eq!(recent[0].worker, "w2");
        assert_eq!(recent[0].issued_before_us, 7_000);
        assert!(recent[0].found.contains("b"));
    }

    #[test]
    fn the_oldest_cleanups_go_past_the_limit() {
        let cleaned = CleanedWorkers::default();
        for i in 0..MAX + 3 {
            cleaned.remember(&format!("w{i}"), 1, finds(&[], true));
        }
        let recent = cleaned.recent(KEPT);
        assert_eq!(recent.len(), MAX);
        assert_eq!(recent[0].worker, "w3");
    }
}
