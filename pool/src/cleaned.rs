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
//!
//! Only while the worker stays dead, and only where the cleanup saw all it
//! held: a worker that comes back registers again (a newer creation time
//! in its record) and re-asserts what it runs itself, so its cleanup is
//! forgotten as soon as a node sees it registered again, and never acted
//! on when Redis shows the newer registration; and a cleanup is not
//! remembered when this node recovered from a loss while the worker was
//! silent (the worker could not re-assert then, and its cleanup may have
//! missed runs Redis had lost and that it still held).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cleanup::OWNED_PAGE;
use crate::error::Result;
use crate::node::NodeInner;
use crate::store::records::WorkerEntry;
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

impl Cleaned {
    /// Whether `registration` (a `workers` map value) is one made after
    /// this cleanup: the worker came back.
    fn registered_since(&self, registration: &str) -> bool {
        WorkerEntry::parse(registration)
            .and_then(|w| w.created_at_ms)
            .is_some_and(|created| created.saturating_mul(1000) >= self.issued_before_us)
    }
}

/// The cleanups this node finished lately.
#[derive(Debug, Default)]
pub(crate) struct CleanedWorkers {
    inner: Mutex<VecDeque<Arc<Cleaned>>>,
    /// When this node last began to recover from a loss of Redis's data.
    recovery_began: Mutex<Option<Instant>>,
}

impl CleanedWorkers {
    /// Notes that this node begins to recover from a loss now.
    pub(crate) fn recovery_begins(&self) {
        *self
            .recovery_began
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    /// Remembers that this node cleaned `worker` up, claimed at server time
    /// `claimed_ms` or later, and found `finds` there. Not when its listing
    /// did not finish (runs it did not list may have been there), nor when
    /// this node began a recovery within `exposed` (how long the worker was
    /// silent, and a TTL before: a worker that could not re-assert after a
    /// loss held runs its records did not show).
    pub(crate) fn remember(
        &self,
        worker: &str,
        claimed_ms: u64,
        exposed: Duration,
        finds: CleanupFinds,
    ) {
        let recovered_lately = self
            .recovery_began
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|at| at.elapsed() <= exposed);
        if !finds.listed_all || recovered_lately {
            tracing::debug!(
                worker,
                listed_all = finds.listed_all,
                recovered_lately,
                "what this cleanup found is not remembered"
            );
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

    /// Forgets the cleanups of workers that `workers` (the workers map's
    /// replica) shows registered again since: they came back.
    pub(crate) fn forget_returned(&self, workers: &HashMap<String, String>) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.is_empty() {
            return;
        }
        inner.retain(|c| {
            !workers
                .get(&c.worker)
                .is_some_and(|registration| c.registered_since(registration))
        });
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
        let cleanups = self.cleaned.recent(KEPT);
        let workers: Vec<String> = cleanups.iter().map(|c| c.worker.clone()).collect();
        // One read for all: a worker Redis does not show registered holds
        // nothing a cleanup would move; one registered since came back,
        // and re-asserts its own runs.
        let registrations = self.store.worker_registrations(&workers).await?;
        for (cleaned, registration) in cleanups.iter().zip(registrations) {
            match registration {
                None => continue,
                Some(registration) if cleaned.registered_since(&registration) => continue,
                Some(_) => {}
            }
            let left = self.runs_left_before_cleanup(cleaned).await?;
            if left.is_empty() {
                continue;
            }
            self.make_stand(left.into_iter(), StopKind::Run, |_: &str, _| None, |key, token, _| {
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
        cleaned.remember("w1", 5, Duration::ZERO, finds(&["a"], false));
        cleaned.remember("w2", 7, Duration::ZERO, finds(&["b"], true));
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
            cleaned.remember(&format!("w{i}"), 1, Duration::ZERO, finds(&[], true));
        }
        let recent = cleaned.recent(KEPT);
        assert_eq!(recent.len(), MAX);
        assert_eq!(recent[0].worker, "w3");
    }

    #[test]
    fn a_cleanup_after_a_recovery_within_the_silence_is_not_remembered() {
        let cleaned = CleanedWorkers::default();
        cleaned.recovery_begins();
        cleaned.remember("w1", 5, Duration::from_secs(60), finds(&[], true));
        assert!(cleaned.recent(KEPT).is_empty());
        cleaned.remember("w2", 5, Duration::ZERO, finds(&[], true));
        assert_eq!(cleaned.recent(KEPT).len(), 1);
    }

    #[test]
    fn a_worker_registered_again_since_its_cleanup_is_forgotten() {
        let cleaned = CleanedWorkers::default();
        cleaned.remember("back", 2_000, Duration::ZERO, finds(&[], true));
        cleaned.remember("old", 2_000, Duration::ZERO, finds(&[], true));
        let registration = |created: u64| {
            format!(r#"{{"node":"n","host":"h","pid":1,"created_at_ms":{created}}}"#)
        };
        let workers = HashMap::from([
            ("back".to_string(), registration(2_500)),
            // The registration the cleanup removed, back with a rollback.
            ("old".to_string(), registration(1_000)),
        ]);
        cleaned.forget_returned(&workers);
        let recent = cleaned.recent(KEPT);
        assert_eq!(recent.len(), 1);
        assert_eq!(recent[0].worker, "old");
    }
}
